"""Batched best-first tree build on a lattice (one Triton program per request), with its verify layout.

Each program keeps a frontier of ``(N + 1) x K`` path scores in registers: row 0 holds the root's
children, row ``t + 1`` the children of node ``t``. Step ``t`` takes the frontier's best entry (ties:
shallower, then lexicographically smaller candidate path, coded as a base-2^BITS integer), appends it as
node ``t``, removes it, and fills row ``t + 1`` with the node's children: the log-softmax of the lattice
row its candidate selects (loaded, normalised and added to the node's score in the kernel, so the build
is one launch). Because edges are <= 0 a node never scores above its parent, so the ``N`` nodes taken are
the top ``N`` by path score, prefix-closed, in the reference's order (``reference.best_first_tree_reference``).
The same program also links each node into its parent's child list (``retrieve_next_token`` /
``retrieve_next_sibling`` of SGLang's tree verify) as it is created, so siblings are in index order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import KINDS, DraftTree, VerifyLayout

MAX_PATH_BITS = 63  # the tie-break code of a path lives in one int64


@triton.jit
def _best_first_kernel(pair_ptr, unary_ptr, cand_ptr,
                       parents_ptr, depths_ptr, ranks_ptr, scores_ptr, tokens_ptr, num_nodes_ptr,
                       next_token_ptr, next_sibling_ptr,
                       M, DEPTH,
                       N: tl.constexpr, K: tl.constexpr, ROWS: tl.constexpr, BITS: tl.constexpr,
                       MARKOV: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, K)
    flat = rows[:, None] * K + cols[None, :]
    neg_inf = float("-inf")
    pair_base = pair_ptr + b * M * K * K
    unary_base = unary_ptr + b * M * K

    # row 0: the root's children (position 0; every parent row of it is the same, take row 0)
    x = tl.load(pair_base + cols).to(tl.float32)
    if MARKOV:
        x = x + tl.load(unary_base + cols).to(tl.float32)
    top = tl.max(x, axis=0)
    top = tl.where(top == neg_inf, 0.0, top)
    total = tl.maximum(tl.sum(tl.exp(x - top), axis=0), 1.0)
    root_row = (x - top) - tl.log(total)
    live = DEPTH > 0
    front = tl.where((rows[:, None] == 0) & live, root_row[None, :], neg_inf)
    row_depth = tl.zeros([ROWS], dtype=tl.int64)  # depth of the node whose children the row holds
    row_code = tl.zeros([ROWS], dtype=tl.int64)  # that node's candidate path, one BITS-bit digit a level
    last_child = tl.full([ROWS], -1, dtype=tl.int64)  # per frontier row (parent column): last child taken
    first_child = tl.full([ROWS], -1, dtype=tl.int64)
    sibling = tl.full([ROWS], -1, dtype=tl.int64)  # per node column (node + 1)
    count = tl.zeros([], dtype=tl.int64)
    for t in range(N):
        best = tl.max(tl.max(front, axis=1), axis=0)
        alive = (best > neg_inf).to(tl.int32) != 0
        at_best = front == best
        depth_all = row_depth[:, None] + 1 + tl.zeros([ROWS, K], dtype=tl.int64)
        shallowest = tl.min(tl.min(tl.where(at_best, depth_all, 1 << 30), axis=1), axis=0)
        at_best = at_best & (depth_all == shallowest)
        code_all = (row_code[:, None] << BITS) + cols[None, :].to(tl.int64)
        smallest = tl.min(tl.min(tl.where(at_best, code_all, 0x7FFFFFFFFFFFFFFF), axis=1), axis=0)
        pick = tl.min(tl.min(tl.where(at_best & (code_all == smallest), flat, ROWS * K), axis=1), axis=0)
        row = pick // K
        rank = pick % K
        level = shallowest
        parent = row - 1
        if alive:
            tl.store(parents_ptr + b * N + t, parent.to(tl.int64))
            tl.store(depths_ptr + b * N + t, level.to(tl.int64))
            tl.store(ranks_ptr + b * N + t, rank.to(tl.int64))
            tl.store(scores_ptr + b * N + t, best)
            token = tl.load(cand_ptr + b * M * K + (level - 1) * K + rank)
            tl.store(tokens_ptr + b * N + t, token.to(tl.int64))
        # link node t (column t + 1) into its parent's child list
        prev = tl.max(tl.where(rows == row, last_child, -1), axis=0)
        here = (rows == row) & alive
        sibling = tl.where((rows == prev) & (prev >= 0) & alive, t + 1, sibling)
        first_child = tl.where(here & (prev < 0), t + 1, first_child)
        last_child = tl.where(here, t + 1, last_child)
        # take it off the frontier, put its children on
        front = tl.where(flat == pick, neg_inf, front)
        grow = alive & (level < DEPTH)
        safe_level = tl.where(grow, level, 0)
        x = tl.load(pair_base + (safe_level * K + rank) * K + cols).to(tl.float32)
        if MARKOV:
            x = x + tl.load(unary_base + safe_level * K + cols).to(tl.float32)
        top = tl.max(x, axis=0)
        top = tl.where(top == neg_inf, 0.0, top)
        total = tl.maximum(tl.sum(tl.exp(x - top), axis=0), 1.0)
        child = best + ((x - top) - tl.log(total))
        fill = (rows == t + 1) & grow
        front = tl.where(fill[:, None], child[None, :], front)
        code = tl.max(tl.where(rows == row, row_code, 0), axis=0) * (1 << BITS) + rank
        row_depth = tl.where(rows == t + 1, level, row_depth)
        row_code = tl.where(rows == t + 1, code, row_code)
        count += alive.to(tl.int64)
    tl.store(num_nodes_ptr + b, count)
    keep = rows < N + 1
    tl.store(next_token_ptr + b * (N + 1) + rows, first_child, mask=keep)
    tl.store(next_sibling_ptr + b * (N + 1) + rows, sibling, mask=keep)


def path_bits(candidates: int) -> int:
    return max(1, (candidates - 1).bit_length())


def best_first_tree(pair: torch.Tensor, cand: torch.Tensor, nodes: int, depth: int | None = None,
                    unary: torch.Tensor | None = None, kind: str = "selector",
                    num_warps: int = 4) -> tuple[DraftTree, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best-first trees of a batch of lattices in one launch.

    Args:
        pair: [B, m, K, K] float32/bf16/fp16 selector scores, pair[b, d, i, j] of candidate j at position d
            given candidate i at d - 1 (rows of d = 0 equal); contiguous.
        cand: [B, m, K] int candidate tokens.
        nodes: node budget N >= 1.
        depth: deepest level, 1 <= depth <= m (default m); depth * ceil(log2 K) <= 63.
        unary: [B, m, K] (``kind="markov"``: DSpark's Eq. 1 score = unary + pair).
        kind: "selector" (DFlash2) or "markov" (DSpark).
        num_warps: warps per request's program (the frontier of (N+1) x K scores is spread over them).

    Returns:
        (tree, tokens [B, N] int64 (-1 on padding), retrieve_next_token [B, N+1], retrieve_next_sibling
        [B, N+1]) — the last two as in SGLang's tree verify (columns: root 0, node i at i + 1).

    Example:
        >>> tree, tokens, nxt, sib = best_first_tree(pair, cand, nodes=32, depth=15)
    """
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    b, m, k, k2 = pair.shape
    if k2 != k or cand.shape != (b, m, k):
        raise ValueError(f"pair must be [B, m, K, K] and cand [B, m, K]; got {tuple(pair.shape)} and {tuple(cand.shape)}")
    depth = m if depth is None else depth
    if not 1 <= depth <= m or nodes < 1:
        raise ValueError(f"need 1 <= depth <= m ({m}) and nodes >= 1, got depth {depth}, nodes {nodes}")
    bits = path_bits(k)
    if depth * bits > MAX_PATH_BITS or k & (k - 1):
        raise ValueError(f"depth {depth} with K={k} needs a power-of-two K and depth * log2(K) <= {MAX_PATH_BITS}")
    if kind == "markov" and (unary is None or unary.shape != (b, m, k)):
        raise ValueError("kind='markov' needs unary [B, m, K]")
    dev = pair.device
    pair = pair.contiguous()
    unary_arg = unary.contiguous() if kind == "markov" else pair
    i64 = dict(dtype=torch.int64, device=dev)
    parents = torch.full((b, nodes), -1, **i64)
    depths = torch.zeros((b, nodes), **i64)
    ranks = torch.full((b, nodes), -1, **i64)
    scores = torch.full((b, nodes), float("-inf"), dtype=torch.float32, device=dev)
    tokens = torch.full((b, nodes), -1, **i64)
    num_nodes = torch.zeros(b, **i64)
    next_token = torch.empty((b, nodes + 1), **i64)
    next_sibling = torch.empty((b, nodes + 1), **i64)
    if b:
        _best_first_kernel[(b,)](pair, unary_arg, cand.contiguous(), parents, depths, ranks, scores, tokens, num_nodes,
                                 next_token, next_sibling, m, depth, N=nodes, K=k,
                                 ROWS=triton.next_power_of_2(nodes + 1), BITS=bits, MARKOV=kind == "markov",
                                 num_warps=num_warps)
    return DraftTree(parents, depths, ranks, scores, num_nodes), tokens, next_token, next_sibling


