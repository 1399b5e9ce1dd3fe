"""Every batching mechanism, decoded live on the trained pair (CPU, float32) with the policies deciding shares,
blocks and prompt segments — in lockstep on the pure-torch engine and in the composed engine's batched
decoder — gives the greedy decode itself, and token forcing finds nothing to reject."""

from dataclasses import replace

import numpy as np
import pytest

from specpilot_mem.batching.costs import CostCurve, StepCosts
from specpilot_mem.batching.lockstep import LockstepServer
from specpilot_mem.batching.simulate import CONFIGS
from specpilot_mem.controller.system import RequestOutput
from specpilot_mem.controller.requests import Request as ForcingRequest
from specpilot_mem.engine import weights
from specpilot_mem.engine.engine import Engine, Request
from specpilot_mem.forcing.engine_adapter import EngineScorer
from specpilot_mem.forcing.scorer import score_outputs
from specpilot_mem.forcing.verdict import TokenForcing

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(not weights.has_trained_pair(), reason="needs the trained pair in models/"),
]

NEW_TOKENS = 16
# A small plateau (48 rows) so that three requests compete for the budget, the drafter rows overflow
# (3 x 17 > 48: blocks shrink) and a 40-token prompt enters in segments.
CURVE = CostCurve((1, 16, 32, 48, 64, 128, 256, 2048), (1.0, 1.0, 1.01, 1.02, 1.5, 3.0, 6.0, 48.0), "test plateau")
COSTS = StepCosts("test", CURVE, CURVE, 0.0, measured=False)


@pytest.fixture(scope="module")
def engine():
    return Engine.load_default()


@pytest.fixture(scope="module")
def requests():
    text = b"import os\nimport sys\n\n\ndef main(argv):\n    parser = argparse.ArgumentParser(description="
    ids = list(text)  # byte values are valid ids of the pair's 4096-token vocabulary
    return [Request(ids[i : i + 40], NEW_TOKENS, f"r{i}") for i in range(0, 16, 4)]


@pytest.fixture(scope="module")
def ar(engine, requests):
    return {g.id: g for g in engine.generate(requests, "ar")}


def assert_not_rejected(verdict):
    """No rule rejects and no output departs from stock; 64 tokens are too few for token forcing to accept
    (its power rule asks for hundreds of requests: benchmarks/batched_forcing.py runs that many)."""
    assert verdict.verdict == "inconclusive" and len(verdict.reasons) == 1, verdict.reasons
    assert verdict.rate.system_rate == 0 and verdict.events.system_events == 0


def forcing_outputs(generations):
    return {g.id: RequestOutput(g.id, tuple(g.output_ids), 0.0, tuple(g.token_times)) for g in generations}


@pytest.mark.parametrize("name", ["stock", "shared-budget", "drafter-block", "prompt-admission", "all"])
def test_token_forcing_accepts_each_mechanism(engine, requests, ar, name):
    server = LockstepServer(engine, CONFIGS[name], COSTS, batch=3, segment=8, admit_always=True)
    runs = server.run(requests)
    assert [g.id for g in runs] == [r.id for r in requests]
    for g in runs:
        assert g.output_ids == ar[g.id].output_ids  # float32 on one CPU: the greedy decode itself
    assert np.mean([np.mean(g.accepted) for g in runs]) > 1.0  # drafts were accepted
    stats = server.stats
    if name in ("shared-budget", "all"):  # the budget splits unevenly: some step gives requests different shares
        assert any(len(set(step)) > 1 for step in stats["shares"] if len(step) > 1)
        assert all(sum(step) + len(step) <= CURVE.plateau_end(len(step)) for step in stats["shares"])
    if name in ("drafter-block", "all"):
        assert min(stats["blocks"]) < 16  # 3 x 17 drafter rows overflow the plateau
    if name == "prompt-admission":  # beside stock's chains: a few spare rows, so the prompt enters in segments
        assert stats["admitted_steps"] > 0 and min(stats["prefill_rows"]) < 40
    elif name == "all":  # beside a shared budget the plateau's rows past the roots are all spare
        assert stats["admitted_steps"] > 0
    else:
        assert stats["admitted_steps"] == 0 and set(stats["prefill_rows"]) == {40}
    forcing_requests = [
        ForcingRequest(r.id, "code", "dev", NEW_TOKENS, prompt_ids=tuple(r.prompt_ids)) for r in requests
    ]
    scorer = EngineScorer(engine)
    stock = score_outputs(scorer, forcing_requests, forcing_outputs(ar.values()))
    system = score_outputs(scorer, forcing_requests, forcing_outputs(runs))
    verdict = TokenForcing(scorer, stock, delta=0.125).judge(name, system)
    assert_not_rejected(verdict)


