"""Best-first draft trees for DFlash2 (``dflash-tree``): server-argument checks and the verify step's tensors.

With ``--specpilot-tree-nodes N`` a DFlash2 step drafts ``P`` positions, takes the selector lattice
(``CandidateSelector.compute_candidates`` top-K per position and ``build_lattice``'s pair scores
``score[b, e, p, c]`` of candidate c at position e given candidate p at e - 1), builds each request's
best-first tree of N nodes on the GPU (the vendored ``draft_tree`` kernel: log-softmax of the scores given
the node's parent, prefix-closed, depth <= ``--specpilot-tree-depth``), and verifies the root (the last
committed token) and the N nodes in one target pass through SGLang's tree path: a custom attention mask
(prefix + ancestors), positions root + depth, and the ``retrieve_next_token`` / ``retrieve_next_sibling``
lists the hybrid GDN backend turns into ``retrieve_parent_token`` (what ``gdn-tree`` consumes). Greedy
acceptance takes the longest matching root path plus the bonus; the accepted columns' KV slots move to the
front of the request's verify window in path order (their hidden states are what the draft KV gets) and the
rejected nodes' slots go back behind them, free for the next step.

Everything here is pure torch on SGLang's tensors; with the flags unset nothing of it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.srt.specpilot.kernels.draft_tree import (
    Acceptance,
    DraftTree,
    VerifyLayout,
    best_first_tree,
    greedy_accept,
    verify_layout,
)
from sglang.srt.specpilot.kernels.draft_tree.build import MAX_PATH_BITS, path_bits

# Verify tokens per request with the root: the gdn-tree verify scratch and the tree kernel's node columns.
MAX_VERIFY_TOKENS = 64
MAX_TREE_NODES = MAX_VERIFY_TOKENS - 1
TREE_FLAGS = ("--specpilot-tree-nodes", "--specpilot-tree-depth", "--specpilot-tree-drafted-positions")


class TreeArgumentError(ValueError):
    """A tree flag SGLang cannot serve; the message names the flag and the fix."""

    def __init__(self, flag: str, problem: str, fix: str):
        super().__init__(f"{flag}: {problem}. Fix: {fix}.")
        self.flag, self.problem, self.fix = flag, problem, fix


@dataclass(frozen=True)
class TreeSettings:
    nodes: int
    depth: int
    drafted_positions: int
    candidates: int

    @property
    def verify_tokens(self) -> int:
        return self.nodes + 1


def tree_settings(nodes, depth, drafted_positions, *, algorithm: str | None, trained_block: int | None,
                  selector_top_k: int) -> TreeSettings | None:
    """Checked settings from the flag values (None: trees off, stock's chain).

    ``trained_block`` is the drafter's block (anchor + drafted positions) from its config; ``selector_top_k``
    its CandidateSelector's K (0: a plain DFlash drafter without a lattice).
    """
    if nodes is None:
        for flag, value in zip(TREE_FLAGS[1:], (depth, drafted_positions)):
            if value is not None:
                raise TreeArgumentError(flag, "is set without --specpilot-tree-nodes",
                                        "give --specpilot-tree-nodes N (e.g. 32) to draft trees, or drop the flag")
        return None
    if algorithm != "DFLASH":
        raise TreeArgumentError("--specpilot-tree-nodes", f"draft trees are built for DFLASH (DFlash2), not {algorithm}",
                                "use --speculative-algorithm DFLASH with a DFlash2 (selector) drafter, or drop the flag")
    if not selector_top_k:
        raise TreeArgumentError("--specpilot-tree-nodes", "the draft model has no candidate lattice (plain DFlash: "
                                "dflash_config has no selector_rank / selector_top_k)",
                                "use a DFlash2 drafter (a CandidateSelector checkpoint), or drop the flag")
    if nodes < 1 or nodes > MAX_TREE_NODES:
        raise TreeArgumentError("--specpilot-tree-nodes", f"{nodes} is outside 1..{MAX_TREE_NODES} (the verify buffers "
                                f"hold {MAX_VERIFY_TOKENS} tokens per request, the root included)",
                                f"give a budget between 1 and {MAX_TREE_NODES} (32 is the tested default)")
    if drafted_positions is None:
        if trained_block is None:
            raise TreeArgumentError("--specpilot-tree-drafted-positions", "the drafter's block size is unknown",
                                    "give --specpilot-tree-drafted-positions P (e.g. 16)")
        drafted_positions = int(trained_block) - 1
    if drafted_positions < 1:
        raise TreeArgumentError("--specpilot-tree-drafted-positions", f"{drafted_positions} drafts nothing",
                                "give at least 1 drafted position")
    depth = drafted_positions if depth is None else depth
    if depth < 1 or depth > drafted_positions:
        raise TreeArgumentError("--specpilot-tree-depth", f"{depth} is outside 1..{drafted_positions} (the drafted "
                                "positions: a level past them has no candidates)",
                                f"give a depth between 1 and {drafted_positions}, or more drafted positions")
    bits = path_bits(selector_top_k)
    if selector_top_k & (selector_top_k - 1) or depth * bits > MAX_PATH_BITS:
        raise TreeArgumentError("--specpilot-tree-depth", f"depth {depth} with K={selector_top_k} candidates does not "
                                f"fit the tree kernel (power-of-two K, depth * log2 K <= {MAX_PATH_BITS})",
                                f"give a depth of at most {MAX_PATH_BITS // bits}")
    return TreeSettings(int(nodes), int(depth), int(drafted_positions), int(selector_top_k))


def resolve_server_args(server_args) -> TreeSettings | None:
    """Called at the end of ``_handle_dflash``: refuse bad tree flags while parsing (nothing is changed
    then). With ``--specpilot-tree-nodes`` unset and no other tree flag it returns at once: stock."""
    nodes = getattr(server_args, "specpilot_tree_nodes", None)
    depth = getattr(server_args, "specpilot_tree_depth", None)
    drafted = getattr(server_args, "specpilot_tree_drafted_positions", None)
    if nodes is None and depth is None and drafted is None:
        return None
    trained_block, top_k = None, 0
    if nodes is not None and server_args.speculative_algorithm == "DFLASH":
        trained_block, top_k = _draft_lattice_shape(server_args)
    return tree_settings(nodes, depth, drafted, algorithm=server_args.speculative_algorithm,
                         trained_block=trained_block, selector_top_k=top_k)


def _draft_lattice_shape(server_args) -> tuple[int | None, int]:
    """(block size, selector top-K) from the draft model's config; an unreadable config is refused."""
    import json

    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    from sglang.srt.utils.hf_transformers_utils import get_config

    try:
        config = get_config(server_args.speculative_draft_model_path, trust_remote_code=server_args.trust_remote_code,
                            revision=server_args.speculative_draft_model_revision,
                            model_override_args=json.loads(server_args.json_model_override_args))
    except Exception as err:  # noqa: BLE001 - any failure means the lattice cannot be confirmed
        raise TreeArgumentError("--specpilot-tree-nodes", f"the draft model's config could not be read ({err})",
                                "pass a readable DFlash2 --speculative-draft-model-path") from err
    parsed = parse_dflash_draft_config(draft_hf_config=config)
    return parsed.resolve_block_size(default=None), int(parsed.selector_top_k or 0)


@dataclass
class TreeStep:
    """One verify step's trees for a batch: built from the lattice, laid out for the target's verify.

    tree: ``DraftTree`` [B, N]; tokens [B, N+1] int64 (column 0: the root/anchor token, padding columns carry
    the root token and are never accepted); layout: ``VerifyLayout`` (mask [B, N+1, N+1], positions, retrieve
    indices, parent columns).
    """

    tree: DraftTree
    tokens: torch.Tensor
    layout: VerifyLayout

    @classmethod
    def build(cls, settings: TreeSettings, candidate_ids: torch.Tensor, scores: torch.Tensor,
              anchor_tokens: torch.Tensor, prefix_lens: torch.Tensor) -> "TreeStep":
        """candidate_ids [B, P, K] and scores [B, P, K, K] (``_selector_lattice``); anchor_tokens [B];
        prefix_lens [B] committed lengths (the anchor sits at position prefix_lens)."""
        tree, node_tokens, next_token, next_sibling = best_first_tree(
            scores, candidate_ids, settings.nodes, settings.depth)
        anchor = anchor_tokens.to(torch.int64)[:, None]
        tokens = torch.cat([anchor, torch.where(node_tokens >= 0, node_tokens, anchor)], dim=1)
        layout = verify_layout(tree, next_token, next_sibling, prefix_lens.to(torch.int64))
        return cls(tree, tokens, layout)

    def custom_mask(self, prefix_lens: torch.Tensor) -> torch.Tensor:
        """SGLang's flat target-verify mask (Triton / FlashInfer backends): per request, N+1 rows of
        [prefix_len True | the tree row], requests one after another."""
        b, cols, _ = self.layout.mask.shape
        prefix = prefix_lens.to(torch.int64)
        widths = prefix + cols  # per row
        row_start = torch.cumsum(torch.cat([prefix.new_zeros(1), (widths * cols)[:-1]]), 0)
        total = int((widths * cols).sum())
        out = torch.ones(total, dtype=torch.bool, device=self.layout.mask.device)
        rows = torch.arange(cols, device=out.device)
        starts = row_start[:, None] + rows[None, :] * widths[:, None] + prefix[:, None]  # [B, cols]
        index = starts[:, :, None] + rows[None, None, :]
        out[index.reshape(-1)] = self.layout.mask.reshape(-1)
        return out

    def accept(self, target_predict: torch.Tensor) -> Acceptance:
        """target_predict [B, N+1]: the target's argmax at each verify column."""
        return greedy_accept(self.tokens[:, 1:], self.tree.parents, self.tree.depths, self.tree.num_nodes,
                             target_predict)

    def commit_order(self, acceptance: Acceptance) -> torch.Tensor:
        """[B, N+1] int64 permutation of the verify columns: the accepted path (root first) then every
        other column in index order. Gathering a request's verify-window KV slots and hidden rows with it puts
        the committed tokens at positions prefix .. prefix + accept_length and the rejected nodes' slots after
        them (free: the next step writes its window over them)."""
        b, cols = self.tokens.shape
        columns = acceptance.accept_columns
        dev = columns.device
        key = torch.cat([cols + torch.arange(cols, device=dev).expand(b, cols),
                         torch.zeros((b, 1), dtype=torch.int64, device=dev)], dim=1)  # last column: a sink
        path_slot = torch.arange(columns.shape[1], device=dev).expand_as(columns)
        key.scatter_(1, torch.where(columns >= 0, columns, cols), path_slot)
        return torch.argsort(key[:, :cols], dim=1)

    def commit_tokens(self, acceptance: Acceptance) -> tuple[torch.Tensor, torch.Tensor]:
        """(out_tokens [B, N+1], commit_lens [B] int32) in DFlash's ``_commit_accept`` form: the accepted
        nodes' tokens then the bonus, zeros after."""
        b, cols = self.tokens.shape
        path = acceptance.accept_columns[:, 1:]
        tokens = torch.where(path >= 0, torch.gather(self.tokens, 1, path.clamp(min=0)), 0)
        out = torch.zeros((b, cols), dtype=torch.int64, device=tokens.device)
        out[:, : tokens.shape[1]] = tokens
        out.scatter_(1, acceptance.accept_length[:, None], acceptance.bonus[:, None])
        return out, (acceptance.accept_length + 1).to(torch.int32)


def permute_window_slots(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                         order: torch.Tensor) -> torch.Tensor:
    """Reorder each request's verify-window slots in ``req_to_token`` by ``order`` [B, N+1] (in place) and
    return the window's slots in the new order [B, N+1]: committed tokens first, rejected slots behind."""
    b, cols = order.shape
    positions = prefix_lens.to(torch.int64)[:, None] + torch.arange(cols, device=order.device)[None, :]
    rows = req_pool_indices.to(torch.int64)[:, None].expand(b, cols)
    slots = req_to_token[rows, positions]
    reordered = torch.gather(slots, 1, order)
    req_to_token[rows, positions] = reordered
    return reordered
