"""A drafter block per request (``drafter-block``): each request drafts one of the chosen blocks (e.g. 16, 12 or
8 positions) and its tree's depth is capped at it, so the drafter's rows (block + anchor per request, over the
batch) stay within the plateau of its measured c(R). While every request's largest block fits the plateau none
shrinks (those rows are free); past it, the requests that use their drafts least shrink first.

Signals per request, tensors on the device (no host synchronisation), kept per request-pool slot and reset
when the slot's ``req_generation`` changes (a new request): its recent acceptance (a decaying maximum of the
accepted lengths, read from how far its committed length moved since its last step) and its draft confidence
(the deepest node of its share of the last step's budget). A request's need is ``HEADROOM`` positions deeper
than both. The semantics of the project's ``specpilot_mem.batching.blocks.DrafterBlocks`` (the tests compare
the two).
"""

from __future__ import annotations

import torch

from sglang.srt.specpilot.batching_args import PLATEAU_TOLERANCE
from sglang.srt.specpilot.batching_checks.drafter_block import BLOCKS_FLAG, COSTS_FLAG, BlockSettings, block_settings

DECAY = 0.75  # of the recent-acceptance maximum per step
HEADROOM = 2  # positions drafted past the deepest one in use


def share_depth(depths: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """[B] int64: the deepest node among each request's first ``counts[b]`` nodes (0: none)."""
    if depths.shape[1] == 0:
        return torch.zeros(depths.shape[0], dtype=torch.int64, device=depths.device)
    chosen = torch.arange(depths.shape[1], device=depths.device)[None, :] < counts[:, None]
    return torch.where(chosen, depths, torch.zeros_like(depths)).amax(dim=1)


class DrafterBlocks:
    """Chooses each request's block (``choose``), from ``BlockSettings``."""

    def __init__(self, settings: BlockSettings, tolerance: float = PLATEAU_TOLERANCE):
        self.choices = torch.tensor(settings.choices, dtype=torch.int64)
        self.curve, self.tolerance = settings.curve, tolerance

    @property
    def largest(self) -> int:
        return int(self.choices[-1])

    def drafter_rows(self, requests: int) -> int:
        """The drafter's rows for ``requests`` requests: the end of the plateau their smallest blocks are on."""
        return self.curve.plateau_end(requests * (int(self.choices[0]) + 1), self.tolerance)

    def update(self, recent: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        return torch.maximum(accepted.to(recent.dtype), recent * DECAY)

    def choose(self, recent: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
        """[B] int64 blocks: the largest each, then shrunk to the drafter's plateau, least need first."""
        need = torch.maximum(recent.ceil().to(torch.int64), confidence.to(torch.int64)) + HEADROOM
        return self.fit(torch.full_like(need, self.largest), need, self.drafter_rows(need.numel()))

    def fit(self, blocks: torch.Tensor, need: torch.Tensor, rows: int) -> torch.Tensor:
        """Shrink blocks one choice at a time, those of the least need first (ties: request order), until the
        drafter's rows (block + anchor per request) fit ``rows`` or every block is the smallest."""
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


class BlockState:
    """Per request-pool slot: committed length, generation, recent acceptance and confidence at its last step."""

    def __init__(self, blocks: DrafterBlocks, req_to_token_pool):
        self.blocks, self.pool = blocks, req_to_token_pool
        self.length = self.generation = self.recent = self.confidence = None

    @classmethod
    def from_worker(cls, worker, tree_settings, shared: bool) -> "BlockState | None":
        """None with the flags unset (every request drafts the whole block)."""
        from sglang.srt.specpilot import option_value

        settings = block_settings(option_value(BLOCKS_FLAG), option_value(COSTS_FLAG),
                                  drafted_positions=tree_settings.drafted_positions, shared=shared)
        if settings is None:
            return None
        return cls(DrafterBlocks(settings), worker.target_worker.model_runner.req_to_token_pool)

    def caps(self, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        """[B] int64 the depth each request's tree may reach this step (its block)."""
        device = prefix_lens.device
        if self.length is None:
            size = self.pool.req_generation.shape[0]
            self.length = torch.zeros(size, dtype=torch.int64, device=device)
            self.generation = torch.full((size,), -1, dtype=torch.int64, device=device)
            self.recent = torch.zeros(size, dtype=torch.float32, device=device)
            self.confidence = torch.zeros(size, dtype=torch.int64, device=device)
        slots = req_pool_indices.to(device=device, dtype=torch.int64)
        generation = self.pool.req_generation.to(device, non_blocking=True)[slots]
        fresh = self.generation[slots] == generation  # the slot's request stepped before
        accepted = (prefix_lens.to(torch.int64) - self.length[slots] - 1).clamp(min=0)
        recent = torch.where(fresh, self.blocks.update(self.recent[slots], accepted),
                             torch.full_like(self.recent[slots], float(self.blocks.largest)))
        confidence = torch.where(fresh, self.confidence[slots], 0)
        self.length[slots], self.generation[slots], self.recent[slots] = prefix_lens.to(torch.int64), generation, recent
        return self.blocks.choose(recent, confidence)

    def observe(self, req_pool_indices: torch.Tensor, depths: torch.Tensor, counts: torch.Tensor) -> None:
        """Record the draft confidence of the step's shares (their deepest node)."""
        self.confidence[req_pool_indices.to(device=depths.device, dtype=torch.int64)] = share_depth(depths, counts)
