#!/usr/bin/env python3
"""Make the engine's default pair from one command: corpus + tokenizer, target + drafter, GPU reference.

    python3 scripts/train_pair.py                      # everything, into models/
    python3 scripts/train_pair.py --prepare-only       # corpus tokens only (then train where the GPU is)

Steps: (1) read the stdlib files pinned in models/corpus-manifest.json (skipping any whose bytes differ
on this Python), encode them with models/tokenizer.json into --tokens; (2) train the target, then the
drafter (distilled on the target's greedy rollouts), seeded (specpilot_mem.engine.train.train); (3) record
greedy tokens for the CPU test.
``--rescan`` re-pins the manifest and retrains the tokenizer from this machine's stdlib.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specpilot_mem.engine.train import reference, train  # noqa: E402
from specpilot_mem.engine.train.corpus import prepare  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=ROOT / "models")
    ap.add_argument("--tokens", type=Path, default=ROOT / ".g1data" / "corpus.npz")
    ap.add_argument("--rescan", action="store_true")
    ap.add_argument("--prepare-only", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-seconds", type=float, default=70)
    ap.add_argument(
        "--rollout-seconds", type=float, default=15, help="greedy rollouts of the target to distil the drafter on"
    )
    ap.add_argument("--drafter-seconds", type=float, default=140)
    args = ap.parse_args()
    print(json.dumps(prepare(args.models, args.tokens, rescan=args.rescan)), flush=True)
    if args.prepare_only:
        return 0
    train.main(
        [
            "--tokens",
            str(args.tokens),
            "--out",
            str(args.models),
            "--seed",
            str(args.seed),
            "--target-seconds",
            str(args.target_seconds),
            "--rollout-seconds",
            str(args.rollout_seconds),
            "--drafter-seconds",
            str(args.drafter_seconds),
        ]
    )
    return reference.main(
        [
            "--model-dir",
            str(args.models),
            "--tokens",
            str(args.tokens),
            "--out",
            str(args.models / "greedy-reference.json"),
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
