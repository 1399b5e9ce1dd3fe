"""The draft_tree kernels against their references and the replay package's builder.

CPU: the Triton build kernel under the interpreter (its exp/log are numpy's, as the replay builder's), so the
trees must equal the replay's best-first builder node for node, float32 path scores included; the torch heap
reference computes its log-softmax with torch's exp/log, so against it the structure is exact and the scores
agree to float32 rounding. Layout vs brute force and acceptance vs the walking reference are exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specpilot_kernels.draft_tree import (
    best_first_tree,
    best_first_tree_layout,
    best_first_tree_reference,
    child_lists,
    greedy_accept,
    greedy_accept_reference,
    lattice_edge_logp,
    tree_tokens,
    verify_layout,
    verify_layout_reference,
)
from specpilot_mem.replay.trees import get_builder
from specpilot_mem.replay.trees.base import StepBatch


def lattice(b: int, m: int, k: int, seed: int, ties: bool = False):
    g = torch.Generator().manual_seed(seed)
    pair = torch.randn(b, m, k, k, generator=g) * 2
    if ties:  # scores on a coarse grid: many equal path scores
        pair = torch.round(pair)
    pair[:, 0] = pair[:, 0, :1]  # one parent (the committed token) at position 0
    unary = torch.randn(b, m, k, generator=g)
    cand = torch.stack([torch.randperm(4096, generator=g)[: m * k].view(m, k) for _ in range(b)])
    return pair, unary, cand


def replay_tree(pair, unary, cand, kind, nodes, depth):
    sb = StepBatch.from_scores(cand, unary.numpy(), pair.numpy(), kind=kind)
    return get_builder("best-first")(sb, nodes, depth)


@pytest.mark.parametrize("kind", ["selector", "markov"])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("nodes,depth", [(32, 15), (5, 2)])
def test_build_equals_the_replay_builder_node_for_node(kind, ties, nodes, depth):
    pair, unary, cand = lattice(2, 16, 16, seed=nodes + depth, ties=ties)
    tree, tokens, _, _ = best_first_tree(pair, cand, nodes, depth, unary=unary, kind=kind)
    want = replay_tree(pair, unary, cand, kind, nodes, depth)
    assert np.array_equal(tree.num_nodes.numpy(), want.num_nodes)
    assert np.array_equal(tree.parents.numpy(), want.parents)
    assert np.array_equal(tree.depths.numpy(), want.depths)
    assert np.array_equal(tree.ranks.numpy(), want.ranks)
    assert np.array_equal(tokens.numpy(), want.tokens)
    assert np.array_equal(tree.scores.numpy(), want.scores)  # same float32 additions, same numpy exp/log


@pytest.mark.parametrize("kind", ["selector", "markov"])
@pytest.mark.parametrize("warps", [4, 8])
def test_rows_normalised_in_the_step_equal_the_scratch_and_the_replay_builder(kind, warps):
    pair, unary, cand = lattice(2, 16, 16, seed=29, ties=True)
    base, base_tokens, base_layout = best_first_tree_layout(pair, cand, 32, 15, unary=unary, kind=kind)
    tree, tokens, layout = best_first_tree_layout(
        pair, cand, 32, 15, unary=unary, kind=kind, scratch=False, num_warps=warps
    )
    want = replay_tree(pair, unary, cand, kind, 32, 15)
    assert np.array_equal(tree.parents.numpy(), want.parents) and np.array_equal(tree.ranks.numpy(), want.ranks)
    assert np.array_equal(tree.scores.numpy(), want.scores) and np.array_equal(tokens.numpy(), want.tokens)
    for a, b in zip(layout, base_layout):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["selector", "markov"])
def test_build_equals_the_heap_reference(kind):
    pair, unary, cand = lattice(2, 16, 16, seed=7)
    tree, tokens, _, _ = best_first_tree(pair, cand, 32, 15, unary=unary, kind=kind)
    ref = best_first_tree_reference(lattice_edge_logp(pair, unary, kind), 32, 15)
    for field in ("parents", "depths", "ranks", "num_nodes"):
        assert torch.equal(getattr(tree, field), getattr(ref, field)), field
    assert torch.allclose(tree.scores, ref.scores, rtol=0, atol=1e-5)
    assert torch.equal(tokens, tree_tokens(cand, ref))


def test_best_first_tree_is_prefix_closed_and_best_first_ordered():
    pair, _, cand = lattice(2, 16, 16, seed=3)
    tree, _, _, _ = best_first_tree(pair, cand, 32, 15)
    for b in range(2):
        for i in range(32):
            p = int(tree.parents[b, i])
            assert p < i
            assert int(tree.depths[b, i]) == (1 if p < 0 else int(tree.depths[b, p]) + 1)
        assert torch.all(tree.scores[b, 1:] <= tree.scores[b, :-1])
        assert int(tree.depths[b].max()) <= 15


def test_candidates_without_tokens_are_never_taken():
    pair, _, cand = lattice(1, 4, 16, seed=5)
    pair[:, :, :, 2:] = float("-inf")  # two usable candidates per position: 2 + 4 + 8 + 16 = 30 nodes
    tree, tokens, _, _ = best_first_tree(pair, cand, 32, 4)
    want = replay_tree(pair, torch.zeros(1, 4, 16), cand, "selector", 32, 4)
    assert int(tree.num_nodes[0]) == 30 == int(want.num_nodes[0])
    assert (
        torch.all(tree.ranks[0, :30] < 2) and torch.all(tree.parents[0, 30:] == -1) and torch.all(tokens[0, 30:] == -1)
    )


def test_layout_equals_brute_force():
    pair, _, cand = lattice(3, 16, 16, seed=11)
    pair[1, :, :, 2:] = float("-inf")  # request 1: two candidates a position, depth 3 -> 14 nodes and padding
    pair[2, :, :, 1:] = float("-inf")  # request 2: a chain of 3
    roots = torch.tensor([0, 17, 300])
    tree, _, got = best_first_tree_layout(pair, cand, 32, 3, root_positions=roots)
    assert tree.num_nodes.tolist() == [32, 14, 3]
    want = verify_layout_reference(tree.parents, tree.num_nodes, roots)
    for field in want._fields:
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    again = verify_layout(tree, *child_lists(tree.parents, tree.num_nodes), roots)  # torch: trees from elsewhere
    for field in want._fields:
        assert torch.equal(getattr(again, field), getattr(want, field)), field


def test_full_trees_lay_out_as_brute_force():
    pair, _, cand = lattice(3, 16, 16, seed=13)
    tree, _, got = best_first_tree_layout(pair, cand, 32, 15)
    want = verify_layout_reference(tree.parents, tree.num_nodes, torch.zeros(3, dtype=torch.int64))
    for field in want._fields:
        assert torch.equal(getattr(got, field), getattr(want, field)), field


def test_child_lists_of_any_tree_equal_brute_force():
    g = torch.Generator().manual_seed(23)
    b, n = 4, 12
    parents = torch.stack(
        [torch.tensor([int(torch.randint(-1, i, (), generator=g)) for i in range(n)]) for _ in range(b)]
    )
    num_nodes = torch.tensor([12, 7, 0, 1])
    parents = torch.where(torch.arange(n)[None, :] < num_nodes[:, None], parents, -1)
    nxt, sib = child_lists(parents, num_nodes)
    want = verify_layout_reference(parents, num_nodes, torch.zeros(b, dtype=torch.int64))
    assert torch.equal(nxt, want.retrieve_next_token) and torch.equal(sib, want.retrieve_next_sibling)


def _predict_following(tokens, parents, num_nodes, hit, vocab, seed):
    """Target argmax per column that follows the tree along a random path with probability ``hit`` per level."""
    g = torch.Generator().manual_seed(seed)
    b, n = parents.shape
    pred = torch.randint(0, vocab, (b, n + 1), generator=g)
    for r in range(b):
        col = 0
        while True:
            kids = [i for i in range(int(num_nodes[r])) if int(parents[r, i]) + 1 == col]
            if not kids or torch.rand((), generator=g) >= hit:
                break
            pick = kids[int(torch.randint(0, len(kids), (), generator=g))]
            pred[r, col] = tokens[r, pick]
            col = pick + 1
    return pred


@pytest.fixture(scope="module")
def built():
    pair, _, cand = lattice(6, 16, 16, seed=17)
    return best_first_tree(pair, cand, 32, 15)


@pytest.mark.parametrize("hit", [0.0, 0.6, 1.0])
def test_acceptance_equals_the_walking_reference(built, hit):
    tree, tokens, _, _ = built
    pred = _predict_following(tokens, tree.parents, tree.num_nodes, hit, 4096, seed=int(hit * 10))
    got = greedy_accept(tokens, tree.parents, tree.num_nodes, pred)
    want = greedy_accept_reference(tokens, tree.parents, tree.num_nodes, pred)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    if hit == 0.0:  # all miss: only the root, the bonus is the target's token after it
        assert torch.all(got.accept_length == 0) and torch.equal(got.bonus, pred[:, 0])
    if hit == 1.0:  # every level followed to a leaf
        assert torch.all(got.accept_length >= 1)


def test_acceptance_full_depth_chain_hit():
    b, n = 2, 15
    parents = torch.arange(-1, n - 1).expand(b, n).clone()
    tokens = torch.randint(0, 100, (b, n))
    pred = torch.cat([tokens, torch.full((b, 1), 7)], dim=1)  # column i predicts node i's token, the last the bonus
    got = greedy_accept(tokens, parents, torch.full((b,), n), pred)
    assert torch.all(got.accept_length == n) and torch.all(got.bonus == 7)
    assert torch.equal(got.accept_columns, torch.arange(n + 1).expand(b, n + 1))


def test_acceptance_sibling_ties_take_the_first_matching_child():
    # root -> nodes 0 and 1 share token 5; node 2 (child of 1) matches deeper, but node 0 comes first
    parents = torch.tensor([[-1, -1, 1]])
    tokens = torch.tensor([[5, 5, 9]])
    pred = torch.tensor([[5, 3, 9, 4]])
    got = greedy_accept(tokens, parents, torch.tensor([3]), pred)
    want = greedy_accept_reference(tokens, parents, torch.tensor([3]), pred)
    assert int(got.accept_length[0]) == 1 and int(got.bonus[0]) == 3
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_bad_arguments_are_refused():
    pair, _, cand = lattice(1, 4, 16, seed=1)
    with pytest.raises(ValueError, match="depth"):
        best_first_tree(pair, cand, 8, 5)
    wide, _, wide_cand = lattice(1, 16, 16, seed=2)
    with pytest.raises(ValueError, match="depth"):  # 16 levels of 4-bit digits: beyond the key's 60 bits
        best_first_tree(wide, wide_cand, 8, 16)
    with pytest.raises(ValueError, match="nodes"):
        best_first_tree(pair, cand, 0, 2)
    with pytest.raises(ValueError, match="markov"):
        best_first_tree(pair, cand, 8, 2, kind="markov")


COMPILE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specpilot_kernels.draft_tree import accept, build

target = GPUTarget("cuda", int(sys.argv[1]), 32)
sig = {n: "*i64" for n in ["tokens_ptr", "parents_ptr", "num_nodes_ptr", "predict_ptr", "out_ptr"]} | {"B": "i32"}
consts = {"N": 32, "NODES": 32, "COLS": 64, "LEVELS": 15}
triton.compile(ASTSource(fn=accept._accept_kernel, signature=sig | dict.fromkeys(consts, "constexpr"),
                         constexprs=consts), target=target)
names = ["pair_ptr", "unary_ptr", "cand_ptr", "root_pos_ptr", "ints_ptr", "floats_ptr", "mask_ptr"]
types = ["*fp32", "*fp32", "*i64", "*i64", "*i64", "*fp32", "*i8"]
for scratch in (False, True):
    consts = {"N": 32, "K": 16, "ROWS": 32, "NODES": 32, "COLS": 64, "BITS": 4, "MARKOV": False,
              "LATTICE_ROWS": 256, "SCRATCH": scratch}
    sig = dict(zip(names, types)) | {"B": "i32", "M": "i32", "DEPTH": "i32"} | dict.fromkeys(consts, "constexpr")
    triton.compile(ASTSource(fn=build._best_first_kernel, signature=sig, constexprs=consts), target=target)
print("compiled")
"""


@pytest.mark.parametrize("arch", [90, 120])
def test_kernels_compile_for_sm90_and_sm120(arch):
    """Triton's code generation down to a cubin runs without a GPU, in a process without the interpreter (which
    skips its type checks: a loop-carried int32 that became int64 failed on the H200 and passes the interpreter):
    sm_90 for the H200, sm_120 for the entry's RTX PRO 6000 variant (compiled here, never run)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE, str(arch)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
