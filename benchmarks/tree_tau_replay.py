"""τ(N) of draft trees by exact replay on the trained pair's lattices (Figure 10's form): the stock chain and
best-first trees at 16/32/64 nodes with 8 and 16 drafted positions, and best-first with the edge scores
calibrated by one temperature fitted on the dev split (the scoring the ``dflash-tree`` entry's kernel takes).

    PYTHONPATH=kernels:. python3 benchmarks/tree_tau_replay.py record --tokens .g1data/corpus.npz --lattices /tmp/pl
    PYTHONPATH=kernels:. python3 benchmarks/tree_tau_replay.py replay --lattices /tmp/pl --out benchmarks/results/tree_tau_replay-pair12-cpu-2026-12-02.json

``record`` drafts 16 positions (the drafter's trained block) at every position of each request's greedy output
(teacher-forced, CPU float32). The 8-position lattices are the same steps cut to their first 8 positions.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.provenance import print_result, result_header  # noqa: E402
from specpilot_mem.replay.lattice import Lattice, load_lattice  # noqa: E402
from specpilot_mem.replay.replay import replay_set  # noqa: E402

LABEL = "small models trained here — not comparable in absolute terms to the paper's"
SPLITS = ("dev", "unseen")
TEMPERATURES = (0.5, 0.7, 0.85, 1.0, 1.2, 1.5, 2.0, 3.0)


def record(args) -> int:
    import torch

    from specpilot_mem.engine import weights
    from specpilot_mem.engine.engine import Engine
    from specpilot_mem.engine.train.corpus import file_prompts
    from specpilot_mem.replay.lattice import LatticeRecorder

    torch.set_num_threads(args.threads)
    engine = Engine.load(args.model_dir or weights.DEFAULT_MODEL_DIR, device="cpu", dtype=torch.float32)
    data = np.load(args.tokens)
    for split in SPLITS:
        prompts = file_prompts(data[split], args.requests, args.prompt_len)
        requests = [{"prompt_ids": p, "id": f"{split}-{i}"} for i, p in enumerate(prompts)]
        recorder = LatticeRecorder(
            args.lattices / f"pair-{split}.npz",
            kind="selector",
            positions=16,
            meta={
                "target": "models/target.safetensors",
                "drafter": "models/drafter.safetensors",
                "synthetic": False,
                "label": LABEL,
            },
        )
        with torch.no_grad():
            engine.record_lattices(
                recorder,
                requests,
                positions=16,
                max_new_tokens=args.new_tokens,
                labels=[f"stdlib/{split}"] * len(requests),
            )
        recorder.close()
        print(f"recorded {split}", file=sys.stderr, flush=True)
    return 0


def cut(lat: Lattice, positions: int) -> Lattice:
    """The same steps with only their first ``positions`` drafted positions."""
    meta = {**lat.meta, "positions": positions}
    return dataclasses.replace(
        lat,
        meta=meta,
        cand=lat.cand[:, :positions],
        unary=lat.unary[:, :positions],
        pair=lat.pair[:, :positions],
        _lookup=None,
    )


def tempered(lat: Lattice, temperature: float) -> Lattice:
    """Selector scores divided by ``temperature`` (float32 then, so the division rounds once)."""
    return dataclasses.replace(lat, pair=(lat.pair.astype(np.float32) / np.float32(temperature)), _lookup=None)


def taus(lattices, builders, nodes) -> dict[str, float]:
    out = {}
    for run in replay_set(lattices, builders, nodes):
        out[f"{run.builder}@{run.nodes}/p{run.positions}"] = round(run.tau, 4)
    return out


def along_true_path(lat: Lattice) -> list[dict]:
    """Per drafted position d, over the steps whose greedy path so far is in the lattice (each position's
    candidate set holds the greedy token): how often position d's candidates hold it (top-K coverage), the
    selector's probability of it given the true parent, how often it is the selector's top pick, and the
    mean top probability (calibration: equal to the top-pick rate when calibrated)."""
    from specpilot_mem.replay.trees.base import log_softmax

    steps = np.arange(lat.num_steps)
    greedy = lat.greedy_windows(lat.step_request.astype(np.int64), lat.step_position.astype(np.int64), lat.positions)
    parent = np.zeros(lat.num_steps, dtype=np.int64)
    alive = np.ones(lat.num_steps, dtype=bool)
    rows = []
    for d in range(lat.positions):
        logp = log_softmax(lat.pair[steps, d, parent].astype(np.float32))
        hit = lat.cand[:, d] == greedy[:, d : d + 1]
        covered = hit.any(axis=1)
        p_true = np.where(covered, np.exp(np.where(hit, logp, -np.inf).max(axis=1)), 0.0)
        top_right = hit[steps, logp.argmax(axis=1)]
        n = int(alive.sum())
        rows.append(
            {
                "position": d,
                "steps": n,
                "top_k_coverage": round(float(covered[alive].mean()), 4),
                "p_true": round(float(p_true[alive].mean()), 4),
                "top1_rate": round(float(top_right[alive].mean()), 4),
                "mean_top_p": round(float(np.exp(logp.max(axis=1))[alive].mean()), 4),
            }
        )
        parent = np.where(covered, hit.argmax(axis=1), 0)
        alive &= covered
    return rows


def ratio_interval(lat: Lattice, short: Lattice, resamples: int = 2000, seed: int = 0) -> dict:
    """τ(best-first@32, 16 positions) / τ(chain@8, 8 positions) with a 95% bootstrap interval over requests
    (each request's steps and tokens resampled together, both builders on the same draw)."""
    from specpilot_mem.replay.replay import replay as replay_one

    tree_steps, tree_tokens = replay_one(lat, "best-first", 32)
    chain_steps, chain_tokens = replay_one(short, "chain", 8)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, lat.num_requests, size=(resamples, lat.num_requests))
    ratio = (tree_tokens[draws].sum(1) / tree_steps[draws].sum(1)) / (
        chain_tokens[draws].sum(1) / chain_steps[draws].sum(1)
    )
    point = (tree_tokens.sum() / tree_steps.sum()) / (chain_tokens.sum() / chain_steps.sum())
    return {
        "ratio": round(float(point), 4),
        "ci95": [round(float(x), 4) for x in np.percentile(ratio, [2.5, 97.5])],
        "requests": int(lat.num_requests),
        "resamples": resamples,
    }


