"""Stock-vs-stock noise of the per-process device pool against the interleaved one-device run, on the same
requests, with every system in its own worker process (``specpilot_mem.controller.pool``). Prints JSON.

    # CPU workers (two slots, one core each), the committed trained pair in fp32:
    PYTHONPATH=.:kernels python3 benchmarks/controller_pool_bench.py --devices cpu:0,cpu:1 \\
        --variant path-verify='{"gdn_verify": "path"}' --out benchmarks/results/controller-pool-cpu-2026-12-02.json
    # one H200: interleaved on cuda:0 against two worker processes sharing it
    PYTHONPATH=.:kernels python3 benchmarks/controller_pool_bench.py --devices 'cuda:0#0,cuda:0#1' --out OUT.json
    # two GPUs (issue 36): the same command with two devices, and the variants to judge
    PYTHONPATH=.:kernels python3 benchmarks/controller_pool_bench.py --devices cuda:0,cuda:1 \\
        --variant path-verify='{"gdn_verify": "path"}' --variant NAME='{...engine options...}' --out OUT.json

Modes: ``interleaved`` runs A B B A on the first device's slot; ``pool`` runs A and B at once on the
listed slots, swapped A/B/B/A. Each timed run gets a fresh worker (started and warmed up on perturbed
copies of the requests before timing; stopped while not timed), as in rounds. Per mode: the noise
(|gain - 1| of stock over a second copy of stock) with its interval, then for each ``--variant`` the
gain of the variant over stock with the promotion rule's decision at that mode's noise. Each mode and
variant is a section: one that fails records its error, and ``--out`` holds everything measured so far.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specpilot_mem.bench.cuda_timing import record_section  # noqa: E402
from specpilot_mem.bench.runs import log, pick_requests  # noqa: E402
from specpilot_mem.controller.pool import ProcessDevices, RepetitionPolicy, pool_paired_run, pool_stock_noise  # noqa: E402
from specpilot_mem.controller.promotion import PromotionRule  # noqa: E402
from specpilot_mem.provenance import result_header, write_result  # noqa: E402

LABEL = "small models trained here: speeds are not comparable in absolute terms to the paper's"


def encoder(args):
    """The trained pair's tokenizer (prompts are encoded here, so every system gets the same ids)."""
    from specpilot_mem.engine.weights import DEFAULT_MODEL_DIR, has_trained_pair

    if args.random_weights or not has_trained_pair():
        from specpilot_mem.forcing.engine_adapter import utf8_bytes

        return utf8_bytes
    from specpilot_mem.engine.train.corpus import load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL_DIR)
    return lambda text: tokenizer.encode(text).ids


def slot_rates(run) -> dict:
    """Mean output rate (tokens/s over requests and repeats) of each system on each slot."""
    rates: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for each in (*run.paired.runs_a, *run.paired.runs_b):
        rates[each.system][each.device].extend(o.rate for o in each.outputs)
    return {
        system: {slot: round(statistics.fmean(values), 2) for slot, values in by_slot.items()}
        for system, by_slot in rates.items()
    }


def noise_section(devices, stock, requests, policy, encode) -> dict:
    start = time.perf_counter()
    noise, run = pool_stock_noise(devices, stock, requests, policy, encode=encode)
    log(
        f"{devices.slots}: stock-vs-stock noise {noise.noise:.4f} [{noise.estimate.low:.4f}, {noise.estimate.high:.4f}]"
    )
    return {
        "slots": devices.slots,
        "noise": noise.to_dict(),
        "rates_tokens_per_s": slot_rates(run),
        "placement": run.placement,
        "reruns": run.reruns,
        "workers": run.workers,
        "worker_info": run.info,
        "seconds": round(time.perf_counter() - start, 2),
    }


def variant_section(devices, stock, variant, requests, policy, encode, noise: float) -> dict:
    start = time.perf_counter()
    run = pool_paired_run(devices, stock, variant, requests, policy, encode=encode)
    estimate = run.paired.gain(requests)
    decision = PromotionRule().decide(estimate, noise, run.paired.divergent())
    log(
        f"{devices.slots}: {variant['name']} over stock {estimate.gain:.4f} [{estimate.low:.4f}, {estimate.high:.4f}], "
        f"promote={decision.promote}"
    )
    return {
        "options": variant["options"],
        "gain_over_stock": estimate.to_dict(),
        "decision": decision.to_dict(),
        "divergent_requests": run.paired.divergent(),
        "rates_tokens_per_s": slot_rates(run),
        "reruns": run.reruns,
        "seconds": round(time.perf_counter() - start, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--devices", required=True, help="pool slots, comma-separated (cpu:0,cpu:1 / cuda:0#0,cuda:0#1 / cuda:0,cuda:1)"
    )
    ap.add_argument("--requests", type=Path, default=ROOT / "requests" / "specpilot-v1.jsonl")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--per-benchmark", type=int, default=4, help="requests per benchmark (at least 2)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--random-weights", action="store_true", help="seeded random weights (synthetic)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="an engine variant to judge against stock: its name and EngineOptions changes as JSON",
    )
    ap.add_argument("--out", help="also write the JSON here, after each section and at the end")
    args = ap.parse_args()
    slots = args.devices.split(",")
    requests = pick_requests(args)
    encode = encoder(args)
    stock = {
        "name": "stock",
        "adapter": "engine",
        "model": "random" if args.random_weights else "default",
        "dtype": args.dtype,
        "mode": "spec",
        "threads": args.threads,
        "options": {},
    }
    variants = []
    for item in args.variant:
        name, _, options = item.partition("=")
        variants.append({**stock, "name": name, "options": json.loads(options or "{}")})
    policy = RepetitionPolicy(repeats=args.repeats)
    record = result_header("controller_pool_bench") | {
        "label": LABEL,
        "weights": stock["model"],
        "dtype": args.dtype,
        "threads_per_worker": args.threads,
        "requests": {
            "file": str(args.requests.relative_to(ROOT)) if args.requests.is_relative_to(ROOT) else str(args.requests),
            "split": args.split,
            "ids": [r.id for r in requests],
            "max_new_tokens": args.max_new_tokens,
        },
        "policy": policy.to_dict(),
    }
    interleaved = [slots[0].split("#", 1)[0]]
    modes = {"interleaved": interleaved, **({"pool": slots} if len(slots) > 1 else {})}
    for mode, mode_slots in modes.items():
        devices = ProcessDevices(mode_slots)
        try:
            record_section(
                record,
                f"{mode}/noise",
                lambda devices=devices: noise_section(devices, stock, requests, policy, encode),
                args.out,
            )
            noise = record[f"{mode}/noise"].get("noise", {}).get("noise")
            for variant in variants:
                record_section(
                    record,
                    f"{mode}/{variant['name']}",
                    lambda devices=devices, variant=variant, noise=noise: variant_section(
                        devices, stock, variant, requests, policy, encode, noise if noise is not None else 0.0
                    ),
                    args.out,
                )
        finally:
            devices.shutdown()
    if "pool" in modes and all("error" not in record[f"{m}/noise"] for m in modes):
        pool, one = record["pool/noise"]["noise"]["noise"], record["interleaved/noise"]["noise"]["noise"]
        record["pool_over_interleaved_noise"] = round(pool / one, 3) if one > 0 else None
        record["target"] = "pool noise <= 2x the interleaved noise on the same requests"
    if args.out:
        write_result(record, args.out)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
