"""Greedy acceptance of draft trees against the target's argmax, vectorised over the batch (torch, any device).

A node is accepted when its token is the target's argmax after its parent, its parent is accepted, and
no sibling before it (lower index) also matches; the deepest accepted node's root path is taken and
the bonus is the target's argmax after it. This equals walking the tree from the root taking the
first matching child (``reference.greedy_accept_reference``), also when siblings repeat a token.
"""

from __future__ import annotations

import torch

from .reference import Acceptance


def greedy_accept(tree_tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, num_nodes: torch.Tensor,
                  target_predict: torch.Tensor) -> Acceptance:
    """Accept each request's longest matching root path plus the bonus token.

    Args:
        tree_tokens: [B, N] int64 node tokens (any value on padding).
        parents: [B, N] int64 parent node (-1: the root), parent < node.
        depths: [B, N] int64 node depths (>= 1 on valid nodes).
        num_nodes: [B] int64 valid nodes.
        target_predict: [B, N+1] int64 target argmax at the root (column 0) and after node i (column i+1),
            from one verify pass over the tree.

    Returns:
        ``Acceptance``: accept_length [B], accept_columns [B, D+1] (root and accepted columns, -1 after;
        D = deepest possible level), bonus [B].

    Example:
        >>> acc = greedy_accept(tokens, tree.parents, tree.depths, tree.num_nodes, logits.argmax(-1))
    """
    b, n = parents.shape
    dev = parents.device
    cols = n + 1
    valid = torch.arange(n, device=dev)[None, :] < num_nodes[:, None]
    parent_col = torch.where(valid, parents + 1, torch.zeros_like(parents))
    matched = valid & (tree_tokens == torch.gather(target_predict, 1, parent_col))
    # the first matching child of each column
    index = torch.arange(n, device=dev).expand(b, n)
    first = torch.full((b, cols), n, dtype=torch.int64, device=dev)
    first = first.scatter_reduce(1, parent_col, torch.where(matched, index, n), reduce="amin")
    chosen = matched & (torch.gather(first, 1, parent_col) == index)
    # accepted = chosen all along the root path: closed by pointer doubling; the accepted set is one path
    ok = torch.cat([torch.ones((b, 1), dtype=torch.bool, device=dev), chosen], dim=1)
    jump = torch.cat([torch.zeros((b, 1), dtype=torch.int64, device=dev), parent_col], dim=1)
    for _ in range(max(1, int(n).bit_length())):
        ok = ok & torch.gather(ok, 1, jump)
        jump = torch.gather(jump, 1, jump)
    depth_col = torch.cat([torch.zeros((b, 1), dtype=torch.int64, device=dev), torch.where(valid, depths, 0)], dim=1)
    length, deepest = torch.where(ok, depth_col, -1).max(dim=1)
    bonus = torch.gather(target_predict, 1, deepest[:, None])[:, 0]
    columns = torch.full((b, cols + 1), -1, dtype=torch.int64, device=dev)  # last column: a sink for the rest
    columns.scatter_(1, torch.where(ok, depth_col, cols), torch.arange(cols, device=dev).expand(b, cols))
    return Acceptance(length, columns[:, :cols], bonus)
