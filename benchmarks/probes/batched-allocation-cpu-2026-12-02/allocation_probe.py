"""Does a better allocation rule reach the issue's +6% (shared budget vs equal-size per-request trees, tokens per
step, 16-32 requests) or the drafter block's 1.03x on the trained pair's lattices? Exact replay on the CPU.

Per verify step of B requests (steps drawn from the unseen split's lattices, recorded at every greedy
position), each request's best-first tree of ``budget`` nodes is built once; every rule then picks an
ancestor-closed node set within the step's budget and the tokens of the step are exact (the accepted path
against the target's greedy tokens, plus the bonus):

- ``equal``: budget // B nodes each (the baseline of the issue's figure);
- ``shared``: the global top nodes by the drafter's path log-probability (``batching.shared_shares``);
- ``calibrated``: the global top nodes by a path probability calibrated on held-out acceptance (dev split):
  each edge's conditional probability mapped, per depth, by an isotonic fit of the empirical rate at which a
  child of an accepted parent is accepted; a node's value is the product along its path (marginal-gain greedy:
  expected tokens are the sum of the chosen nodes' path probabilities, and the product never grows along a
  path, so the greedy set is ancestor-closed);
- ``oracle``: the best split of the budget into per-request prefixes of the best-first order knowing every
  request's accepted length (a dynamic program over requests): the bound of every rule that allocates
  prefixes of the drafter's order.

Budgets: the end of the target's measured c(R) plateau (``CostCurve.plateau_end``, the H200's 4B-like and
27B-like curves) and a sweep of nodes per request. The closed-loop replay of ``specpilot_mem.batching.simulate``
gives the shared/equal ratio of the same lattices in the benchmark's setting, and the drafter-block section
compares each block's exact tokens per step with the 16-block's first positions (the truncated bound).

    PYTHONPATH=kernels:. python3 benchmarks/probes/batched-allocation-cpu-2026-12-02/allocation_probe.py \\
        --lattices /tmp/sglbatch/lat --costs benchmarks/results/batched-costs-h200-2026-12-02.json --out R.json
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import specpilot_mem.batching.simulate as simulate_module  # noqa: E402
from specpilot_mem.batching.budget import shared_shares  # noqa: E402
from specpilot_mem.batching.costs import StepCosts  # noqa: E402
from specpilot_mem.batching.simulate import CONFIGS, STOCK_BLOCK, simulate  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402
from specpilot_mem.replay.lattice import load_lattice  # noqa: E402
from specpilot_mem.replay.trees import best_first  # noqa: E402
from specpilot_mem.replay.trees.base import DraftTrees, StepBatch, pad_trees  # noqa: E402
from specpilot_mem.replay.verify import verify_against_greedy  # noqa: E402

MAX_DEPTH_BIN = 10  # depths past it share one calibration map


def on_path(trees, greedy):
    """[B, N] bool: the node's whole path equals the target's greedy tokens (it would be accepted)."""
    d = greedy.shape[1]
    expected = np.take_along_axis(greedy, np.clip(trees.depths - 1, 0, d - 1), axis=1)
    ok = (trees.tokens == expected) & (trees.depths >= 1) & (expected >= 0) & trees.valid
    b, n = ok.shape
    flat = np.arange(b)[:, None] * n + np.maximum(trees.parents, 0)
    out = ok.copy()
    for _ in range(int(trees.depths.max(initial=1))):
        out = ok & ((trees.parents < 0) | out.take(flat))
    return out


def edge_prob(trees):
    parent_score = np.where(trees.parents >= 0, np.take_along_axis(trees.scores, np.maximum(trees.parents, 0), 1), 0)
    return np.exp(np.where(trees.valid, trees.scores - parent_score, -np.inf))


def pav(x, y, bins=24):
    """Isotonic (non-decreasing) fit of y on x over quantile bins: (bin edges, fitted rate per bin)."""
    edges = np.unique(np.quantile(x, np.linspace(0, 1, bins + 1)))
    idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    rate = np.bincount(idx, y, len(edges) - 1)
    count = np.bincount(idx, None, len(edges) - 1)
    blocks = [[rate[i], count[i]] for i in range(len(rate)) if count[i] > 0]
    keep = [i for i in range(len(rate)) if count[i] > 0]
    merged = []  # pool adjacent violators
    for (s, c), i in zip(blocks, keep):
        merged.append([s, c, [i]])
        while len(merged) > 1 and merged[-2][0] / merged[-2][1] > merged[-1][0] / merged[-1][1]:
            s2, c2, i2 = merged.pop()
            merged[-1][0] += s2
            merged[-1][1] += c2
            merged[-1][2] += i2
    fitted = np.zeros(len(rate))
    for s, c, members in merged:
        fitted[members] = s / c
    for i in range(len(fitted)):  # empty bins take the fit below them
        if count[i] == 0:
            fitted[i] = fitted[i - 1] if i else 0.0
    return edges, np.maximum.accumulate(fitted)


def bucket(last):
    """History feature of a request: its accepted length at its previous step (-1: its first step)."""
    return np.digitize(last, HISTORY_EDGES)


HISTORY_EDGES = (0, 2, 4, 7)  # buckets: first step, 0-1, 2-3, 4-6, 7+ accepted
MIN_SAMPLES = 300  # a (depth, history) map with fewer samples falls back to the depth's own map


class Calibration:
    """Isotonic maps from the drafter's conditional edge probability to the empirical rate at which a child of an
    accepted parent (or of the root) is accepted: per depth, and per depth and history bucket."""

    def __init__(self, q, accepted, depth, hist):
        depth = np.minimum(depth, MAX_DEPTH_BIN)
        self.depth_maps = {int(d): pav(q[depth == d], accepted[depth == d]) for d in np.unique(depth)}
        self.hist_maps = {}
        for d in self.depth_maps:
            for h in np.unique(hist):
                m = (depth == d) & (hist == h)
                if m.sum() >= MIN_SAMPLES:
                    self.hist_maps[(d, int(h))] = pav(q[m], accepted[m])
        self.samples = int(q.size)

    def path_value(self, trees, hist=None):
        """[B, N] calibrated path probabilities (0 on padding); ``hist`` [B] buckets or None (depth maps)."""
        q = edge_prob(trees)
        d = np.minimum(trees.depths, MAX_DEPTH_BIN)
        h = np.zeros(trees.parents.shape[0], dtype=np.int64) if hist is None else hist
        cal = np.zeros_like(q)
        for b in range(q.shape[0]):
            for depth in np.unique(d[b][trees.valid[b]]):
                m = (d[b] == depth) & trees.valid[b]
                edges, fitted = (self.hist_maps.get((int(depth), int(h[b]))) if hist is not None else None) or \
                    self.depth_maps[int(depth)]
                idx = np.clip(np.searchsorted(edges, q[b][m], side="right") - 1, 0, len(fitted) - 1)
                cal[b][m] = np.clip(fitted[idx], 1e-9, 1.0)
        value = np.zeros_like(cal)  # product along the path, parents first (best-first order is topological)
        for i in range(trees.parents.shape[1]):
            p = trees.parents[:, i]
            base = np.where(p >= 0, value[np.arange(p.size), np.maximum(p, 0)], 1.0)
            value[:, i] = np.where(trees.valid[:, i], base * cal[:, i], 0.0)
        return value

    def to_dict(self):
        def one(e, f):
            return {"edges": e.round(4).tolist(), "rate": f.round(4).tolist()}

        return {"samples": self.samples, "depth": {str(k): one(*v) for k, v in self.depth_maps.items()},
                "depth_history": {f"{k[0]}/{k[1]}": one(*v) for k, v in self.hist_maps.items()}}


def global_take(values, nodes):
    """[B, N] bool: top ``nodes`` by value over the step (ties: earlier request, earlier node; zero never)."""
    b, n = values.shape
    flat = values.reshape(-1)
    order = np.argsort(-flat, kind="stable")
    taken = np.zeros(b * n, dtype=bool)
    taken[order[:nodes]] = flat[order[:nodes]] > 0
    return taken.reshape(b, n)


def oracle_counts(path, depths, nodes, most=48):
    """[B] per-request prefix shares summing to at most ``nodes`` that maximise the step's accepted tokens,
    knowing each request's accepted length for every prefix (a dynamic program over requests)."""
    k = min(most, depths.shape[1])
    gain = np.maximum.accumulate(np.where(path, depths, 0)[:, :k], axis=1)
    gain = np.concatenate([np.zeros((gain.shape[0], 1)), gain], axis=1)  # [B, k+1]: accepted with j nodes
    r = np.arange(nodes + 1)[:, None] - np.arange(k + 1)[None, :]  # rows left before this request's j nodes
    best, picks = np.zeros(nodes + 1), []
    for row in gain:
        cand = np.where(r >= 0, best[np.clip(r, 0, None)] + row[None, :], -np.inf)
        picks.append(cand.argmax(axis=1))
        best = cand.max(axis=1)
    counts, left = np.zeros(len(picks), dtype=np.int64), int(best.argmax())
    for b in range(len(picks) - 1, -1, -1):
        counts[b] = picks[b][left]
        left -= counts[b]
    return counts


