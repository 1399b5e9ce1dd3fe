"""Property tests of the tree builders, shared budgets and greedy verification (hypothesis)."""

import heapq
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot_mem.replay.trees import (
    BUILDERS,
    ancestor_mask,
    best_first,
    chain,
    ddtree,
    oracle,
    sequoia,
    shared,
    verify_mask,
)
from specpilot_mem.replay.trees.base import StepBatch
from specpilot_mem.replay.verify import verify_against_argmax, verify_against_greedy

VOCAB = 12


@st.composite
def batches(draw, max_positions=4, max_candidates=4, max_steps=3, tied=True):
    """Small lattices; integer-valued scores make exact ties common (the tie-break is exercised)."""
    b = draw(st.integers(1, max_steps))
    m = draw(st.integers(1, max_positions))
    k = draw(st.integers(1, max_candidates))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    if tied:
        pair = rng.integers(-2, 3, size=(b, m, k, k)).astype(np.float32)
        unary = rng.integers(-2, 3, size=(b, m, k)).astype(np.float32)
    else:
        pair = rng.standard_normal((b, m, k, k)).astype(np.float32)
        unary = rng.standard_normal((b, m, k)).astype(np.float32)
    pair[:, 0] = pair[:, 0, :1]
    cand = np.stack([np.stack([rng.permutation(VOCAB)[:k] for _ in range(m)]) for _ in range(b)])
    greedy = rng.integers(0, VOCAB, size=(b, m))
    return StepBatch.from_scores(cand, unary, pair, kind=draw(st.sampled_from(["selector", "markov"])), greedy=greedy)


def all_paths(batch: StepBatch, b: int, logp: np.ndarray, depth: int):
    """Every node (candidate-index path) with its float32 path score, summed root to node."""
    out = []
    for d in range(1, depth + 1):
        for path in itertools.product(range(batch.candidates), repeat=d):
            score = np.float32(0.0)
            parent = 0
            for level, c in enumerate(path):
                score = np.float32(score + logp[b, level, min(parent, logp.shape[2] - 1), c])
                parent = c
            out.append((path, score))
    return out


def paths_of(trees, b):
    t = trees.tree(b)
    paths = []
    for i in range(len(t["parents"])):
        p = [int(t["ranks"][i])]
        j = int(t["parents"][i])
        while j >= 0:
            p.append(int(t["ranks"][j]))
            j = int(t["parents"][j])
        paths.append(tuple(reversed(p)))
    return paths


def assert_prefix_closed(trees):
    for b in range(trees.parents.shape[0]):
        t = trees.tree(b)
        for i, parent in enumerate(t["parents"]):
            assert parent < i
            if parent >= 0:
                assert t["depths"][i] == t["depths"][parent] + 1
            else:
                assert t["depths"][i] == 1
        assert (trees.depths[b, len(t["parents"]) :] == 0).all()


def expected_top(batch, logp, nodes, depth):
    result = []
    for b in range(batch.size):
        ranked = [(p, s) for p, s in all_paths(batch, b, logp, depth) if s > -np.inf]
        ranked.sort(key=lambda ps: (-float(ps[1]), len(ps[0]), ps[0]))
        result.append([p for p, _ in ranked[:nodes]])
    return result


@settings(max_examples=60, deadline=None)
@given(batch=batches(), nodes=st.integers(0, 12), cap=st.one_of(st.none(), st.integers(0, 4)))
def test_best_first_is_exactly_the_top_n_in_documented_order(batch, nodes, cap):
    trees = best_first.build(batch, nodes, cap)
    assert trees.parents.shape == (batch.size, nodes)
    assert_prefix_closed(trees)
    depth = batch.positions if cap is None else min(cap, batch.positions)
    want = expected_top(batch, batch.conditional_logp, nodes, depth)
    for b in range(batch.size):
        assert paths_of(trees, b) == want[b]
        t = trees.tree(b)
        assert (np.diff(t["scores"]) <= 0).all()  # best-first order: every prefix is the best smaller tree


@settings(max_examples=40, deadline=None)
@given(batch=batches(), nodes=st.integers(0, 12))
def test_ddtree_is_the_top_n_of_marginal_path_scores(batch, nodes):
    trees = ddtree.build(batch, nodes)
    assert_prefix_closed(trees)
    want = expected_top(batch, batch.marginal_logp, nodes, batch.positions)
    for b in range(batch.size):
        assert paths_of(trees, b) == want[b]


