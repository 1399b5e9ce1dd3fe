"""Live batched decoding with the batching policies on the pure-torch engine (``specpilot_mem.engine``), for
token forcing: B requests step together, each in its own cache over the engine's weights; every step the
policies decide each request's drafter block, its share of the node budget and the prompt rows admitted,
exactly as in ``simulate`` (the same ``step_trees`` / ``block_signals``), and each request verifies its own
tree against the target.

The engine verifies one request per forward, so this checks what the policies decide (the outputs are the
target's greedy decode whatever they choose), not their speed; the step costs they decide from are
``StepCosts``. Prompts admitted into verify steps are prefilled in the segments the admission plans, one
after another in the request's cache (stock scheduling prefills a prompt whole on arrival).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from specpilot_mem.batching.admission import PromptAdmission
from specpilot_mem.batching.blocks import DrafterBlocks
from specpilot_mem.batching.budget import SharedBudget
from specpilot_mem.batching.costs import BatchingError, StepCosts
from specpilot_mem.batching.simulate import STOCK_BLOCK, Mechanisms, block_signals, step_trees
from specpilot_mem.engine.engine import Engine, Generation, Request
from specpilot_mem.engine.model import lm_head, make_rows
from specpilot_mem.replay.trees.base import DraftTrees, StepBatch
from specpilot_mem.replay.verify import verify_against_argmax


class _Slot:
    def __init__(self, engine: Engine, request: Request, largest_block: int):
        self.engine, self.request = engine, request
        self.prefilled, self.outputs, self.times, self.accepted = 0, [], [], []
        self.recent, self.confidence = float(largest_block), 0
        self.start = time.perf_counter()
        engine.cache.reset()

    @property
    def decoding(self) -> bool:
        return self.prefilled == len(self.request.prompt_ids)

    @property
    def done(self) -> bool:
        return len(self.outputs) >= self.request.max_new_tokens

    def prefill(self, rows: int) -> None:
        """The next ``rows`` prompt tokens; the first output token once the prompt is in."""
        prompt = self.request.prompt_ids
        hidden = self.engine.prefill(prompt[self.prefilled : self.prefilled + rows])
        self.prefilled += min(rows, len(prompt) - self.prefilled)
        if self.decoding:
            head = self.engine.target.lm_head_weight
            first = lm_head(hidden[-1:], head, self.engine.options.lm_head, self.engine.options.splitk_chunks)
            self._emit([int(first.argmax(-1))])

    def _emit(self, tokens: list[int]) -> None:
        self.outputs.extend(tokens)
        self.times.extend([time.perf_counter() - self.start] * len(tokens))

    def verify(self, trees: DraftTrees, b: int) -> int:
        """Verify row b of ``trees`` below the pending token; commit the accepted path. Returns the drafted
        nodes accepted."""
        n = int(trees.num_nodes[b])
        tokens = [self.outputs[-1]] + [int(t) for t in trees.tokens[b, :n]]
        parents = [-1] + [int(p) + 1 for p in trees.parents[b, :n]]
        rows = make_rows(tokens, parents, self.engine.target.cfg.conv_size, self.engine.device)
        logits, pending = self.engine.verify(rows)
        argmax = logits.argmax(-1).cpu().numpy()[None]
        single = DraftTrees(
            *(
                np.asarray(getattr(trees, f)[b : b + 1])
                for f in ("parents", "depths", "ranks", "tokens", "scores", "num_nodes")
            )
        )
        verdict, bonus = verify_against_argmax(single, argmax)
        path = verdict.path(single, 0)
        self.engine.cache.commit(pending, [0] + [i + 1 for i in path])
        new = [int(single.tokens[0, i]) for i in path] + [int(bonus[0])]
        self._emit(new)
        self.accepted.append(len(new))
        return int(verdict.accepted[0])

    def generation(self) -> Generation:
        n = self.request.max_new_tokens
        total = time.perf_counter() - self.start
        return Generation(
            self.request.id,
            list(self.request.prompt_ids),
            self.outputs[:n],
            self.times[:n],
            total,
            len(self.accepted),
            self.accepted,
        )


class LockstepServer:
    """``batch`` request slots over ``engine``'s weights, decoding ``config`` (``simulate.CONFIGS``) with the
    policies deciding from ``costs``. ``segment``: prompt rows per admitted segment."""

    def __init__(
        self,
        engine: Engine,
        config: Mechanisms,
        costs: StepCosts,
        batch: int,
        segment: int | None = 64,
        verify_buffer: int = 2048,
        budget_rows: int | None = None,
        admit_always: bool = False,
    ):
        if engine.drafter is None and config.speculate:
            raise BatchingError("speculative batching needs a drafter", where="engine", fix="load the trained pair")
        if config.speculate and engine.drafter.cfg.block_size < STOCK_BLOCK:
            raise BatchingError(
                f"the drafter drafts {engine.drafter.cfg.block_size} positions; stock drafts {STOCK_BLOCK}",
                where="engine",
                fix="use a drafter trained on 16-position blocks",
            )
        self.engine, self.config, self.costs, self.batch = engine, config, costs, batch
        self.budget = SharedBudget(costs.target, verify_buffer, budget_rows)
        self.blocks = DrafterBlocks(STOCK_BLOCK, costs.drafter) if config.blocks else None
        self.admission = (
            PromptAdmission(costs.target, verify_buffer, segment, always=admit_always) if config.admission else None
        )
        # what the policies decided: blocks drafted, prompt rows per prefill, nodes per request per step
        self.stats = {"blocks": {}, "prefill_rows": [], "shares": [], "admitted_steps": 0}

    @torch.no_grad()
    def run(self, requests: list[Request]) -> list[Generation]:
        queue, slots, finished = list(requests), [], {}
        while queue or slots:
            while queue and len(slots) < self.batch:
                slot = _Slot(self.engine.with_options(), queue.pop(0), STOCK_BLOCK)
                slots.append(slot)
                if self.admission is None:
                    slot.prefill(len(slot.request.prompt_ids))
                    self.stats["prefill_rows"].append(len(slot.request.prompt_ids))
            self._step(slots)
            for slot in [s for s in slots if s.done]:
                finished[slot.request.id] = slot.generation()
                slots.remove(slot)
        return [finished[r.id] for r in requests]

    def _step(self, slots: list[_Slot]) -> None:
        decoding = [s for s in slots if s.decoding and not s.done]
        waiting = [s for s in slots if not s.decoding]
        n = len(decoding)
        chain_rows = STOCK_BLOCK * n if self.config.speculate and self.config.tree == "chain" else 0
        if waiting:
            left = torch.tensor([len(s.request.prompt_ids) - s.prefilled for s in waiting])
            admitted = [0] * len(waiting)
            if n and self.admission is not None:
                step_ms = self.costs.draft_ms(n * (STOCK_BLOCK + 1), n) + self.costs.verify_ms(
                    self.budget.rows_for(n), n
                )
                if self.admission.pays(
                    n + chain_rows, int(left.sum()), n, step_ms, self.costs.prefill_ms(int(left.max()))
                ):
                    admitted = self.admission.plan(n + chain_rows, left)[0].tolist()
                    self.stats["admitted_steps"] += int(any(admitted))
            if not any(admitted):  # no spare rows, or admitting does not pay: prefill as stock does
                admitted = left.tolist()
            for slot, rows in zip(waiting, admitted):
                if rows:
                    slot.prefill(rows)
                    self.stats["prefill_rows"].append(int(rows))
        if not decoding:
            return
        if not self.config.speculate:
            empty = DraftTrees(
                *(np.zeros((n, 0), dtype=d) for d in (np.int64, np.int64, np.int64, np.int64, np.float32)),
                np.zeros(n, np.int64),
            )
            for b, slot in enumerate(decoding):
                slot.verify(empty, b)
            return
        chosen = np.full(n, STOCK_BLOCK)
        if self.blocks is not None:
            recent = torch.tensor([s.recent for s in decoding])
            confidence = torch.tensor([s.confidence for s in decoding])
            chosen = self.blocks.choose(recent, confidence).numpy()
        groups = []
        for block in np.unique(chosen):
            mine = np.flatnonzero(chosen == block)
            lattices = [
                decoding[i].engine.draft(decoding[i].outputs[-1], int(block), int(block)).to("cpu") for i in mine
            ]
            groups.append(
                (
                    mine,
                    StepBatch.from_scores(
                        torch.stack([lat.cand for lat in lattices]),
                        torch.stack([lat.unary for lat in lattices]),
                        torch.stack([lat.pair for lat in lattices]),
                    ),
                )
            )
        rows = self.budget.rows_for(n)
        trees, _ = step_trees(groups, n, self.config, max(0, rows - n))
        self.stats["shares"].append(trees.num_nodes.tolist())
        for block in chosen.tolist():
            self.stats["blocks"][block] = self.stats["blocks"].get(block, 0) + 1
        accepted = np.array([slot.verify(trees, b) for b, slot in enumerate(decoding)])
        if self.blocks is not None:
            recent, confidence = block_signals(
                self.blocks, torch.tensor([s.recent for s in decoding]), trees, accepted, self.config
            )
            for b, slot in enumerate(decoding):
                slot.recent, slot.confidence = float(recent[b]), int(confidence[b])