def compact(trees, keep):
    """The trees cut to the ancestor-closed node sets ``keep`` [B, N], in their order (parents renumbered)."""
    b, n = keep.shape
    index = np.broadcast_to(np.arange(n), (b, n))
    order = np.argsort(np.where(keep, index, index + n), axis=1, kind="stable")
    count = keep.sum(axis=1)
    valid = index < count[:, None]
    renumber = np.cumsum(keep, axis=1) - 1
    parents = np.take_along_axis(trees.parents, order, 1)
    parents = np.where(valid & (parents >= 0), np.take_along_axis(renumber, np.maximum(parents, 0), 1), -1)
    pick = lambda a, fill: np.where(valid, np.take_along_axis(a, order, 1), fill)  # noqa: E731
    return DraftTrees(parents, pick(trees.depths, 0), pick(trees.ranks, -1), pick(trees.tokens, -1),
                      pick(trees.scores, -np.inf).astype(np.float32), count.astype(np.int64))


class Rule:
    """``simulate.step_trees`` with the budget split by ``rule``: "fit" (the shared budget's split, logging
    every node whose parent was accepted), "calibrated", "history" or "oracle". Keeps each request's accepted
    length of its previous step (the history feature), computed from the same trees simulate verifies."""

    def __init__(self, lat, rule, calibration=None):
        self.lat, self.rule, self.calibration, self.last = lat, rule, calibration, {}
        self.samples = {"q": [], "accepted": [], "depth": [], "hist": []}

    def __call__(self, groups, n, config, nodes, cap=None):
        width = max(nodes, 1)  # every request's own best-first tree of the whole budget, in request order
        order = np.concatenate([mine for mine, _ in groups])
        stacked = simulate_module._stack([pad_trees(best_first.build(batch, width), width) for _, batch in groups])
        back = np.argsort(order)
        trees = DraftTrees(*(getattr(stacked, f)[back] for f in simulate_module.TREE_FIELDS))
        greedy = np.full((n, STOCK_BLOCK), -1, dtype=np.int64)
        steps = np.zeros(n, dtype=np.int64)
        for mine, batch in groups:
            greedy[mine, : batch.positions] = batch.greedy
            steps[mine] = batch.steps
        request = self.lat.step_request[steps].astype(np.int64)
        position = self.lat.step_position[steps].astype(np.int64)
        last = np.array([self.last.get(r, (-1, -1))[1] if self.last.get(r, (-1, -1))[0] < p else -1
                         for r, p in zip(request.tolist(), position.tolist())])  # a new request starts over
        hist = bucket(last)
        path = on_path(trees, greedy)
        index = np.arange(trees.parents.shape[1])[None, :]
        if self.rule == "oracle":
            chosen = index < oracle_counts(path, trees.depths, nodes)[:, None]
        elif self.rule == "fit":
            chosen = index < shared_shares(torch.from_numpy(trees.scores), nodes).numpy()[:, None]
            parent_ok = np.where(trees.parents >= 0, np.take_along_axis(path, np.maximum(trees.parents, 0), 1), True)
            m = trees.valid & parent_ok
            self.samples["q"].append(edge_prob(trees)[m])
            self.samples["accepted"].append(path[m].astype(np.float64))
            self.samples["depth"].append(trees.depths[m])
            self.samples["hist"].append(np.broadcast_to(hist[:, None], m.shape)[m])
        else:
            value = self.calibration.path_value(trees, hist if self.rule == "history" else None)
            chosen = global_take(value, nodes)
        accepted = np.where(path & chosen, trees.depths, 0).max(axis=1)
        for r, p, a in zip(request.tolist(), position.tolist(), accepted.tolist()):
            self.last[r] = (p, a)
        return compact(trees, chosen), 0.0  # admission is off in these runs (no tail value read)


