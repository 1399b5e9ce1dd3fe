"""Two-level verification live on the trained pair: τ per exact pass of the TLV cycle against single-pass best-first at
N nodes (8 and 16 drafted positions), the Q pass's top-1 agreement with the exact pass along C and over the whole
combined tree, |C|, the cycle's time against a single pass's (CPU: labelled, not a GPU figure), and token forcing:
the lossless TLV (midpoint and truncated) and the lossy variant that accepts C from the Q pass, each judged against
stock (δ calibrated on AR vs stock). Prints JSON (``--out`` also writes it).

    PYTHONPATH=kernels:. python benchmarks/tlv_engine_bench.py [--requests 8] [--new-tokens 96] [--out FILE]

Prompts: the first ``--prompt-len`` tokens of files of the unseen split (the pinned corpus, read from this
machine's CPython standard library; files whose bytes differ from their pinned hash are skipped).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.bench.runs import log  # noqa: E402
from specpilot_mem.controller.requests import Request  # noqa: E402
from specpilot_mem.controller.system import RequestOutput  # noqa: E402
from specpilot_mem.engine import weights  # noqa: E402
from specpilot_mem.engine.engine import Engine  # noqa: E402
from specpilot_mem.engine.tlv import TlvOptions, TwoLevelEngine  # noqa: E402
from specpilot_mem.forcing.calibrate import calibrate_delta  # noqa: E402
from specpilot_mem.forcing.engine_adapter import EngineScorer  # noqa: E402
from specpilot_mem.forcing.scorer import score_outputs  # noqa: E402
from specpilot_mem.forcing.verdict import TokenForcing  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

LABEL = "small models trained here, CPU float32 — tau and agreement are the pair's, times are not GPU figures"


def unseen_prompts(model_dir: Path, count: int, length: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    from specpilot_mem.engine.train.corpus import file_prompts, read_pinned

    manifest = json.loads((model_dir / "corpus-manifest.json").read_text())
    texts, _ = read_pinned(manifest["files"])
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    stream = []
    for text in texts["unseen"]:
        stream += tokenizer.encode(text).ids + [0]
    return file_prompts(np.array(stream), count, length)


def tau_per_pass(generations) -> float:
    """Output tokens per exact pass over all requests (each step is one exact pass)."""
    return sum(sum(g.accepted) for g in generations) / sum(len(g.accepted) for g in generations)


def step_seconds(generations) -> float:
    return statistics.median(t for g in generations for t in getattr(g, "step_times", []))


def add_run_arguments(ap: argparse.ArgumentParser, requests: int) -> None:
    """The arguments both TLV benches take: the pair, the unseen prompts, the tree, which systems, the output."""
    ap.add_argument("--model-dir", type=Path, default=weights.DEFAULT_MODEL_DIR)
    ap.add_argument("--requests", type=int, default=requests)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--positions", default="8,16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default=None, help="regex: run only the systems it matches (AR and stock always run)")
    ap.add_argument("--out", type=Path)


def unseen_requests(prompts: list[list[int]], new_tokens: int) -> list[Request]:
    return [Request(f"unseen-{i}", "corpus", "unseen", new_tokens, prompt_ids=tuple(p)) for i, p in enumerate(prompts)]


def only_systems(systems: dict, only: str | None) -> dict:
    """``systems`` cut to those ``only`` matches, AR and stock kept (the forcing reference and δ need them)."""
    if not only:
        return systems
    return {k: v for k, v in systems.items() if k in ("ar", "stock") or re.search(only, k)}


def stock_forcing(engine: Engine, requests: list[Request], outputs: dict) -> tuple[dict, TokenForcing]:
    """Every system's outputs scored by the engine's exact pass, and token forcing against stock with δ calibrated
    on AR vs stock."""
    scorer = EngineScorer(engine)
    scored = {name: score_outputs(scorer, requests, outs) for name, outs in outputs.items()}
    calibration = calibrate_delta(scored["ar"], scored["stock"])
    return scored, TokenForcing(scorer, scored["stock"], calibration.delta)


def system_entry(name, generations, requests, outputs, scored, forcing, *, synthetic) -> dict:
    """One system's result: τ per exact pass, per-request counts, identity to AR; the TLV cycle's chain and Q-pass
    agreement along it; token forcing for every system but the two references."""
    entry = {
        "tau_per_exact_pass": tau_per_pass(generations),
        "per_request": {
            "tokens": [sum(g.accepted) for g in generations],
            "exact_passes": [len(g.accepted) for g in generations],
        },
        "identical_to_ar": sum(outputs[name][r.id].output_ids == outputs["ar"][r.id].output_ids for r in requests),
    }
    if name.startswith("tlv"):
        entry["mean_chain"] = sum(sum(g.chain) for g in generations) / sum(len(g.chain) for g in generations)
        compared = sum(g.chain_compared for g in generations)
        entry["qpass_agreement_along_chain"] = sum(g.chain_agree for g in generations) / compared if compared else None
    if name not in ("ar", "stock"):
        verdict = forcing.judge(name, scored[name], synthetic=synthetic)
        entry["token_forcing"] = {
            "verdict": verdict.verdict,
            "reasons": list(verdict.reasons),
            "mismatch_rate": verdict.rate.system_rate,
            "stock_rate": verdict.rate.stock_rate,
            "events": verdict.events.system_events,
            "unexplained": verdict.events.unexplained,
        }
    return entry


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(ap, requests=8)
    ap.add_argument(
        "--lossy-truncated",
        action="store_true",
        help="also the accept-from-Q variant on the truncated view (a coarser Q pass)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = Engine.load(args.model_dir)
    prompts = unseen_prompts(args.model_dir, args.requests, args.prompt_len)
    requests = unseen_requests(prompts, args.new_tokens)
    result = {
        **result_header("tlv_engine_bench"),
        "label": LABEL,
        "model_dir": str(args.model_dir),
        "requests": len(requests),
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "nodes": args.nodes,
        "builder": "best-first",
        "device": "cpu",
        "dtype": "float32",
    }
    # (decoder, mode) per system: AR, stock (the engine's default chain), single-pass best-first, TLV variants
    systems = {"ar": (engine, "ar"), "stock": (engine, "spec")}
    for positions in (int(p) for p in args.positions.split(",")):
        single = engine.with_options(tree="best-first", positions=positions, nodes=args.nodes)
        systems[f"best-first-p{positions}"] = (single, "spec")
        for name, opts in (
            (f"tlv-p{positions}", dict(measure_agreement=True)),
            (f"tlv-truncated-p{positions}", dict(low_bits="truncated", measure_agreement=True)),
            (f"tlv-accept-from-q-p{positions}", dict(accept_from_qpass=True)),
            *(
                ((f"tlv-accept-from-q-truncated-p{positions}", dict(accept_from_qpass=True, low_bits="truncated")),)
                if args.lossy_truncated
                else ()
            ),
        ):
            systems[name] = (TwoLevelEngine(engine, TlvOptions(nodes=args.nodes, positions=positions, **opts)), "tlv")
    systems = only_systems(systems, args.only)
    batch = [{"prompt_ids": list(r.prompt_ids), "max_new_tokens": r.max_new_tokens, "id": r.id} for r in requests]
    outputs, generations = {}, {}
    for name, (decoder, mode) in systems.items():
        start = time.perf_counter()
        generations[name] = decoder.generate(batch, mode=mode)
        outputs[name] = {
            g.id: RequestOutput(g.id, tuple(g.output_ids), 0.0, tuple(g.token_times)) for g in generations[name]
        }
        log(
            f"{name}: {len(requests)} requests in {time.perf_counter() - start:.1f} s, tau {tau_per_pass(generations[name]):.2f}"
        )
    scored, forcing = stock_forcing(engine, requests, outputs)
    result["delta"] = forcing.delta
    systems_out = {}
    for name in systems:
        gens = generations[name]
        entry = system_entry(name, gens, requests, outputs, scored, forcing, synthetic=engine.synthetic)
        if name.startswith("tlv"):
            entry["median_cycle_s"] = step_seconds(gens)
            tree = sum(g.compared for g in gens)
            entry["qpass_agreement_over_tree"] = sum(g.agree for g in gens) / tree if tree else None
        systems_out[name] = entry
    result["systems"] = systems_out
    summary = {}
    for positions in (int(p) for p in args.positions.split(",")):
        if f"best-first-p{positions}" not in systems_out or f"tlv-p{positions}" not in systems_out:
            continue
        single, tlv = systems_out[f"best-first-p{positions}"], systems_out[f"tlv-p{positions}"]
        summary[f"p{positions}"] = {
            "tau_single_pass": single["tau_per_exact_pass"],
            "tau_tlv": tlv["tau_per_exact_pass"],
            "tau_ratio": tlv["tau_per_exact_pass"] / single["tau_per_exact_pass"],
            "target_ratio": 1.6,
            "tlv_verdict": tlv["token_forcing"]["verdict"],
            "accept_from_q_verdict": systems_out[f"tlv-accept-from-q-p{positions}"]["token_forcing"]["verdict"],
        }
    result["summary"] = summary
    lossy = {name: entry["token_forcing"]["verdict"] for name, entry in systems_out.items() if "accept-from-q" in name}
    result["accept_from_q_verdicts"] = lossy
    result["headline"] = "; ".join(
        f"P={key[1:]}: tau/exact pass {v['tau_tlv']:.2f} vs best-first {v['tau_single_pass']:.2f} ({v['tau_ratio']:.2f}x), "
        f"forcing {v['tlv_verdict']} / accept-from-Q {v['accept_from_q_verdict']}"
        for key, v in summary.items()
    )
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
