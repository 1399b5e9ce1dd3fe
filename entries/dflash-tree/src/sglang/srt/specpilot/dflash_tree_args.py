"""Server-argument checks of ``dflash-tree``: bad draft-tree flags are refused while SGLang parses its
arguments (``handle_speculative_decoding``), naming the flag and the fix; nothing is resolved then.

Imports nothing heavy at module level (server_args imports it); the tree kernel's limits are read only
when a tree flag is given.
"""

from __future__ import annotations

from dataclasses import dataclass

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


TREE_ALGORITHMS = ("DFLASH", "DSPARK")
NO_LATTICE = {  # why a drafter of each algorithm can have no lattice, and the fix
    "DFLASH": ("the draft model has no candidate lattice (plain DFlash: dflash_config has no selector_rank / "
               "selector_top_k)", "use a DFlash2 drafter (a CandidateSelector checkpoint), or drop the flag"),
    "DSPARK": ("the DSpark drafter's Markov head is recurrent (markov_head_type rnn): its bias depends on the whole "
               "path, not only the parent, so it gives no lattice", "use a DSpark drafter with a vanilla or gated "
               "(first-order) Markov head, or drop the flag"),
}


def tree_settings(nodes, depth, drafted_positions, *, algorithm: str | None, trained_block: int | None,
                  selector_top_k: int) -> TreeSettings | None:
    """Checked settings from the flag values (None: trees off, stock's chain).

    ``trained_block`` is the drafter's block (anchor + drafted positions) from its config; ``selector_top_k``
    the lattice's K: DFlash2's CandidateSelector top-K, DSpark's candidates of a first-order Markov head
    (0: no lattice: a plain DFlash drafter, a recurrent DSpark head).
    """
    if nodes is None:
        for flag, value in zip(TREE_FLAGS[1:], (depth, drafted_positions)):
            if value is not None:
                raise TreeArgumentError(flag, "is set without --specpilot-tree-nodes",
                                        "give --specpilot-tree-nodes N (e.g. 32) to draft trees, or drop the flag")
        return None
    if algorithm not in TREE_ALGORITHMS:
        raise TreeArgumentError("--specpilot-tree-nodes", f"draft trees are built for DFLASH (DFlash2) and DSPARK, "
                                f"not {algorithm}", "use --speculative-algorithm DFLASH with a DFlash2 (selector) "
                                "drafter or DSPARK with a first-order Markov head, or drop the flag")
    if not selector_top_k:
        raise TreeArgumentError("--specpilot-tree-nodes", *NO_LATTICE[algorithm])
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
    from sglang.srt.specpilot.kernels.draft_tree.build import max_tree_depth

    if selector_top_k & (selector_top_k - 1):
        raise TreeArgumentError("--specpilot-tree-nodes", f"the drafter's K={selector_top_k} candidates is not a power "
                                "of two (the tree kernel's path key)", "use a drafter with a power-of-two selector_top_k")
    deepest = max_tree_depth(selector_top_k)
    if depth is None:  # as deep as the drafted positions and the kernel's path key allow (15 at K = 16)
        depth = min(drafted_positions, deepest)
    if depth < 1 or depth > drafted_positions:
        raise TreeArgumentError("--specpilot-tree-depth", f"{depth} is outside 1..{drafted_positions} (the drafted "
                                "positions: a level past them has no candidates)",
                                f"give a depth between 1 and {drafted_positions}, or more drafted positions")
    if depth > deepest:
        raise TreeArgumentError("--specpilot-tree-depth", f"depth {depth} with K={selector_top_k} candidates does not "
                                f"fit the tree kernel's path key ({deepest} levels)", f"give a depth of at most {deepest}")
    return TreeSettings(int(nodes), int(depth), int(drafted_positions), int(selector_top_k))


def check_server_args(server_args) -> TreeSettings | None:
    """Called by ``handle_speculative_decoding`` before any algorithm resolves: refuse bad tree flags
    (nothing is changed then). With every tree flag unset it returns None at once: stock."""
    nodes = getattr(server_args, "specpilot_tree_nodes", None)
    depth = getattr(server_args, "specpilot_tree_depth", None)
    drafted = getattr(server_args, "specpilot_tree_drafted_positions", None)
    if nodes is None and depth is None and drafted is None:
        return None
    trained_block, top_k = None, 0
    if nodes is not None and server_args.speculative_algorithm == "DFLASH":
        trained_block, top_k = _draft_lattice_shape(server_args)
    if nodes is not None and server_args.speculative_algorithm == "DSPARK":
        trained_block, top_k = _dspark_lattice_shape(server_args)
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


DSPARK_TREE_CANDIDATES = 16  # a DSpark lattice's candidates per position: the top-16 of its base logits
FIRST_ORDER_MARKOV_HEADS = ("vanilla", "gated")  # their bias reads only x_{s-1} (the node's parent)


def _dspark_lattice_shape(server_args) -> tuple[int | None, int]:
    """(block size, candidates) of a DSpark drafter: its block is gamma + 1; a first-order Markov head gives a
    lattice of ``DSPARK_TREE_CANDIDATES``, a recurrent one none. An unreadable config is refused."""
    from sglang.srt.speculative.dspark_components.dspark_config import read_draft_checkpoint_config

    try:
        config = read_draft_checkpoint_config(server_args=server_args)
    except Exception as err:  # noqa: BLE001 - any failure means the lattice cannot be confirmed
        raise TreeArgumentError("--specpilot-tree-nodes", f"the DSpark draft model's config could not be read ({err})",
                                "pass a readable DSpark --speculative-draft-model-path") from err
    gamma = config.resolve_gamma(default=None)
    head = str(config.markov_head_type or "vanilla").lower()  # SGLang's default head (build_markov_head)
    top_k = DSPARK_TREE_CANDIDATES if config.require_markov() and head in FIRST_ORDER_MARKOV_HEADS else 0
    return None if gamma is None else int(gamma) + 1, top_k


def declare_tree_resolution(server_args, settings: TreeSettings | None) -> None:
    """After DFLASH / DSPARK resolved: the verify window (``speculative_num_draft_tokens``, which sizes the KV the
    scheduler reserves per request and step) becomes the tree's N + 1 tokens when that exceeds the draft
    block. No-op with trees off."""
    if settings is None:
        return
    from sglang.srt.arg_groups.overrides import declare_resolution

    window = max(settings.verify_tokens, settings.drafted_positions + 1)
    declare_resolution(server_args, "specpilot.dflash_tree", speculative_num_draft_tokens=window)
