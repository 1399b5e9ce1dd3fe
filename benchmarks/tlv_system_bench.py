"""TLV live in the system engine on the trained pair (CPU float32): τ per exact pass of the TLV cycle against the
single-pass best-first step at N nodes, the Q pass's agreement along C, token identity to AR, and token forcing
(TLV: lossless, must not be rejected; the accept-from-Q variant: lossy, must be rejected).

    PYTHONPATH=kernels:. python benchmarks/tlv_system_bench.py [--requests 12] [--new-tokens 96] [--positions 8,16]
        [--only REGEX] [--out FILE]

The exact pass reads W12, which is lossless against BF16 weights, so the pair's weights are rounded to BF16 first
(kept in float32): AR, stock, every system and the FP32 scorer then share the weights W12 reproduces. Prompts: the
first ``--prompt-len`` tokens of files of the unseen split. AR and stock always run (stock is the forcing reference,
δ is calibrated from AR vs stock).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tlv_engine_bench import (  # noqa: E402
    add_run_arguments,
    only_systems,
    stock_forcing,
    system_entry,
    tau_per_pass,
    unseen_prompts,
    unseen_requests,
)

from specpilot_mem.bench.runs import log  # noqa: E402
from specpilot_mem.controller.system import RequestOutput  # noqa: E402
from specpilot_mem.engine.decode import SystemDecoder  # noqa: E402
from specpilot_mem.engine.engine import Engine  # noqa: E402
from specpilot_mem.engine.options import SystemOptions  # noqa: E402
from specpilot_mem.engine.tlv_system import SystemTwoLevel  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

LABEL = "small models trained here, CPU float32 (weights rounded to BF16) — tau and agreement are the pair's"
LOSSY = "accept-from-q"


def exact_options(positions: int, nodes: int) -> SystemOptions:
    return SystemOptions(
        linears="w12", lm_head="w12", gdn_verify="path", tree="best-first", nodes=nodes, positions=positions
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(ap, requests=12)
    ap.add_argument(
        "--activations",
        default="fp8",
        choices=("fp8", "bf16"),
        help="the Q pass's activations: E4M3 per row (the FP8 tensor-core Q pass, emulated here) or as they are",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    engine = Engine.load(args.model_dir)
    with torch.no_grad():
        for p in engine.target.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    prompts = unseen_prompts(args.model_dir, args.requests, args.prompt_len)
    requests = unseen_requests(prompts, args.new_tokens)
    max_len = args.prompt_len + args.new_tokens + 4 * (args.nodes + 1) + 8
    positions_list = [int(p) for p in args.positions.split(",")]
    base = SystemDecoder(engine, exact_options(positions_list[0], args.nodes), batch=1, max_len=max_len)
    # name -> a callable giving the generations
    systems = {
        "ar": lambda: base.generate(prompts, mode="ar", max_new_tokens=args.new_tokens),
        "stock": lambda: base.with_options(SystemOptions()).generate(
            prompts, mode="spec", max_new_tokens=args.new_tokens
        ),
    }
    for positions in positions_list:
        dec = base.with_options(exact_options(positions, args.nodes))
        systems[f"best-first-p{positions}"] = lambda dec=dec: dec.generate(
            prompts, mode="spec", max_new_tokens=args.new_tokens
        )
        systems[f"tlv-p{positions}"] = lambda dec=dec: SystemTwoLevel(dec, activations=args.activations).generate(
            prompts, args.new_tokens
        )
        systems[f"tlv-truncated-p{positions}"] = lambda dec=dec: SystemTwoLevel(
            dec, "truncated", activations=args.activations
        ).generate(prompts, args.new_tokens)
        systems[f"tlv-{LOSSY}-p{positions}"] = lambda dec=dec: SystemTwoLevel(
            dec, accept_from_qpass=True, activations=args.activations
        ).generate(prompts, args.new_tokens)
    systems = only_systems(systems, args.only)
    result = {
        **result_header("tlv_system_bench"),
        "label": LABEL,
        "model_dir": str(args.model_dir),
        "requests": len(requests),
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "nodes": args.nodes,
        "builder": "best-first",
        "qpass_activations": args.activations,
        "engine": "system engine (SystemModel / SystemDecoder), one request in flight",
        "device": "cpu",
        "dtype": "float32",
    }
    generations, outputs = {}, {}
    for name, run in systems.items():
        t0 = time.perf_counter()
        generations[name] = run()
        outputs[name] = {
            r.id: RequestOutput(r.id, tuple(g.output_ids)) for r, g in zip(requests, generations[name], strict=True)
        }
        log(f"{name}: {time.perf_counter() - t0:.1f} s, tau {tau_per_pass(generations[name]):.2f}")
    scored, forcing = stock_forcing(engine, requests, outputs)
    result["delta"] = forcing.delta
    out = {}
    for name, gens in generations.items():
        entry = system_entry(name, gens, requests, outputs, scored, forcing, synthetic=engine.synthetic)
        entry["exact_passes"] = sum(len(g.accepted) for g in gens)
        if name.startswith("tlv"):
            entry["median_cycle_s_cpu"] = statistics.median(t for g in gens for t in g.step_times)
        out[name] = entry
    result["systems"] = out
    summary = {}
    for positions in positions_list:
        single, tlv = out.get(f"best-first-p{positions}"), out.get(f"tlv-p{positions}")
        if single and tlv:
            summary[f"p{positions}"] = {
                "tau_single_pass": single["tau_per_exact_pass"],
                "tau_tlv": tlv["tau_per_exact_pass"],
                "tau_ratio": tlv["tau_per_exact_pass"] / single["tau_per_exact_pass"],
                "target_ratio": 1.6,
                "tlv_identical_to_ar": f"{tlv['identical_to_ar']}/{len(requests)}",
                "tlv_verdict": tlv["token_forcing"]["verdict"],
            }
    result["summary"] = summary
    result["lossy_verdicts"] = {n: e["token_forcing"]["verdict"] for n, e in out.items() if LOSSY in n}
    result["headline"] = "; ".join(
        [
            f"P={k[1:]}: tau/exact pass {v['tau_tlv']:.2f} vs best-first {v['tau_single_pass']:.2f} "
            f"({v['tau_ratio']:.2f}x), identical to AR {v['tlv_identical_to_ar']}, forcing {v['tlv_verdict']}"
            for k, v in summary.items()
        ]
        + [
            f"{n}: {e['token_forcing']['verdict']} (mismatch {100 * e['token_forcing']['mismatch_rate']:.2f}%, "
            f"{e['token_forcing']['unexplained']} unexplained events)"
            for n, e in out.items()
            if LOSSY in n
        ]
    )
    result["wall_s"] = round(time.perf_counter() - started, 1)
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
