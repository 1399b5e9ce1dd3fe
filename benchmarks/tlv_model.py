"""The modelled single-request gain of TLV: the H200 pass times at the 27B-like shape combined with the trained pair's
τ per exact pass (``tlv_engine_bench.py`` or ``tlv_system_bench.py``), with a bootstrap interval over requests.

Pass times: ``--system`` takes the system engine's whole passes (``tlv_qpass_probe.py``: draft, Q pass, exact step,
stock step, each a CUDA graph of every kernel); ``--qpass`` the weight GEMMs alone (``tlv_qpass_bench.py``), below.

    step time of a system = drafts x T_draft + its passes, each pass = the sum of its weight GEMMs
    (layers x (qkv + o_proj + gate_up + down) + LM head, as tlv_qpass_bench sums them), at its row count
    stock          : one draft, one BF16 (cuBLAS) pass over the chain (positions + 1 rows), τ of the stock chain
    single-pass    : one draft, one exact W12 pass over the N-node tree (N + 1 rows), τ of best-first
    TLV            : two drafts, one Q pass and one exact W12 pass over N + 1 rows, τ of TLV
    gain           = (τ / step time) of one system over another's

Only the weight GEMMs are modelled (attention over the cache, GDN state, norms and glue are the same bytes in every
system but add to each step, so the real gains are smaller); the drafter is ``--drafter-layers`` layers of the
target's projections in BF16 at ``--draft-rows`` rows plus the LM head at those rows in W12 (DFlash reuses the
target's head) — an assumption, printed with the result.

    PYTHONPATH=kernels:. python benchmarks/tlv_model.py (--system PROBE.json | --qpass QPASS.json) --engine ENGINE.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.provenance import print_result, result_header  # noqa: E402

PROJECTIONS = ("qkv", "o_proj", "gate_up", "down")


def row_entry(shape: dict, rows: int) -> dict:
    for row in shape["rows"]:
        if row["M"] == rows:
            return row
    raise SystemExit(
        f"the Q-pass result has no {rows}-row timing for N={shape['N']}, K={shape['K']}; "
        f"it has {[r['M'] for r in shape['rows']]}: rerun tlv_qpass_bench.py with --rows including {rows}"
    )


def pass_us(shapes: dict, rows: int, key: str, layers: int, head_key: str | None = None) -> float:
    total = sum(layers * row_entry(shapes[name], rows)[key] for name in PROJECTIONS)
    return total + row_entry(shapes["lm_head"], rows)[head_key or key]


def tau(entry: dict, picks: list[int]) -> float:
    per = entry["per_request"]
    return sum(per["tokens"][i] for i in picks) / sum(per["exact_passes"][i] for i in picks)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qpass", type=Path, help="tlv_qpass_bench.py's GEMM times (the GEMM-only model)")
    ap.add_argument(
        "--system",
        type=Path,
        help="tlv_qpass_probe.py's system section instead: whole passes in the system engine (draft, Q pass, exact "
        "step, stock step), every kernel of a step included",
    )
    ap.add_argument(
        "--q-mode",
        default=None,
        help="with --system from tlv_fp8_qpass_bench.py: the Q mode whose passes to take (e.g. fp8_midpoint)",
    )
    ap.add_argument("--stock", type=Path, default=None, help="a system result with stock's step, if --system has none")
    ap.add_argument("--tlv-system", default=None, help="the engine result's TLV system to take τ from (default tlv-pP)")
    ap.add_argument("--engine", type=Path, required=True)
    ap.add_argument("--tree-rows", type=int, default=33, help="rows of an N = 32 tree and its root")
    ap.add_argument(
        "--chain-rows", type=int, default=16, help="rows timed for stock's chain (8 positions + anchor: 16)"
    )
    ap.add_argument("--draft-rows", type=int, default=16)
    ap.add_argument("--drafter-layers", type=int, default=5)
    ap.add_argument("--positions", type=int, default=16, help="drafted positions of the compared systems")
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if (args.qpass is None) == (args.system is None):
        raise SystemExit("give one of --qpass (GEMM times) or --system (the system engine's whole passes)")
    engine = json.loads(args.engine.read_text())
    if args.system:
        probe = json.loads(args.system.read_text())
        key = f"rows={args.tree_rows}" + (f",{args.q_mode}" if args.q_mode else "")
        stock_probe = json.loads(args.stock.read_text()) if args.stock else probe
        passes, stock = probe["system"].get(key), stock_probe["system"].get("stock")
        if passes is None or stock is None:
            raise SystemExit(
                f"{args.system} has no system timing {key!r} and of stock (it has {sorted(probe['system'])}): rerun "
                "tlv_qpass_probe.py or tlv_fp8_qpass_bench.py with its system section, or pick --q-mode"
            )
        ms = 1000.0
        draft, exact, q = ms * passes["draft_ms"], ms * passes["exact_step_ms"], ms * passes["qpass_ms"]
        stock_draft, stock_pass = ms * stock["draft_ms"], ms * stock["step_ms"]
        gpu = probe.get("device", {}).get("name")
        modelled = "whole passes in the system engine (every kernel, one CUDA graph each); host tree build left out"
    else:
        qpass = json.loads(args.qpass.read_text())
        shapes, layers = qpass["shapes"], qpass["layers"]
        draft = (
            args.drafter_layers * sum(row_entry(shapes[n], args.draft_rows)["cublas_bf16_us"] for n in PROJECTIONS)
            + row_entry(shapes["lm_head"], args.draft_rows)["exact_w12_us"]
        )
        exact = pass_us(shapes, args.tree_rows, "exact_w12_us", layers)
        q = pass_us(shapes, args.tree_rows, "triton_qpass_midpoint_us", layers)
        stock_draft, stock_pass = draft, pass_us(shapes, args.chain_rows, "cublas_bf16_us", layers)
        gpu = qpass.get("gpu")
        modelled = "weight GEMMs only; attention, GDN state, norms and glue left out"
    times = {
        "draft_us": draft,
        "exact_pass_us": exact,
        "q_pass_us": q,
        "stock_pass_us": stock_pass,
        "stock_step_us": stock_draft + stock_pass,
        "single_step_us": draft + exact,
        "tlv_cycle_us": 2 * draft + q + exact,
    }
    systems = engine["systems"]
    tlv_name = args.tlv_system or f"tlv-p{args.positions}"
    names = {"stock": "stock", "single": f"best-first-p{args.positions}", "tlv": tlv_name}
    requests = len(systems["stock"]["per_request"]["tokens"])

    def gains(picks):
        t = {k: tau(systems[v], picks) for k, v in names.items()}
        rate = {
            "stock": t["stock"] / times["stock_step_us"],
            "single": t["single"] / times["single_step_us"],
            "tlv": t["tlv"] / times["tlv_cycle_us"],
        }
        return t, {
            "tlv_over_single": rate["tlv"] / rate["single"],
            "tlv_over_stock": rate["tlv"] / rate["stock"],
            "single_over_stock": rate["single"] / rate["stock"],
        }

    taus, point = gains(list(range(requests)))
    rng = random.Random(0)
    samples = [gains([rng.randrange(requests) for _ in range(requests)])[1] for _ in range(args.resamples)]
    interval = {}
    for key in point:
        values = sorted(s[key] for s in samples)
        interval[key] = [values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]]
    result = {
        **result_header("tlv_model"),
        "inputs": {
            "qpass": str(args.qpass or ""),
            "system": str(args.system or ""),
            "q_mode": args.q_mode,
            "stock": str(args.stock or args.system or ""),
            "tlv_system": tlv_name,
            "engine": str(args.engine),
        },
        "assumptions": {
            "drafter": f"{args.drafter_layers} layers of the target's projections (cuBLAS BF16) at "
            f"{args.draft_rows} rows + the W12 LM head at {args.draft_rows} rows"
            if args.qpass
            else "the system engine's synthetic drafter block (docs/engine.md)",
            "modelled": modelled,
            "tau": "the trained pair (CPU), not the 27B target",
            "gpu": gpu,
        },
        "positions": args.positions,
        "tree_rows": args.tree_rows,
        "times": times,
        "q_over_exact": q / exact,
        "tau": taus,
        "gain": point,
        "gain_95_interval_over_requests": interval,
        "requests": requests,
    }
    result["headline"] = (
        f"modelled TLV gain over single-pass W12 + tree {point['tlv_over_single']:.3f}x "
        f"[{interval['tlv_over_single'][0]:.3f}, {interval['tlv_over_single'][1]:.3f}], over stock "
        f"{point['tlv_over_stock']:.2f}x; Q/exact {q / exact:.2f} at {args.tree_rows} rows"
    )
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
