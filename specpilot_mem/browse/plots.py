"""Plots as inline SVG: line charts (speedup by row count, τ(N)) and bar charts with 95% intervals (token forcing).

SVG rather than PNG because the pages are read in a browser: the plots scale, their text can be selected,
and building a thousand entry pages costs no rendering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 520, 300
MARGIN = {"left": 62, "right": 150, "top": 34, "bottom": 46}
PALETTE = ("#1f6fd6", "#e8613c", "#2a9d5b", "#8e44ad", "#c59400", "#17a2b8", "#d63384", "#6c757d")
BAR_COLOURS = {"stock": "#9aa1ab", "accept": "#1f6fd6", "reject": "#e8613c", None: "#1f6fd6"}


@dataclass
class Bar:
    label: str
    value: float
    low: float | None = None
    high: float | None = None
    kind: str | None = None  # stock | accept | reject (token forcing), else None


@dataclass
class Plot:
    kind: str  # "speedup by row count" | "τ(N)" | "token forcing" | "figures"
    title: str
    x_label: str = ""
    y_label: str = ""
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    bars: list[Bar] = field(default_factory=list)
    log_x: bool = False
    reference_y: float | None = None  # a dashed line (e.g. 1.0: the speed of the baseline)
    source: str = ""  # where the numbers come from (a results file or the record's figures)

    def svg(self) -> str:
        return bar_svg(self) if self.bars else line_svg(self)


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        high = low + 1.0
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    return [round(first + n * step, 10) for n in range(int((high - first) / step) + 1)]


def _fmt(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e5 else f"{value:.2e}"


def _frame(plot: Plot, body: list[str], y_low: float, y_high: float) -> str:
    inner_w = WIDTH - MARGIN["left"] - MARGIN["right"]
    inner_h = HEIGHT - MARGIN["top"] - MARGIN["bottom"]
    head = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(plot.title)}">'
        ),
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        f'<text x="{MARGIN["left"]}" y="20" class="plot-title">{escape(plot.title)}</text>',
    ]
    for tick in _ticks(y_low, y_high):
        y = MARGIN["top"] + inner_h * (1 - (tick - y_low) / (y_high - y_low))
        head.append(
            f'<line x1="{MARGIN["left"]}" x2="{MARGIN["left"] + inner_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
        )
        head.append(
            f'<text x="{MARGIN["left"] - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{_fmt(tick)}</text>'
        )
    head.append(
        f'<text x="14" y="{MARGIN["top"] + inner_h / 2:.0f}" transform="rotate(-90 14 {MARGIN["top"] + inner_h / 2:.0f})" '
        f'text-anchor="middle" class="axis">{escape(plot.y_label)}</text>'
    )
    head.append(
        f'<text x="{MARGIN["left"] + inner_w / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle" class="axis">'
        f"{escape(plot.x_label)}</text>"
    )
    head.append(f'<rect x="{MARGIN["left"]}" y="{MARGIN["top"]}" width="{inner_w}" height="{inner_h}" class="frame"/>')
    return "".join(head + body + ["</svg>"])


def line_svg(plot: Plot) -> str:
    points = [p for values in plot.series.values() for p in values]
    xs = [math.log2(x) if plot.log_x else x for x, _ in points]
    ys = [y for _, y in points] + ([plot.reference_y] if plot.reference_y is not None else [])
    x_low, x_high = min(xs), max(xs)
    if x_high == x_low:
        x_low, x_high = x_low - 1, x_high + 1
    y_low, y_high = min(ys), max(ys)
    pad = (y_high - y_low) * 0.08 or abs(y_high) * 0.1 or 1.0
    y_low, y_high = y_low - pad, y_high + pad
    inner_w = WIDTH - MARGIN["left"] - MARGIN["right"]
    inner_h = HEIGHT - MARGIN["top"] - MARGIN["bottom"]

    def at(x: float, y: float) -> tuple[float, float]:
        fx = math.log2(x) if plot.log_x else x
        return (
            MARGIN["left"] + inner_w * (fx - x_low) / (x_high - x_low),
            MARGIN["top"] + inner_h * (1 - (y - y_low) / (y_high - y_low)),
        )

    body = []
    for x in sorted({x for x, _ in points}):
        px, _ = at(x, y_low)
        body.append(
            f'<text x="{px:.1f}" y="{MARGIN["top"] + inner_h + 16}" text-anchor="middle" class="tick">{_fmt(x)}</text>'
        )
    if plot.reference_y is not None:
        _, ry = at(points[0][0], plot.reference_y)
        body.append(
            f'<line x1="{MARGIN["left"]}" x2="{MARGIN["left"] + inner_w}" y1="{ry:.1f}" y2="{ry:.1f}" class="reference"/>'
        )
    for n, (label, values) in enumerate(plot.series.items()):
        colour = PALETTE[n % len(PALETTE)]
        coords = [at(x, y) for x, y in sorted(values)]
        body.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
            + " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            + '"/>'
        )
        for (x, y), (vx, vy) in zip(coords, sorted(values)):
            body.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"><title>{escape(label)}: '
                f"{_fmt(vx)} → {_fmt(vy)}</title></circle>"
            )
        ly = MARGIN["top"] + 12 + 16 * n
        body.append(
            f'<line x1="{WIDTH - MARGIN["right"] + 10}" x2="{WIDTH - MARGIN["right"] + 26}" y1="{ly - 4}" '
            f'y2="{ly - 4}" stroke="{colour}" stroke-width="3"/>'
        )
        body.append(f'<text x="{WIDTH - MARGIN["right"] + 30}" y="{ly}" class="legend">{escape(label[:22])}</text>')
    return _frame(plot, body, y_low, y_high)


def bar_svg(plot: Plot) -> str:
    tops = [b.high if b.high is not None else b.value for b in plot.bars] + (
        [plot.reference_y] if plot.reference_y is not None else []
    )
    y_low, y_high = 0.0, max(tops + [0.0]) * 1.15 or 1.0
    inner_w = WIDTH - MARGIN["left"] - MARGIN["right"]
    inner_h = HEIGHT - MARGIN["top"] - MARGIN["bottom"]
    slot = inner_w / len(plot.bars)

    def y_of(value: float) -> float:
        return MARGIN["top"] + inner_h * (1 - (value - y_low) / (y_high - y_low))

    body = []
    for n, bar in enumerate(plot.bars):
        x = MARGIN["left"] + slot * n + slot * 0.15
        width = slot * 0.7
        colour = BAR_COLOURS.get(bar.kind, BAR_COLOURS[None])
        body.append(
            f'<rect x="{x:.1f}" y="{y_of(bar.value):.1f}" width="{width:.1f}" '
            f'height="{y_of(y_low) - y_of(bar.value):.1f}" fill="{colour}"><title>{escape(bar.label)}: '
            f"{_fmt(bar.value)}</title></rect>"
        )
        if bar.low is not None and bar.high is not None:
            cx = x + width / 2
            body.append(
                f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y_of(bar.low):.1f}" y2="{y_of(bar.high):.1f}" class="whisker"/>'
            )
        body.append(
            f'<text x="{x + width / 2:.1f}" y="{MARGIN["top"] + inner_h + 16}" text-anchor="middle" class="tick">'
            f"{escape(bar.label[:14])}</text>"
        )
        if bar.kind in ("accept", "reject"):
            body.append(
                f'<text x="{x + width / 2:.1f}" y="{y_of(bar.high if bar.high is not None else bar.value) - 5:.1f}" '
                f'text-anchor="middle" class="tick">{bar.kind}</text>'
            )
    if plot.reference_y is not None:
        ry = y_of(plot.reference_y)
        body.append(
            f'<line x1="{MARGIN["left"]}" x2="{MARGIN["left"] + inner_w}" y1="{ry:.1f}" y2="{ry:.1f}" class="reference"/>'
        )
    return _frame(plot, body, y_low, y_high)