def run_rule(lat, costs, batch, rule, calibration=None, rows=None):
    original, ruled = simulate_module.step_trees, Rule(lat, rule, calibration)
    simulate_module.step_trees = ruled
    try:
        return simulate({16: lat}, costs, CONFIGS["shared-budget"], batch, budget_rows=rows), ruled
    finally:
        simulate_module.step_trees = original


def closed_loop(lat, costs, batch, calibration, rows=None):
    """tau of equal trees, the shared budget, and the calibrated, history and oracle splits, in the closed loop."""
    out = {name: simulate({16: lat}, costs, CONFIGS[name], batch, budget_rows=rows).tau
           for name in ("equal-trees", "shared-budget")}
    for rule in ("calibrated", "history", "oracle"):
        out[rule] = run_rule(lat, costs, batch, rule, calibration, rows)[0].tau
    out.update({f"{k} over equal": out[k] / out["equal-trees"]
                for k in ("shared-budget", "calibrated", "history", "oracle")})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lattices", type=Path, required=True)
    ap.add_argument("--costs", type=Path, required=True)
    ap.add_argument("--batches", default="16,24,32")
    ap.add_argument("--sweep", default="", help="nodes per request to sweep, e.g. 2,4,12")
    ap.add_argument("--fit-split", default="dev", help="the split the calibration is fitted on")
    ap.add_argument("--eval-split", default="unseen", help="the split every rule is replayed on")
    ap.add_argument("--skip-blocks", action="store_true", help="leave out the drafter-block sections")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    started = time.perf_counter()
    import json

    measured = json.loads(args.costs.read_text())
    lat = {s: load_lattice(args.lattices / f"pair-{s}-block16.npz") for s in ("dev", "unseen")}
    rng = np.random.default_rng(0)  # the blocks' steps
    fit_costs = StepCosts.from_measurement(measured, "4b")
    calibration = Calibration(*(np.concatenate(v) for v in zip(*[
        [np.concatenate(r.samples[k]) for k in ("q", "accepted", "depth", "hist")]
        for r in (run_rule(lat[args.fit_split], fit_costs, b, "fit")[1] for b in (16, 32))])))
    doc = {
        **result_header("batched_allocation_probe"),
        "harness": "benchmarks/probes/batched-allocation-cpu-2026-12-02/allocation_probe.py",
        "label": "exact replay on the small pair trained here (lattices of 40 dev + 40 unseen requests, 128 "
        "tokens each); timing curves measured on the H200 (random weights at the paper's shapes)",
        "splits": {"fit": args.fit_split, "eval": args.eval_split},
        "calibration": {"fit": f"{args.fit_split} split, closed loop with the shared budget at 16 and 32 requests (4B-like "
                        "plateau)", **calibration.to_dict()},
        "closed_loop": {}, "blocks": {},
    }
    batches = [int(b) for b in args.batches.split(",")]
    for b in batches:  # tau reads only the rows, so shapes with the same plateau share one run
        rows = {shape: StepCosts.from_measurement(measured, shape).target.plateau_end(b) for shape in ("4b", "27b")}
        for r in sorted(set(rows.values())):
            key = f"B={b}/plateau rows={r} ({', '.join(s for s in rows if rows[s] == r)}-like c(R))"
            doc["closed_loop"][key] = closed_loop(lat[args.eval_split], fit_costs, b, calibration, rows=r)
            print(key, {k: round(v, 3) for k, v in doc["closed_loop"][key].items()}, file=sys.stderr, flush=True)
    for b in batches:
        for k in (int(x) for x in args.sweep.split(",") if x):
            key = f"B={b}/{k} nodes per request"
            doc["closed_loop"][key] = closed_loop(lat[args.eval_split], fit_costs, b, calibration, rows=b * (k + 1))
            print(key, {kk: round(v, 3) for kk, v in doc["closed_loop"][key].items()}, file=sys.stderr, flush=True)
    plateau = {k: v for k, v in doc["closed_loop"].items() if "plateau" in k}

    def span(rule):
        values = [v[f"{rule} over equal"] for v in plateau.values()]
        return f"{100 * (min(values) - 1):+.1f}..{100 * (max(values) - 1):+.1f}%"

    doc["headline"] = (f"tokens/step over equal trees at the plateau budget, {args.batches} requests "
                       f"({args.eval_split} split): shared {span('shared-budget')}, depth-calibrated "
                       f"{span('calibrated')}, history-calibrated {span('history')}, oracle split {span('oracle')}")
    if args.skip_blocks:
        doc["seconds"] = round(time.perf_counter() - started, 1)
        print_result(doc, args.out)
        return 0
    # drafter blocks: each block's own lattice vs the 16-block cut to its first positions, chains (tau per step)
    blocks = {blk: load_lattice(args.lattices / f"pair-unseen-block{blk}.npz") for blk in (16, 12, 8)
              if (args.lattices / f"pair-unseen-block{blk}.npz").exists()}
    pick = rng.choice(blocks[16].num_steps, size=min(2000, blocks[16].num_steps), replace=False)
    for blk, own in blocks.items():
        flat = blocks[16].greedy_offsets[blocks[16].step_request[pick]] + blocks[16].step_position[pick]
        sb_own = StepBatch.from_lattice(own, own.step_lookup()[flat])
        sb_cut = StepBatch.from_lattice(blocks[16], pick)
        for name, sb in (("own block", sb_own), ("16-block cut", sb_cut)):
            for nodes in (blk, 8):
                trees = best_first.build(sb, nodes, depth_cap=blk)
                acc = verify_against_greedy(trees, sb.greedy[:, :blk]).accepted
                doc["blocks"][f"block {blk}/{name}/best-first {nodes} nodes"] = 1 + float(acc.mean())
    # drafter-block rules in the closed loop (real 12/8-block lattices): gain in tokens/s over the shared budget
    real = {blk: load_lattice(args.lattices / f"pair-unseen-block{blk}.npz") for blk in (16, 12, 8)}
    doc["block_rules"] = {}
    for shape in ("4b", "27b"):
        costs = StepCosts.from_measurement(measured, shape)
        for b in batches:
            base = simulate({16: real[16]}, costs, CONFIGS["shared-budget"], b).tokens_per_ms
            row = {}
            for name, choices, headroom in (("16,12,8 headroom 2 (the policy)", (16, 12, 8), 2),
                                            ("16,12 headroom 2", (16, 12), 2), ("16,8 headroom 2", (16, 8), 2),
                                            ("16,12,8 headroom 4", (16, 12, 8), 4), ("16,12 headroom 4", (16, 12), 4)):
                original = simulate_module.DrafterBlocks
                simulate_module.DrafterBlocks = functools.partial(original, headroom=headroom)
                try:
                    run = simulate({k: real[k] for k in choices}, costs, CONFIGS["shared-budget+drafter-block"], b)
                finally:
                    simulate_module.DrafterBlocks = original
                row[name] = {"gain": run.tokens_per_ms / base, "tau": run.tau,
                             "drafter_rows": run.drafter_rows / max(run.spec_steps, 1)}
            doc["block_rules"][f"{shape}/B={b}"] = row
            print(shape, b, {k: round(v["gain"], 3) for k, v in row.items()}, file=sys.stderr, flush=True)
    gains = {name: [r[name]["gain"] for r in doc["block_rules"].values()] for name in row}
    best = max(gains, key=lambda name: min(gains[name]))
    doc["headline"] += (f"; drafter blocks over the shared budget: {min(gains[best]):.3f}-{max(gains[best]):.3f}x "
                        f"(best rule: {best})")
    doc["seconds"] = round(time.perf_counter() - started, 1)
    print_result(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
