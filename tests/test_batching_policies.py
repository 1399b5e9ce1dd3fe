"""The batching policies (shared node budget, per-request drafter block, prompt admission) against their
numpy references and their contracts, and the bad inputs they refuse."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot_mem.batching import (
    CostCurve,
    DrafterBlocks,
    PromptAdmission,
    SharedBudget,
    StepCosts,
    equal_shares,
    shared_shares,
)
from specpilot_mem.batching.blocks import confident_depth, share_depth
from specpilot_mem.batching.budget import expected_tokens
from specpilot_mem.batching.costs import BatchingError
from specpilot_mem.replay.trees import best_first, shared
from specpilot_mem.replay.trees.base import StepBatch

# Flat to 64 rows, a step at 65, flat to 128, then linear: the shape of a GEMM's measured c(R).
CURVE = CostCurve((1, 16, 32, 64, 96, 128, 256, 512), (10.0, 10.1, 10.0, 10.2, 12.0, 12.1, 20.0, 40.0), "test")


def random_batch(seed: int, steps: int, positions: int = 4, candidates: int = 4, tied: bool = True) -> StepBatch:
    rng = np.random.default_rng(seed)
    if tied:  # integer scores: exact ties across requests and inside trees
        pair = rng.integers(-2, 3, size=(steps, positions, candidates, candidates)).astype(np.float32)
    else:
        pair = rng.standard_normal((steps, positions, candidates, candidates)).astype(np.float32)
    pair[:, 0] = pair[:, 0, :1]
    cand = np.stack([np.stack([rng.permutation(50)[:candidates] for _ in range(positions)]) for _ in range(steps)])
    return StepBatch.from_scores(cand, np.zeros((steps, positions, candidates), np.float32), pair)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), steps=st.integers(1, 6), nodes=st.integers(0, 40), tied=st.booleans())
def test_shared_shares_equal_the_numpy_reference_and_are_trees(seed, steps, nodes, tied):
    batch = random_batch(seed, steps, tied=tied)
    trees = best_first.build(batch, max(nodes, 1))
    got = shared_shares(torch.from_numpy(trees.scores), nodes).numpy()
    want = shared.shares(trees, np.zeros(steps, dtype=np.int64), nodes)
    np.testing.assert_array_equal(got, want)
    assert got.sum() == min(nodes, int(trees.num_nodes.sum()))
    cut = trees.truncate(got)
    for b in range(steps):  # each share is prefix-closed: every kept node's parent is kept
        parents = cut.parents[b, : got[b]]
        assert np.all(parents < np.arange(got[b]))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), steps=st.integers(2, 6), nodes=st.integers(1, 30))
def test_shared_shares_expect_at_least_the_tokens_of_equal_trees(seed, steps, nodes):
    trees = best_first.build(random_batch(seed, steps, tied=False), nodes)
    scores = torch.from_numpy(trees.scores)
    shared_counts = shared_shares(scores, nodes)
    equal_counts = equal_shares(torch.from_numpy(trees.num_nodes), nodes)
    assert int(shared_counts.sum()) >= int(equal_counts.sum())
    assert (
        float(expected_tokens(scores, shared_counts).sum()) >= float(expected_tokens(scores, equal_counts).sum()) - 1e-5
    )


def test_shared_shares_take_the_best_nodes_across_requests():
    scores = torch.tensor([[-0.1, -0.5, -0.6], [-0.2, -3.0, float("-inf")]])
    assert shared_shares(scores, 3).tolist() == [2, 1]
    assert shared_shares(scores, torch.tensor(10)).tolist() == [3, 2]  # never past a tree's nodes
    tied = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    assert shared_shares(tied, 3).tolist() == [2, 1]  # ties: the lower request first


def test_equal_shares_split_evenly_within_each_tree():
    assert equal_shares(torch.tensor([10, 10, 10]), 7).tolist() == [3, 2, 2]
    assert equal_shares(torch.tensor([1, 10]), 8).tolist() == [1, 4]


def test_expected_tokens_sum_path_probabilities():
    scores = torch.log(torch.tensor([[0.5, 0.25], [0.9, 0.1]]))
    got = expected_tokens(scores, torch.tensor([1, 2]))
    torch.testing.assert_close(got, torch.tensor([1.5, 2.0]))


def test_cost_curve_steps_up_and_finds_the_plateau_end():
    assert CURVE.at(65) == pytest.approx(12.0) and CURVE.at(64) == pytest.approx(10.2)
    assert CURVE.at(1024) == pytest.approx(80.0)  # past the last measurement: proportional to rows
    assert (
        CURVE.plateau_end(1) == 64 and CURVE.plateau_end(70) == 128 and CURVE.plateau_end(200) == 256
    )  # 200 rows cost what 256 do
    assert CURVE.plateau_end(1, limit=40) == 32  # the verify buffers cap it
    noisy = CostCurve((1, 8, 16), (10.0, 9.0, 10.1))
    assert noisy.at(8) == 10.0  # the monotone envelope: noise never makes more rows cheaper
    with pytest.raises(BatchingError, match="increase"):
        CostCurve((4, 2), (1.0, 2.0))


def test_roofline_costs_are_flat_then_compute_bound():
    costs = StepCosts.roofline("27b")
    assert not costs.measured
    assert costs.target.at(64) < 1.1 * costs.target.at(1)  # weight stream dominates
    assert costs.target.at(2048) > 3 * costs.target.at(1)  # compute dominates
    assert costs.ar_ms(32) > costs.ar_ms(1)


def test_shared_budget_rows_at_the_plateau_and_refusals():
    budget = SharedBudget(CURVE, verify_buffer=512)
    assert budget.rows_for(8) == 64 and budget.rows_for(64) == 64 and budget.rows_for(100) == 128
    scores = (
        torch.log(torch.rand(8, 20, generator=torch.Generator().manual_seed(0))).sort(dim=1, descending=True).values
    )
    assert int(budget.shares(scores).sum()) == 64 - 8
    with pytest.raises(BatchingError, match="smaller than the 16 requests") as err:
        SharedBudget(CURVE, verify_buffer=512, rows=8).rows_for(16)
    assert err.value.where == "--shared-budget-rows" and "at least 16" in err.value.fix
    with pytest.raises(BatchingError, match="larger than the verify buffers"):
        SharedBudget(CURVE, verify_buffer=64, rows=128)
    with pytest.raises(BatchingError, match="root rows"):
        SharedBudget(CURVE, verify_buffer=64).rows_for(65)


def test_drafter_blocks_stay_largest_while_the_drafter_plateau_holds_them():
    blocks = DrafterBlocks(16, CURVE)
    recent = torch.tensor([1.0, 6.0, 3.0])
    assert blocks.choose(recent, torch.zeros(3, dtype=torch.int64)).tolist() == [16, 16, 16]  # 51 rows: on the plateau
    recent = blocks.update(torch.tensor([1.0, 6.0, 14.0]), torch.tensor([0, 0, 0]))
    assert recent.tolist() == pytest.approx([0.75, 4.5, 10.5])  # long acceptances fade, not vanish
    assert blocks.initial_recent(2).tolist() == [16.0, 16.0]


def test_drafter_blocks_shrink_least_need_first_to_fit_the_plateau():
    blocks = DrafterBlocks(16, CURVE)
    recent = torch.tensor([14.0, 1.0, 3.0, 14.0, 5.0, 0.0])
    confidence = torch.tensor([0, 0, 9, 0, 0, 0])
    got = blocks.choose(recent, confidence)  # 6 x 17 = 102 rows; the plateau ends at 64
    assert blocks.drafter_rows(6) == 64 and int((got + 1).sum()) <= 64
    assert got.tolist() == [12, 8, 8, 12, 8, 8]  # needs 16, 3, 11, 16, 7, 2: all to 12, then the four least to 8
    many = blocks.choose(torch.full((64,), 14.0), torch.zeros(64, dtype=torch.int64))  # 576 rows at the least
    assert many.tolist() == [8] * 64  # nothing smaller to draft: all at the smallest block


def test_drafter_blocks_refuse_blocks_the_drafter_cannot_draft():
    with pytest.raises(BatchingError, match="block 24 cannot be drafted") as err:
        DrafterBlocks(16, CURVE, choices=(24, 8))
    assert err.value.where == "--drafter-blocks" and "between 1 and 16" in err.value.fix


def test_confidence_depth_and_share_depth():
    logp = torch.log(torch.tensor([[0.9, 0.9, 0.5, 0.1], [0.05, 0.9, 0.9, 0.9]]))
    assert confident_depth(logp, threshold=0.3).tolist() == [3, 0]
    depths = torch.tensor([[1, 2, 3, 2], [1, 1, 2, 3]])
    assert share_depth(depths, torch.tensor([2, 4])).tolist() == [2, 3]


def test_prompt_admission_uses_only_the_plateau():
    chain = PromptAdmission(CURVE, verify_buffer=512, segment=None)
    admitted, rows = chain.plan(8, torch.tensor([30, 100]))  # 56 spare rows on the plateau
    assert admitted.tolist() == [30, 26] and int(rows) == 56
    segments = PromptAdmission(CURVE, verify_buffer=512, segment=16)
    admitted, rows = segments.plan(8, torch.tensor([20, 100]))  # 3 segments: two of the first, one of the second
    assert admitted.tolist() == [20, 16] and int(rows) == 48
    admitted, rows = segments.plan(40, torch.tensor([100]))  # drafts already take 40 rows: 24 spare, one segment
    assert admitted.tolist() == [16] and int(rows) == 16
    saturated = segments.plan(256, torch.tensor([100]))  # the step's rows end the plateau: admission off
    assert saturated[0].tolist() == [0] and int(saturated[1]) == 0
    assert chain.spare_rows(64) == 0 and chain.spare_rows(0) == 0


def test_prompt_admission_pays_only_against_a_dearer_prefill_pass():
    segments = PromptAdmission(CURVE, verify_buffer=512, segment=16)
    # 48 spare rows: a 96-row prompt enters in 2 steps, against 8 requests idling 2 steps for its pass
    assert segments.pays(16, 96, 8, step_ms=10.0, prefill_ms=20.0)
    assert not segments.pays(16, 960, 8, step_ms=10.0, prefill_ms=20.0)  # 20 idle steps for the slot
    assert not segments.pays(16, 96, 8, step_ms=10.0, prefill_ms=20.0, row_value=1.0)  # rows worth a token each
    assert not segments.pays(64, 96, 8, step_ms=10.0, prefill_ms=20.0)  # no spare rows


def test_prompt_admission_refuses_a_segment_larger_than_the_verify_buffers():
    with pytest.raises(BatchingError, match="--prompt-segment=600 does not fit") as err:
        PromptAdmission(CURVE, verify_buffer=512, segment=600)
    assert "1..512" in err.value.fix


def test_policies_run_on_the_gpu_without_host_sync():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    scores = torch.randn(32, 64, device="cuda").sort(dim=1, descending=True).values
    counts = shared_shares(scores, torch.tensor(96, device="cuda"))
    assert counts.device.type == "cuda" and int(counts.sum()) == 96
    blocks = DrafterBlocks(16, CURVE).choose(
        torch.rand(32, device="cuda") * 16, torch.zeros(32, dtype=torch.int64, device="cuda")
    )
    assert blocks.device.type == "cuda" and int((blocks + 1).sum()) <= CostCurve.plateau_end(CURVE, 32 * 9)
    assert math.isfinite(float(expected_tokens(scores.clamp(max=0), counts).sum()))
