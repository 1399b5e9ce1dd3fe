"""Fault study (paper §6.2): does token forcing reject the injected fault and accept lossless variants?

For each seed, the pure-torch engine (seeded random weights unless the trained pair is committed)
serves a seeded sample of the project's requests as AR, stock (speculative, chain), the lossless
variants and the faulty system (+2 logit bias on every 7th vocabulary id from output token
``--fault-after`` on). The engine's teacher-forced scorer (FP32 LM head) scores every output, δ is
calibrated on AR vs stock, and each system is judged against stock. Prints JSON: per-seed verdicts,
and the fault's rejection rate and the lossless variants' false-rejection rate with sample sizes.

    python benchmarks/fault_study.py --device cuda --seeds 8 > benchmarks/results/fault_study-<date>.json
    python benchmarks/fault_study.py --device cuda --dtype bfloat16 --seeds 12 --budget-seconds 60 > trained.json
    python benchmarks/fault_study.py --figure benchmarks/results/fault_study-<date>.json figure4.png

Imports only torch, numpy and this package's engine/forcing/controller modules (no rich, pydantic or
scipy), so it runs on the lent GPU machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from specpilot_mem.controller.engine_system import EngineSystem  # noqa: E402
from specpilot_mem.controller.requests import load_requests  # noqa: E402
from specpilot_mem.engine.config import DrafterConfig, TargetConfig  # noqa: E402
from specpilot_mem.engine.engine import Engine  # noqa: E402
from specpilot_mem.engine.weights import has_trained_pair  # noqa: E402
from specpilot_mem.forcing.calibrate import calibrate_delta  # noqa: E402
from specpilot_mem.forcing.engine_adapter import EngineScorer, prompt_encoder  # noqa: E402
from specpilot_mem.forcing.scorer import score_outputs  # noqa: E402
from specpilot_mem.forcing.verdict import TokenForcing, Verdict  # noqa: E402

# Lossless variants: engine options that change floating-point reduction order or the verified
# shape, never which tokens a correct system may accept.
LOSSLESS = {
    "splitk-head": {"lm_head": "splitk"},
    "path-verify": {"gdn_verify": "path"},
    "best-first-tree": {"tree": "best-first"},
}
# A small model for CPU smoke runs of this script (the default is the engine's default config).
TINY_TARGET = TargetConfig(vocab_size=512, d_model=64, layer_types=("gdn", "attn"), ffn_dim=128, gdn_heads=2,
                           gdn_head_dim=32, attn_heads=2, attn_kv_heads=1, attn_head_dim=32, feature_layers=(0, 1))
TINY_DRAFTER = DrafterConfig(d_model=64, n_layers=1, heads=2, head_dim=32, ffn_dim=128, block_size=8,
                             context_window=16, top_k=8, selector_rank=16)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def engine_for(seed: int, args) -> Engine:
    dtype = getattr(torch, args.dtype)
    if has_trained_pair() and not args.random_weights:
        return Engine.load_default(device=args.device, dtype=dtype)
    if args.tiny:
        return Engine.random(seed, TINY_TARGET, TINY_DRAFTER, device=args.device, dtype=dtype)
    return Engine.random(seed, device=args.device, dtype=dtype)


def summary(verdict: Verdict) -> dict:
    rate, events = verdict.rate, verdict.events
    return {
        "verdict": verdict.verdict, "mismatch_rate": rate.system_rate, "mismatch_ci": [rate.system_low, rate.system_high],
        "stock_rate": rate.stock_rate, "difference_low": rate.difference_low, "rate_reject": rate.reject,
        "events": events.system_events, "audited": events.audited, "unexplained": events.unexplained,
        "stock_events": events.stock_events, "p_value": events.p_value, "event_reject": events.reject,
        "explained_by": verdict.explained_by,
    }


def one_seed(seed: int, requests, args) -> dict:
    engine = engine_for(seed, args)
    encode = prompt_encoder(engine)
    sample = sorted(random.Random(seed).sample(requests, min(args.requests_per_seed, len(requests))), key=lambda r: r.id)
    sample = [type(r)(r.id, r.benchmark, r.split, args.max_new_tokens, prompt=r.prompt, prompt_ids=r.prompt_ids) for r in sample]
    systems = {
        "ar": EngineSystem("ar", engine, mode="ar", encode=encode),
        "stock": EngineSystem("stock", engine, mode="spec", encode=encode),
        **{name: EngineSystem(name, engine.with_options(**opts), mode="spec", encode=encode) for name, opts in LOSSLESS.items()},
        "fault": EngineSystem("fault", engine.with_options(fault_after=args.fault_after), mode="spec", encode=encode),
    }
    device = str(engine.device)
    outputs, seconds = {}, {}
    for name, system in systems.items():
        start = time.perf_counter()
        outputs[name] = {o.id: o for o in system.run(sample, batch_size=1, device=device)}
        seconds[name] = time.perf_counter() - start
        log(f"seed {seed}: {name} served {len(sample)} requests in {seconds[name]:.1f} s")
    scorer = EngineScorer(engine, encode=encode)
    scored = {name: score_outputs(scorer, sample, outs) for name, outs in outputs.items()}
    calibration = calibrate_delta(scored["ar"], scored["stock"])
    forcing = TokenForcing(scorer, scored["stock"], calibration.delta, audit_sample=args.audit_sample, seed=seed)
    verdicts = {name: forcing.judge(name, scored[name], synthetic=engine.synthetic)
                for name in [*LOSSLESS, "fault"]}
    for name, verdict in verdicts.items():
        log(f"seed {seed}: {name} -> {verdict.verdict} (mismatch {100 * verdict.rate.system_rate:.2f}%, "
            f"events {verdict.events.system_events}, unexplained {verdict.events.unexplained})")
    return {
        "seed": seed, "synthetic": engine.synthetic, "requests": [r.id for r in sample],
        "tokens": sum(s.tokens for s in scored["stock"].values()),
        "delta": calibration.delta, "departures": len(calibration.departures), "largest_gap": calibration.largest_gap,
        "stock_vs_ar_identical": sum(outputs["ar"][r.id].output_ids == outputs["stock"][r.id].output_ids for r in sample),
        "fault_changed_requests": sum(outputs["fault"][r.id].output_ids != outputs["stock"][r.id].output_ids for r in sample),
        "serve_seconds": seconds,
        "verdicts": {name: summary(v) for name, v in verdicts.items()},
        "full_verdicts": {name: v.to_dict() for name, v in verdicts.items()},
    }


def rates(runs: list[dict]) -> dict:
    """Rejection and false-rejection rates with their sample sizes. A fault that changed no output
    token (its biased ids never overtook the argmax) leaves nothing to detect, so the fault's rate is
    also given over the runs where it changed at least one request's output."""
    fault = [r["verdicts"]["fault"]["verdict"] == "reject" for r in runs]
    effective = [r["verdicts"]["fault"]["verdict"] == "reject" for r in runs if r["fault_changed_requests"] > 0]
    lossless = {name: [r["verdicts"][name]["verdict"] == "reject" for r in runs] for name in LOSSLESS}
    pooled = [x for values in lossless.values() for x in values]
    return {
        "fault_rejection_rate": sum(fault) / len(fault), "fault_runs": len(fault), "fault_rejected": sum(fault),
        "fault_effective_runs": len(effective), "fault_effective_rejected": sum(effective),
        "fault_effective_rejection_rate": sum(effective) / len(effective) if effective else None,
        "lossless_false_rejection_rate": sum(pooled) / len(pooled), "lossless_runs": len(pooled),
        "lossless_rejected": sum(pooled),
        "per_variant": {name: {"runs": len(v), "rejected": sum(v)} for name, v in lossless.items()},
    }


