"""Greedy acceptance of draft trees against the target's argmax (one Triton program per request).

Walk from the root: at each column take the first child (lowest index) whose token is the target's argmax
there, until none matches; the bonus is the argmax at the last column taken. The same program writes what
the commit needs: the committed tokens (accepted nodes' tokens, then the bonus) and the order of the verify
columns with the accepted path first (root first) and every other column after it in index order. Equals
``reference.greedy_accept_reference``, also when siblings repeat a token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import Acceptance


@triton.jit
def _accept_kernel(
    tokens_ptr,
    parents_ptr,
    num_nodes_ptr,
    predict_ptr,
    out_ptr,
    B,
    N: tl.constexpr,
    NODES: tl.constexpr,
    COLS: tl.constexpr,
    LEVELS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    width = N + 1
    # the outputs: parts of one int64 buffer (few arguments: each costs Python time a launch)
    length_ptr, bonus_ptr, columns_ptr = out_ptr, out_ptr + B, out_ptr + 2 * B
    order_ptr, out_tokens_ptr = columns_ptr + B * width, columns_ptr + 2 * B * width
    node = tl.arange(0, NODES)
    count = tl.load(num_nodes_ptr + b)
    valid = node < count
    parent_col = tl.load(parents_ptr + b * N + node, mask=valid, other=-2) + 1
    token = tl.load(tokens_ptr + b * N + node, mask=valid, other=-1)
    col_ids = tl.arange(0, COLS)
    predict = tl.load(predict_ptr + b * width + col_ids, mask=col_ids < width, other=-1)  # read once, then in registers
    slot = tl.where(col_ids == 0, 0, -1).to(
        tl.int64
    )  # path slot of each column (-1: not on the path); int64 as the loop writes it
    path_cols = tl.where(col_ids == 0, 0, -1).to(tl.int64)  # the accepted columns, root first
    path_tokens = tl.zeros([COLS], dtype=tl.int64)  # their tokens, then the bonus
    at = tl.zeros([], dtype=tl.int64)  # the column reached
    length = tl.zeros([], dtype=tl.int64)
    going = count >= 0
    for _ in range(LEVELS):  # one level a step: a path is at most as deep as the tree
        want = tl.sum(tl.where(col_ids == at, predict, 0), axis=0)
        first = tl.min(tl.where(valid & (parent_col == at) & (token == want), node, NODES), axis=0)
        found = going & (first < NODES)
        taken = tl.sum(tl.where(node == first, token, 0), axis=0)
        path_tokens = tl.where(found & (col_ids == length), taken, path_tokens)
        length += found.to(tl.int64)
        at = tl.where(found, first + 1, at)
        slot = tl.where(found & (col_ids == at), length, slot)
        path_cols = tl.where(found & (col_ids == length), at, path_cols)
        going = found
    bonus = tl.sum(tl.where(col_ids == at, predict, 0), axis=0)
    path_tokens = tl.where(col_ids == length, bonus, path_tokens)
    tl.store(length_ptr + b, length)
    tl.store(bonus_ptr + b, bonus)
    on = col_ids < width
    on_path = slot >= 0
    tl.store(columns_ptr + b * width + col_ids, path_cols, mask=on)  # every slot written: no fill launch before
    tl.store(out_tokens_ptr + b * width + col_ids, path_tokens, mask=on)
    rest = tl.cumsum((on & ~on_path).to(tl.int64), axis=0) - 1
    tl.store(order_ptr + b * width + tl.where(on_path, slot, length + 1 + rest), col_ids.to(tl.int64), mask=on)


def greedy_accept(
    tree_tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    target_predict: torch.Tensor,
    max_depth: int | None = None,
) -> Acceptance:
    """Accept each request's longest matching root path plus the bonus token.

    Args:
        tree_tokens: [B, N] int64 node tokens (any value on padding).
        parents: [B, N] int64 parent node (-1: the root), parent < node.
        num_nodes: [B] int64 valid nodes.
        target_predict: [B, N+1] int64 target argmax at the root (column 0) and after node i (column i+1),
            from one verify pass over the tree.
        max_depth: the trees' deepest level, if known (the walk's step count; default N).

    Returns:
        ``Acceptance``: accept_length [B], accept_columns [B, N+1] (root and accepted columns, -1 after), bonus [B],
        commit_tokens [B, N+1] (accepted tokens then the bonus, 0 after), commit_order [B, N+1] (a permutation
        of the columns: the accepted path, then the rest in index order).

    Example:
        >>> acc = greedy_accept(tokens, tree.parents, tree.num_nodes, logits.argmax(-1).view(B, N + 1))
    """
    b, n = parents.shape
    dev = parents.device
    flat = torch.empty(b * (2 + 3 * (n + 1)), dtype=torch.int64, device=dev)  # one allocation, five views, in the
    # kernel's order
    length, bonus = flat[:b], flat[b : 2 * b]
    columns, order, out_tokens = flat[2 * b :].view(3, b, n + 1).unbind(0)
    if b:
        _accept_kernel[(b,)](
            tree_tokens.to(torch.int64).contiguous(),
            parents.contiguous(),
            num_nodes.contiguous(),
            target_predict.to(torch.int64).contiguous(),
            flat,
            b,
            N=n,
            NODES=triton.next_power_of_2(max(n, 1)),
            COLS=triton.next_power_of_2(n + 1),
            LEVELS=n if max_depth is None else min(n, max_depth),
            num_warps=1,
        )
    return Acceptance(length, columns, bonus, out_tokens, order)