def ddtree_heap(marginal: np.ndarray, nodes: int):
    """DDTree's own enumeration: pop the best node, push its next sibling and its first child."""
    m, k = marginal.shape
    order = [np.argsort(-marginal[d], kind="stable") for d in range(m)]
    heap = [(-float(marginal[0, order[0][0]]), (0,))]  # path of positions in each depth's sorted order
    out = []
    while heap and len(out) < nodes:
        neg, path = heapq.heappop(heap)
        out.append(tuple(int(order[d][i]) for d, i in enumerate(path)))
        base = -neg - float(marginal[len(path) - 1, order[len(path) - 1][path[-1]]])
        if path[-1] + 1 < k:
            sib = path[:-1] + (path[-1] + 1,)
            heapq.heappush(heap, (-(base + float(marginal[len(path) - 1, order[len(path) - 1][sib[-1]]])), sib))
        if len(path) < m:
            heapq.heappush(heap, (neg - float(marginal[len(path), order[len(path)][0]]), path + (0,)))
    return out


@settings(max_examples=30, deadline=None)
@given(batch=batches(max_positions=5, max_candidates=5, tied=False), nodes=st.integers(1, 20))
def test_ddtree_matches_the_heap_enumeration(batch, nodes):
    trees = ddtree.build(batch, nodes)
    for b in range(batch.size):
        assert set(paths_of(trees, b)) == set(ddtree_heap(batch.marginal_logp[b, :, 0].astype(np.float64), nodes))


@settings(max_examples=60, deadline=None)
@given(batch=batches(), nodes=st.integers(1, 10), cap=st.one_of(st.none(), st.integers(1, 4)))
def test_every_builder_is_prefix_closed_and_bounded_by_the_oracle(batch, nodes, cap):
    bound = verify_against_greedy(oracle.build(batch, nodes, cap), batch.greedy).accepted
    options = {"sequoia": {"acceptance": np.linspace(0.6, 0.01, batch.candidates)}}
    for name, build in BUILDERS.items():
        trees = build(batch, nodes, cap, **options.get(name, {}))
        assert trees.parents.shape == (batch.size, nodes)
        assert (trees.num_nodes <= nodes).all()
        assert_prefix_closed(trees)
        assert (trees.depths.max(axis=1) <= (batch.positions if cap is None else min(cap, batch.positions))).all()
        accepted = verify_against_greedy(trees, batch.greedy).accepted
        assert (accepted <= bound).all(), name


@settings(max_examples=60, deadline=None)
@given(batch=batches())
def test_chain_accepts_what_stock_greedy_verification_accepts(batch):
    trees = chain.build(batch, batch.positions)
    accepted = verify_against_greedy(trees, batch.greedy).accepted
    for b in range(batch.size):
        drafted = trees.tree(b)["tokens"]
        stock = 0  # stock: compare the chain token by token with the greedy output, stop at the first miss
        while stock < len(drafted) and drafted[stock] == batch.greedy[b, stock]:
            stock += 1
        assert accepted[b] == stock


@settings(max_examples=50, deadline=None)
@given(batch=batches(max_steps=5), nodes=st.integers(0, 14), groups=st.lists(st.integers(0, 2), min_size=5, max_size=5))
def test_shared_budget_shares_are_trees_whose_union_is_the_global_top_n(batch, nodes, groups):
    groups = np.array(groups[: batch.size])
    trees = shared.build(batch, groups, nodes)
    assert_prefix_closed(trees)
    everything = best_first.build(batch, 10_000)  # every node of every request, best first
    for g in np.unique(groups):
        members = np.flatnonzero(groups == g)
        assert trees.num_nodes[members].sum() <= nodes
        pool = [
            (-float(everything.scores[b, i]), place, i, b)
            for place, b in enumerate(members)
            for i in range(int(everything.num_nodes[b]))
        ]
        pool.sort()
        top = pool[:nodes]
        for b in members:
            mine = sorted(i for *_, i, owner in top if owner == b)
            assert mine == list(range(int(trees.num_nodes[b])))  # a prefix of its own best-first order
            assert paths_of(trees, b) == paths_of(everything, b)[: len(mine)]