def figure(results_path: str, png: str) -> None:
    from specpilot_mem.forcing.plot import plot_figure4

    results = json.loads(Path(results_path).read_text())
    first = results["runs"][0]
    verdicts = [Verdict.from_dict(v) for v in first["full_verdicts"].values()]
    model = "synthetic" if results["synthetic"] else "small models trained here"
    label = f"Fault study, seed {first['seed']} ({results['device']}, {results.get('dtype', 'float32')}; {model})"
    print(plot_figure4(verdicts, png, title=label))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the served systems' and the scorer's passes (the scorer's LM head is float32 either way)")
    parser.add_argument("--seeds", type=int, default=4, help="repeated runs (weights seed and request sample)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--requests", default=str(ROOT / "requests" / "specpilot-v1.jsonl"))
    parser.add_argument("--requests-per-seed", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--fault-after", type=int, default=32, help="output position the fault starts at (paper: 2048)")
    parser.add_argument("--audit-sample", type=int, default=200)
    parser.add_argument("--tiny", action="store_true", help="a tiny random model (CPU smoke runs)")
    parser.add_argument("--random-weights", action="store_true", help="random weights even if the trained pair exists")
    parser.add_argument("--budget-seconds", type=float,
                        help="start no further seed after this many seconds (a device lease); the JSON counts the runs made")
    parser.add_argument("--figure", nargs=2, metavar=("RESULTS_JSON", "PNG"), help="draw Figure 4 from a results file and exit")
    args = parser.parse_args()
    if args.figure:
        figure(*args.figure)
        return 0
    if args.device.startswith("cuda"):
        args.device = str(torch.device(args.device if ":" in args.device else "cuda:0"))
    requests = load_requests(args.requests)
    started = time.perf_counter()
    runs = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        if runs and args.budget_seconds is not None and time.perf_counter() - started > args.budget_seconds:
            log(f"budget of {args.budget_seconds:.0f} s spent: stopping after {len(runs)} of {args.seeds} seeds")
            break
        runs.append(one_seed(seed, requests, args))
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    result = {
        "benchmark": "fault_study",
        "device": device,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "synthetic": any(r["synthetic"] for r in runs),
        "model": "tiny random" if args.tiny else ("random weights" if any(r["synthetic"] for r in runs) else
                                                  "trained pair (small models trained here, not comparable to the paper's)"),
        "prompt_encoding": "UTF-8 bytes" if any(r["synthetic"] for r in runs) else "the trained pair's tokenizer",
        "dtype": args.dtype,
        "seeds_planned": args.seeds,
        "settings": {"max_new_tokens": args.max_new_tokens, "fault_after": args.fault_after, "fault_bias": 2.0,
                     "fault_stride": 7, "requests_per_seed": args.requests_per_seed, "audit_sample": args.audit_sample,
                     "lossless_variants": LOSSLESS},
        "wall_seconds": time.perf_counter() - started,
        **rates(runs),
        "runs": runs,
    }
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
