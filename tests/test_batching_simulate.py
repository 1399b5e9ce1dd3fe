"""The closed-loop batched replay (batching.simulate) on small synthetic lattices: every configuration
decodes the same greedy tokens, the mechanisms behave as their contracts say, bad input is refused."""

from dataclasses import replace

import numpy as np
import pytest

from specpilot_mem.batching.costs import BatchingError, CostCurve, StepCosts
from specpilot_mem.batching.simulate import CONFIGS, check_block_lattices, simulate, speedups
from specpilot_mem.replay.synthetic import SyntheticSpec, generate


def cut(lat, block):
    """The first ``block`` positions of a lattice: a valid lattice of that block (synthetic stand-in)."""
    return replace(
        lat,
        cand=lat.cand[:, :block],
        unary=lat.unary[:, :block],
        pair=lat.pair[:, :block],
        meta={**lat.meta, "positions": block},
        _lookup=None,
    )


@pytest.fixture(scope="module")
def lattices():
    lat = generate(SyntheticSpec(requests=6, length=24, positions=16, candidates=4, vocab=500, seed=3))
    return {16: lat, 12: cut(lat, 12), 8: cut(lat, 8)}


@pytest.fixture(scope="module")
def costs():
    return StepCosts.roofline("4b")


@pytest.mark.parametrize("batch", [1, 4])
def test_every_configuration_decodes_whole_requests(lattices, costs, batch):
    outcomes = {name: simulate(lattices, costs, cfg, batch, prompt_rows=64, stream=8) for name, cfg in CONFIGS.items()}
    assert outcomes["ar"].tau == 1.0
    for o in outcomes.values():
        assert o.tokens > 0 and o.time_ms > 0 and o.request_steps > 0
        assert 1.0 <= o.tau <= 17.0
    if batch == 1:  # one request: the shared budget and the equal split are the same tree
        assert outcomes["shared-plateau"].tokens == outcomes["equal-trees"].tokens
    figures = speedups(outcomes)
    assert figures["ar"]["over_ar"] == 1.0 and figures["stock"]["over_stock"] == 1.0


def test_shared_budget_and_equal_trees_verify_the_same_rows(lattices, costs):
    shared = simulate(lattices, costs, CONFIGS["shared-plateau"], 4, stream=8)
    equal = simulate(lattices, costs, CONFIGS["equal-trees"], 4, stream=8)
    assert shared.verify_rows / shared.spec_steps == pytest.approx(equal.verify_rows / equal.spec_steps, rel=0.05)


def test_admission_is_off_where_compute_never_idles(lattices):
    linear = CostCurve(
        (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
        tuple(float(r) for r in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)),
        "linear",
    )
    saturated = StepCosts("linear", linear, linear, 0.0, measured=False)
    ungated = replace(CONFIGS["prompt-admission"], gate=False)
    admitted = simulate(lattices, saturated, ungated, 4, prompt_rows=64, stream=12)
    stock = simulate(lattices, saturated, CONFIGS["stock"], 4, prompt_rows=64, stream=12)
    assert admitted.admitted_rows == 0
    assert (admitted.tokens, admitted.time_ms) == (stock.tokens, stock.time_ms)


def test_a_gated_mechanism_runs_ar_where_speculation_loses(lattices):
    counts = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    linear = CostCurve(counts, tuple(float(r) for r in counts))
    saturated = StepCosts("linear", linear, linear, 0.0, measured=False)  # every row costs: a 17-row chain never pays
    ar = simulate(lattices, saturated, CONFIGS["ar"], 4, stream=12)
    for name in ("shared-budget", "drafter-block", "prompt-admission"):
        gated = simulate(lattices, saturated, CONFIGS[name], 4, stream=12)
        ungated = simulate(lattices, saturated, replace(CONFIGS[name], gate=False), 4, stream=12)
        assert ungated.spec_steps == ungated.steps and gated.spec_steps <= gated.steps // 4  # only its looks
        assert gated.tokens_per_ms > ungated.tokens_per_ms and gated.tokens_per_ms > 0.75 * ar.tokens_per_ms


def test_drafter_blocks_shrink_only_past_the_drafter_plateau(lattices, costs):
    one = simulate(lattices, costs, CONFIGS["drafter-block"], 1, stream=3)
    assert set(one.blocks) == {16}  # 17 drafter rows are on the plateau: nothing to save
    many = simulate(lattices, costs, CONFIGS["drafter-block"], 24, stream=30)
    assert set(many.blocks) != {16} and many.to_dict()["mean_drafter_rows"] <= costs.drafter.plateau_end(24 * 9)


def test_block_lattices_must_share_requests(lattices):
    other = generate(SyntheticSpec(requests=6, length=24, positions=8, candidates=4, vocab=500, seed=4))
    with pytest.raises(BatchingError, match="different requests"):
        check_block_lattices({16: lattices[16], 8: other})
    with pytest.raises(BatchingError, match="drafts 16 positions"):
        check_block_lattices({8: lattices[16]})
    assert np.array_equal(lattices[8].greedy_tokens, lattices[16].greedy_tokens)


def test_admission_enters_prompts_but_never_first_in_a_look(lattices, monkeypatch):
    import specpilot_mem.batching.simulate as sim
    from specpilot_mem.batching.planner import BudgetPlanner

    counts = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    flat = CostCurve(counts, tuple(1.0 for _ in counts))  # spare rows in every step, AR and speculative
    step = sim._speculative_step

    def looks(self, requests, tau=None):  # the planner's decisions made for it: two looks in three steps, else AR
        self.calls = getattr(self, "calls", 0) + 1
        self.looking = bool(self.calls % 3)
        return self.buckets[-1] if self.looking else 1

    in_looks = []

    def spec_step(*args):  # every speculative step here is a look; its admitted prompt rows (``extra``)
        in_looks.append(args[8])
        return step(*args)

    monkeypatch.setattr(BudgetPlanner, "rows_for", looks)
    monkeypatch.setattr(sim, "_speculative_step", spec_step)
    costs = StepCosts("flat", flat, flat, 0.0, measured=False)  # a look costs 2 AR steps: a prompt would ride in it
    out = simulate(lattices, costs, CONFIGS["prompt-admission"], 4, stream=12)
    # prompts enter in the AR steps' spare rows; those arriving in a look are prefilled, none enters beside it
    assert len(in_looks) > out.steps // 3 and out.admitted_rows > 0 and out.prefill_passes > 0
    assert set(in_looks) == {0}


def test_prefill_is_charged_in_proportion_to_the_tokens_decoded(lattices, costs):
    # two slots, no refills: they start staggered at 0 and half-way, and the run ends when the second one finishes
    out = simulate(lattices, costs, CONFIGS["ar"], 2, prompt_rows=64, stream=2)
    length = int(np.diff(lattices[16].greedy_offsets)[0])
    assert out.prefill_ms == 0 and out.tokens == length  # half of each request: no pass paid, one request's tokens
    assert out.prefill_share_ms == pytest.approx(costs.prefill_ms(64))  # so one pass of its own is charged
    assert out.tokens_per_ms == pytest.approx(out.tokens / (out.time_ms + costs.prefill_ms(64)))
    # refilled requests decoded whole (equal lengths here) are charged the passes paid for them, whole
    refilled = simulate(lattices, costs, CONFIGS["ar"], 2, prompt_rows=64, stream=6)
    assert refilled.prefill_passes > 0 and refilled.tokens == 5 * length
    assert refilled.prefill_share_ms == pytest.approx(refilled.prefill_ms + costs.prefill_ms(64))
