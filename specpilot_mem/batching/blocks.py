"""A drafter block per request (§4.4): each request drafts 16, 12 or 8 positions, the fewest that cover
how deep its drafts are being used, so the drafter's rows (blocks + anchors over the batch) stay within
the plateau of its GEMMs; the request's tree depth is capped at its block.

Signals, per request slot, all tensors on the engine's device (no host synchronisation):

* recent acceptance: a decaying maximum of the accepted lengths (a long acceptance keeps a deep block
  for a few steps, a run of short ones lets it shrink);
* draft confidence: how deep the last step's draft reached with enough probability — the deepest node of
  the request's share of a shared budget (``share_depth``), or the chain positions whose cumulative
  probability stays above a threshold (``confident_depth``).

The block is the smallest choice at least ``headroom`` deeper than both.
"""

from __future__ import annotations

import math

import torch

from specpilot_mem.batching.costs import BatchingError

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

    choices: blocks to choose from (``--drafter-blocks``), each 1..``drafter_block`` (the drafter's trained
    block, the most masked positions its forward drafts); drafter_rows: the end of the drafter GEMM's
    plateau in rows (None: no cap), where anchors count one row each; decay: of the recent-acceptance
    maximum per step; headroom: positions drafted past the deepest one in use.
    """

    FLAG = "--drafter-blocks"

    def __init__(self, drafter_block: int, choices=DEFAULT_BLOCKS, drafter_rows: int | None = None,
                 decay: float = 0.75, headroom: int = 2):
        choices = sorted({int(c) for c in choices})
        bad = [c for c in choices if not 1 <= c <= drafter_block]
        if not choices or bad:
            raise BatchingError(f"{self.FLAG}: block {bad[0] if bad else '(none)'} cannot be drafted: the drafter "
                                f"drafts 1..{drafter_block} positions per forward", where=self.FLAG,
                                fix=f"choose blocks between 1 and {drafter_block}, e.g. 16,12,8")
        self.choices = torch.tensor(choices, dtype=torch.int64)
        self.drafter_block, self.drafter_rows, self.decay, self.headroom = drafter_block, drafter_rows, decay, headroom

    @property
    def largest(self) -> int:
        return int(self.choices[-1])

    def initial_recent(self, requests: int, device=None) -> torch.Tensor:
        """[B] float recent-acceptance state of requests that have not stepped yet (largest block)."""
        return torch.full((requests,), float(self.largest), device=device)

    def update(self, recent: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        """Next recent-acceptance state from the accepted draft lengths [B] of the step just verified."""
        return torch.maximum(accepted.to(recent.dtype), recent * self.decay)

    def choose(self, recent: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
        """[B] int64 blocks from the recent-acceptance state [B] and the draft confidence depth [B]."""
        choices = self.choices.to(recent.device)
        need = torch.maximum(recent.ceil().to(torch.int64), confidence.to(torch.int64)) + self.headroom
        pick = torch.searchsorted(choices, need.clamp(max=self.largest)).clamp(max=choices.numel() - 1)
        return self.fit(choices[pick], need)

    def fit(self, blocks: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
        """Shrink blocks, those of the least need first, one choice at a time, until the drafter's rows
        (block + anchor per request) fit ``drafter_rows`` (or every block is the smallest)."""
        if self.drafter_rows is None:
            return blocks
        choices = self.choices.to(blocks.device)
        order = torch.argsort(need, stable=True)  # least need first
        for _ in range(choices.numel() - 1):
            level = torch.searchsorted(choices, blocks)
            lower = choices[(level - 1).clamp(min=0)]
            saving = (blocks - lower)[order]
            excess = (blocks + 1).sum() - self.drafter_rows
            # shrink the shortest prefix (in need order) whose savings cover the excess
            covered = saving.cumsum(0) - saving < excess
            shrink = torch.zeros_like(blocks, dtype=torch.bool)
            shrink[order] = covered & (saving > 0)
            blocks = torch.where(shrink, lower, blocks)
        return blocks
