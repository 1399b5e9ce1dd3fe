"""Token forcing's scorer speed on the trained pair: the batched whole-sequence scorer (one pass per
output, many outputs per pass) against the engine's per-request chunked scorer, in one process.

Outputs are ``--tokens`` tokens in all, as long outputs (``--output-tokens`` each, the sealed final's
long-output pass: up to the pair's 2,048-token context less the prompt) after the fault-study
prompts; their token values do not change a teacher-forced pass's cost, so they are drawn at random
(seeded). The baseline scores ``--baseline-tokens`` of them the old way and is scaled per token.

    nice -n 10 python benchmarks/forcing_score_bench.py --tokens 20000 --out benchmarks/results/forcing_score_bench-cpu.json
    python benchmarks/forcing_score_bench.py --device cuda --dtype bfloat16 --tokens 120000 --out r.json

Imports only torch, numpy and this package's engine/forcing/controller modules (runs on the GPU machine).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from specpilot_mem.controller.requests import Request, load_requests  # noqa: E402
from specpilot_mem.controller.system import RequestOutput  # noqa: E402
from specpilot_mem.engine.engine import Engine  # noqa: E402
from specpilot_mem.forcing.engine_adapter import BATCH_TOKENS, EngineScorer  # noqa: E402
from specpilot_mem.forcing.scorer import score_outputs  # noqa: E402
from specpilot_mem.provenance import result_header, write_result  # noqa: E402


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--tokens", type=int, default=100_000, help="scored output tokens in all")
    parser.add_argument("--output-tokens", type=int, default=1_984, help="tokens per output (prompt + output <= 2,048)")
    parser.add_argument("--baseline-tokens", type=int, default=4_000, help="tokens the per-request baseline scores")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda:0" if args.device == "cuda" else args.device
    engine = Engine.load_default(device=device, dtype=getattr(torch, args.dtype))
    scorer = EngineScorer(engine)
    pool = load_requests(ROOT / "requests" / "fault-study-v1.jsonl")
    rng = np.random.default_rng(0)
    per = min(args.output_tokens, engine.max_len - max(len(r.prompt_ids) for r in pool))
    count = -(-args.tokens // per)
    requests = [
        Request(f"b{i:04d}", "bench", "unseen", per, prompt_ids=pool[i % len(pool)].prompt_ids) for i in range(count)
    ]
    outputs = {
        r.id: RequestOutput(r.id, tuple(int(t) for t in rng.integers(1, engine.target.cfg.vocab_size, per)))
        for r in requests
    }
    warm = requests[:1]
    score_outputs(scorer, warm, outputs)
    _sync(device)
    start = time.perf_counter()
    cpu_start = time.process_time()
    scored = score_outputs(scorer, requests, outputs)
    _sync(device)
    batched_s, batched_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    tokens = sum(o.tokens for o in scored.values())
    base_n = max(1, min(len(requests), -(-args.baseline_tokens // per)))
    start = time.perf_counter()
    for r in requests[:base_n]:
        scorer.score(list(r.prompt_ids), list(outputs[r.id].output_ids))
    _sync(device)
    baseline_s = time.perf_counter() - start
    baseline_per_token = baseline_s / (base_n * per)
    doc = result_header("forcing_score_bench")
    doc.update(
        {
            "model": "trained pair (small models trained here)",
            "dtype": args.dtype,
            "threads": torch.get_num_threads(),
            "tokens": tokens,
            "outputs": len(requests),
            "tokens_per_output": per,
            "batch_tokens": BATCH_TOKENS,
            "batched": {"seconds": batched_s, "cpu_seconds": batched_cpu_s, "tokens_per_second": tokens / batched_s},
            "per_request_baseline": {
                "tokens": base_n * per,
                "seconds": baseline_s,
                "tokens_per_second": 1 / baseline_per_token,
            },
            "speedup": baseline_per_token * tokens / batched_s,
            "projected_seconds_for_100k": 100_000 * batched_s / tokens,
            "target": "100,000 scored tokens <= 600 s on a 2-core machine",
        }
    )
    doc["headline"] = (
        f"{tokens} tokens scored in {batched_s:.0f} s ({tokens / batched_s:.0f} tok/s batched, "
        f"{doc['speedup']:.1f}x the per-request scorer; {args.dtype}, {doc['threads']} thread(s))"
    )
    write_result(doc, args.out)
    print(
        f"scored {tokens} tokens in {batched_s:.1f} s ({tokens / batched_s:.0f} tok/s, batched); per-request baseline "
        f"{1 / baseline_per_token:.0f} tok/s; 100k tokens -> {doc['projected_seconds_for_100k']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
