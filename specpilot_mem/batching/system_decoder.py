"""The batching policies in the composed engine's batched decoder (``specpilot_mem.engine.decode``): its
draft-tree hook (``SystemDecoder.draft_trees``) takes each step's trees from the policies — every request's
drafter block (a forward over that many masked positions, its tree's depth capped at it) and its share of
the step's node budget — the same ``step_trees`` / ``block_signals`` the closed-loop replay runs.

The decoder verifies all requests in one pass over a padded [B, T] layout (T = 1 + ``options.nodes``), so a
share is capped at ``options.nodes`` nodes; the budget (``SharedBudget``, the plateau of the target's c(R))
decides how the rows are split, not yet how many the pass computes. With prompt admission a new request's
prompt enters in the verify steps' forward, in the rows ``PromptAdmission`` plans on the step's c(R) past the
B x T rows the step computes anyway (``SystemDecoder.generate(admission=...)``). The budget planner's rows per
step (``planner.BudgetPlanner``) would need a bucket per row count: not wired here.
"""

from __future__ import annotations

import numpy as np
import torch

from specpilot_mem.batching.admission import PromptAdmission
from specpilot_mem.batching.blocks import DrafterBlocks
from specpilot_mem.batching.budget import SharedBudget
from specpilot_mem.batching.costs import BatchingError, StepCosts
from specpilot_mem.batching.simulate import STOCK_BLOCK, Mechanisms, block_signals, step_trees
from specpilot_mem.engine.decode import SystemDecoder
from specpilot_mem.engine.engine import Engine
from specpilot_mem.engine.options import SystemOptions
from specpilot_mem.replay.trees.base import DraftTrees, StepBatch


class PolicyDecoder(SystemDecoder):
    """``SystemDecoder`` drafting ``config``'s trees (``simulate.CONFIGS``), deciding from ``costs``; ``segment``: prompt
    admission's segment rows (None: one chain of the spare rows), ``verify_buffer``: the most rows a step may take."""

    def __init__(
        self,
        engine: Engine,
        config: Mechanisms,
        costs: StepCosts,
        batch: int = 1,
        options: SystemOptions | None = None,
        max_len: int = 1024,
        weights=None,
        segment: int | None = 64,
        verify_buffer: int = 2048,
    ):
        if config.plan:
            raise BatchingError(
                "the budget planner is not wired into the system decoder (its step has one [B, T] bucket)",
                where="config",
                fix="use a configuration without plan (the closed-loop replay and system_bench run the planner)",
            )
        options = options or SystemOptions(
            tree="best-first" if config.tree == "best-first" else "chain", positions=STOCK_BLOCK, nodes=STOCK_BLOCK
        )
        super().__init__(engine, options, batch, max_len, weights)
        self.config, self.costs = config, costs
        self.budget = SharedBudget(costs.target, verify_buffer=batch * self.options.rows)
        self.blocks = DrafterBlocks(STOCK_BLOCK, costs.drafter) if config.blocks else None
        # the step computes every slot's rows: the plateau past them is what prompts may take
        self.admission = PromptAdmission(costs.rows_curve(batch), verify_buffer, segment) if config.admission else None
        self._recent = torch.full((batch,), float(STOCK_BLOCK))
        self._confidence = torch.zeros(batch, dtype=torch.int64)
        self._last: dict[int, tuple[int, DraftTrees, int]] = {}  # slot -> (cache length, trees, row) of its last draft
        self.stats = {"blocks": {}, "shares": []}

    @torch.no_grad()
    def draft_trees(self, anchors: list[int], slots: list[int]) -> list[tuple[list[int], list[int]]]:
        n = len(slots)
        lengths = self.caches.lengths[slots]
        self._observe(slots, lengths.tolist())
        chosen = np.full(n, STOCK_BLOCK)
        if self.blocks is not None:
            chosen = self.blocks.choose(self._recent[slots], self._confidence[slots]).numpy()
        drafter, target = self.engine.drafter, self.engine.target
        W = drafter.cfg.context_window
        ctx = lengths[:, None] - W + torch.arange(W, device=self.device)
        feats = self.caches.features[torch.tensor(slots, device=self.device)[:, None], ctx.clamp(min=0)]
        anchor_t = torch.tensor(anchors, device=self.device)
        groups = []
        for block in np.unique(chosen):
            mine = np.flatnonzero(chosen == block)
            idx = torch.from_numpy(mine).to(self.device)
            hidden = drafter(target.embed, feats[idx], (ctx >= 0)[idx], anchor_t[idx], lengths[idx], int(block))
            base = hidden @ target.lm_head_weight.t()
            cand, unary, pair = drafter.lattice_batch(hidden, base, anchor_t[idx], int(block))
            groups.append((mine, StepBatch.from_scores(cand, unary, pair)))
        rows = self.budget.rows_for(n)
        trees, _ = step_trees(groups, n, self.config, max(0, rows - n), cap=self.options.rows - 1)
        self.stats["shares"].append(trees.num_nodes.tolist())
        for block in chosen.tolist():
            self.stats["blocks"][block] = self.stats["blocks"].get(block, 0) + 1
        out = []
        for b, (slot, anchor) in enumerate(zip(slots, anchors)):
            k = int(trees.num_nodes[b])
            self._last[slot] = (int(lengths[b]), trees, b)
            out.append(([anchor] + trees.tokens[b, :k].tolist(), [-1] + (trees.parents[b, :k] + 1).tolist()))
        return out

    def generate(self, prompts, mode: str = "spec", max_new_tokens: int = 64, batched_prefill: bool = False):
        """``SystemDecoder.generate`` with the configuration's prompt admission."""
        return super().generate(prompts, mode, max_new_tokens, batched_prefill, admission=self.admission)

    def start_request(self, slot: int) -> None:
        """A new request takes ``slot``: its drafter-block signals start afresh."""
        self._last.pop(slot, None)
        self._recent[slot], self._confidence[slot] = float(STOCK_BLOCK), 0
        super().start_request(slot)

    def prefill(self, slot: int, prompt: list[int], start: int = 0, chunks=None) -> int:
        if start == 0:
            self.start_request(slot)
        return super().prefill(slot, prompt, start, chunks)

    def _observe(self, slots: list[int], lengths: list[int]) -> None:
        """The drafter-block signals of each slot's last step, from how far its cache grew since."""
        if self.blocks is None:
            return
        for slot, length in zip(slots, lengths):
            last = self._last.get(slot)
            if last is None:
                continue
            base, trees, row = last
            one = DraftTrees(
                *(
                    np.asarray(getattr(trees, f)[row : row + 1])
                    for f in ("parents", "depths", "ranks", "tokens", "scores", "num_nodes")
                )
            )
            recent, confidence = block_signals(
                self.blocks, self._recent[slot : slot + 1], one, np.array([length - base - 1]), self.config
            )
            self._recent[slot], self._confidence[slot] = float(recent[0]), int(confidence[0])
