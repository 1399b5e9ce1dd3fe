"""Certified head kernels (Triton interpreter on CPU; ``gpu`` tests on the H200): argmax == exact head's."""

import pytest
import torch

from specpilot_kernels.certified_head import (
    certified_argmax,
    certified_argmax_graphable,
    exact_head_logits,
    int8_pass,
    quantize_head,
)
from specpilot_kernels.certified_head import reference as R
from specpilot_kernels.certified_head.adversarial import adversarial_head, adversarial_inputs
from specpilot_kernels.certified_head.head import interpreting, uses_cuda_exact

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def small_head():
    gen = torch.Generator().manual_seed(42)
    w, pairs = adversarial_head(320, 128, gen)  # 320: the last INT8 block is partial
    return quantize_head(w.to(DEVICE)), pairs.to(DEVICE), gen


def test_exact_head_kernel_matches_reference(small_head):
    head, pairs, gen = small_head
    x = adversarial_inputs(head.weight, pairs, 8, gen)
    got = exact_head_logits(x, head.weight)
    want = R.exact_head_reference(
        x.cpu(), R.CertifiedHead(head.weight.cpu(), head.qweight.cpu(), head.scale.cpu(), head.radius_coef.cpu())
    )
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_thousands_of_adversarial_rows_keep_the_exact_argmax(small_head):
    """2048 synthetic adversarial rows in calls of 32: the certified token is the exact head's argmax.

    The exact argmax comes from the FP64 reference where its top two logits are equal (identical rows)
    or clearly apart, and from the exact head kernel itself on the near-ties in between.
    """
    head, pairs, gen = small_head
    cpu_head = R.CertifiedHead(head.weight.cpu(), head.qweight.cpu(), head.scale.cpu(), head.radius_coef.cpu())
    mismatches, near_ties, candidates = 0, 0, []
    for _ in range(64):
        x = adversarial_inputs(head.weight, pairs, 32, gen)
        tokens, count = certified_argmax(x, head, max_survivors=256, block_k=128, rescore_programs=1)
        ref = R.exact_head_reference(x.cpu(), cpu_head)
        top2 = ref.topk(2, dim=1).values
        gap = top2[:, 0] - top2[:, 1]
        near = (gap > 0) & (gap <= 1e-4 * top2[:, 0].abs())
        want = ref.argmax(1).to(tokens.device)
        if near.any():
            rows = near.nonzero().squeeze(1).to(x.device)
            want[rows] = exact_head_logits(x[rows].contiguous(), head.weight).argmax(1)
        mismatches += int((tokens != want).sum())
        near_ties += int(near.sum())
        candidates.append(count)
    assert mismatches == 0
    assert near_ties > 0  # near-ties were settled by the exact head kernel itself
    assert int(torch.cat(candidates).max()) >= 2  # ties and near-ties reached the rescore


def test_int8_pass_bounds_and_candidates_agree_with_the_reference(small_head):
    """The INT8 pass alone: its best lower bound is the reference's, and every row that may win is listed."""
    head, pairs, gen = small_head
    x = adversarial_inputs(head.weight, pairs, 8, gen)
    best_lower, count, cand_idx, cand_upper = int8_pass(x, head, max_survivors=320, block_n=64, block_k=128)
    cpu_head = R.CertifiedHead(head.weight.cpu(), head.qweight.cpu(), head.scale.cpu(), head.radius_coef.cpu())
    approx, radius = R.int8_logits_and_radius(x.cpu(), cpu_head)
    want_best = (approx - radius).amax(1)
    torch.testing.assert_close(best_lower.cpu(), want_best, rtol=1e-5, atol=1e-5 * float(want_best.abs().max()))
    for m in range(x.shape[0]):
        listed = set(cand_idx[m, : int(count[m])].tolist())
        assert len(listed) == int(count[m])  # each row appended once
        # the rows the final bound keeps (with the FP32 slack of the two computations) are all listed
        margin = 1e-5 * (float(want_best[m].abs()) + 1)
        kept = ((approx[m] + radius[m]) >= want_best[m] + margin).nonzero().squeeze(1).tolist()
        assert set(kept) <= listed


