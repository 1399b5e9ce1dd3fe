"""An entry's evidence as plots: from its results JSON where the browser knows the shape, else from its figures.

Known shapes, found anywhere in a results document:

- speedup by row count: a mapping whose key names a speedup and whose values map row counts to speedups
  (``{"qkv": {"1": 1.27, "16": 1.31}}``), or the figures of a record named ``..., 8 rows`` / ``..., B=8``;
- τ(N): a list of replay runs with ``builder``, ``nodes`` and ``tau`` (one line per tree builder);
- token forcing: verdicts with ``rate.stock_rate`` / ``rate.system_rate`` and their intervals (bars of the
  mismatch rates, the stock run first, as the paper's Figure 4).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from specpilot_mem.browse.plots import Bar, Plot
from specpilot_mem.models import Evidence

# "speedup over SGLang, B=8", "speedup vs the BF16 head (cuBLAS), 16 rows", "tau, N=32"
_PARAMETER = re.compile(
    r"^(?P<base>.*?)[,;:]?\s*(?:(?P<var>B|N|M|rows|batch|nodes)\s*=\s*(?P<a>\d+)|(?<![\d-])(?P<b>\d+)\s*(?P<unit>rows?|nodes|requests))\s*$"
)
_AXIS = {
    "B": "batch size B",
    "batch": "batch size",
    "N": "node budget N",
    "nodes": "nodes N",
    "M": "rows M",
    "rows": "rows",
    "row": "rows",
    "requests": "requests",
}
MAX_PLOTS = 6


def figure_plots(evidence: Evidence) -> list[Plot]:
    """Series of figures that differ only in a row count, batch size or node budget, one plot per unit."""
    groups: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = {}
    for fig in evidence.figures:
        match = _PARAMETER.match(fig.name)
        if not match:
            continue
        var = match["var"] or match["unit"]
        x = float(match["a"] or match["b"])
        groups.setdefault((_AXIS.get(var, var), fig.unit), {}).setdefault(match["base"].strip(), []).append(
            (x, fig.value)
        )
    plots = []
    for (axis, unit), series in groups.items():
        series = {label: points for label, points in series.items() if len(points) > 1}
        if not series:
            continue
        speedup = unit == "x" or all("speedup" in label for label in series)
        kind = (
            "τ(N)"
            if axis.startswith("node") and all("tau" in s.lower() or "τ" in s for s in series)
            else ("speedup by row count" if speedup else "figures")
        )
        what = "speedup" if speedup else ("τ" if kind == "τ(N)" else unit or "value")
        plots.append(
            Plot(
                kind,
                f"{what} by {axis}" + (f" ({unit})" if unit and not speedup else ""),
                axis,
                unit or "value",
                series,
                log_x=_spread(series),
                reference_y=1.0 if speedup else None,
                source="record figures",
            )
        )
    return plots


def _spread(series: dict[str, list[tuple[float, float]]]) -> bool:
    xs = [x for points in series.values() for x, _ in points if x > 0]
    return bool(xs) and max(xs) / min(xs) >= 8


def _numeric_map(value) -> dict[float, float] | None:
    if (
        isinstance(value, dict)
        and value
        and all(re.fullmatch(r"\d+", str(k)) for k in value)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())
    ):
        return {float(k): float(v) for k, v in value.items()}
    return None


def _walk(doc, path: str = ""):
    yield path, doc
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(doc, list):
        for n, value in enumerate(doc[:200]):
            yield from _walk(value, f"{path}[{n}]")


def results_plots(doc, source: str) -> list[Plot]:
    """Plots of the shapes this module knows, wherever they sit in a results document."""
    plots: list[Plot] = []
    for path, value in _walk(doc):
        if len(plots) >= MAX_PLOTS:
            break
        key = path.rsplit(".", 1)[-1]
        if isinstance(value, dict) and "speedup" in key.lower():
            series = {label: sorted(m.items()) for label, inner in value.items() if (m := _numeric_map(inner))}
            if not series and (m := _numeric_map(value)):
                series = {key: sorted(m.items())}
            if series:
                plots.append(
                    Plot(
                        "speedup by row count",
                        f"speedup by row count ({key})",
                        "rows",
                        "speedup (x)",
                        series,
                        log_x=_spread(series),
                        reference_y=1.0,
                        source=f"{source}: {path}",
                    )
                )
        elif (
            isinstance(value, list)
            and value
            and all(isinstance(r, dict) and {"builder", "nodes", "tau"} <= r.keys() for r in value)
        ):
            series: dict[str, list[tuple[float, float]]] = {}
            for run in value:
                label = run["builder"] + (f" (batch {run['batch']})" if run.get("batch", 1) not in (None, 1) else "")
                series.setdefault(label, []).append((float(run["nodes"]), float(run["tau"])))
            series = {k: sorted(v) for k, v in series.items()}
            plots.append(
                Plot(
                    "τ(N)",
                    "τ(N): accepted tokens per step by node budget",
                    "node budget N",
                    "τ",
                    series,
                    log_x=_spread(series),
                    source=f"{source}: {path}",
                )
            )
        elif (
            isinstance(value, list)
            and value
            and all(
                isinstance(v, dict) and isinstance(v.get("rate"), dict) and "system_rate" in v["rate"] for v in value
            )
        ):
            plots.append(token_forcing_plot(value, f"{source}: {path}"))
    return plots


def token_forcing_plot(verdicts: list[dict], source: str) -> Plot:
    """Mismatch rates (percent, 95% intervals): each stock run once, then the systems judged against it."""
    bars, seen, limit = [], set(), None
    for v in verdicts:
        rate = v["rate"]
        if v.get("stock") not in seen:
            seen.add(v.get("stock"))
            bars.append(
                Bar(
                    str(v.get("stock", "stock")),
                    100 * rate["stock_rate"],
                    _pct(rate.get("stock_low")),
                    _pct(rate.get("stock_high")),
                    "stock",
                )
            )
            limit = 100 * (rate["stock_rate"] + rate.get("limit", 0.005))
        bars.append(
            Bar(
                str(v.get("system", "system")),
                100 * rate["system_rate"],
                _pct(rate.get("system_low")),
                _pct(rate.get("system_high")),
                "reject" if str(v.get("verdict", "")).startswith("reject") else "accept",
            )
        )
    return Plot(
        "token forcing",
        "token forcing: mismatch rate (%)",
        "",
        "mismatch rate (%)",
        bars=bars,
        reference_y=limit,
        source=source,
    )


def _pct(value) -> float | None:
    return None if value is None else 100 * value


def evidence_plots(evidence: Evidence, root: Path) -> tuple[list[Plot], str | None]:
    """(plots, a problem reading the results file or None): the results file's plots, else the figures'."""
    problem = None
    plots: list[Plot] = []
    if evidence.results:
        path = root / evidence.results
        try:
            plots = results_plots(json.loads(path.read_text()), evidence.results)
        except FileNotFoundError:
            problem = f"results file {evidence.results} is missing"
        except (OSError, ValueError) as err:
            problem = f"results file {evidence.results} cannot be read: {err}"
    return (plots or figure_plots(evidence))[:MAX_PLOTS], problem
