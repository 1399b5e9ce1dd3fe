"""Batched best-first tree build on a lattice (one Triton program per request), with its verify layout.

Each program keeps a frontier of ``N x K`` path scores in registers: row 0 holds the root's children,
row ``t + 1`` the children of node ``t`` (the last node's children are never taken). Every entry has a key,
one int64: its depth in the top four bits (sign bit flipped, so signed order is depth order) and its candidate path below them, ``BITS`` bits a level
(base ``2^BITS`` digits: numeric order is lexicographic order at equal depth). Step ``t`` takes the best
score and, among entries at it, the smallest key (ties: shallower, then the lexicographically smaller
path, the replay builders' rule), appends that node, removes it and fills row ``t + 1`` with its children:
the log-softmax of the lattice row its candidate selects, normalised in the kernel. One (score, key) reduction
a step; the key carries everything else (depth, candidate, parent's path). Edges are <= 0, so the ``N`` nodes taken
are the top ``N`` by path score, prefix-closed, in the reference's order
(``reference.best_first_tree_reference``).

After the loop the same program derives, from the nodes' keys, everything the verify needs: parents (the node
whose key is the path minus its last digit), tokens, the ancestor mask (j is an ancestor of i when j's path
is a prefix of i's), positions, parent columns and SGLang's ``retrieve_next_token`` /
``retrieve_next_sibling`` (children in index order), retrieve indices included: one launch for the step's whole
tree work, nothing else on the stream.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .reference import KINDS, DraftTree, VerifyLayout

MAX_DEPTH = 15  # the key's depth field: four bits
MAX_PATH_BITS = 60  # the key's path field
CODE_MASK = (1 << MAX_PATH_BITS) - 1


@triton.jit
def _normalised_row(pair_base, unary_base, level, rank, cols, K: tl.constexpr, MARKOV: tl.constexpr):
    """log-softmax over the K candidates of position ``level`` given candidate ``rank`` at ``level - 1``
    (the replay's steps: shift by the max, 0 for a row without a finite score; the exp-sum clamped at 1)."""
    x = tl.load(pair_base + (level * K + rank) * K + cols).to(tl.float32)
    if MARKOV:
        x = x + tl.load(unary_base + level * K + cols).to(tl.float32)
    top = tl.max(x, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    total = tl.maximum(tl.sum(tl.exp(x - top), axis=0), 1.0)
    return (x - top) - tl.log(total)


@triton.jit
def _better(score_a, key_a, score_b, key_b):
    """The frontier's order: higher score, then smaller key (shallower, then lexicographically smaller path)."""
    take_a = (score_a > score_b) | ((score_a == score_b) & (key_a < key_b))
    return tl.where(take_a, score_a, score_b), tl.where(take_a, key_a, key_b)


@triton.jit
def _best_first_kernel(
    pair_ptr,
    unary_ptr,
    cand_ptr,
    root_pos_ptr,
    ints_ptr,
    floats_ptr,
    mask_ptr,
    B,
    M,
    DEPTH,
    N: tl.constexpr,
    K: tl.constexpr,
    ROWS: tl.constexpr,
    NODES: tl.constexpr,
    COLS: tl.constexpr,
    BITS: tl.constexpr,
    MARKOV: tl.constexpr,
    LATTICE_ROWS: tl.constexpr,
    SCRATCH: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    # the outputs: parts of one int64 and one float32 buffer (few arguments: each costs Python time a launch)
    per_node, per_col = B * N, B * (N + 1)
    parents_ptr, depths_ptr, ranks_ptr = ints_ptr, ints_ptr + per_node, ints_ptr + 2 * per_node
    tokens_ptr, codes_ptr, num_nodes_ptr = ints_ptr + 3 * per_node, ints_ptr + 4 * per_node, ints_ptr + 5 * per_node
    positions_ptr = num_nodes_ptr + B
    index_ptr, parent_col_ptr = positions_ptr + per_col, positions_ptr + 2 * per_col
    next_token_ptr, next_sibling_ptr = positions_ptr + 3 * per_col, positions_ptr + 4 * per_col
    scores_ptr, norm_ptr = floats_ptr, floats_ptr + per_node
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, K)
    neg_inf = float("-inf")
    code_mask = 0xFFFFFFFFFFFFFFF  # 60 bits
    pair_base = pair_ptr + b * M * K * K
    unary_base = unary_ptr + b * M * K
    if SCRATCH:  # every lattice row normalised once, up front, into a scratch: the step's chain is then a load
        lat_row = tl.arange(0, LATTICE_ROWS)
        inside = (lat_row < M * K)[:, None]
        x = tl.load(pair_base + lat_row[:, None] * K + cols[None, :], mask=inside, other=0.0).to(tl.float32)
        if MARKOV:
            x = x + tl.load(unary_base + (lat_row // K)[:, None] * K + cols[None, :], mask=inside, other=0.0).to(
                tl.float32
            )
        top = tl.max(x, axis=1)
        top = tl.where(top == neg_inf, 0.0, top)
        total = tl.maximum(tl.sum(tl.exp(x - top[:, None]), axis=1), 1.0)
        tl.store(
            norm_ptr + b * M * K * K + lat_row[:, None] * K + cols[None, :],
            (x - top[:, None]) - tl.log(total)[:, None],
            mask=inside,
        )
        tl.debug_barrier()
        root_row = tl.load(norm_ptr + b * M * K * K + cols)
    else:
        root_row = _normalised_row(pair_base, unary_base, 0, 0, cols, K, MARKOV)  # every parent row of d = 0 is equal
    front = tl.where((rows[:, None] == 0) & (DEPTH > 0), root_row[None, :], neg_inf)
    # per frontier row: the key of its children without their last digit (depth field ^ 8, parent's path)
    prefix = tl.where(rows == 0, tl.full([ROWS], 1 ^ 8, tl.int64) << 60, 0)
    node = tl.arange(0, NODES)
    node_key = tl.zeros([NODES], dtype=tl.int64)
    node_score = tl.full([NODES], neg_inf, dtype=tl.float32)
    count = tl.zeros([], dtype=tl.int64)
    for t in range(N):
        keys = prefix[:, None] | cols[None, :].to(tl.int64)
        # one reduction of (score, key) pairs, by axis (a reshape to 1-D would move the frontier through memory)
        row_best, row_pick = tl.reduce((front, keys), 1, _better)
        best, pick = tl.reduce((row_best, row_pick), 0, _better)
        alive = (best > neg_inf).to(tl.int32) != 0
        level = ((pick >> 60) & 15) ^ 8
        rank = (pick & (K - 1)).to(tl.int32)
        node_key = tl.where((node == t) & alive, pick, node_key)
        node_score = tl.where((node == t) & alive, best, node_score)
        front = tl.where(keys == pick, neg_inf, front)
        grow = alive & (level < DEPTH)
        safe_level = tl.where(grow, level, 0)
        if SCRATCH:
            child = best + tl.load(norm_ptr + b * M * K * K + (safe_level * K + rank) * K + cols)
        else:
            child = best + _normalised_row(pair_base, unary_base, safe_level, rank, cols, K, MARKOV)
        front = tl.where(((rows == t + 1) & grow)[:, None], child[None, :], front)
        child_prefix = (((level + 1) ^ 8) << 60) | ((pick & code_mask) << BITS)
        prefix = tl.where(rows == t + 1, child_prefix, prefix)
        count += alive.to(tl.int64)

    # the nodes, from their keys
    valid = node < count
    depth = tl.where(valid, ((node_key >> 60) & 15) ^ 8, 0)
    code = node_key & code_mask
    rank = tl.where(valid, code & (K - 1), -1)
    token = tl.load(cand_ptr + b * M * K + tl.maximum(depth - 1, 0) * K + tl.maximum(rank, 0), mask=valid, other=-1)
    # parent: the node one level up whose path is this one's without its last digit (at most one)
    depth_j = tl.where(valid, depth, -2)
    is_parent = (depth_j[None, :] == depth[:, None] - 1) & (code[None, :] == (code[:, None] >> BITS))
    parent = tl.where(valid, tl.max(tl.where(is_parent, node[None, :], -1), axis=1), -1)
    keep = node < N
    out = b * N + node
    tl.store(parents_ptr + out, parent.to(tl.int64), mask=keep)
    tl.store(depths_ptr + out, depth.to(tl.int64), mask=keep)
    tl.store(ranks_ptr + out, rank.to(tl.int64), mask=keep)
    tl.store(scores_ptr + out, node_score, mask=keep)
    tl.store(tokens_ptr + out, tl.where(valid, token.to(tl.int64), -1), mask=keep)
    tl.store(codes_ptr + out, code, mask=keep)
    tl.store(num_nodes_ptr + b, count)
    tl.debug_barrier()  # the columns below read the nodes back in column order (node i at column i + 1)

    col = tl.arange(0, COLS)
    in_tree = (col >= 1) & (col - 1 < count)
    c_depth = tl.load(depths_ptr + b * N + col - 1, mask=in_tree, other=0)
    c_code = tl.load(codes_ptr + b * N + col - 1, mask=in_tree, other=0)
    c_parent = tl.where(
        in_tree, tl.load(parents_ptr + b * N + col - 1, mask=in_tree, other=-1) + 1, tl.where(col == 0, -1, 0)
    )
    # ancestor mask: column j is an ancestor of row i (or i itself) when its path is a prefix of i's; all see the root
    shift = tl.maximum(c_depth[:, None] - c_depth[None, :], 0) * BITS
    prefix_of = (c_depth[None, :] <= c_depth[:, None]) & ((c_code[:, None] >> shift) == c_code[None, :])
    sees = (in_tree[:, None] & in_tree[None, :] & prefix_of) | (col[:, None] == col[None, :]) | (col[None, :] == 0)
    sees = sees & ((col[:, None] >= 1) | (col[None, :] == 0))  # the root row sees only the root
    width = N + 1
    tile = (col[:, None] < width) & (col[None, :] < width)
    tl.store(mask_ptr + b * width * width + col[:, None] * width + col[None, :], sees.to(tl.int8), mask=tile)
    root = tl.load(root_pos_ptr + b)
    position = root + tl.where(col == 0, 0, tl.where(in_tree, c_depth, 1))
    on = col < width
    tl.store(positions_ptr + b * width + col, position.to(tl.int64), mask=on)
    tl.store(index_ptr + b * width + col, b * width + col, mask=on)
    tl.store(parent_col_ptr + b * width + col, c_parent.to(tl.int64), mask=on)
    # children in column order: first child of each column, next child of the same parent
    child_of = in_tree[None, :] & (c_parent[None, :] == col[:, None])  # [parent column, child column]
    first = tl.min(tl.where(child_of, col[None, :], COLS), axis=1)
    tl.store(next_token_ptr + b * width + col, tl.where(first < COLS, first, -1).to(tl.int64), mask=on)
    later = in_tree[None, :] & (c_parent[None, :] == c_parent[:, None]) & (col[None, :] > col[:, None])
    sibling = tl.min(tl.where(later, col[None, :], COLS), axis=1)
    tl.store(
        next_sibling_ptr + b * width + col, tl.where(in_tree & (sibling < COLS), sibling, -1).to(tl.int64), mask=on
    )


def path_bits(candidates: int) -> int:
    return max(1, (candidates - 1).bit_length())


def max_tree_depth(candidates: int) -> int:
    """The deepest level the kernel's key holds with ``candidates`` per position (15 at K = 16)."""
    return min(MAX_DEPTH, MAX_PATH_BITS // path_bits(candidates))


def best_first_tree_layout(
    pair: torch.Tensor,
    cand: torch.Tensor,
    nodes: int,
    depth: int | None = None,
    unary: torch.Tensor | None = None,
    kind: str = "selector",
    root_positions: torch.Tensor | None = None,
    num_warps: int = 8,
    scratch: bool = True,
) -> tuple[DraftTree, torch.Tensor, VerifyLayout]:
    """Best-first trees of a batch of lattices and their verify layout, in one launch.

    Args:
        pair: [B, m, K, K] float32/bf16/fp16 selector scores, pair[b, d, i, j] of candidate j at position d
            given candidate i at d - 1 (rows of d = 0 equal).
        cand: [B, m, K] int candidate tokens.
        nodes: node budget N >= 1.
        depth: deepest level, 1 <= depth <= min(m, ``max_tree_depth(K)``) (default: that bound); K a power of two.
        unary: [B, m, K] (``kind="markov"``: DSpark's Eq. 1 score = unary + pair).
        kind: "selector" (DFlash2) or "markov" (DSpark).
        root_positions: [B] int64 position of each root (the last committed token); default 0.
        num_warps: warps per request's program (the frontier of (N+1) x K scores is spread over them).
        scratch: normalise every lattice row once before the loop into a scratch of B x m x K x K floats (a load
            a step; the faster on the H200) instead of loading and normalising the row each step selects.

    Returns:
        (tree, tokens [B, N] int64 (-1 on padding), layout) — ``VerifyLayout`` with the mask [B, N+1, N+1],
        positions, retrieve indices, child lists and parent columns (root column 0, node i at column i + 1).

    Example:
        >>> tree, tokens, layout = best_first_tree_layout(pair, cand, nodes=32, depth=15, root_positions=seq_lens)
    """
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    b, m, k, k2 = pair.shape
    if k2 != k or cand.shape != (b, m, k):
        raise ValueError(
            f"pair must be [B, m, K, K] and cand [B, m, K]; got {tuple(pair.shape)} and {tuple(cand.shape)}"
        )
    if k & (k - 1):
        raise ValueError(f"K={k} candidates: the kernel's path key needs a power of two")
    deepest = min(m, max_tree_depth(k))
    depth = deepest if depth is None else depth
    if not 1 <= depth <= deepest or nodes < 1:
        raise ValueError(
            f"need nodes >= 1 and 1 <= depth <= {deepest} (m = {m}, K = {k}), got depth {depth}, nodes {nodes}"
        )
    if kind == "markov" and (unary is None or unary.shape != (b, m, k)):
        raise ValueError("kind='markov' needs unary [B, m, K]")
    dev = pair.device
    pair = pair.contiguous()
    unary_arg = unary.contiguous() if kind == "markov" else pair
    roots = (
        torch.zeros(b, dtype=torch.int64, device=dev)
        if root_positions is None
        else root_positions.to(device=dev, dtype=torch.int64).contiguous()
    )
    # the outputs as views of three allocations (each torch.empty is a few µs of Python on an eager step), in the
    # order the kernel finds them
    shapes = [(b, nodes)] * 5 + [(b,)] + [(b, nodes + 1)] * 5
    flat = torch.empty(sum(math.prod(s) for s in shapes), dtype=torch.int64, device=dev)
    parents, depths, ranks, tokens, codes, num_nodes, positions, index, parent_col, next_token, next_sibling = (
        part.view(s) for part, s in zip(flat.split([math.prod(s) for s in shapes]), shapes)
    )
    floats = torch.empty(b * nodes + (b * m * k * k if scratch else 1), dtype=torch.float32, device=dev)  # + scratch
    scores = floats[: b * nodes].view(b, nodes)
    mask = torch.empty((b, nodes + 1, nodes + 1), dtype=torch.int8, device=dev)
    if b:
        _best_first_kernel[(b,)](
            pair,
            unary_arg,
            cand.contiguous(),
            roots,
            flat,
            floats,
            mask,
            b,
            m,
            depth,
            N=nodes,
            K=k,
            ROWS=triton.next_power_of_2(nodes),
            NODES=triton.next_power_of_2(nodes),
            COLS=triton.next_power_of_2(nodes + 1),
            BITS=path_bits(k),
            MARKOV=kind == "markov",
            LATTICE_ROWS=triton.next_power_of_2(m * k),
            SCRATCH=scratch,
            num_warps=num_warps,
        )
    layout = VerifyLayout(mask.view(torch.bool), positions, index, next_token, next_sibling, parent_col)
    return DraftTree(parents, depths, ranks, scores, num_nodes), tokens, layout


def best_first_tree(
    pair: torch.Tensor,
    cand: torch.Tensor,
    nodes: int,
    depth: int | None = None,
    unary: torch.Tensor | None = None,
    kind: str = "selector",
    **options,
) -> tuple[DraftTree, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``best_first_tree_layout``'s trees with only their child lists: (tree, tokens [B, N], retrieve_next_token
    [B, N+1], retrieve_next_sibling [B, N+1]); same arguments (``options``: root_positions, num_warps, ...).

    Example:
        >>> tree, tokens, next_token, next_sibling = best_first_tree(pair, cand, nodes=31, depth=15)
    """
    tree, tokens, layout = best_first_tree_layout(pair, cand, nodes, depth, unary=unary, kind=kind, **options)
    return tree, tokens, layout.retrieve_next_token, layout.retrieve_next_sibling


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
    follows = torch.cat(
        [sorted_parent[:, 1:] == sorted_parent[:, :-1], torch.zeros((b, 1), dtype=torch.bool, device=dev)], dim=1
    )
    after = torch.cat([sorted_col[:, 1:], torch.full((b, 1), -1, dtype=torch.int64, device=dev)], dim=1)
    next_sibling = torch.full((b, cols + 1), -1, dtype=torch.int64, device=dev)  # last column: padding's sink
    next_sibling.scatter_(
        1, torch.where(torch.gather(valid, 1, order), sorted_col, cols), torch.where(follows, after, -1)
    )
    first = torch.full((b, cols + 1), cols, dtype=torch.int64, device=dev)
    first.scatter_reduce_(1, parent_col, torch.where(valid, index, cols), reduce="amin")
    next_token = torch.where(first < cols, first, -1)
    return next_token[:, :cols], next_sibling[:, :cols]


def verify_layout(
    tree: DraftTree, next_token: torch.Tensor, next_sibling: torch.Tensor, root_positions: torch.Tensor
) -> VerifyLayout:
    """The verify layout of trees built elsewhere (a combined tree, a chain; ``best_first_tree_layout`` returns
    its own), with their child lists (``child_lists``).

    Args:
        tree: ``DraftTree`` [B, N] (parents, depths, num_nodes are read), parent < node.
        next_token, next_sibling: [B, N+1] child lists.
        root_positions: [B] int64 position of the root (the last committed token).

    Torch, any device: the ancestor mask is closed by pointer doubling (log2 of the depth gathers); padding
    columns hang off the root and see only themselves and it.
    """
    b, n = tree.parents.shape
    cols = n + 1
    dev = tree.parents.device
    valid = torch.arange(n, device=dev)[None, :] < tree.num_nodes[:, None]
    parent_col = torch.cat(
        [
            torch.full((b, 1), -1, dtype=torch.int64, device=dev),
            torch.where(valid, tree.parents + 1, torch.zeros_like(tree.parents)),
        ],
        dim=1,
    )
    mask = torch.eye(cols, dtype=torch.bool, device=dev).expand(b, cols, cols).clone()
    mask[:, :, 0] = True
    jump = parent_col.clamp(min=0)
    for _ in range(max(1, int(n).bit_length())):  # after s rounds each row holds its 2^s nearest ancestors
        mask = mask | torch.gather(mask, 1, jump[:, :, None].expand(b, cols, cols))
        jump = torch.gather(jump, 1, jump)
    depth_col = torch.cat(
        [torch.zeros((b, 1), dtype=torch.int64, device=dev), torch.where(valid, tree.depths, 1)], dim=1
    )
    positions = root_positions.to(torch.int64)[:, None] + depth_col
    index = torch.arange(b * cols, dtype=torch.int64, device=dev).view(b, cols)
    return VerifyLayout(mask, positions, index, next_token, next_sibling, parent_col)