def test_candidate_overflow_falls_back_to_the_full_head(small_head):
    head, pairs, gen = small_head
    x = adversarial_inputs(head.weight, pairs, 16, gen)
    tokens, count = certified_argmax_graphable(x, head, max_survivors=1, block_k=128, rescore_programs=2)
    overflow = count > 1
    assert overflow.any() and (tokens[overflow] == -1).all()
    exact = exact_head_logits(x, head.weight).argmax(1)
    assert torch.equal(tokens[~overflow], exact[~overflow])
    fixed, _ = certified_argmax(x, head, max_survivors=1, block_k=128, rescore_programs=2)
    assert torch.equal(fixed, exact)


def test_rejects_bad_inputs(small_head):
    head, _, _ = small_head
    with pytest.raises(ValueError, match="bf16"):
        certified_argmax(torch.randn(2, 128, device=DEVICE), head)
    with pytest.raises(ValueError, match="at most 32"):
        certified_argmax(torch.zeros(33, 128, dtype=torch.bfloat16, device=DEVICE), head)


@pytest.mark.parametrize("k_splits", [1, 2, 4])
def test_k_split_exact_head_and_rescore_agree(k_splits):
    """K = 1024 in 4 slices of 256 summed as 1, 2 or 4 parts: the full head (parts added in one program) is
    the reference's logits, and the rescore (parts from separate programs, added by the finalize) keeps its
    argmax."""
    gen = torch.Generator().manual_seed(9)
    w, pairs = adversarial_head(192, 1024, gen)
    head = quantize_head(w.to(DEVICE), exact_depth=1024)  # the Triton exact head's radius: any order
    x = adversarial_inputs(head.weight, pairs.to(DEVICE), 8, gen)
    exact = exact_head_logits(x, head.weight, k_splits=k_splits)
    want = R.exact_head_reference(
        x.cpu(), R.CertifiedHead(head.weight.cpu(), head.qweight.cpu(), head.scale.cpu(), head.radius_coef.cpu())
    )
    torch.testing.assert_close(exact.cpu(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    tokens, _ = certified_argmax(x, head, block_k=128, rescore_programs=2, k_splits=k_splits)
    assert torch.equal(tokens, exact.argmax(1))


@pytest.mark.gpu
def test_interpreter_flag_is_off_on_the_gpu():
    assert not interpreting()


@pytest.mark.gpu
@pytest.mark.parametrize("exact,k_splits", [("cuda", None), ("triton", None), ("triton", 1), ("triton", 2)])
def test_rescored_logits_are_the_exact_heads_bits(exact, k_splits):
    """The certificate relies on rescoring reproducing the full head's value of every row bit for bit."""
    gen = torch.Generator().manual_seed(7)
    w, pairs = adversarial_head(4096, 1024, gen)
    head = quantize_head(w.cuda(), exact_depth=None if exact == "cuda" else 1024)
    x = adversarial_inputs(head.weight, pairs.cuda(), 32, gen)
    full = exact_head_logits(x, head.weight, k_splits=k_splits, exact=exact)
    perm = torch.randperm(4096, device="cuda")
    shuffled = exact_head_logits(x, head.weight[perm].contiguous(), k_splits=k_splits, exact=exact)
    assert torch.equal(shuffled, full[:, perm])
    tokens, _ = certified_argmax(x, head, k_splits=k_splits, exact=exact)
    assert torch.equal(tokens, full.argmax(1))


@pytest.mark.gpu
def test_the_default_exact_head_on_the_gpu_is_the_cuda_one():
    x = torch.ones(1, 256, dtype=torch.bfloat16, device="cuda")
    assert uses_cuda_exact(x, "auto", None) and not uses_cuda_exact(x, "auto", 2)
    with pytest.raises(ValueError, match="k_splits"):
        uses_cuda_exact(x, "cuda", 2)


def test_hidden_size_that_is_not_a_multiple_of_the_int8_tile():
    """K = 384 with 256-wide INT8 tiles: the partial last tile must be masked, not read from the next row."""
    gen = torch.Generator().manual_seed(7)
    w, pairs = adversarial_head(320, 384, gen)
    head = quantize_head(w.to(DEVICE))
    x = adversarial_inputs(head.weight, pairs.to(DEVICE), 16, gen)
    tokens, _ = certified_argmax(x, head, block_k=256, rescore_programs=1)
    assert torch.equal(tokens, exact_head_logits(x, head.weight).argmax(1))
