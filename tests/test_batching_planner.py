"""The batch-size-aware budget planner (batching.planner): it takes the bucket of most expected tokens per
ms, AR when no bucket beats AR, backs off its probes where speculation cannot pay, and refuses bad buckets."""

import math

import numpy as np
import pytest
import torch

from specpilot_mem.batching.costs import BatchingError
from specpilot_mem.batching.planner import BudgetPlanner


class Costs:
    """Step costs of a toy engine: AR 10 ms; a speculative step 10 ms x (1 + growth x extra rows per request)
    plus a 2 ms draft."""

    def __init__(self, growth: float):
        self.growth = growth

    def ar_ms(self, requests):
        return 10.0

    def verify_ms(self, rows, requests):
        return 10.0 * (1 + self.growth * (rows / requests - 1))

    def draft_ms(self, rows, requests):
        return 2.0


TAU = np.array([1.8, 2.4, 3.0, 3.4, 3.6])  # expected tokens per request at 2, 3, 5, 9, 17 rows


def test_the_plan_takes_the_best_bucket_where_extra_rows_are_cheap():
    planner = BudgetPlanner(Costs(growth=0.001))
    table = planner.table(8, TAU)
    assert table[0]["rows"] == 1 and table[0]["tokens_per_ms"] == pytest.approx(0.8)
    best = max(table, key=lambda r: r["tokens_per_ms"])
    assert planner.rows_for(8, TAU) == best["rows"] == 17


def test_the_plan_is_ar_where_no_bucket_beats_it():
    planner = BudgetPlanner(Costs(growth=1.5))  # one extra row per request already costs 2.5x AR
    table = planner.table(32, TAU)
    assert all(r["tokens_per_ms"] < table[0]["tokens_per_ms"] for r in table[1:])
    assert planner.rows_for(32, TAU) == 1


def test_the_plan_is_a_smaller_bucket_in_between():
    planner = BudgetPlanner(Costs(growth=0.2))
    rows = planner.rows_for(16, TAU)
    assert 2 < rows < 17


def test_drafter_blocks_follow_the_bucket():
    planner = BudgetPlanner(Costs(growth=0.1), blocks=(8, 12, 16))
    assert [planner.draft_block(r) for r in (2, 9, 10, 13, 17)] == [8, 8, 12, 12, 16]


def scores(B: int, p: float, n: int = 16) -> torch.Tensor:
    """Chains whose i-th node has path probability p^i."""
    return (torch.arange(1, n + 1, dtype=torch.float32) * math.log(p)).expand(B, n).contiguous()


def test_estimates_from_tree_scores_and_calibration():
    planner = BudgetPlanner(Costs(growth=0.01))
    curve = planner.estimate(scores(4, 0.5))
    want = [1 + sum(0.5**i for i in range(1, r)) for r in planner.buckets]
    np.testing.assert_allclose(curve, want, rtol=1e-5)
    for _ in range(30):  # the drafter is twice as confident as its acceptance
        planner.observe(scores(4, 0.5), 5, 0.5 * (want[2] - 1))
    assert planner.calibration == pytest.approx(0.5, rel=1e-3)
    np.testing.assert_allclose(planner.expected(), 1 + 0.5 * (np.array(want) - 1), rtol=1e-3)


def test_probes_back_off_where_speculation_cannot_pay():
    planner = BudgetPlanner(Costs(growth=3.0), probe=2, max_probe=16)
    planner.observe(scores(8, 0.5), 2, 0.5)
    picks = [planner.rows_for(8) for _ in range(64)]
    probes = [i for i, r in enumerate(picks) if r > 1]
    assert probes and all(picks[i] == planner.buckets[0] for i in probes)
    gaps = np.diff(probes)
    assert list(gaps) == sorted(gaps) and gaps[-1] == 16  # doubling intervals up to max_probe


def test_bad_buckets_are_refused():
    with pytest.raises(BatchingError, match="--plan-rows"):
        BudgetPlanner(Costs(0.1), per_request=(1, 5))
    with pytest.raises(BatchingError, match="requests in flight"):
        BudgetPlanner(Costs(0.1)).rows_for(0)


def engine_doc(path: bool) -> dict:
    entry = lambda b: {  # noqa: E731
        "T_AR_ms": 5.0 + b / 16,
        "T_draft_ms": {"16": 1.0, "8": 0.8},
        "T_step_ms": {"2": 8.0 + b / 4, "17": 12.0 + b},
        **({"T_step_path_ms": {"2": 6.0 + b / 8, "17": 9.0 + b / 2}} if path else {}),
    }
    return {"source": "toy", "by_batch": {str(b): entry(b) for b in (1, 8, 32)}}


def test_engine_costs_per_option_set():
    from specpilot_mem.batching.costs import EngineStepCosts, StepCosts

    base = StepCosts.roofline("4b")
    stock = EngineStepCosts(base, engine_doc(True), "stock")
    path = EngineStepCosts(base, engine_doc(True), "path")
    assert stock.ar_ms(8) == path.ar_ms(8) == pytest.approx(5.5)
    assert stock.verify_ms(8 * 17, 8) == pytest.approx(20.0) and path.verify_ms(8 * 17, 8) == pytest.approx(13.0)
    with pytest.raises(BatchingError, match="T_step_path_ms"):
        EngineStepCosts(base, engine_doc(False), "path")
    with pytest.raises(BatchingError, match="unknown engine variant"):
        EngineStepCosts(base, engine_doc(True), "w12")
