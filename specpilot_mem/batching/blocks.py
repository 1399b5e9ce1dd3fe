"""A drafter block per request (§4.4): each request drafts 16, 12 or 8 positions so that the drafter's
rows (block + anchor per request, over the batch) stay within the plateau of its GEMMs; the request's
tree depth is capped at its block. While every request's largest block fits the plateau, none shrinks
(those rows are free); past it, the requests that use their drafts least shrink first.

Signals, per request slot, all tensors on the engine's device (no host synchronisation):

* recent acceptance: a decaying maximum of the accepted lengths (a long acceptance keeps a deep block
  for a few steps, a run of short ones lets it shrink);
* draft confidence: how deep the last step's draft reached with enough probability — the deepest node of
  the request's share of a shared budget (``share_depth``), or the chain positions whose cumulative
  probability stays above a threshold (``confident_depth``).

A request's need is ``headroom`` positions deeper than both; the requests of least need shrink first.
"""

from __future__ import annotations

import math

import torch

from specpilot_mem.batching.costs import BatchingError, CostCurve

DEFAULT_BLOCKS = (16, 12, 8)


def confident_depth(chain_logp: torch.Tensor, threshold: float = 0.1) -> torch.Tensor:
    """[B] int64: leading chain positions whose cumulative probability is at least ``threshold``.

    Args:
        chain_logp: [B, m] log-probability of each chain position given the previous (-inf past the chain).
    """
    cumulative = chain_logp.float().cumsum(dim=1)
    return (cumulative >= math.log(threshold)).cumprod(dim=1).sum(dim=1)


def share_depth(depths: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[B] int64: deepest node among each request's first ``counts[b]`` nodes (0: no node).

    Args:
        depths: [B, N] node depths (>= 1) in best-first order; counts: [B] nodes of the request's share.
    """
    if depths.shape[1] == 0:
        return torch.zeros(depths.shape[0], dtype=torch.int64, device=depths.device)
    chosen = torch.arange(depths.shape[1], device=depths.device)[None, :] < counts[:, None]
    return torch.where(chosen, depths, torch.zeros_like(depths)).amax(dim=1)


class DrafterBlocks:
    """Chooses each request's drafter block.

    drafter_block: the drafter's trained block (the most masked positions its forward drafts); choices:
    blocks to choose from (``--drafter-blocks``), each 1..drafter_block; curve: the drafter's measured c(R)
    (``StepCosts.drafter``), whose plateau caps the rows; decay: of the recent-acceptance maximum per step;
    headroom: positions drafted past the deepest one in use.
    """

    FLAG = "--drafter-blocks"

    def __init__(
        self,
        drafter_block: int,
        curve: CostCurve,
        choices=DEFAULT_BLOCKS,
        tolerance: float = 0.05,
        decay: float = 0.75,
        headroom: int = 2,
    ):
        choices = sorted({int(c) for c in choices})
        bad = [c for c in choices if not 1 <= c <= drafter_block]
        if not choices or bad:
            raise BatchingError(
                f"{self.FLAG}: block {bad[0] if bad else '(none)'} cannot be drafted: the drafter "
                f"drafts 1..{drafter_block} positions per forward",
                where=self.FLAG,
                fix=f"choose blocks between 1 and {drafter_block}, e.g. 16,12,8",
            )
        self.choices = torch.tensor(choices, dtype=torch.int64)
        self.drafter_block, self.curve, self.tolerance = drafter_block, curve, tolerance
        self.decay, self.headroom = decay, headroom

    @property
    def largest(self) -> int:
        return int(self.choices[-1])

    def drafter_rows(self, requests: int) -> int:
        """The drafter's rows for ``requests`` requests: the end of the plateau their smallest blocks are on."""
        return self.curve.plateau_end(requests * (int(self.choices[0]) + 1), self.tolerance)

    def initial_recent(self, requests: int, device=None) -> torch.Tensor:
        """[B] float recent-acceptance state of requests that have not stepped yet (largest block)."""
        return torch.full((requests,), float(self.largest), device=device)

    def update(self, recent: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        """Next recent-acceptance state from the accepted draft lengths [B] of the step just verified."""
        return torch.maximum(accepted.to(recent.dtype), recent * self.decay)

    def choose(self, recent: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
        """[B] int64 blocks from the recent-acceptance state [B] and the draft confidence depth [B]: the
        largest block each, then ``fit`` to the drafter's plateau."""
        need = torch.maximum(recent.ceil().to(torch.int64), confidence.to(torch.int64)) + self.headroom
        blocks = torch.full_like(need, self.largest)
        return self.fit(blocks, need, self.drafter_rows(need.numel()))

    def fit(self, blocks: torch.Tensor, need: torch.Tensor, rows: int) -> torch.Tensor:
        """Shrink blocks one choice at a time, those of the least need first (ties: request order), until
        the drafter's rows (block + anchor per request) fit ``rows`` or every block is the smallest."""
        choices = self.choices.to(blocks.device)
        order = torch.argsort(need, stable=True)
        for _ in range(choices.numel() - 1):
            lower = choices[(torch.searchsorted(choices, blocks) - 1).clamp(min=0)]
            saving = (blocks - lower)[order]
            excess = (blocks + 1).sum() - rows
            shrink = torch.zeros_like(blocks, dtype=torch.bool)  # the shortest need-ordered prefix covering it
            shrink[order] = (saving.cumsum(0) - saving < excess) & (saving > 0)
            blocks = torch.where(shrink, lower, blocks)
        return blocks
