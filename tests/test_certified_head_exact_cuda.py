"""The exact head's CUDA arithmetic (``gpu`` tests): the full head against the FP64 reference, the one-launch
rescore against the full head's argmax, and its overlapped launch under CUDA-graph replay."""

import pytest
import torch

from specpilot_kernels.certified_head import certified_argmax_graphable, quantize_head
from specpilot_kernels.certified_head import reference as R
from specpilot_kernels.certified_head.adversarial import adversarial_head, adversarial_inputs
from specpilot_kernels.certified_head.cuda_pass import int8_pass_cuda, run_cuda_pass
from specpilot_kernels.certified_head.exact_cuda import (
    _rescore_state,
    certified_tokens_cuda,
    compact_and_rescore_cuda,
    exact_head_logits_cuda,
    rescore_cuda,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def head_and_inputs():
    gen = torch.Generator().manual_seed(5)
    w, pairs = adversarial_head(3000, 1280, gen)  # K = 1280: 160 pieces, not a multiple of 32 lanes x 20
    head = quantize_head(w.cuda())
    return head, adversarial_inputs(head.weight, pairs.cuda(), 40, gen)


def test_cuda_exact_head_is_its_pure_torch_definition_bit_for_bit(head_and_inputs):
    head, x = head_and_inputs
    got = exact_head_logits_cuda(x, head.weight).cpu()
    assert torch.equal(got, R.exact_head_warp_order(x.cpu(), head.weight.cpu()))


def test_rescore_of_every_row_is_the_full_heads_argmax(head_and_inputs):
    """Every head row listed for 40 input rows (two groups of 32 in the row walk): the lowest index of the
    largest logit (the adversarial head has exact duplicates: ties), the same over repeated calls."""
    head, x = head_and_inputs
    m, n = x.shape[0], head.vocab
    full = exact_head_logits_cuda(x, head.weight)
    count = torch.full((m,), n, dtype=torch.int32, device="cuda")
    cand_idx = torch.randperm(n, device="cuda").to(torch.int32).repeat(m, 1).contiguous()
    cand_upper = torch.zeros((m, n), device="cuda")
    best_lower = torch.full((m,), -1.0, device="cuda")
    for _ in range(3):  # the keys and ticket are left zero for the next call
        tokens = rescore_cuda(x, head.weight, best_lower, count, cand_idx, cand_upper)
        assert torch.equal(tokens, full.argmax(1))


def test_rescore_skips_rows_below_the_bound_and_flags_overflow(head_and_inputs):
    head, x = head_and_inputs
    m, cap = 8, 64
    x = x[:m].contiguous()
    full = exact_head_logits_cuda(x, head.weight)
    cand_idx = torch.stack([torch.randperm(head.vocab, device="cuda")[:cap] for _ in range(m)]).to(torch.int32)
    listed = full.gather(1, cand_idx.long())
    # the upper bound of every other listed row falls below the best lower bound: those are not rescored
    reach = torch.arange(cap, device="cuda")[None, :] % 2 == 0
    cand_upper = torch.where(reach, 1.0, -1.0).expand(m, cap).contiguous()
    count = torch.tensor([cap, cap - 7, 0, 1, cap + 1, cap, 3, cap], dtype=torch.int32, device="cuda")
    tokens = rescore_cuda(x, head.weight, torch.zeros(m, device="cuda"), count, cand_idx, cand_upper.float())
    for row in range(m):
        n = int(count[row])
        if n > cap or n == 0:  # overflow: the full head; nothing listed: no token
            assert tokens[row] == (-1 if n else 2**31 - 1)
            continue
        keep = reach[0, :n]
        vals, rows = listed[row, :n][keep], cand_idx[row, :n][keep].long()
        best = vals.max()
        assert tokens[row] == rows[vals == best].min()


@pytest.mark.parametrize("rows", [1, 13, 32])
@pytest.mark.parametrize("incumbent_min_pairs", [-1, 0])
def test_rescore_that_compacts_gives_the_compaction_launchs_lists_and_tokens(
    head_and_inputs, rows, incumbent_min_pairs
):
    """The pass without its compaction launch, then the rescore that compacts the stage lists itself, without and
    with incumbents (each row's listed row of largest upper bound settled exactly first, then only the candidates
    reaching its logit rescored): the same count and candidate set per row as the pass's compaction launch and the
    same tokens as rescoring those lists (the adversarial inputs aim at exact and one-ulp ties), with a row the
    prologue flags (count above the capacity, token -1), call after call (keys, incumbents, barrier count and ticket
    go back to zero)."""
    head, x = head_and_inputs
    x = x[:rows].clone()
    x[0, 1] = 2.0**-40 * float(x[0].float().abs().max())  # not exact in fp16: the full head
    best_lower, count, cand_idx, cand_upper = int8_pass_cuda(x, head, max_survivors=3000)
    want = rescore_cuda(x, head.weight, best_lower, count, cand_idx, cand_upper)
    assert count[0] == 3001 and want[0] == -1
    for _ in range(3):
        lists = run_cuda_pass(x, head, max_survivors=3000, config=None, compact=False)
        assert not lists.count.any()  # left to the rescore
        tokens = compact_and_rescore_cuda(x, head.weight, lists, incumbent_min_pairs=incumbent_min_pairs)
        assert torch.equal(tokens, want) and torch.equal(lists.count, count)
        assert not _rescore_state(x).any()
        for m in range(1, rows):
            n = int(count[m])
            assert sorted(lists.cand_idx[m, :n].tolist()) == sorted(cand_idx[m, :n].tolist())
        got = certified_tokens_cuda(x, head, max_survivors=3000, incumbent_min_pairs=incumbent_min_pairs)[0]
        assert torch.equal(got, want)


@pytest.mark.parametrize("rows", [1, 32])
def test_incumbents_give_the_full_heads_argmax_on_adversarial_rows(head_and_inputs, rows):
    """Incumbents on, adversarial input rows (near-ties, duplicates, extreme norms): every certified token is the
    full exact head's argmax (lowest index on ties) or the row is sent to the full head (-1)."""
    head, x = head_and_inputs
    x = x[-rows:].contiguous()
    full = exact_head_logits_cuda(x, head.weight).argmax(1)
    for _ in range(2):
        tokens, _ = certified_tokens_cuda(x, head, max_survivors=3000, incumbent_min_pairs=0)
        sent = tokens == -1
        assert torch.equal(tokens[~sent], full[~sent]) and int(sent.sum()) <= x.shape[0] // 4


@pytest.mark.parametrize("rows", [1, 13, 32])
def test_overlapped_rescore_in_a_graph_gives_the_eager_tokens(head_and_inputs, rows):
    """The rescore launched to overlap the pass before it (sm_90+; it compacts the pass's lists first), two calls
    captured in one graph (the second call's prologue follows the first call's rescore): the tokens of eager calls,
    replay after replay."""
    head, x = head_and_inputs
    x = x[:rows].contiguous()
    want, _ = certified_argmax_graphable(x, head, max_survivors=3000, backend="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        certified_argmax_graphable(x, head, max_survivors=3000, backend="cuda")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        first, _ = certified_argmax_graphable(x, head, max_survivors=3000, backend="cuda")
        second, _ = certified_argmax_graphable(x, head, max_survivors=3000, backend="cuda")
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(first, want) and torch.equal(second, want)