def child_lists(parents: torch.Tensor, num_nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's ``retrieve_next_token`` / ``retrieve_next_sibling`` [B, N+1] for any batch of trees (torch, any
    device): columns are the root (0) and node i (i + 1), children in index order; what ``best_first_tree``
    returns for its own trees, for trees built elsewhere (a combined tree, a chain).

    Args:
        parents: [B, N] int64 parent node (-1: the root), parent < node.
        num_nodes: [B] int64 valid nodes (the rest is padding, linked nowhere).
    """
    b, n = parents.shape
    cols = n + 1
    dev = parents.device
    index = torch.arange(1, cols, device=dev).expand(b, n)
    valid = index <= num_nodes[:, None]
    parent_col = torch.where(valid, parents + 1, cols)  # padding sorts last
    order = torch.argsort(parent_col * cols + index, dim=1)
    sorted_parent = torch.gather(parent_col, 1, order)
    sorted_col = torch.gather(index, 1, order)
    follows = torch.cat([sorted_parent[:, 1:] == sorted_parent[:, :-1],
                         torch.zeros((b, 1), dtype=torch.bool, device=dev)], dim=1)
    after = torch.cat([sorted_col[:, 1:], torch.full((b, 1), -1, dtype=torch.int64, device=dev)], dim=1)
    next_sibling = torch.full((b, cols + 1), -1, dtype=torch.int64, device=dev)  # last column: padding's sink
    next_sibling.scatter_(1, torch.where(torch.gather(valid, 1, order), sorted_col, cols),
                          torch.where(follows, after, -1))
    first = torch.full((b, cols + 1), cols, dtype=torch.int64, device=dev)
    first.scatter_reduce_(1, parent_col, torch.where(valid, index, cols), reduce="amin")
    next_token = torch.where(first < cols, first, -1)
    return next_token[:, :cols], next_sibling[:, :cols]


def verify_layout(tree: DraftTree, next_token: torch.Tensor, next_sibling: torch.Tensor,
                  root_positions: torch.Tensor) -> VerifyLayout:
    """The verify pass's mask, positions and retrieve indices from a built tree (torch, any device).

    Args:
        tree: ``best_first_tree``'s tree ([B, N] fields).
        next_token, next_sibling: [B, N+1] from ``best_first_tree``.
        root_positions: [B] int64 position of the root (the last committed token).

    The ancestor mask is closed by pointer doubling (log2 of the depth gathers); padding columns hang off
    the root and see only themselves and it.
    """
    b, n = tree.parents.shape
    cols = n + 1
    dev = tree.parents.device
    valid = torch.arange(n, device=dev)[None, :] < tree.num_nodes[:, None]
    parent_col = torch.cat([torch.full((b, 1), -1, dtype=torch.int64, device=dev),
                            torch.where(valid, tree.parents + 1, torch.zeros_like(tree.parents))], dim=1)
    eye = torch.eye(cols, dtype=torch.bool, device=dev).expand(b, cols, cols)
    mask = eye.clone()
    mask[:, :, 0] = True
    jump = parent_col.clamp(min=0)
    steps = max(1, int(n).bit_length())
    for _ in range(steps):  # after s rounds each row holds its 2^s nearest ancestors
        mask = mask | torch.gather(mask, 1, jump[:, :, None].expand(b, cols, cols))
        jump = torch.gather(jump, 1, jump)
    depth_col = torch.cat([torch.zeros((b, 1), dtype=torch.int64, device=dev), torch.where(valid, tree.depths, 1)], dim=1)
    positions = root_positions.to(torch.int64)[:, None] + depth_col
    index = torch.arange(b * cols, dtype=torch.int64, device=dev).view(b, cols)
    return VerifyLayout(mask, positions, index, next_token, next_sibling, parent_col)