@settings(max_examples=40, deadline=None)
@given(batch=batches(), nodes=st.integers(1, 10))
def test_masks_and_both_verification_forms_agree(batch, nodes):
    trees = best_first.build(batch, nodes)
    mask = ancestor_mask(trees)
    full = verify_mask(trees)
    for b in range(batch.size):
        t = trees.tree(b)
        for i in range(len(t["parents"])):
            ancestors = {i}
            j = int(t["parents"][i])
            while j >= 0:
                ancestors.add(j)
                j = int(t["parents"][j])
            assert set(np.flatnonzero(mask[b, i])) == ancestors
            assert full[b, i + 1, 0]
    # the target's argmax after a node of depth d on the greedy path is greedy[d]
    greedy_ext = np.concatenate([batch.greedy, np.full((batch.size, 1), -1)], axis=1)
    argmax = np.concatenate(
        [greedy_ext[:, :1], np.take_along_axis(greedy_ext, np.minimum(trees.depths, batch.positions), axis=1)], axis=1
    )
    on_path = verify_against_greedy(trees, batch.greedy)
    engine, bonus = verify_against_argmax(trees, argmax)
    assert (engine.accepted == on_path.accepted).all()
    for b in range(batch.size):
        path = engine.path(trees, b)
        assert len(path) == engine.accepted[b]
        assert [int(trees.tokens[b, i]) for i in path] == list(batch.greedy[b, : len(path)])
    assert (bonus == greedy_ext[np.arange(batch.size), on_path.accepted]).all()


def test_sequoia_shape_spends_the_budget_on_likely_ranks():
    parents, ranks, depths = sequoia.tree_shape((0.8, 0.1, 0.05, 0.0), 6, 4)
    assert len(parents) == 6
    assert ranks[0] == 0 and depths[0] == 1
    assert all(p < i for i, p in enumerate(parents))
    assert max(depths) >= 3  # a confident rank 0 makes a deep spine
    chain_only = sequoia.tree_shape((1.0, 0.0), 3, 3)
    assert chain_only == ((-1, 0, 1), (0, 0, 0), (1, 2, 3))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_wide_tree_has_more_nodes_than_positions(name):
    rng = np.random.default_rng(1)
    b, m, k = 4, 16, 16
    pair = rng.standard_normal((b, m, k, k)).astype(np.float32)
    pair[:, 0] = pair[:, 0, :1]
    cand = rng.integers(0, 1000, size=(b, m, k))
    batch = StepBatch.from_scores(cand, rng.standard_normal((b, m, k)), pair, greedy=cand[:, :, 0])
    opts = {"acceptance": np.full(k, 0.05)} if name == "sequoia" else {}
    trees = BUILDERS[name](batch, 32, 15, **opts)
    assert trees.depths.max() <= 15
    if name not in ("chain", "oracle"):
        assert (trees.num_nodes == 32).all()


@settings(max_examples=40, deadline=None)
@given(batch=batches(), nodes=st.integers(0, 4))
def test_eagle2_with_full_width_equals_best_first_when_the_budget_fits_one_expansion(batch, nodes):
    nodes = min(nodes, batch.candidates)  # expanding the top K of each depth covers the top N <= K
    wide = BUILDERS["eagle2"](batch, nodes, None, top_k=batch.candidates)
    best = best_first.build(batch, nodes)
    for b in range(batch.size):
        assert paths_of(wide, b) == paths_of(best, b)


def brute_best_value(p, nodes, depth):
    """Max over rank-prefix trees of Σ_nodes Π p[rank] along the path (exhaustive)."""
    from functools import lru_cache

    @lru_cache(maxsize=None)
    def best(n, d, r):  # children of rank >= r, n nodes at most, depth budget d
        if n == 0 or d == 0 or r >= len(p):
            return 0.0
        out = 0.0
        for size in range(1, n + 1):
            out = max(out, p[r] * (1 + best(size - 1, d - 1, 0)) + best(n - size, d, r + 1))
        return out

    return best(nodes, depth, 0)


@settings(max_examples=40, deadline=None)
@given(p=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4), nodes=st.integers(0, 7), depth=st.integers(1, 4))
def test_sequoia_shape_is_optimal(p, nodes, depth):
    parents, ranks, depths = sequoia.tree_shape(tuple(p), nodes, depth)
    assert len(parents) <= nodes and all(d <= depth for d in depths)
    value, acc = 0.0, []
    for i, parent in enumerate(parents):
        acc.append((acc[parent] if parent >= 0 else 1.0) * p[ranks[i]])
        value += acc[-1]
    assert value == pytest.approx(brute_best_value(tuple(p), nodes, depth), rel=1e-9, abs=1e-12)
