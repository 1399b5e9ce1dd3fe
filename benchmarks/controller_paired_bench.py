"""Paired runs of the controller on the pure-torch engine: stock-vs-stock noise and the gain of stock over
a variant that is slower by construction, interleaved on one device and over a device pool (when there
are two or more), with the promotion rule's decision. Prints JSON.

    PYTHONPATH=kernels:. python3 benchmarks/controller_paired_bench.py                  # every visible GPU
    PYTHONPATH=. python3 benchmarks/controller_paired_bench.py --devices cpu:0,cpu:1 --per-benchmark 2 --max-new-tokens 16

Each mode is a section (``record_section``): a mode that fails records its error and keeps the other's
figures, and ``--out`` holds everything measured so far if the run is cut short.

The variant ("path-verify") is stock with the GDN verify done by the path recurrence, eagerly: the same
tokens (up to rounding), several times more kernel launches per step, so its direction is known and
the controller must find stock faster and promote it. On the CPU, "cpu:0,cpu:1" rehearses a pool
(two engines served from two threads). Without the committed trained pair the weights are seeded
random (labelled synthetic).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from specpilot_mem.forcing.engine_adapter import prompt_encoder  # noqa: E402
from specpilot_mem.controller.engine_system import EngineSystem  # noqa: E402
from specpilot_mem.controller.paired import PairedResult, paired_run, stock_noise  # noqa: E402
from specpilot_mem.controller.promotion import PromotionRule  # noqa: E402
from specpilot_mem.engine.engine import Engine  # noqa: E402
from specpilot_mem.bench.cuda_timing import record_section  # noqa: E402
from specpilot_mem.bench.runs import log, pick_requests  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

LABEL = "small models trained here: speeds are not comparable in absolute terms to the paper's"


def device_rates(result: PairedResult) -> dict:
    """Mean output rate (tokens/s over requests and repeats) of each system on each device."""
    rates: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in (*result.runs_a, *result.runs_b):
        rates[run.system][run.device].extend(o.rate for o in run.outputs)
    return {
        system: {device: round(statistics.fmean(values), 2) for device, values in by_device.items()}
        for system, by_device in rates.items()
    }


def measure(stock, variant, requests, devices, repeats: int) -> dict:
    start = time.perf_counter()
    noise = stock_noise(stock, requests, repeats=repeats, devices=devices)
    log(f"{devices}: stock-vs-stock noise {noise.noise:.4f}")
    result = paired_run(variant, stock, requests, repeats=repeats, devices=devices)
    estimate = result.gain(requests)
    decision = PromotionRule().decide(estimate, noise.noise, result.divergent())
    log(
        f"{devices}: stock over {variant.name} {estimate.gain:.3f} [{estimate.low:.3f}, {estimate.high:.3f}], "
        f"promote={decision.promote}"
    )
    return {
        "devices": list(devices),
        "mode": "pool" if len(devices) > 1 else "interleaved",
        "noise": noise.to_dict(),
        "gain_stock_over_variant": estimate.to_dict(),
        "divergent_requests": result.divergent(),
        "decision": decision.to_dict(),
        "rates_tokens_per_s": {"noise_run": device_rates(noise.result), "gain_run": device_rates(result)},
        "seconds": round(time.perf_counter() - start, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    visible = [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]
    ap.add_argument("--devices", default=",".join(visible), help="the pool, comma-separated (default: every GPU)")
    ap.add_argument("--requests", type=Path, default=ROOT / "requests" / "specpilot-v1.jsonl")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--per-benchmark", type=int, default=4, help="requests per benchmark (at least 2)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--random-weights", action="store_true", help="seeded random weights instead of the trained pair")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--out", help="also write the JSON here, after each mode and at the end")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = args.devices.split(",")
    requests = pick_requests(args)

    engines = {d: Engine.random(0, device=d) if args.random_weights else Engine.load_default(device=d) for d in devices}
    encode = prompt_encoder(engines[devices[0]])
    stock = EngineSystem("stock", engines, encode=encode)
    variant = EngineSystem(
        "path-verify", {d: e.with_options(gdn_verify="path") for d, e in engines.items()}, encode=encode
    )
    start = time.perf_counter()
    for system in (stock, variant):  # warm-up: CUDA graph capture counts against neither side
        for device in devices:
            system.run(requests, batch_size=1, device=device)
    warmup = time.perf_counter() - start
    log(f"warm-up {warmup:.1f} s")

    synthetic = engines[devices[0]].synthetic
    record = {
        **result_header("controller_paired_bench"),
        "devices": [torch.cuda.get_device_name(torch.device(d)) if d.startswith("cuda") else "cpu" for d in devices],
        "weights": "seeded random (synthetic)" if synthetic else "the committed trained pair (models/)",
        "synthetic": synthetic,
        "label": LABEL,
        "dtype": str(engines[devices[0]].dtype),
        "requests": {
            "file": str(args.requests.relative_to(ROOT)) if args.requests.is_relative_to(ROOT) else str(args.requests),
            "split": args.split,
            "ids": [r.id for r in requests],
            "max_new_tokens": args.max_new_tokens,
        },
        "repeats": args.repeats,
        "variant": "path-verify: GDN verify by the path recurrence, eager (slower by construction)",
        "warmup_seconds": round(warmup, 2),
    }
    modes = {"interleaved": devices[:1], **({"pool": devices} if len(devices) > 1 else {})}
    for mode, pool in modes.items():
        record_section(record, mode, lambda pool=pool: measure(stock, variant, requests, pool, args.repeats), args.out)
    # read after the runs, so a capture that failed during them shows
    record["cuda_graphs"] = {d: {"captured": e.captured_graphs, "error": e.graph_error} for d, e in engines.items()}
    if all("error" not in record[mode] for mode in modes) and "pool" in modes:
        record["pool_over_interleaved_gain"] = round(
            record["pool"]["gain_stock_over_variant"]["gain"]
            / record["interleaved"]["gain_stock_over_variant"]["gain"],
            4,
        )
    print_result(record, args.out)


if __name__ == "__main__":
    main()
