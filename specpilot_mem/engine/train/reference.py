"""Greedy tokens of the trained pair recorded where it was trained (the H200), which a CPU test replays.

    python3 -m specpilot_mem.engine.train.reference --model-dir models --tokens .g1data/corpus.npz \
        --out models/greedy-reference.json

Prompts are slices of the unseen split, stored in the file with the greedy tokens and the scorer's
top-2 margin at each position, so the test can name the near-ties where CPU rounding may pick the
other token.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from specpilot_mem.engine.config import EngineOptions
from specpilot_mem.engine.engine import Engine

PROMPT_OFFSETS = (0, 7919, 15838, 31676)
PROMPT_LEN = 48
NEW_TOKENS = 24


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--tokens", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    unseen = np.load(args.tokens)["unseen"].astype(np.int64)
    prompts = [unseen[o % (unseen.size - PROMPT_LEN) :][:PROMPT_LEN].tolist() for o in PROMPT_OFFSETS]
    # float32 eager passes: the same arithmetic the CPU test runs, so only rounding differs.
    engine = Engine.load(args.model_dir, device=device, dtype=torch.float32, options=EngineOptions(cuda_graphs=False))
    runs = engine.generate(prompts, "ar", max_new_tokens=NEW_TOKENS)
    margins = [engine.score(p, r.output_ids).top2_margin for p, r in zip(prompts, runs)]
    payload = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": "float32",
        "prompts": prompts,
        "greedy": [r.output_ids for r in runs],
        "top2_margin": margins,
    }
    args.out.write_text(json.dumps(payload) + "\n")
    print(json.dumps({"reference": str(args.out), "greedy": payload["greedy"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
