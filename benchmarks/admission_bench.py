"""Prompt admission against stock scheduling in a batched server (``batching.arrivals.serve``), timed by the composed
engine's measured steps (``admission_costs.py`` on the H200: the decode step of B slots, the same step with a prompt
segment in its forward, the drafter's pass, stock's prefill passes), the trained pair's stock chains replayed exactly
on its lattices, at the 4B-like and 27B-like shapes and 1-64 slots.

Two arrival processes: a closed loop (every finished request's slot takes the next prompt at once: the prompt
waits at every completion) reports throughput; Poisson arrivals at ``--load`` x stock's closed-loop request rate
report the mean time to first token and latency. Admission runs in both of its forms, fixed ``--segment``-row
segments and one chain of the plateau's spare rows; it admits only the rows on the plateau of the measured step
(``PromptAdmission``, 5% tolerance), and only where that beats a prefill pass of its own.

    PYTHONPATH=kernels:. python3 benchmarks/admission_bench.py --costs benchmarks/results/admission-costs-h200-2026-12-02.json \\
        --lattices /tmp/batched/lat/pair-dev-block16.npz --out benchmarks/results/admission-h200costs-2026-12-02.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.batching.admission import PromptAdmission  # noqa: E402
from specpilot_mem.batching.arrivals import CHAIN_ROWS, AdmissionCosts, Arrivals, chain_gains, serve  # noqa: E402
from specpilot_mem.batching.simulate import STOCK_BLOCK, concat_lattices  # noqa: E402
from specpilot_mem.provenance import print_result, result_header, write_result  # noqa: E402
from specpilot_mem.replay.lattice import load_lattice  # noqa: E402

LABEL = (
    "timing: the composed engine's steps at the paper's shapes (synthetic weights); tau: exact replay of the small pair"
)


def run_batch(gains, costs: AdmissionCosts, batch: int, args) -> dict:
    curve = costs.curve(batch)
    requests = max(args.requests_per_slot * batch, args.min_requests)
    forms = {"segment": args.segment, "chain": None}
    spare = curve.plateau_end(batch * CHAIN_ROWS, args.tolerance) - batch * CHAIN_ROWS
    row = {"spare_rows": int(spare), "step_ms": costs.step_ms(batch), "closed": {}, "poisson": {}}
    closed = Arrivals("closed")
    stock = serve(gains, costs, batch, closed, requests, args.prompt_rows)
    row["closed"]["stock"] = stock.to_dict()
    # Poisson at a share of what stock serves in the closed loop (requests per second)
    rate = args.load * 1e3 * stock.requests / stock.time_ms
    poisson = Arrivals("poisson", rate, seed=args.seed)
    row["poisson"]["rate_per_s"] = rate
    row["poisson"]["stock"] = serve(gains, costs, batch, poisson, requests, args.prompt_rows).to_dict()
    for form, segment in forms.items():
        policy = PromptAdmission(curve, args.verify_buffer, segment, tolerance=args.tolerance)
        got = serve(gains, costs, batch, closed, requests, args.prompt_rows, policy)
        row["closed"][form] = {**got.to_dict(), "gain_over_stock": got.tokens_per_s / stock.tokens_per_s}
        timed = serve(gains, costs, batch, poisson, requests, args.prompt_rows, policy)
        base = row["poisson"]["stock"]
        row["poisson"][form] = {
            **timed.to_dict(),
            "ttft_vs_stock": timed.ttft_ms / base["ttft_ms"],
            "latency_vs_stock": timed.latency_ms / base["latency_ms"],
        }
    return row


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, shape in doc["shapes"].items():
        batches = [int(b) for b in shape["by_batch"]]
        for form, style in (("segment", "-o"), ("chain", "--s")):
            gain = [shape["by_batch"][str(b)]["closed"][form]["gain_over_stock"] for b in batches]
            lat = [shape["by_batch"][str(b)]["poisson"][form]["latency_vs_stock"] for b in batches]
            axes[0].plot(batches, gain, style, label=f"{name} {form}")
            axes[1].plot(batches, lat, style, label=f"{name} {form}")
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[1].axhline(1.0, color="grey", lw=0.8)
    axes[0].set(xscale="log", xlabel="requests in flight (slots)", ylabel="throughput over stock (closed loop)")
    axes[1].set(xscale="log", xlabel="requests in flight (slots)", ylabel="mean latency / stock (Poisson)")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Prompt admission vs stock prefill passes ({doc['prompt_rows']}-row prompts, engine-timed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--costs", type=Path, required=True, help="admission_costs.py's result")
    ap.add_argument("--lattices", type=Path, nargs="+", required=True, help="block-16 lattice files of the pair")
    ap.add_argument("--shapes", default="4b,27b")
    ap.add_argument(
        "--draft-costs",
        nargs="*",
        default=[],
        help="SHAPE=FILE: the drafter's pass from batched_engine_costs.py's result (by_batch T_draft_ms 16), where --costs has none",
    )
    ap.add_argument("--batches", default="1,8,16,32,64")
    ap.add_argument("--prompt-rows", type=int, default=512)
    ap.add_argument("--segment", type=int, default=64)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--verify-buffer", type=int, default=2048)
    ap.add_argument("--load", type=float, default=0.8, help="Poisson rate as a share of stock's closed-loop rate")
    ap.add_argument("--requests-per-slot", type=int, default=8)
    ap.add_argument("--min-requests", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--png", type=Path, help="default: --out with .png")
    args = ap.parse_args(argv)
    measured = json.loads(args.costs.read_text())
    lattice = concat_lattices([load_lattice(p) for p in args.lattices])
    if lattice.positions != STOCK_BLOCK:
        raise SystemExit(f"--lattices: block-{STOCK_BLOCK} lattices are stock's chain; these draft {lattice.positions}")
    gains = chain_gains(lattice)
    doc = {
        **result_header("admission_bench"),
        "label": LABEL,
        "costs": str(args.costs),
        "costs_commit": measured.get("git", {}).get("commit"),
        "lattices": {"requests": lattice.num_requests, "source": lattice.source},
        "tau_stock_chain": float(np.mean(np.concatenate(gains))),
        "prompt_rows": args.prompt_rows,
        "segment": args.segment,
        "tolerance": args.tolerance,
        "load": args.load,
        "shapes": {},
    }
    for name in args.shapes.split(","):
        if name not in measured.get("shapes", {}):
            raise SystemExit(f"--shapes: {name!r} is not in {args.costs}")
        drafts = dict(item.split("=", 1) for item in args.draft_costs)
        draft = None
        if name in drafts:
            by = json.loads(Path(drafts[name]).read_text())["by_batch"]
            draft = {b: e["T_draft_ms"]["16"] for b, e in by.items() if "16" in e.get("T_draft_ms", {})}
            doc.setdefault("draft_costs", {})[name] = drafts[name]
        costs = AdmissionCosts(measured["shapes"][name], f"{args.costs}:{name}", draft)
        shape = {"by_batch": {}}
        for b in (int(x) for x in args.batches.split(",")):
            shape["by_batch"][str(b)] = row = run_batch(gains, costs, b, args)
            print(
                f"{name} B={b}: spare {row['spare_rows']} rows, closed gain "
                f"{row['closed']['segment']['gain_over_stock']:.3f} (chain {row['closed']['chain']['gain_over_stock']:.3f}),"
                f" Poisson latency x{row['poisson']['segment']['latency_vs_stock']:.3f}",
                file=sys.stderr,
            )
        doc["shapes"][name] = shape
    rows = [(n, b, r) for n, s in doc["shapes"].items() for b, r in s["by_batch"].items()]
    forms = ("segment", "chain")

    def admits(r):
        return any(r["closed"][f]["admitted_rows"] for f in forms)

    on = [(n, b, r) for n, b, r in rows if admits(r)]
    saturated = [(n, b, r) for n, b, r in rows if r["spare_rows"] == 0]
    gains_on = [r["closed"][f]["gain_over_stock"] for _, _, r in on for f in forms]
    every = [r["closed"][f]["gain_over_stock"] for _, _, r in rows for f in forms]
    doc["targets"] = {
        "gains_where_prompts_wait": bool(gains_on) and max(gains_on) > 1.0,
        "max_gain": max(gains_on, default=float("nan")),
        "off_where_compute_saturated": all(
            r["closed"][f]["admitted_rows"] == 0 for _, _, r in saturated for f in forms
        ),
        "never_negative": min(every) >= 0.999,
        "min_gain": min(every),
        "admits_at": [f"{n}:{b}" for n, b, _ in on],
        "saturated_at": [f"{n}:{b}" for n, b, _ in saturated],
        "spare_but_not_paying_at": [f"{n}:{b}" for n, b, r in rows if r["spare_rows"] and not admits(r)],
    }
    t = doc["targets"]
    doc["headline"] = (
        f"admission up to {t['max_gain']:.3f}x stock throughput in the closed loop where it admits"
        f" ({', '.join(t['admits_at']) or 'nowhere'}); min {t['min_gain']:.3f}x over all; no spare plateau rows"
        f" (compute saturated, admission off) at {', '.join(t['saturated_at']) or 'no batch size'}"
    )
    if args.out:
        png = args.png or args.out.with_suffix(".png")
        plot(doc, png)
        doc["figure"] = str(png)
        write_result(doc, args.out)
    print_result(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
