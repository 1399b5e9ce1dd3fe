"""Figure 10 of the paper for any lattice set: τ in exact replay against the node budget N, one line
per (lattice positions, builder): color by builder (the stock chain gray, the oracle black), line
style by the lattice's number of positions."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from specpilot_mem.optional import pyplot
from specpilot_mem.replay.replay import ReplayRun

COLORS = {
    "chain": "0.55",
    "oracle": "black",
    "best-first": "tab:blue",
    "ddtree": "tab:orange",
    "eagle2": "tab:green",
    "sequoia": "tab:red",
}
LINESTYLES = ("-", "--", "-.", ":")  # by lattice positions, most positions first


def plot_tau(runs: list[ReplayRun], path: str | os.PathLike) -> Path:
    path = Path(path)
    plt = pyplot("Figure 10 (replay --figure)")
    fig, ax = plt.subplots(figsize=(8.0, 4.2), dpi=150)
    series: dict[tuple[int, str], list[ReplayRun]] = {}
    for run in runs:
        series.setdefault((run.positions, run.builder), []).append(run)
    sizes = sorted({r.positions for r in runs}, reverse=True)
    for (positions, builder), members in sorted(series.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        members.sort(key=lambda r: r.nodes)
        ax.plot(
            [r.nodes for r in members],
            [r.tau for r in members],
            marker="o",
            markersize=3,
            color=COLORS.get(builder),
            linestyle=LINESTYLES[sizes.index(positions) % len(LINESTYLES)],
            label=f"{builder}, {positions} positions",
        )
    ax.set_xscale("log", base=2)
    budgets = sorted({r.nodes for r in runs})
    ax.set_xticks(budgets, [str(n) for n in budgets])
    ax.set_xlabel("verified nodes N")
    ax.set_ylabel("tokens per step τ")
    synthetic = any(r.synthetic for r in runs)
    ax.set_title("Exact replay" + (" (SYNTHETIC lattices)" if synthetic else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # outside: lines stay readable
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tau-", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)
    return path
