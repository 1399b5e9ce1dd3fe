"""Lattices of the trained pair for the batched benchmarks: teacher-forced at every greedy position, once
per drafter block (16, 12 and 8 masked positions in the drafter's forward), on the same greedy outputs.

    PYTHONPATH=kernels:. python3 benchmarks/batched_lattices.py --tokens .g1data/corpus.npz --out /tmp/batched-lattices \
        --drafter models/batching/drafter-blocks.safetensors

Writes ``pair-<split>-block<b>.npz`` per split and block (``--requests`` per split, file-start prompts of
``--prompt-len`` tokens, ``--new-tokens`` greedy tokens each) and prints one JSON document. A per-request
drafter block replays exactly from these: a step that drafts b positions reads the block-b file at the
request's position. ``--drafter``: the batching evidence's drafter, trained on every block
(``models/batching/drafter-blocks.safetensors``); the default is the pair's own. 128 new tokens: past them the small
target's greedy text is mostly loops (of 512-token outputs, 96-100% of the positions 256-512 end an 8-gram seen
earlier in the request, 65% of the first 128), which a drafter copies easily, so longer outputs would flatter every
speculative arm rather than make the stream more like served text.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.engine import weights  # noqa: E402
from specpilot_mem.engine.engine import Engine  # noqa: E402
from specpilot_mem.engine.train.corpus import file_prompts  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402
from specpilot_mem.replay.lattice import LatticeRecorder  # noqa: E402

BLOCKS = (16, 12, 8)
LABEL = "small models trained here — not comparable in absolute terms to the paper's"


def shown(path: Path) -> str:
    """``path`` relative to the repository where it is inside it (as the result files name models)."""
    root = Path(__file__).resolve().parents[1]
    return str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)


def lattice_path(folder: Path, split: str, block: int) -> Path:
    return Path(folder) / f"pair-{split}-block{block}.npz"


@torch.no_grad()
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="folder for the lattice files")
    ap.add_argument("--model-dir", type=Path, default=weights.DEFAULT_MODEL_DIR)
    ap.add_argument("--drafter", type=Path, help="drafter file (default: the model dir's drafter.safetensors)")
    ap.add_argument("--splits", default="dev,unseen")
    ap.add_argument("--requests", type=int, default=80, help="per split")
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json-out", type=Path, help="also write the JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    drafter = args.drafter or Path(args.model_dir) / weights.DRAFTER_FILE
    if not drafter.is_file():
        raise SystemExit(f"--drafter {drafter}: no such file (the pair's drafters are under models/)")
    target = weights.load_target(Path(args.model_dir) / weights.TARGET_FILE)
    engine = Engine(target, weights.load_drafter(drafter, target.cfg))
    data = np.load(args.tokens)
    doc = {
        **result_header("batched_lattices"),
        "label": LABEL,
        "drafter": shown(drafter),
        "new_tokens": args.new_tokens,
        "blocks": list(BLOCKS),
        "files": {},
    }
    for split in args.splits.split(","):
        prompts = file_prompts(data[split], args.requests, args.prompt_len)
        requests = [{"prompt_ids": p, "id": f"{split}-{i}"} for i, p in enumerate(prompts)]
        started = time.perf_counter()
        greedy = engine.generate(requests, "ar", args.new_tokens)
        for block in BLOCKS:
            path = lattice_path(args.out, split, block)
            recorder = LatticeRecorder(
                path,
                kind="selector",
                positions=block,
                meta={
                    "target": shown(Path(args.model_dir) / weights.TARGET_FILE),
                    "drafter": shown(drafter),
                    "drafter_block": block,
                    "synthetic": False,
                    "label": LABEL,
                },
            )
            engine.record_lattices(
                recorder,
                requests,
                positions=block,
                labels=[f"stdlib/{split}"] * len(requests),
                block=block,
                greedy=greedy,
            )
            recorder.close()
            doc["files"][path.name] = {
                "split": split,
                "block": block,
                "requests": len(requests),
                "tokens": sum(len(g.output_ids) for g in greedy),
            }
        doc["files"][f"{split}-seconds"] = round(time.perf_counter() - started, 1)
        print(f"{split}: {len(requests)} requests in {doc['files'][f'{split}-seconds']} s", file=sys.stderr, flush=True)
    print_result(doc, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
