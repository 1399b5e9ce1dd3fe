"""A node budget shared by the batch (§4.4): each verify step checks a fixed number of rows, every
request's root plus the best nodes by path log-probability over all requests' best-first trees.

Each request's nodes come in best-first order (path scores never increase along a path, and a parent
precedes its children), so the nodes of one request that make the global cut are a prefix of its order:
a valid tree. Ties: higher score, then the lower request index, then the earlier node (the order
``replay.trees.shared`` uses, which is the numpy reference of ``shared_shares``).

The budget's size is a shape decision made once per batch size: the end of the plateau of the target's
measured c(R) that the batch's roots are on (rows past the roots are nearly free until the next tile).
The shares are tensors computed on the scores' device without host synchronisation.
"""

from __future__ import annotations

import torch

from specpilot_mem.batching.costs import BatchingError, CostCurve


def shared_shares(scores: torch.Tensor, nodes) -> torch.Tensor:
    """Nodes per request: the global top-``nodes`` of all requests' best-first trees.

    Args:
        scores: [B, N] float path scores, each row in its best-first order, -inf past a tree's nodes.
        nodes: int or 0-dim int64 tensor (on the scores' device): nodes to share (roots excluded).

    Returns [B] int64 nodes per request (the first ``count[b]`` nodes of row b form its tree).

    Example: ``shared_shares(torch.tensor([[-.1, -.5], [-.2, -3.]]), 3)`` -> ``tensor([2, 1])``.
    """
    b, n = scores.shape
    flat = scores.reshape(-1)
    order = torch.sort(flat, descending=True, stable=True).indices  # ties keep (request, node) order
    taken = torch.arange(b * n, device=scores.device) < torch.as_tensor(nodes, device=scores.device)
    taken &= flat[order] > float("-inf")
    counts = torch.zeros(b, dtype=torch.int64, device=scores.device)
    return counts.scatter_add_(0, order // n, taken.to(torch.int64))


def equal_shares(available: torch.Tensor, nodes: int) -> torch.Tensor:
    """Equal-size per-request trees (the baseline of the shared budget): ``nodes // B`` each, the remainder
    one each to the first requests, never more than a request's tree holds.

    Args:
        available: [B] int64 nodes each request's best-first tree holds.
        nodes: nodes to split (roots excluded).
    """
    b = available.shape[0]
    base = torch.full((b,), nodes // max(b, 1), dtype=torch.int64, device=available.device)
    base += (torch.arange(b, device=available.device) < nodes % max(b, 1)).to(torch.int64)
    return torch.minimum(base, available)


def expected_tokens(scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[B] float: 1 + the sum of path probabilities of each request's chosen nodes (the tokens a step
    commits if the drafter's scores are calibrated: every node is accepted with its path probability).

    Args:
        scores: [B, N] path log-probabilities in best-first order; counts: [B] nodes chosen.
    """
    chosen = torch.arange(scores.shape[1], device=scores.device)[None, :] < counts[:, None]
    return 1 + torch.where(chosen, scores.float().exp(), torch.zeros((), device=scores.device)).sum(dim=1)


class SharedBudget:
    """Verify rows per step for B requests in flight, and their split.

    curve: the target's measured c(R) (``StepCosts.target``); verify_buffer: rows the verify buffers hold;
    rows: a fixed budget (``--shared-budget-rows``), else each batch size's plateau end; tolerance: how much
    dearer each next measured row count on a plateau may be (``CostCurve.plateau_end``).
    """

    FLAG = "--shared-budget-rows"

    def __init__(self, curve: CostCurve, verify_buffer: int, rows: int | None = None, tolerance: float = 0.05):
        if verify_buffer < 1:
            raise BatchingError(
                f"verify buffers of {verify_buffer} rows",
                where="--verify-buffer",
                fix="give the verify buffers at least one row per request",
            )
        if rows is not None and rows > verify_buffer:
            raise BatchingError(
                f"{self.FLAG}={rows} is larger than the verify buffers ({verify_buffer} rows)",
                where=self.FLAG,
                fix=f"use at most {verify_buffer} rows, or larger verify buffers",
            )
        self.curve, self.verify_buffer, self.fixed, self.tolerance = curve, verify_buffer, rows, tolerance

    def rows_for(self, requests: int) -> int:
        """Verify rows (roots included) of a step with ``requests`` requests in flight."""
        if requests > self.verify_buffer:
            raise BatchingError(
                f"{requests} requests in flight need {requests} root rows; the verify buffers hold "
                f"{self.verify_buffer}",
                where="--verify-buffer",
                fix=f"run at most {self.verify_buffer} requests, or larger verify buffers",
            )
        if self.fixed is not None:
            if self.fixed < requests:
                raise BatchingError(
                    f"{self.FLAG}={self.fixed} is smaller than the {requests} requests in flight "
                    "(each needs its root row)",
                    where=self.FLAG,
                    fix=f"use at least {requests} rows, or fewer requests in flight",
                )
            return self.fixed
        return self.curve.plateau_end(requests, self.tolerance, self.verify_buffer)

    def shares(self, scores: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """[B] nodes per request for a step whose best-first trees have ``scores`` [B, N]."""
        rows = self.rows_for(scores.shape[0]) if rows is None else rows
        return shared_shares(scores, rows - scores.shape[0])
