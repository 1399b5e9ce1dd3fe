"""Live batched decoding on the composed engine with the batching policies (``batching.system_decoder``): the
trained pair through ``engine.decode.SystemDecoder`` at 1-64 requests in flight, AR, stock and each policy
configuration on the same requests; tokens per second, tau, and agreement with AR per batch size.

    PYTHONPATH=kernels:. python3 benchmarks/batched_live.py --out batched-live-h200.json
    PYTHONPATH=kernels:. TRITON_INTERPRET=1 python3 benchmarks/batched_live.py --device cpu --batches 1,2 --requests 4 --new-tokens 8

The pair is small (launch-bound on a GPU), so its speedups are not the paper's shapes'; the policies decide
from the 4B-like c(R) measured on the H200 (``--costs``), or the roofline model without it. Prompts: the
pair's greedy-reference prompts, each cut at several offsets.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.batching.costs import StepCosts  # noqa: E402
from specpilot_mem.batching.simulate import CONFIGS  # noqa: E402
from specpilot_mem.batching.system_decoder import PolicyDecoder  # noqa: E402
from specpilot_mem.engine import weights  # noqa: E402
from specpilot_mem.engine.decode import SystemDecoder  # noqa: E402
from specpilot_mem.engine.engine import Engine  # noqa: E402
from specpilot_mem.provenance import print_result, result_header, write_result  # noqa: E402

LIVE = ("stock", "shared-budget", "drafter-block", "shared-budget+drafter-block")


def prompts(count: int, length: int) -> list[list[int]]:
    reference = json.loads((weights.DEFAULT_MODEL_DIR / "greedy-reference.json").read_text())["prompts"]
    out = []
    for offset in range(0, 10_000):
        for p in reference:
            if len(out) < count and len(p) >= offset + length:
                out.append(list(p[offset : offset + length]))
        if len(out) >= count:
            return out
    raise SystemExit(f"the reference prompts give only {len(out)} prompts of {length} tokens")


def timed(decoder, requests, mode, new_tokens, device) -> tuple[list, float]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    runs = decoder.generate(requests, mode, new_tokens)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return runs, time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batches", default="1,8,16,32,64")
    ap.add_argument("--requests", type=int, default=96, help="at most; 2 x B (at least 8) per batch size")
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--costs", type=Path, default=Path("benchmarks/results/batched-costs-h200-2026-12-02.json"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    engine = Engine.load_default(device, dtype)
    costs = (
        StepCosts.from_measurement({**json.loads(args.costs.read_text()), "source": str(args.costs)}, "4b")
        if args.costs.exists()
        else StepCosts.roofline("4b")
    )
    pool = prompts(args.requests, args.prompt_len)
    max_len = args.prompt_len + args.new_tokens + 40
    doc = {
        **result_header("batched_live"),
        "dtype": str(dtype).replace("torch.", ""),
        "requests": len(pool),
        "new_tokens": args.new_tokens,
        "costs": costs.source,
        "costs_measured": costs.measured,
        "label": "live: the small pair trained here (launch-bound), policies deciding from the 4B-like c(R)",
        "by_batch": {},
        "errors": {},
    }
    for b in [int(x) for x in args.batches.split(",")]:
        row = {}
        requests = pool[: max(8, 2 * b)]
        try:
            ar_decoder = SystemDecoder(engine, batch=b, max_len=max_len)
            ar, seconds = timed(ar_decoder, requests, "ar", args.new_tokens, device)
            row["ar"] = {
                "tokens_per_s": sum(len(r.output_ids) for r in ar) / seconds,
                "tau": 1.0,
                "requests": len(requests),
            }
            for name in LIVE:
                decoder = PolicyDecoder(
                    engine, CONFIGS[name], costs, batch=b, max_len=max_len, weights=ar_decoder.weights
                )
                runs, seconds = timed(decoder, requests, "spec", args.new_tokens, device)
                tokens = sum(len(r.output_ids) for r in runs)
                same = sum(x == y for r, a in zip(runs, ar) for x, y in zip(r.output_ids, a.output_ids))
                steps = sum(r.steps for r in runs)
                row[name] = {
                    "tokens_per_s": tokens / seconds,
                    "tau": tokens / max(steps, 1),
                    "over_ar": tokens / seconds / row["ar"]["tokens_per_s"],
                    "token_agreement_with_ar": same / max(tokens, 1),
                    "blocks": decoder.stats["blocks"],
                }
        except Exception as exc:  # noqa: BLE001 - keep the batch sizes measured so far
            doc["errors"][str(b)] = f"{type(exc).__name__}: {exc}"[:400]
        doc["by_batch"][str(b)] = row
        print(
            f"B={b}: " + ", ".join(f"{k} {v['tokens_per_s']:.0f} tok/s" for k, v in row.items()),
            file=sys.stderr,
            flush=True,
        )
        if args.out:
            write_result(doc, args.out)
    print_result(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
