"""A node budget shared by the batch (``shared-budget``): each verify step checks ``R`` rows, every request's
root plus the top nodes by path log-probability over all requests' best-first trees, as one ragged pass.

dflash-tree builds each request's best-first tree of up to N nodes (``--specpilot-tree-nodes``); its nodes come
in best-first order (path scores never increase along it, a parent precedes its children). The nodes of one
request that make the global cut are then a prefix of its order: a valid tree (ties: the higher score, then the
lower request, then the earlier node — the order of the project's ``specpilot_mem.batching.shared_shares``,
which the entry's tests compare with). ``R`` is fixed (``--specpilot-shared-budget-rows``) or the end of the
plateau of the target's measured c(R) that the step's roots are on (``--specpilot-shared-budget-costs``).

This is SGLang 0.5.23's DSpark verify planner (``dspark_planner.py``: the top survival probabilities over all
requests' chain positions, verify lengths packed into a ``RaggedVerifyLayout``) carried over to trees: the
chain positions become tree nodes, ``verify_lens = 1 + share``, and each request's rows carry its tree's
ancestor mask. The shares stay tensors (no host synchronisation); the ragged layout reads the lengths on the
host once, as the DSpark planner does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.srt.specpilot.batching_checks.shared_budget import COSTS_FLAG, ROWS_FLAG, BudgetSettings, budget_settings
from sglang.srt.specpilot.dflash_tree import TreeStep
from sglang.srt.specpilot.kernels.draft_tree import DraftTree

# Its target verify reads ``spec_info.ragged_verify_layout`` (qo_indptr) with the custom mask, eagerly.
RAGGED_ATTENTION_BACKENDS = ("flashinfer",)


def shared_take(scores: torch.Tensor, nodes) -> torch.Tensor:
    """[B, N] bool: the global top-``nodes`` of all requests' nodes by score (finite scores only).

    Args:
        scores: [B, N] float path scores, each row in its best-first order, -inf past a tree's nodes (or where
            a node may not be taken).
        nodes: int or 0-dim int64 tensor: nodes to share (roots excluded).
    """
    b, n = scores.shape
    flat = scores.reshape(-1)
    order = torch.sort(flat, descending=True, stable=True).indices  # ties keep (request, node) order
    taken = torch.arange(b * n, device=scores.device) < torch.as_tensor(nodes, device=scores.device)
    taken &= flat[order] > float("-inf")
    return torch.zeros(b * n, dtype=torch.bool, device=scores.device).scatter_(0, order, taken).view(b, n)


def shared_shares(scores: torch.Tensor, nodes) -> torch.Tensor:
    """[B] int64 nodes per request of the global cut (with best-first rows: the first ``count[b]`` nodes)."""
    return shared_take(scores, nodes).sum(dim=1)


def compact_step(step: TreeStep, keep: torch.Tensor, anchor_tokens: torch.Tensor, prefix_lens: torch.Tensor) -> TreeStep:
    """The step's trees cut to the nodes in ``keep`` [B, N] (closed under ancestors), in their best-first order
    (parents renumbered), with the verify layout of the cut trees."""
    tree = step.tree
    b, n = keep.shape
    dev = keep.device
    index = torch.arange(n, device=dev).expand(b, n)
    order = torch.sort(torch.where(keep, index, index + n), dim=1).indices  # kept nodes first, order kept
    count = keep.sum(dim=1)
    valid = index < count[:, None]
    renumber = keep.cumsum(dim=1) - 1  # a kept node's new index
    parents = tree.parents.gather(1, order)
    parents = torch.where(valid & (parents >= 0), renumber.gather(1, parents.clamp(min=0)), -1)
    cut = DraftTree(parents, torch.where(valid, tree.depths.gather(1, order), 0),
                    torch.where(valid, tree.ranks.gather(1, order), -1),
                    torch.where(valid, tree.scores.gather(1, order), float("-inf")), count)
    node_tokens = torch.where(valid, step.tokens[:, 1:].gather(1, order), -1)
    out = TreeStep.from_tree(cut, node_tokens, anchor_tokens, prefix_lens)
    out.depth = step.depth
    return out


@dataclass
class RaggedTreeVerify:
    """A step's trees packed ragged: request b verifies its root and its ``num_nodes[b]`` nodes, one request
    after another (``verify_lens[b] = 1 + num_nodes[b]``, SGLang's ``RaggedVerifyLayout`` order).

    columns [T] int64: each packed row's flat column ``b * (N + 1) + c`` in the padded [B, N + 1] step;
    tokens, positions [T] int64; custom_mask: SGLang's flat target-verify mask, per request ``verify_lens[b]``
    rows of [prefix_len True | the tree row's first verify_lens[b] columns].
    """

    verify_lens: torch.Tensor
    columns: torch.Tensor
    tokens: torch.Tensor
    positions: torch.Tensor
    custom_mask: torch.Tensor
    cols: int

    @classmethod
    def from_step(cls, step: TreeStep, prefix_lens: torch.Tensor) -> "RaggedTreeVerify":
        b, cols = step.tokens.shape
        dev = step.tokens.device
        lens = step.tree.num_nodes.to(torch.int64) + 1
        grid = torch.arange(cols, device=dev).expand(b, cols)
        live = grid < lens[:, None]
        columns = (torch.arange(b, device=dev)[:, None] * cols + grid)[live]
        prefix = prefix_lens.to(torch.int64)
        widths = prefix + lens  # the key columns of each of the request's rows
        sizes = lens * widths
        start = torch.cumsum(sizes, 0) - sizes
        mask = torch.ones(int(sizes.sum()), dtype=torch.bool, device=dev)
        rows = start[:, None, None] + grid[:, :, None] * widths[:, None, None] + prefix[:, None, None] + grid[:, None, :]
        tree_part = live[:, :, None] & live[:, None, :]
        mask[rows[tree_part]] = step.layout.mask[tree_part]
        return cls(lens, columns, step.tokens.reshape(-1)[columns], step.layout.positions.reshape(-1)[columns], mask,
                   cols)

    def unpack(self, packed: torch.Tensor, fill=0) -> torch.Tensor:
        """[B, N + 1, ...] from the packed rows [T, ...] (the target's argmax, its hidden states); columns past
        a request's share get ``fill`` (they hold no node, so acceptance and the commit never read them)."""
        b = self.verify_lens.numel()
        out = packed.new_full((b * self.cols, *packed.shape[1:]), fill)
        out[self.columns] = packed
        return out.view(b, self.cols, *packed.shape[1:])

    def layout(self, device):
        """SGLang's ``RaggedVerifyLayout`` of these lengths (eager: one grid tier of exactly the packed rows)."""
        from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

        lens = self.verify_lens.tolist()
        return RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=lens, device=device, grid=[sum(lens)])


class SharedBudget:
    """The step's budget and its split, for dflash-tree's ``TreeDecoder``."""

    def __init__(self, settings: BudgetSettings, blocks=None):
        self.settings = settings
        self.blocks = blocks  # drafter-block's per-request state (None: every tree as deep as dflash-tree builds)

    @classmethod
    def from_worker(cls, worker, tree_settings) -> "SharedBudget | None":
        """None with the flags unset (dflash-tree's per-request trees); refuses, at start-up, what the ragged
        tree verify does not cover."""
        from sglang.srt.specpilot import option_value

        server_args = worker.target_worker.model_runner.server_args
        settings = budget_settings(option_value(ROWS_FLAG), option_value(COSTS_FLAG), nodes=tree_settings.nodes,
                                   max_running_requests=getattr(server_args, "max_running_requests", None))
        if settings is None:
            return None
        problems = []
        backend = str(server_args.attention_backend)
        if backend not in RAGGED_ATTENTION_BACKENDS:
            problems.append(f"--attention-backend {backend}: the ragged tree verify needs one of "
                            f"{RAGGED_ATTENTION_BACKENDS}")
        model_config = getattr(worker.target_worker.model_runner, "model_config", None)
        if model_config is not None:
            from sglang.srt.configs.hybrid_arch import mambaish_config

            if mambaish_config(model_config) is not None:
                problems.append("a hybrid (recurrent-state) target: gdn-tree's verify reads dense [B, N + 1] trees")
        if problems:
            raise ValueError("shared-budget cannot serve this configuration: " + "; ".join(problems))
        from sglang.srt.specpilot.drafter_block import BlockState

        return cls(settings, BlockState.from_worker(worker, tree_settings, shared=True))

    def share(self, step: TreeStep, anchor_tokens: torch.Tensor, prefix_lens: torch.Tensor,
              req_pool_indices: torch.Tensor) -> TreeStep:
        """The step's trees cut to their shares of the budget (every request keeps its root); with drafter
        blocks, each tree first capped at its request's block (ancestor-closed, so the cut is still a tree)."""
        b = step.tree.num_nodes.numel()
        scores = step.tree.scores
        if self.blocks is not None:
            caps = self.blocks.caps(req_pool_indices, prefix_lens)
            scores = torch.where(step.tree.depths <= caps[:, None], scores, float("-inf"))
        taken = shared_take(scores, self.settings.rows_for(b) - b)
        cut = compact_step(step, taken, anchor_tokens, prefix_lens)
        if self.blocks is not None:
            self.blocks.observe(req_pool_indices, cut.tree.depths, cut.tree.num_nodes)
        return cut
