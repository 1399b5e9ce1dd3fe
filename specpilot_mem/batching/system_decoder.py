"""The batching policies in the composed engine's batched decoder (``specpilot_mem.engine.decode``): its
draft-tree hook (``SystemDecoder.draft_trees``) takes each step's trees from the policies — every request's
drafter block (a forward over that many masked positions, its tree's depth capped at it) and its share of
the step's node budget — the same ``step_trees`` / ``block_signals`` the closed-loop replay runs.

The decoder verifies all requests in one pass over a padded [B, T] layout. Without the planner T is
1 + ``options.nodes`` and the budget (``SharedBudget``, the plateau of the target's c(R)) decides how the rows
are split, not how many the pass computes. With it (``Mechanisms.plan``) each step's bucket comes from the
budget planner (``planner.BudgetPlanner``, through the decoder's ``step_rows`` hook): T rows per request
(shares capped at T - 1 nodes, B x T rows shared), or an AR step (T = 1, no draft); the planner learns
from the committed lengths the decoder reads back every step (``step_done``), so it adds no device sync.
With prompt admission a new request's prompt enters in the verify steps' forward, in the rows
``PromptAdmission`` plans on the step's c(R) past the B x T rows the step computes anyway
(``SystemDecoder.generate(admission=...)``); admission plans against the fixed [B, 1 + nodes] step, so it is
not combined with the planner's buckets. A gated configuration (``Mechanisms.gate``) asks the planner, with the
step's own [B, 1 + nodes] rows as its one bucket, whether to run that step or an AR step; with admission the
gate stays off (the mixed step with prompt segments is a speculative step only).
"""

from __future__ import annotations

import numpy as np
import torch

from specpilot_mem.batching.admission import PromptAdmission
from specpilot_mem.batching.blocks import DrafterBlocks
from specpilot_mem.batching.budget import SharedBudget
from specpilot_mem.batching.costs import BatchingError, StepCosts
from specpilot_mem.batching.planner import BudgetPlanner
from specpilot_mem.batching.simulate import STOCK_BLOCK, Mechanisms, block_signals, step_trees
from specpilot_mem.engine.decode import SystemDecoder
from specpilot_mem.engine.engine import Engine
from specpilot_mem.engine.options import SystemOptions
from specpilot_mem.replay.trees.base import DraftTrees, StepBatch


class PolicyDecoder(SystemDecoder):
    """``SystemDecoder`` drafting ``config``'s trees (``simulate.CONFIGS``), deciding from ``costs`` (with the
    planner: the engine's own step costs, ``EngineStepCosts``); ``plan_prior``: the planner's prior
    (``simulate.chain_prior``); ``segment``: prompt admission's segment rows (None: one chain of the spare rows),
    ``verify_buffer``: the most rows a step may take."""

    def __init__(
        self,
        engine: Engine,
        config: Mechanisms,
        costs: StepCosts,
        batch: int = 1,
        options: SystemOptions | None = None,
        max_len: int = 1024,
        weights=None,
        plan_prior: np.ndarray | None = None,
        segment: int | None = 64,
        verify_buffer: int = 2048,
    ):
        if config.plan and config.admission:
            raise BatchingError(
                "prompt admission and the budget planner cannot be combined in the system decoder (admission plans"
                " against the fixed [B, 1 + nodes] step, the planner changes its rows per step)",
                where="config",
                fix="use a configuration with plan or with admission, not both",
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
        self.planner = None
        if config.plan:
            buckets = tuple(r for r in (2, 3, 5, 9, 17) if r <= self.options.rows)
            blocks = tuple(int(b) for b in self.blocks.choices) if self.blocks is not None else (STOCK_BLOCK,)
            self.planner = BudgetPlanner(costs, buckets, blocks=blocks, prior=plan_prior)
        # the AR gate: the step's own rows per request as the planner's one bucket
        self.gate = None
        if config.gate and not config.plan and not config.admission:
            self.gate = BudgetPlanner(costs, (self.options.rows,), blocks=(STOCK_BLOCK,), prior=plan_prior)
        self._rows = self.options.rows  # this step's rows per request (the planner's bucket)
        self._depth: dict[int, int] = {}  # slot -> deepest node of its share in this step
        self.stats = {"blocks": {}, "shares": [], "rows": {}}

    def step_rows(self, live: list[int]) -> tuple[int, bool]:
        """The planner's bucket for ``len(live)`` requests (1: an AR step), else the options' rows (or, gated, an AR
        step where the gate expects it faster)."""
        self._rows = self.planner.rows_for(len(live)) if self.planner is not None else self.options.rows
        if self.gate is not None and self.gate.rows_for(len(live)) == 1:
            self._rows = 1
        self.stats["rows"][self._rows] = self.stats["rows"].get(self._rows, 0) + 1
        return self._rows, self._rows == 1

    def step_done(self, live: list[int], committed: list[int], ar: bool) -> None:
        """The planner (or the gate) observes each speculative step: accepted nodes (committed - 1) and each share's
        depth."""
        planner = self.planner if self.planner is not None else self.gate
        if planner is None or ar:
            return
        depth = np.array([self._depth.get(s, 0) for s in live])
        planner.observe(np.asarray(committed) - 1, depth, self._rows)

    @torch.no_grad()
    def draft_trees(self, anchors: list[int], slots: list[int]) -> list[tuple[list[int], list[int]]]:
        n = len(slots)
        lengths = self.caches.lengths[slots]
        self._observe(slots, lengths.tolist())
        chosen = np.full(n, STOCK_BLOCK)
        if self.blocks is not None:
            chosen = self.blocks.choose(self._recent[slots], self._confidence[slots]).numpy()
        if self.planner is not None:
            chosen = np.minimum(chosen, self.planner.draft_block(self._rows))
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
        rows = n * self._rows if self.planner is not None else self.budget.rows_for(n)
        trees, _ = step_trees(groups, n, self.config, max(0, rows - n), cap=self._rows - 1)
        self.stats["shares"].append(trees.num_nodes.tolist())
        for block in chosen.tolist():
            self.stats["blocks"][block] = self.stats["blocks"].get(block, 0) + 1
        out = []
        for b, (slot, anchor) in enumerate(zip(slots, anchors)):
            k = int(trees.num_nodes[b])
            self._last[slot] = (int(lengths[b]), trees, b)
            self._depth[slot] = int(trees.depths[b, :k].max(initial=0))
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
