"""Pure-torch definition of best-first draft trees on a lattice, their verify layout and greedy acceptance.

A lattice holds, per request and drafted position ``d`` (``m`` positions), ``K`` candidate tokens and the
``K x K`` scores ``score[d, i, j]`` of candidate ``j`` at ``d`` given candidate ``i`` at ``d - 1`` (at
``d = 0`` the parent is the committed token and every row is the same). The edge score of a child given
its parent is the float32 log-softmax of that row over the ``K`` candidates; ``kind="markov"`` (DSpark's
Eq. 1) adds the child's unary score first. A node's path score is the float32 sum of its edges, root first.

The best-first tree of budget ``N`` is the ``N`` nodes with the highest path scores, depth at most
``depth``; edges are <= 0, so every prefix of it is prefix-closed. Order and ties: higher score first,
then shallower, then the candidate-index path in lexicographic order (the replay builders' rule,
``specpilot_mem/replay/trees/base.py``). Nodes with a score of -inf (a candidate slot without a token) are
never taken.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import torch

KINDS = ("selector", "markov")


class DraftTree(NamedTuple):
    """A batch of B trees padded to N nodes, node i valid when i < num_nodes[b], in best-first order.

    parents [B, N] int64 (-1: child of the root; parent < node; -1 on padding); depths [B, N] int64
    (>= 1, 0 on padding); ranks [B, N] int64 (candidate index at position depth - 1, -1 on padding);
    scores [B, N] float32 (path scores, -inf on padding); num_nodes [B] int64.
    """

    parents: torch.Tensor
    depths: torch.Tensor
    ranks: torch.Tensor
    scores: torch.Tensor
    num_nodes: torch.Tensor


class VerifyLayout(NamedTuple):
    """The verify pass of B trees of N nodes with the root (the last committed token) as column 0.

    mask [B, N+1, N+1] bool (row i sees column j: j is i, its ancestor, or the root); positions [B, N+1]
    int64 (root position + depth); retrieve_index [B, N+1] int64 (flat index b * (N+1) + i of each
    column); retrieve_next_token [B, N+1] int64 (first child, -1: none); retrieve_next_sibling [B, N+1]
    int64 (next child of the same parent, -1: none); retrieve_parent [B, N+1] int64 (parent column, -1 for
    the root; padding columns hang off the root and are never linked into next_token/next_sibling).
    """

    mask: torch.Tensor
    positions: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    retrieve_parent: torch.Tensor


class Acceptance(NamedTuple):
    """accept_length [B] int64: accepted draft nodes (the bonus not counted); accept_columns [B, N+1] int64:
    columns of the root and the accepted nodes, root first, -1 after; bonus [B] int64: the target's token after
    the deepest accepted column; commit_tokens [B, N+1] int64: the accepted nodes' tokens then the bonus, 0 after;
    commit_order [B, N+1] int64: the verify columns with the accepted path first (root first), then the others in
    index order (gather a request's window slots or hidden rows with it to commit)."""

    accept_length: torch.Tensor
    accept_columns: torch.Tensor
    bonus: torch.Tensor
    commit_tokens: torch.Tensor
    commit_order: torch.Tensor


def edge_logp_reference(
    scores: torch.Tensor, unary: torch.Tensor | None = None, kind: str = "selector"
) -> torch.Tensor:
    """[..., K] float32 log-softmax over the last axis of the (Markov: unary + pair) scores.

    Same steps as the replay's numpy ``log_softmax``: shift by the row max (0 for a row without a
    finite score), log of the exp-sum clamped at 1, so every result is <= 0 and an all -inf row stays -inf.
    """
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    x = scores.float()
    if kind == "markov":
        if unary is None:
            raise ValueError("kind='markov' needs the unary scores")
        x = x + unary.float()
    top = x.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    shifted = x - top
    total = torch.exp(shifted).sum(dim=-1, keepdim=True).clamp(min=1.0)
    return shifted - torch.log(total)


def lattice_edge_logp(pair: torch.Tensor, unary: torch.Tensor | None = None, kind: str = "selector") -> torch.Tensor:
    """[B, m, K, K] edge log-probabilities of a lattice: pair [B, m, K, K], unary [B, m, K] (Markov only)."""
    return edge_logp_reference(pair, None if unary is None else unary[:, :, None, :], kind)


def best_first_tree_reference(edge_logp: torch.Tensor, nodes: int, depth: int | None = None) -> DraftTree:
    """The best-first tree of each request by a heap (pop the best node, push its children).

    Args:
        edge_logp: [B, m, K, K] float32 edge log-probabilities (``lattice_edge_logp``).
        nodes: node budget N >= 0.
        depth: deepest level (default m), clipped to m.
    """
    b, m, k, _ = edge_logp.shape
    depth = m if depth is None else max(0, min(depth, m))
    logp = edge_logp.detach().float().cpu()
    parents = torch.full((b, nodes), -1, dtype=torch.int64)
    depths = torch.zeros((b, nodes), dtype=torch.int64)
    ranks = torch.full((b, nodes), -1, dtype=torch.int64)
    scores = torch.full((b, nodes), float("-inf"), dtype=torch.float32)
    counts = torch.zeros(b, dtype=torch.int64)
    for r in range(b):
        heap: list[tuple[float, int, tuple[int, ...], int, torch.Tensor]] = []

        def push(
            heap: list, parent: int, level: int, path: tuple[int, ...], base: torch.Tensor, row: torch.Tensor
        ) -> None:
            for j in range(k):
                total = base + row[j]  # float32 scalar add, root to node
                if total.item() > float("-inf"):
                    heapq.heappush(heap, (-total.item(), level, path + (j,), parent, total))

        if depth:
            push(heap, -1, 1, (), torch.zeros((), dtype=torch.float32), logp[r, 0, 0])
        taken = 0
        while heap and taken < nodes:
            _, level, path, parent, total = heapq.heappop(heap)
            parents[r, taken], depths[r, taken], ranks[r, taken], scores[r, taken] = parent, level, path[-1], total
            if level < depth:
                push(heap, taken, level + 1, path, total, logp[r, level, path[-1]])
            taken += 1
        counts[r] = taken
    return DraftTree(parents, depths, ranks, scores, counts)


def tree_tokens(cand: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """[B, N] int64 node tokens (-1 on padding) from cand [B, m, K]."""
    b, m, _ = cand.shape
    pos = (tree.depths - 1).clamp(0, m - 1)
    tok = (
        cand.long()
        .gather(1, pos[:, :, None].expand(-1, -1, cand.shape[2]))
        .gather(2, tree.ranks.clamp(min=0)[:, :, None])
    )
    return torch.where(tree.ranks >= 0, tok[:, :, 0], torch.full_like(tok[:, :, 0], -1))


def verify_layout_reference(
    parents: torch.Tensor, num_nodes: torch.Tensor, root_positions: torch.Tensor
) -> VerifyLayout:
    """The layout by brute force: walk each node's parent chain and scan for children and siblings.

    Args:
        parents: [B, N] int64, parent node index (-1: the root), parent < node.
        num_nodes: [B] int64 valid nodes per tree (the rest is padding).
        root_positions: [B] int64 position of the root token in its sequence.
    """
    b, n = parents.shape
    cols = n + 1
    mask = torch.zeros((b, cols, cols), dtype=torch.bool)
    positions = torch.zeros((b, cols), dtype=torch.int64)
    next_token = torch.full((b, cols), -1, dtype=torch.int64)
    next_sibling = torch.full((b, cols), -1, dtype=torch.int64)
    parent_col = torch.full((b, cols), -1, dtype=torch.int64)
    for r in range(b):
        valid = int(num_nodes[r])
        positions[r, 0] = int(root_positions[r])
        mask[r, 0, 0] = True
        for i in range(1, cols):
            mask[r, i, i] = mask[r, i, 0] = True
            parent_col[r, i] = 0
            positions[r, i] = int(root_positions[r]) + 1
            if i - 1 >= valid:
                continue
            node, level = i - 1, 0
            while node >= 0:
                mask[r, i, node + 1] = True
                node, level = int(parents[r, node]), level + 1
            positions[r, i] = int(root_positions[r]) + level
            parent_col[r, i] = int(parents[r, i - 1]) + 1
        for c in range(cols):
            children = [i for i in range(1, valid + 1) if int(parent_col[r, i]) == c]
            if children:
                next_token[r, c] = children[0]
            for a, nxt in zip(children, children[1:]):
                next_sibling[r, a] = nxt
    index = torch.arange(b * cols, dtype=torch.int64).view(b, cols)
    return VerifyLayout(mask, positions, index, next_token, next_sibling, parent_col)


def greedy_accept_reference(
    tree_tokens_: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor, target_predict: torch.Tensor
) -> Acceptance:
    """Greedy acceptance by walking the tree from the root: take the first child (lowest index) whose
    token is the target's argmax after its parent, until none matches; the bonus is the argmax there.

    Args:
        tree_tokens_: [B, N] int64 node tokens.
        parents: [B, N] int64 parent node index (-1: the root).
        num_nodes: [B] int64.
        target_predict: [B, N+1] int64, the target's argmax at the root (column 0) and after node i (column i+1).
    """
    b, n = parents.shape
    length = torch.zeros(b, dtype=torch.int64)
    columns = torch.full((b, n + 1), -1, dtype=torch.int64)
    bonus = torch.zeros(b, dtype=torch.int64)
    commit_tokens = torch.zeros((b, n + 1), dtype=torch.int64)
    commit_order = torch.zeros((b, n + 1), dtype=torch.int64)
    for r in range(b):
        col, path = 0, [0]
        while True:
            want = int(target_predict[r, col])
            nxt = next(
                (
                    i
                    for i in range(int(num_nodes[r]))
                    if int(parents[r, i]) + 1 == col and int(tree_tokens_[r, i]) == want
                ),
                None,
            )
            if nxt is None:
                break
            col = nxt + 1
            path.append(col)
        length[r] = len(path) - 1
        columns[r, : len(path)] = torch.tensor(path)
        bonus[r] = int(target_predict[r, col])
        committed = [int(tree_tokens_[r, c - 1]) for c in path[1:]] + [int(bonus[r])]
        commit_tokens[r, : len(committed)] = torch.tensor(committed)
        commit_order[r] = torch.tensor(path + [c for c in range(n + 1) if c not in path])
    return Acceptance(length, columns, bonus, commit_tokens, commit_order)
