"""Does a calibration the server learns online, from its own verify steps, lift the shared budget's +5% at 16
requests (issue 32: >= +6% tokens per step over equal per-request trees at 16-32)? Exact closed-loop replay on
the CPU, on the unseen split only (nothing fitted on it offline; its own verify outcomes are what a server sees).

The rule ``online``: the global top nodes by a path probability calibrated per depth (the isotonic maps of
``../batched-allocation-cpu-2026-12-02/allocation_probe.py``), refitted every ``--refit`` steps on the samples the
loop has observed so far, where an observation is what a tree verify reveals: every candidate child of a verified
node whose path was accepted (the target's argmax at that node's row says whether the child would be accepted),
and every child of the root. Before the first fit it is the drafter's path log-probability (the policy). Beside it
the policy (``shared``) and equal trees, all at the 128-row plateau budget, the stream cycled as in
``../batched-budget16-cpu-2026-12-02/budget16_probe.py``.

    PYTHONPATH=kernels:. python3 benchmarks/probes/batched-online-calibration-cpu-2026-12-03/online_probe.py \\
        --lattices /tmp/batching/lat --eval unseen --stream 160 --out R.json
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

ROWS = 128


class OnlineRule(ap.Rule):
    """``ap.Rule`` splitting by a calibration refitted on what the loop's own verifies revealed."""

    def __init__(self, lat, refit: int):
        super().__init__(lat, "online")
        self.refit, self.steps, self.fits = refit, 0, 0
        self.seen = {"q": [], "accepted": [], "depth": []}

    def __call__(self, groups, n, config, nodes, cap=None):
        width = max(nodes, 1)
        order = np.concatenate([mine for mine, _ in groups])
        stacked = sm._stack([ap.pad_trees(ap.best_first.build(batch, width), width) for _, batch in groups])
        trees = ap.DraftTrees(*(getattr(stacked, f)[np.argsort(order)] for f in sm.TREE_FIELDS))
        greedy = np.full((n, sm.STOCK_BLOCK), -1, dtype=np.int64)
        for mine, batch in groups:
            greedy[mine, : batch.positions] = batch.greedy
        index = np.arange(trees.parents.shape[1])[None, :]
        if self.calibration is None:
            chosen = index < ap.shared_shares(ap.torch.from_numpy(trees.scores), nodes).numpy()[:, None]
        else:
            chosen = ap.global_take(self.calibration.path_value(trees), nodes)
        path = ap.on_path(trees, greedy)
        verified_ok = path & chosen  # verified nodes whose whole path was accepted
        parent_ok = np.where(trees.parents >= 0, np.take_along_axis(verified_ok, np.maximum(trees.parents, 0), 1), True)
        m = trees.valid & parent_ok  # what the verify revealed: children of the root and of accepted verified nodes
        self.seen["q"].append(ap.edge_prob(trees)[m])
        self.seen["accepted"].append(path[m].astype(np.float64))
        self.seen["depth"].append(trees.depths[m])
        self.steps += 1
        if self.steps % self.refit == 0:
            q, acc, depth = (np.concatenate(self.seen[k]) for k in ("q", "accepted", "depth"))
            self.calibration = ap.Calibration(q, acc, depth, np.zeros_like(depth))
            self.fits += 1
        return ap.compact(trees, chosen), 0.0


def run(lat, batch, stream, rule=None):
    original = sm.step_trees
    if rule is not None:
        sm.step_trees = rule
    try:
        config = sm.CONFIGS["shared-plateau" if rule is not None else "equal-trees"]
        return sm.simulate({16: lat}, StepCosts.roofline("4b"), config, batch, budget_rows=ROWS, stream=stream)
    finally:
        sm.step_trees = original


def main(argv=None) -> int:
    ap_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap_.add_argument("--lattices", type=Path, required=True)
    ap_.add_argument("--eval", default="unseen")
    ap_.add_argument("--stream", type=int, default=160)
    ap_.add_argument("--refit", type=int, default=16, help="steps between refits of the online calibration")
    ap_.add_argument("--batches", default="16,24,32")
    ap_.add_argument("--out", type=Path)
    args = ap_.parse_args(argv)
    started = time.perf_counter()
    lat = load_lattice(args.lattices / f"pair-{args.eval}-block16.npz")
    doc = {
        **result_header("batched_online_calibration_probe"),
        "label": "exact replay on the small pair trained here; tokens per step only (no times)",
        "split": args.eval,
        "stream": args.stream,
        "rows": ROWS,
        "refit": args.refit,
        "by_batch": {},
    }
    for b in (int(x) for x in args.batches.split(",")):
        equal = run(lat, b, args.stream)
        policy = run(lat, b, args.stream, ap.Rule(lat, "fit"))
        online_rule = OnlineRule(lat, args.refit)
        online = run(lat, b, args.stream, online_rule)
        row = {
            "equal_tau": equal.tau,
            "over_equal": {"shared": policy.tau / equal.tau, "online": online.tau / equal.tau},
            "fits": online_rule.fits,
        }
        doc["by_batch"][str(b)] = row
        print(b, {k: round(v, 4) for k, v in row["over_equal"].items()}, file=sys.stderr, flush=True)
    doc["headline"] = f"{args.eval} split, stream {args.stream}: " + "; ".join(
        f"B={b}: " + ", ".join(f"{k} {100 * (v - 1):+.1f}%" for k, v in r["over_equal"].items())
        for b, r in doc["by_batch"].items()
    )
    doc["seconds"] = round(time.perf_counter() - started, 1)
    print_result(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
