"""The trained pair measured (issue 11): tau in exact replay on lattices recorded from the pair (stock
chain at 8 and 16 positions, best-first at 16/32/64 nodes, the oracle), live speculative tau and
AR-vs-speculative token agreement, and the target's loss from the training log. Prints JSON.

    PYTHONPATH=. python3 benchmarks/engine_pair_eval.py --tokens .g1data/corpus.npz --lattices /tmp/pair-lattices
    PYTHONPATH=. python3 benchmarks/engine_pair_eval.py --device cuda --tokens .g1data/corpus.npz --lattices /tmp/pl

Prompts are the first --prompt-len tokens of files of the dev and unseen splits (corpus.prepare). On
CUDA the pair runs in bfloat16 (float32 on the CPU) unless --dtype says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.engine import weights  # noqa: E402
from specpilot_mem.engine.engine import Engine  # noqa: E402
from specpilot_mem.engine.train.corpus import file_prompts  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402
from specpilot_mem.replay.lattice import LatticeRecorder, load_lattice  # noqa: E402
from specpilot_mem.replay.replay import replay_set  # noqa: E402

LABEL = "small models trained here — not comparable in absolute terms to the paper's"
REPLAYS = [("chain", [8, 16]), ("best-first", [16, 32, 64]), ("ddtree", [32]), ("oracle", [16])]


def median_rate(runs) -> float:
    """Median over requests of output tokens per second (prefill included)."""
    return round(float(np.median([g.output_rate for g in runs])), 1)


@torch.no_grad()
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=Path, required=True)
    ap.add_argument("--lattices", type=Path, required=True, help="folder for the recorded lattice files")
    ap.add_argument("--model-dir", type=Path, default=weights.DEFAULT_MODEL_DIR)
    ap.add_argument("--requests", type=int, default=12, help="per split")
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    engine = Engine.load(args.model_dir, device=args.device, dtype=getattr(torch, dtype))
    data = np.load(args.tokens)
    result = {
        **result_header("engine_pair_eval"),
        "dtype": dtype,
        "threads": args.threads,
        "label": LABEL,
        "training": json.loads((args.model_dir / "training-log.json").read_text())[-1],
        "replay": {},
        "live": {},
    }
    lattices = []
    for split in ("dev", "unseen"):
        prompts = file_prompts(data[split], args.requests, args.prompt_len)
        requests = [{"prompt_ids": p, "id": f"{split}-{i}"} for i, p in enumerate(prompts)]
        path = args.lattices / f"pair-{split}.npz"
        recorder = LatticeRecorder(
            path,
            kind="selector",
            positions=16,
            meta={
                "target": "models/target.safetensors",
                "drafter": "models/drafter.safetensors",
                "synthetic": False,
                "label": LABEL,
            },
        )
        ar = engine.record_lattices(
            recorder, requests, positions=16, max_new_tokens=args.new_tokens, labels=[f"stdlib/{split}"] * len(requests)
        )
        recorder.close()
        lattices.append(load_lattice(path))
        chain_engine = engine.with_options(tree="chain", positions=8)
        tree_engine = engine.with_options(tree="best-first", positions=16, nodes=32)
        spec = chain_engine.generate(requests, "spec", max_new_tokens=args.new_tokens)
        tree = tree_engine.generate(requests, "spec", max_new_tokens=args.new_tokens)
        # Medians over requests: the first request of each engine also pays for its CUDA-graph captures.
        result["live"][f"{split}/ar"] = {"median_tokens_per_s": median_rate(ar), "requests": len(ar)}
        for name, runs in (("chain8", spec), ("best_first32", tree)):
            same = sum(x == y for a, s in zip(ar, runs) for x, y in zip(a.output_ids, s.output_ids))
            total = sum(len(a.output_ids) for a in ar)
            result["live"][f"{split}/{name}"] = {
                "tau": sum(sum(g.accepted) for g in runs) / sum(len(g.accepted) for g in runs),
                "token_agreement_with_ar": same / total,
                "identical_outputs": sum(a.output_ids == s.output_ids for a, s in zip(ar, runs)),
                "median_tokens_per_s": median_rate(runs),
                "requests": len(runs),
            }
        graph_errors = {e.graph_error for e in (engine, chain_engine, tree_engine) if e.graph_error}
        result["cuda_graph_errors"] = sorted(graph_errors | set(result.get("cuda_graph_errors", [])))
        print(json.dumps({split: result["live"]}), file=sys.stderr, flush=True)
    for builder, budgets in REPLAYS:
        for run in replay_set(lattices, [builder], budgets):
            for label, tau in run.tau_by_label().items():
                result["replay"].setdefault(label, {})[f"{builder}@{run.nodes}"] = round(tau, 4)
    result["replay_tokens"] = {
        label: int(sum(np.diff(lat.greedy_offsets).sum() for lat in lattices if label in lat.labels))
        for label in result["replay"]
    }
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
