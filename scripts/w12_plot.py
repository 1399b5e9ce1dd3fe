"""The W12 GEMM's speedup over cuBLAS BF16 by row count, one panel per shape, from w12_gemm_bench JSON files
(one line per file, so kernel versions compare side by side). Reads the committed results; needs no GPU.

    python scripts/w12_plot.py benchmarks/archive/results/w12-gemm-mma-v20-final-h200-2026-12-01.json \\
        benchmarks/results/w12-gemm-mma-v21-final-h200-2026-12-01.json --out w12-speedup.png

A file may be given twice with a --variant each, e.g. ``mma`` and ``mma_settled`` (the bench's --settle figures: the
pace once the power cap has settled the SM clock).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.optional import pyplot  # noqa: E402
from specpilot_mem.provenance import result_header  # noqa: E402

GEOMEAN_TARGET = 1.30  # issue 4: the four projections' geometric mean at 1-32 rows


class PlotInputError(ValueError):
    """A results file that is not a w12_gemm_bench document with the asked kernel's rows."""


def read_speedups(path: Path, variant: str) -> dict[str, list[tuple[int, float]]]:
    """{shape name: [(rows, speedup over cuBLAS), ...]} of one w12_gemm_bench JSON."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlotInputError(f"{path}: not readable as JSON ({exc}); pass a w12_gemm_bench --out file") from exc
    shapes = doc.get("shapes") if isinstance(doc, dict) else None
    if not isinstance(shapes, dict) or not shapes:
        raise PlotInputError(f"{path}: no 'shapes' section; pass a file written by benchmarks/w12_gemm_bench.py")
    key = f"{variant}_speedup"
    out = {
        name: [(row["M"], row[key]) for row in shape.get("rows", []) if key in row and "M" in row]
        for name, shape in shapes.items()
    }
    if not any(out.values()):
        raise PlotInputError(
            f"{path}: no '{key}' figures; the file timed other kernels (try --variant triton), or "
            "was run without --settle (the *_settled figures)"
        )
    return out


def plot_speedups(files: list[Path], labels: list[str], out: Path, variants: list[str]) -> Path:
    """Draw the figure; its PNG metadata (``Description``) holds the shared result header and the inputs."""
    series = [read_speedups(path, variant) for path, variant in zip(files, variants)]  # all read before drawing
    plt = pyplot("scripts/w12_plot.py")
    names = list(dict.fromkeys(name for s in series for name in s))
    columns = min(3, len(names))
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), dpi=130, squeeze=False)
    for ax, name in zip(axes.flat, names):
        for speedups, label in zip(series, labels):
            points = sorted(speedups.get(name, []))
            if points:
                ax.plot([m for m, _ in points], [s for _, s in points], marker="o", markersize=3, label=label)
        ax.axhline(1.0, color="0.3", linewidth=1, label="cuBLAS BF16")
        if name != "lm_head":
            ax.axhline(GEOMEAN_TARGET, color="0.6", linewidth=1, linestyle=":", label="1.30x geomean target")
        ax.axvspan(40, 64, color="0.92", zorder=0)  # 48-64 rows: outside the 1-32-row targets
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8, 16, 32, 64], ["1", "2", "4", "8", "16", "32", "64"])
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("rows", fontsize=8)
        ax.set_ylabel("speedup over cuBLAS", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(
        f"W12 GEMM ({', '.join(dict.fromkeys(variants))}) vs cuBLAS BF16, H200, synthetic N(0, 0.02) weights",
        fontsize=10,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    provenance = {
        **result_header("w12_plot"),
        "inputs": [
            {"file": str(path), "variant": variant, "label": label, "git": input_git(path)}
            for path, variant, label in zip(files, variants, labels)
        ],
    }
    fig.savefig(out, metadata={"Description": json.dumps(provenance)})
    plt.close(fig)
    return out


def input_git(path: Path) -> dict | None:
    """The commit an input result records (files written before the shared header have none: see the index)."""
    doc = json.loads(path.read_text())
    return doc.get("git") if isinstance(doc, dict) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="w12_gemm_bench JSON files, one line each")
    parser.add_argument(
        "--label", action="append", default=None, help="a legend label per file, in order (default: the file names)"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=None,
        help="the figures to plot: mma (default), triton or mma_settled; once for every file or once "
        "per file, in order",
    )
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    labels = args.label or [path.stem for path in args.files]
    if len(labels) != len(args.files):
        parser.error(f"--label given {len(labels)} times for {len(args.files)} files; give one per file or none")
    variants = args.variant or ["mma"]
    if len(variants) == 1:
        variants = variants * len(args.files)
    if len(variants) != len(args.files):
        parser.error(f"--variant given {len(variants)} times for {len(args.files)} files; give one, or one per file")
    try:
        print(plot_speedups(args.files, labels, args.out, variants))
    except PlotInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
