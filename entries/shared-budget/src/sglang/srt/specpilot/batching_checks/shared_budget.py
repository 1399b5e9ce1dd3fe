"""``shared-budget``'s flags, checked while SGLang parses its arguments, and the settings its runtime reads."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.specpilot.batching_args import (
    PLATEAU_TOLERANCE,
    BatchingArgumentError,
    CostCurve,
    load_cost_curve,
)

ROWS_FLAG = "--specpilot-shared-budget-rows"
COSTS_FLAG = "--specpilot-shared-budget-costs"


@dataclass(frozen=True)
class BudgetSettings:
    """rows: a fixed budget; curve: the target's c(R) (the budget at the plateau's end) — one of the two.
    nodes: the most nodes one request's tree holds (dflash-tree's N)."""

    nodes: int
    rows: int | None = None
    curve: CostCurve | None = None
    tolerance: float = PLATEAU_TOLERANCE

    def rows_for(self, requests: int) -> int:
        """Verify rows (roots included) of a step with ``requests`` requests in flight; never more than their
        trees hold (N + 1 each)."""
        most = requests * (self.nodes + 1)
        if self.rows is not None:
            if self.rows < requests:
                raise BatchingArgumentError(ROWS_FLAG, f"{self.rows} rows are fewer than the {requests} requests "
                                            "in flight (each needs its root row)",
                                            f"use at least {requests} rows, or fewer requests in flight")
            return min(self.rows, most)
        return min(self.curve.plateau_end(requests, self.tolerance), most)


def budget_settings(rows, costs, *, nodes, max_running_requests) -> BudgetSettings | None:
    """Checked settings from the flag values (None: flags unset, stock). ``nodes``: ``--specpilot-tree-nodes``."""
    if rows is None and costs is None:
        return None
    flag = ROWS_FLAG if rows is not None else COSTS_FLAG
    if rows is not None and costs is not None:
        raise BatchingArgumentError(ROWS_FLAG, f"is given with {COSTS_FLAG} (a fixed budget or the plateau's, not both)",
                                    "drop one of the two flags")
    if nodes is None:
        raise BatchingArgumentError(flag, "shares a node budget over draft trees, and no tree is drafted",
                                    "give --specpilot-tree-nodes N (the most nodes one request may take, e.g. 32)")
    if costs is not None:
        return BudgetSettings(int(nodes), curve=load_cost_curve(costs, COSTS_FLAG))
    if rows < 1:
        raise BatchingArgumentError(ROWS_FLAG, f"{rows} rows verify nothing", "give at least one row per request")
    if max_running_requests is None:
        raise BatchingArgumentError(ROWS_FLAG, f"a fixed budget of {rows} rows needs the requests in flight bounded "
                                    "(each needs its root row)", f"give --max-running-requests {rows} or fewer")
    if rows < max_running_requests:
        raise BatchingArgumentError(ROWS_FLAG, f"{rows} rows are fewer than the {max_running_requests} requests in "
                                    "flight (--max-running-requests; each needs its root row)",
                                    f"give at least {max_running_requests} rows, or --max-running-requests {rows}")
    buffers = max_running_requests * (int(nodes) + 1)
    if rows > buffers:
        raise BatchingArgumentError(ROWS_FLAG, f"{rows} rows exceed what the verify buffers hold ({buffers}: "
                                    f"{max_running_requests} requests x {int(nodes) + 1} tokens)",
                                    f"give at most {buffers} rows, or a larger --specpilot-tree-nodes")
    return BudgetSettings(int(nodes), rows=int(rows))


def check(server_args) -> BudgetSettings | None:
    settings = budget_settings(getattr(server_args, "specpilot_shared_budget_rows", None),
                           getattr(server_args, "specpilot_shared_budget_costs", None),
                           nodes=getattr(server_args, "specpilot_tree_nodes", None),
                           max_running_requests=getattr(server_args, "max_running_requests", None))
    if settings is not None and getattr(server_args, "specpilot_tlv", False):
        raise BatchingArgumentError(ROWS_FLAG if settings.rows is not None else COSTS_FLAG,
                                    "is not covered with --specpilot-tlv (the TLV cycle verifies its own trees)",
                                    "drop --specpilot-tlv or the shared budget")
    return settings