def replay(args) -> int:
    lattices = {split: load_lattice(args.lattices / f"pair-{split}.npz") for split in SPLITS}
    grid = {split: [lat, cut(lat, 8)] for split, lat in lattices.items()}
    result = {
        **result_header("tree_tau_replay"),
        "label": LABEL,
        "synthetic": False,
        "lattices": {
            s: {
                "steps": int(lat.num_steps),
                "requests": int(lat.num_requests),
                "tokens": int(np.diff(lat.greedy_offsets).sum()),
            }
            for s, lat in lattices.items()
        },
        "tau": {},
        "calibration": {},
    }
    for split in SPLITS:
        result["tau"][split] = {
            **taus(grid[split], ["chain"], [8, 16]),
            **taus(grid[split], ["best-first"], [16, 32, 64]),
        }
    # one temperature for every edge score, fitted on dev at best-first@32 with 16 positions
    fit = {t: taus([tempered(lattices["dev"], t)], ["best-first"], [32])["best-first@32/p16"] for t in TEMPERATURES}
    best = max(fit, key=fit.get)
    result["calibration"] = {
        "fitted_on": "stdlib/dev",
        "criterion": "best-first@32/p16 tau",
        "dev_tau": fit,
        "temperature": best,
    }
    for split in SPLITS:
        warm = [tempered(lat, best) for lat in grid[split]]
        result["tau"][split].update({f"calibrated-{k}": v for k, v in taus(warm, ["best-first"], [16, 32, 64]).items()})
    result["ratio_bootstrap"] = {split: ratio_interval(lattices[split], grid[split][1]) for split in SPLITS}
    result["oracle"] = {split: taus(grid[split], ["oracle"], [16]) for split in SPLITS}
    result["along_true_path"] = {split: along_true_path(lat) for split, lat in lattices.items()}
    unseen = result["tau"]["unseen"]
    chain8 = unseen["chain@8/p8"]
    result["figures"] = {
        "unseen chain@8 (stock, 8 positions)": chain8,
        "unseen best-first@32/p16": unseen["best-first@32/p16"],
        "unseen calibrated best-first@32/p16": unseen["calibrated-best-first@32/p16"],
        "ratio best-first@32/p16 / chain@8": round(unseen["best-first@32/p16"] / chain8, 4),
        "ratio calibrated best-first@32/p16 / chain@8": round(unseen["calibrated-best-first@32/p16"] / chain8, 4),
        "ratio 95% interval (bootstrap over requests)": result["ratio_bootstrap"]["unseen"]["ci95"],
    }
    result["targets"] = {"ratio >= ": 1.25}
    result["headline"] = (
        f"unseen τ: chain@8 {chain8:.2f}, best-first@32/p16 {unseen['best-first@32/p16']:.2f} "
        f"({result['figures']['ratio best-first@32/p16 / chain@8']:.3f}x), calibrated T={best} "
        f"{unseen['calibrated-best-first@32/p16']:.2f} "
        f"({result['figures']['ratio calibrated best-first@32/p16 / chain@8']:.3f}x); "
        f"ratio 95% CI {result['ratio_bootstrap']['unseen']['ci95']} over "
        f"{result['ratio_bootstrap']['unseen']['requests']} requests"
    )
    if args.figure:
        from specpilot_mem.replay.plot import plot_tau

        runs = replay_set(grid["unseen"], ["chain"], [8, 16]) + replay_set(grid["unseen"], ["best-first"], [16, 32, 64])
        plot_tau(runs, args.figure)
        result["figure"] = str(args.figure)
    print_result(result, args.out)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--tokens", type=Path, required=True)
    rec.add_argument("--lattices", type=Path, required=True)
    rec.add_argument("--model-dir", type=Path)
    rec.add_argument("--requests", type=int, default=12, help="per split")
    rec.add_argument("--prompt-len", type=int, default=96)
    rec.add_argument("--new-tokens", type=int, default=128)
    rec.add_argument("--threads", type=int, default=1)
    rep = sub.add_parser("replay")
    rep.add_argument("--lattices", type=Path, required=True)
    rep.add_argument("--figure", type=Path)
    rep.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    return record(args) if args.command == "record" else replay(args)


if __name__ == "__main__":
    raise SystemExit(main())
