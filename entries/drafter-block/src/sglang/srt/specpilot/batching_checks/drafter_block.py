"""``drafter-block``'s flags, checked while SGLang parses its arguments, and the settings its runtime reads."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.specpilot.batching_args import BatchingArgumentError, CostCurve, load_cost_curve

BLOCKS_FLAG = "--specpilot-drafter-blocks"
COSTS_FLAG = "--specpilot-drafter-costs"


@dataclass(frozen=True)
class BlockSettings:
    """choices: the blocks, increasing; curve: the drafter's c(R)."""

    choices: tuple[int, ...]
    curve: CostCurve


def block_settings(blocks, costs, *, drafted_positions, shared) -> BlockSettings | None:
    """Checked settings from the flag values (None: flags unset, stock). ``drafted_positions``: the positions the
    tree step drafts (what one drafter forward can draft); ``shared``: a shared budget is set."""
    if blocks is None:
        if costs is not None:
            raise BatchingArgumentError(COSTS_FLAG, f"is set without {BLOCKS_FLAG}",
                                        f"give {BLOCKS_FLAG} (e.g. 16,12,8), or drop the flag")
        return None
    try:
        choices = sorted({int(b) for b in str(blocks).split(",") if b.strip()})
    except ValueError as err:
        raise BatchingArgumentError(BLOCKS_FLAG, f"{blocks!r} is not a comma-separated list of block sizes",
                                    "give e.g. 16,12,8") from err
    if not shared:
        raise BatchingArgumentError(BLOCKS_FLAG, "caps each request's share of a shared node budget, and none is set",
                                    "give --specpilot-shared-budget-rows or --specpilot-shared-budget-costs")
    bad = [b for b in choices if not 1 <= b <= drafted_positions]
    if not choices or bad:
        raise BatchingArgumentError(BLOCKS_FLAG, f"block {bad[0] if bad else '(none)'} cannot be drafted: the drafter "
                                    f"drafts 1..{drafted_positions} positions per forward",
                                    f"choose blocks between 1 and {drafted_positions}, e.g. 16,12,8")
    if costs is None:
        raise BatchingArgumentError(COSTS_FLAG, "is needed with --specpilot-drafter-blocks (the drafter's plateau)",
                                    "give the drafter pass's measured c(R) file")
    return BlockSettings(tuple(choices), load_cost_curve(costs, COSTS_FLAG))


def check(server_args) -> BlockSettings | None:
    blocks = getattr(server_args, "specpilot_drafter_blocks", None)
    costs = getattr(server_args, "specpilot_drafter_costs", None)
    if blocks is None and costs is None:
        return None
    shared = (getattr(server_args, "specpilot_shared_budget_rows", None) is not None
              or getattr(server_args, "specpilot_shared_budget_costs", None) is not None)
    drafted = getattr(server_args, "specpilot_tree_drafted_positions", None)
    if blocks is not None and shared and drafted is None and getattr(server_args, "specpilot_tree_nodes", None):
        from sglang.srt.specpilot.dflash_tree_args import _draft_lattice_shape

        trained_block, _ = _draft_lattice_shape(server_args)
        drafted = None if trained_block is None else int(trained_block) - 1
    return block_settings(blocks, costs, drafted_positions=drafted or 0, shared=shared)
