"""Why the shared budget is weak at 16 requests, and does a calibrated ranking fix it? Exact closed-loop replay on
the CPU (issue 32).

The closed loop ends when the stream runs out, so with 40 requests a configuration's figure covers a different
mix of requests and positions than another's: the shared-vs-equal ratio moves by several percent with the
stream. Here every split's requests are cycled ``--stream`` times through the loop (each request decoded
several times, beside different neighbours), which measures the same ratio with less noise. Rules (all at the
128-row plateau budget of both shapes' measured c(R), equal-size best-first trees of the same rows as baseline):

- ``shared``: the policy, global top nodes by the drafter's path log-probability;
- ``calibrated`` / ``history``: the global top nodes by a path probability calibrated per depth (and per the
  request's previous accepted length) on the FIT split (the isotonic maps of
  ``../batched-allocation-cpu-2026-12-02/allocation_probe.py``), replayed on the EVAL split.

    PYTHONPATH=kernels:. python3 benchmarks/probes/batched-budget16-cpu-2026-12-02/budget16_probe.py \\
        --lattices /tmp/batched/lat --fit dev --eval unseen --stream 160 --out R.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks/probes/batched-allocation-cpu-2026-12-02"))

import allocation_probe as ap  # noqa: E402
import specpilot_mem.batching.simulate as sm  # noqa: E402
from specpilot_mem.batching.costs import StepCosts  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402
from specpilot_mem.replay.lattice import load_lattice  # noqa: E402

ROWS = 128  # the plateau end of both shapes' measured target c(R) at 16-32 requests


def run(lat, batch, rule, stream, calibration=None):
    original, ruled = sm.step_trees, ap.Rule(lat, rule, calibration)
    sm.step_trees = ruled
    try:
        costs = StepCosts.roofline("4b")  # tokens per step read no times
        return sm.simulate({16: lat}, costs, sm.CONFIGS["shared-budget"], batch, budget_rows=ROWS, stream=stream), ruled
    finally:
        sm.step_trees = original


def main(argv=None) -> int:
    ap_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap_.add_argument("--lattices", type=Path, required=True)
    ap_.add_argument("--fit", default="dev")
    ap_.add_argument("--eval", default="unseen")
    ap_.add_argument("--stream", type=int, default=160)
    ap_.add_argument("--batches", default="16,24,32")
    ap_.add_argument("--out", type=Path)
    args = ap_.parse_args(argv)
    started = time.perf_counter()
    lat = {s: load_lattice(args.lattices / f"pair-{s}-block16.npz") for s in {args.fit, args.eval}}
    fitted = [run(lat[args.fit], b, "fit", args.stream)[1] for b in (16, 32)]
    calibration = ap.Calibration(
        *(
            np.concatenate(v)
            for v in zip(*[[np.concatenate(r.samples[k]) for k in ("q", "accepted", "depth", "hist")] for r in fitted])
        )
    )
    doc = {
        **result_header("batched_budget16_probe"),
        "label": "exact replay on the small pair trained here; tokens per step only (no times)",
        "splits": {"fit": args.fit, "eval": args.eval},
        "stream": args.stream,
        "rows": ROWS,
        "by_batch": {},
    }
    for b in (int(x) for x in args.batches.split(",")):
        equal = sm.simulate(
            {16: lat[args.eval]},
            StepCosts.roofline("4b"),
            sm.CONFIGS["equal-trees"],
            b,
            budget_rows=ROWS,
            stream=args.stream,
        )
        row = {
            "equal_tau": equal.tau,
            "over_equal": {"shared": run(lat[args.eval], b, "fit", args.stream)[0].tau / equal.tau},
        }
        for rule in ("calibrated", "history"):
            row["over_equal"][rule] = run(lat[args.eval], b, rule, args.stream, calibration)[0].tau / equal.tau
        doc["by_batch"][str(b)] = row
        print(b, {k: round(v, 4) for k, v in row["over_equal"].items()}, file=sys.stderr, flush=True)
    doc["headline"] = f"{args.eval} split (fit on {args.fit}), stream {args.stream}: " + "; ".join(
        f"B={b}: " + ", ".join(f"{k} {100 * (v - 1):+.1f}%" for k, v in r["over_equal"].items())
        for b, r in doc["by_batch"].items()
    )
    doc["seconds"] = round(time.perf_counter() - started, 1)
    print_result(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
