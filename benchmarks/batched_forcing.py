"""Token forcing on the batching mechanisms at a sample large enough to accept: the trained pair decoded live
through the composed engine's batched decoder (``batching.system_decoder.PolicyDecoder``), AR and stock
(δ calibrated on them, Phase 0) and each policy configuration judged against stock.

    PYTHONPATH=kernels:. python3 benchmarks/batched_forcing.py --tokens .g1data/corpus.npz --out batched-forcing.json

Prompts: ``--prompt-len`` tokens at every ``--stride`` tokens of the dev and unseen files. The policies decide
from the 4B-like c(R) measured on the H200 (``--costs``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.batching.costs import StepCosts  # noqa: E402
from specpilot_mem.batching.simulate import CONFIGS  # noqa: E402
from specpilot_mem.batching.system_decoder import PolicyDecoder  # noqa: E402
from specpilot_mem.controller.requests import Request  # noqa: E402
from specpilot_mem.controller.system import RequestOutput  # noqa: E402
from specpilot_mem.engine.decode import SystemDecoder  # noqa: E402
from specpilot_mem.engine import weights  # noqa: E402
from specpilot_mem.engine.engine import Engine  # noqa: E402
from specpilot_mem.forcing.calibrate import calibrate_delta  # noqa: E402
from specpilot_mem.forcing.engine_adapter import EngineScorer  # noqa: E402
from specpilot_mem.forcing.scorer import score_outputs  # noqa: E402
from specpilot_mem.forcing.verdict import TokenForcing  # noqa: E402
from specpilot_mem.provenance import print_result, result_header, write_result  # noqa: E402

JUDGED = ("shared-budget", "drafter-block", "shared-budget+drafter-block")


def windows(stream: np.ndarray, length: int, stride: int, eot_id: int = 0) -> list[list[int]]:
    """``length``-token windows every ``stride`` tokens inside each file of a split's stream."""
    starts = np.concatenate([[0], np.flatnonzero(stream == eot_id) + 1])
    out = []
    for a, b in zip(starts[:-1], starts[1:]):
        out.extend(stream[s : s + length].astype(np.int64).tolist() for s in range(a, b - length - 1, stride))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=480)
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--stride", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--costs", type=Path, default=Path("benchmarks/results/batched-costs-h200-2026-12-02.json"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--judged", default=",".join(JUDGED), help="configurations judged against stock")
    ap.add_argument("--segment", type=int, default=16, help="prompt admission's segment rows")
    ap.add_argument(
        "--drafter", type=Path, help="drafter file beside the pair's target (the batching evidence's: drafter-blocks)"
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = Engine.load_default()
    if args.drafter is not None:
        if not args.drafter.is_file():
            raise SystemExit(f"--drafter {args.drafter}: no such file (the pair's drafters are under models/)")
        engine = Engine(engine.target, weights.load_drafter(args.drafter, engine.target.cfg))
    costs = StepCosts.from_measurement({**json.loads(args.costs.read_text()), "source": str(args.costs)}, "4b")
    data = np.load(args.tokens)
    pool = windows(data["dev"], args.prompt_len, args.stride) + windows(data["unseen"], args.prompt_len, args.stride)
    prompts = pool[:: max(1, len(pool) // args.requests)][: args.requests]
    requests = [Request(f"r{i}", "stdlib", "dev", args.new_tokens, prompt_ids=tuple(p)) for i, p in enumerate(prompts)]
    max_len = args.prompt_len + args.new_tokens + 40 + args.segment  # a last segment's padding
    scorer = EngineScorer(engine)
    doc = {
        **result_header("batched_forcing"),
        "label": "the small pair trained here, float32 on the CPU",
        "requests": len(requests),
        "new_tokens": args.new_tokens,
        "batch": args.batch,
        "costs": costs.source,
        "drafter": str(args.drafter or "models/drafter.safetensors"),
        "runs": {},
        "verdicts": {},
    }

    def decode(decoder, mode):
        start = time.perf_counter()
        runs = decoder.generate(prompts, mode, args.new_tokens)
        outputs = {
            r.id: RequestOutput(r.id, tuple(g.output_ids), 0.0, tuple(g.token_times)) for r, g in zip(requests, runs)
        }
        tokens, steps = sum(len(g.output_ids) for g in runs), sum(g.steps for g in runs)
        return outputs, {"seconds": round(time.perf_counter() - start, 1), "tau": tokens / max(steps, 1)}

    base = SystemDecoder(engine, batch=args.batch, max_len=max_len)
    ar, doc["runs"]["ar"] = decode(base, "ar")
    stock, doc["runs"]["stock"] = decode(
        PolicyDecoder(engine, CONFIGS["stock"], costs, args.batch, max_len=max_len, weights=base.weights), "spec"
    )
    ar_scored, stock_scored = score_outputs(scorer, requests, ar), score_outputs(scorer, requests, stock)
    calibration = calibrate_delta(ar_scored, stock_scored)
    doc["delta"] = calibration.delta
    forcing = TokenForcing(scorer, stock_scored, delta=calibration.delta)
    for name in args.judged.split(","):
        decoder = PolicyDecoder(
            engine, CONFIGS[name], costs, args.batch, max_len=max_len, weights=base.weights, segment=args.segment
        )
        outputs, doc["runs"][name] = decode(decoder, "spec")
        if CONFIGS[name].admission:
            chunks = list(decoder.admitted.values())
            doc["runs"][name]["admitted_prompts"] = sum(any(w > 0 for _, w in c) for c in chunks)
        doc["runs"][name]["identical_to_ar"] = sum(outputs[r].output_ids == ar[r].output_ids for r in ar)
        verdict = forcing.judge(name, score_outputs(scorer, requests, outputs))
        doc["verdicts"][name] = {"verdict": verdict.verdict, "reasons": list(verdict.reasons)}
        print(f"{name}: {verdict.verdict} {doc['runs'][name]}", file=sys.stderr, flush=True)
        if args.out:
            write_result(doc, args.out)
    doc["headline"] = (
        "token forcing: "
        + ", ".join(f"{k} {v['verdict']}" for k, v in doc["verdicts"].items())
        + f" ({len(requests)} requests x {args.new_tokens} tokens, B={args.batch})"
    )
    print_result(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
