"""The paper's Figure 4: mismatch rates of stock and the judged systems, as a matplotlib PNG.

Bars give each mismatch rate with its 95% interval (clustered by request); a dashed line over each
stock's group marks the rate-rule limit (stock's rate + 0.5 points); above every system's bar are its
verdict and its count of large-margin events. Verdicts that share a stock run share one stock bar.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from specpilot_mem.forcing.verdict import Verdict
from specpilot_mem.optional import pyplot

COLORS = {"stock": "#9AA1AB", "accept": "#1F6FD6", "reject": "#E8613C", "inconclusive": "#E3B53B"}


def plot_figure4(verdicts: Sequence[Verdict], path: str | Path, title: str | None = None) -> Path:
    plt = pyplot("Figure 4 (tf --figure)")

    groups: dict[tuple[str, float], list[Verdict]] = {}
    for verdict in verdicts:
        groups.setdefault((verdict.stock, verdict.rate.stock_rate), []).append(verdict)

    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * (len(verdicts) + len(groups)) + 1.0), 3.6))
    x, labels, ticks, top = 0.0, [], [], 0.0
    for (stock_name, _), members in groups.items():
        first = members[0].rate
        bars = [(stock_name, first.stock_rate, first.stock_low, first.stock_high, "stock", None)]
        bars += [(v.system, v.rate.system_rate, v.rate.system_low, v.rate.system_high, v.verdict, v) for v in members]
        start = x
        limit = 100 * (first.stock_rate + first.limit)
        for name, rate, low, high, kind, verdict in bars:
            ax.bar(x, 100 * rate, width=0.8, color=COLORS[kind], edgecolor="black", linewidth=0.5)
            ax.errorbar(
                x, 100 * rate, yerr=[[100 * (rate - low)], [100 * (high - rate)]], fmt="none", ecolor="black", capsize=3
            )
            if verdict is not None:
                ax.annotate(
                    f"{verdict.verdict}\n{verdict.events.system_events} events",
                    (x, max(100 * high, limit)),
                    xytext=(0, 4),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
            ticks.append(x)
            labels.append(name)
            top = max(top, 100 * high)
            x += 1.0
        ax.hlines(limit, start - 0.45, x - 0.55, colors="black", linestyles="dashed", linewidth=1)
        top = max(top, limit)
        x += 0.6
    ax.set_xticks(ticks, labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("mismatch rate (%)")
    ax.set_ylim(0, top * 1.35 + 1e-3)
    synthetic = any(v.synthetic for v in verdicts)
    ax.set_title((title or "Token forcing") + (" (synthetic)" if synthetic else ""), fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    try:
        fig.savefig(tmp, dpi=150)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path
