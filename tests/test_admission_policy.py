"""Prompt admission's decision per waiting prompt and the server under arrivals (``batching.arrivals``) on small
synthetic lattices and step costs: every request is served whole under both schedulers, admission is off (and
the run identical to stock's) where the measured step has no spare plateau rows, it gains where prefill passes
stall the batch, and bad records are refused."""

import numpy as np
import pytest
import torch

from specpilot_mem.batching.admission import PromptAdmission
from specpilot_mem.batching.arrivals import CHAIN_ROWS, AdmissionCosts, Arrivals, chain_gains, serve
from specpilot_mem.batching.costs import BatchingError, CostCurve
from specpilot_mem.replay.synthetic import SyntheticSpec, generate

CURVE = CostCurve((1, 16, 32, 64, 96, 128, 256, 512), (10.0, 10.1, 10.0, 10.2, 12.0, 12.1, 20.0, 40.0), "test")


def record(mixed_extra: float, prefill64: float = 6.0) -> dict:
    """Step costs of 1/4/8 slots: the mixed step ``mixed_extra`` x the step per 64 prompt rows."""
    batches = (1, 4, 8)
    step = {str(b): 5.0 + 0.1 * b for b in batches}
    return {
        "T_step_ms": step,
        "T_draft_ms": {str(b): 1.0 for b in batches},
        "T_mixed_ms": {str(b): {str(s): step[str(b)] * (1 + mixed_extra * s / 64) for s in (16, 64)} for b in batches},
        "T_prefill_ms": {"16": prefill64 / 2, "64": prefill64},
    }


@pytest.fixture(scope="module")
def gains():
    lat = generate(SyntheticSpec(requests=6, length=40, positions=16, candidates=4, vocab=500, seed=5))
    return chain_gains(lat)


def test_admitted_prompts_weighs_each_prompt_in_arrival_order():
    segments = PromptAdmission(CURVE, verify_buffer=512, segment=16)
    # 48 spare rows: 96-row prompts enter in 2, 4, 6 ... steps behind each other, against 9 slots idling 2 steps each
    assert segments.admitted_prompts(16, torch.tensor([96, 96, 96]), 8, 10.0, 20.0) == 3
    # the 9th would idle 18 steps (+ the dearer steps): a pass of its own is cheaper
    assert segments.admitted_prompts(16, torch.full((10,), 96), 8, 10.0, 20.0) == 8
    # prompts already entering stay admitted, however long they still have to wait
    assert segments.admitted_prompts(16, torch.tensor([960, 96]), 8, 10.0, 20.0) == 0
    assert segments.admitted_prompts(16, torch.tensor([960, 96]), 8, 10.0, 20.0, committed=1) == 1
    assert segments.admitted_prompts(64, torch.tensor([96]), 8, 10.0, 20.0) == 0  # no spare rows


@pytest.mark.parametrize("arrivals", [Arrivals("closed"), Arrivals("poisson", rate=50.0, seed=1)])
def test_both_schedulers_serve_every_token(gains, arrivals):
    costs = AdmissionCosts(record(0.01), "test")
    policy = PromptAdmission(costs.curve(4), 2048, 16)
    stock = serve(gains, costs, 4, arrivals, 12, prompt_rows=128)
    admitted = serve(gains, costs, 4, arrivals, 12, prompt_rows=128, admission=policy)
    if arrivals.kind == "poisson":  # every request is served whole: the same tokens
        total = sum(gains[r % len(gains)].size for r in range(12))  # each request's output length
        assert stock.tokens == admitted.tokens == total and stock.requests == admitted.requests == 12
    assert admitted.admitted_rows > 0 and admitted.prefill_passes < stock.prefill_passes
    assert stock.admitted_rows == 0


def test_admission_is_off_where_the_step_has_no_spare_rows(gains):
    costs = AdmissionCosts(record(0.5), "test")  # every prompt row costs: no plateau past the slots' rows
    assert costs.curve(4).plateau_end(4 * CHAIN_ROWS) == 4 * CHAIN_ROWS
    policy = PromptAdmission(costs.curve(4), 2048, 16)
    stock = serve(gains, costs, 4, Arrivals("closed"), 16, prompt_rows=128)
    admitted = serve(gains, costs, 4, Arrivals("closed"), 16, prompt_rows=128, admission=policy)
    assert admitted.admitted_rows == 0 and admitted.to_dict() | {"scheduling": "stock"} == stock.to_dict()


def test_admission_gains_where_prefill_passes_stall_the_batch(gains):
    costs = AdmissionCosts(record(0.01, prefill64=20.0), "test")
    stock = serve(gains, costs, 8, Arrivals("closed"), 24, prompt_rows=128)
    admitted = serve(gains, costs, 8, Arrivals("closed"), 24, 128, PromptAdmission(costs.curve(8), 2048, 64))
    assert admitted.tokens_per_s > 1.05 * stock.tokens_per_s


def test_bad_records_and_arrivals_are_refused():
    broken = record(0.01)
    del broken["T_mixed_ms"]["4"]
    with pytest.raises(BatchingError, match="lacks"):
        AdmissionCosts(broken, "test")
    with pytest.raises(BatchingError, match="past the largest measured segment"):
        AdmissionCosts(record(0.01), "test").step_ms(4, 100)
    with pytest.raises(BatchingError, match="poisson with a rate > 0"):
        Arrivals("poisson", 0.0).times(3)
    assert np.all(np.diff(Arrivals("poisson", 10.0).times(5)) > 0)