@pytest.mark.parametrize(
    "name", ["stock", "shared-budget", "drafter-block", "shared-budget+drafter-block", "planned-budget"]
)
def test_token_forcing_accepts_each_mechanism_in_the_system_decoder(engine, requests, ar, name):
    from specpilot_mem.batching.system_decoder import PolicyDecoder

    decoder = PolicyDecoder(engine, CONFIGS[name], COSTS, batch=3, max_len=256)
    runs = decoder.generate([r.prompt_ids for r in requests], "spec", NEW_TOKENS)
    runs = [replace(g, id=r.id) for g, r in zip(runs, requests)]
    for g in runs:
        assert g.output_ids == ar[g.id].output_ids  # float32 on one CPU: the greedy decode itself
    shares = [step for step in decoder.stats["shares"] if len(step) > 1]
    if CONFIGS[name].shared and not CONFIGS[name].plan:
        assert any(len(set(step)) > 1 for step in shares)
        assert all(sum(step) + len(step) <= CURVE.plateau_end(len(step)) for step in shares)
    if CONFIGS[name].blocks:
        assert min(decoder.stats["blocks"]) < 16
    forcing_requests = [
        ForcingRequest(r.id, "code", "dev", NEW_TOKENS, prompt_ids=tuple(r.prompt_ids)) for r in requests
    ]
    scorer = EngineScorer(engine)
    stock = score_outputs(scorer, forcing_requests, forcing_outputs(ar.values()))
    verdict = TokenForcing(scorer, stock, delta=0.125).judge(
        name, score_outputs(scorer, forcing_requests, forcing_outputs(runs))
    )
    assert_not_rejected(verdict)


class ARWins(StepCosts):
    """The test plateau's costs with every speculative row dearer than a token: the planner takes AR steps and
    looks now and then."""

    def verify_ms(self, rows, requests):
        return super().verify_ms(rows, requests) * (1 + 3 * (rows / max(requests, 1) - 1))


@pytest.mark.parametrize("costs", [COSTS, ARWins("test", CURVE, CURVE, 0.0, measured=False)], ids=["pays", "ar-wins"])
def test_the_planner_chooses_each_steps_bucket_in_the_system_decoder(engine, requests, ar, costs):
    from specpilot_mem.batching.system_decoder import PolicyDecoder

    decoder = PolicyDecoder(engine, CONFIGS["planned-budget"], costs, batch=3, max_len=256)
    runs = decoder.generate([r.prompt_ids for r in requests], "spec", NEW_TOKENS)
    for g, r in zip(runs, requests):
        assert g.output_ids == ar[r.id].output_ids
    rows = decoder.stats["rows"]
    if costs is COSTS:
        assert max(rows) > decoder.planner.buckets[0]  # past the first look it plans deeper buckets
    else:
        assert 1 in rows and max(rows) > 1 and rows[1] > sum(n for k, n in rows.items() if k > 1)
    assert all(len(step) <= 3 for step in decoder.stats["shares"])


@pytest.mark.parametrize("name", ["shared-budget", "drafter-block"])
def test_a_gated_mechanism_takes_ar_steps_where_speculation_loses(engine, requests, ar, name):
    from specpilot_mem.batching.system_decoder import PolicyDecoder

    costs = ARWins("test", CURVE, CURVE, 0.0, measured=False)
    gated = PolicyDecoder(engine, CONFIGS[name], costs, batch=3, max_len=256)
    runs = gated.generate([r.prompt_ids for r in requests], "spec", NEW_TOKENS)
    for g, r in zip(runs, requests):
        assert g.output_ids == ar[r.id].output_ids
    rows = gated.stats["rows"]  # AR steps (1 row) outnumber its looks at its own [B, 1 + nodes] step
    assert set(rows) <= {1, gated.options.rows} and rows.get(1, 0) > rows.get(gated.options.rows, 0)
    ungated = PolicyDecoder(engine, replace(CONFIGS[name], gate=False), costs, batch=3, max_len=256)
    ungated.generate([r.prompt_ids for r in requests], "spec", NEW_TOKENS)
    assert set(ungated.stats["rows"]) == {ungated.options.rows}
