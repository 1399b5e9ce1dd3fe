"""W12 GEMM vs cuBLAS BF16 on the GPU: correctness, autotune and timing in one call.

Prints one JSON document (the shared result header, then the figures). Weights are seeded random N(0, 0.02)
BF16: the timings are synthetic-weight timings (speed does not depend on values except through the
escape count, which is reported). Method: CUDA-graph replay over rotating weight copies (>= 4x L2 in
total), median of >= 10 replays; W12 and cuBLAS (torch.matmul) timed the same way in one run.

    PYTHONPATH=kernels:. python benchmarks/w12_gemm_bench.py [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from specpilot_kernels.w12 import encode, w12_gemm
from specpilot_kernels.w12.configs import GemmConfig, select_config
from specpilot_kernels.w12.gemm import launch
from specpilot_kernels.w12.mma import (
    MAX_STAGED_ROWS,
    MAX_WGMMA_WARPS_PER_BLOCK,
    STEP_PLANS,
    MmaConfig,
    default_mma_config,
    select_mma_config,
    to_mma_layout,
    w12_mma_gemm,
)
from specpilot_kernels.w12.reference import gemm_reference
from specpilot_mem.bench.cuda_timing import ClockLog, graph_replay_us, read_bandwidth
from specpilot_mem.bench.runs import log
from specpilot_mem.bench.shapes import PROJECTIONS, SHAPES
from specpilot_mem.provenance import result_header, write_result

ROWS = (1, 2, 4, 8, 16, 32, 48, 64)
L2_BYTES = 60 * 2**20
REPLAYS = 15
TUNE_ROWS = {1: 3, 8: 1, 16: 1, 32: 1}  # rows timed while tuning (1 stands for 1-4 rows), weights
PLAN_BASES = 6  # the best mma partitions also timed at 32 rows with the other step plans
FINALISTS = 4  # the best partitions re-timed side by side (row by row) before one is chosen: sweep timings drift
# sm_90a: warpgroups a K class a block tried for warpgroup MMAs (5: 20 warps, one block a multiprocessor with the ring)
WGMMA_GROUPS = (1, 2, 4, 5)
# Tails (mma.py, row regions): shorter K chains for the rows past the first region's whole rounds of blocks, the rounds
# counted at 16 and 12 resident warps a multiprocessor (the per-warp kernels' 128 and 166 registers at 16 and 32 rows)
TAIL_PARTITIONS = ((1, 8, 1), (1, 4, 2), (4, 2, 1), (4, 1, 2), (1, 8, 2), (1, 4, 4), (2, 4, 2))
TAIL_WARPS_PER_SM = (16, 12)
TAIL_MIN_GAIN = 0.02  # a tail changes its rows' bits: taken only when its score beats one region's by this much
SETTLED_ROWS = (1, 16, 32, 64)  # --settle: rows also timed at the clock the power cap settles at under each kernel


def tune_score(times_us: dict) -> float:
    """Weighted geometric mean of a partition's times at TUNE_ROWS (the 1-32-row geomean's row weights)."""
    return math.exp(sum(w * math.log(times_us[m]) for m, w in TUNE_ROWS.items()) / sum(TUNE_ROWS.values()))


def candidate_configs(n: int, k: int, sms: int) -> list[GemmConfig]:
    """Triton partitions worth trying: K split only while the row blocks alone give too few programs."""
    out, seen = [], set()
    kp = -(-k // 128) * 128
    for block_n in (64,):  # 128-row blocks lost everywhere in the first sweep (docs/w12-notes.md)
        programs = -(-n // block_n)
        for splits in (1, 2, 4, 8, 16, 17):
            splits = GemmConfig(splits=splits).effective_splits(kp)
            if (block_n, splits) in seen or (splits > 1 and (programs >= 2 * sms or programs * splits > 8 * sms)):
                continue
            seen.add((block_n, splits))
            out.append(GemmConfig(block_n=block_n, splits=splits, num_warps=4, num_stages=1))
    return out


def mma_candidates(n: int, k: int, sms: int) -> list[MmaConfig]:
    """mma.sync partitions with at least 2 warps of work per multiprocessor (runtime parameters: no rebuild), timed
    with the weights staged through shared memory up to 16 rows (how far to stage is chosen after the partition)."""
    tiles, chunks = -(-n // 16), -(-k // 128)
    out = []
    # odd warps_k too: e.g. 640 tiles x 3 warps = 14.5 warps per multiprocessor fill one wave on 132 of them
    pairs = [(n, k) for n in (8, 4, 2, 1) for k in (1, 2, 3, 4, 5, 6, 8) if n * k <= 16]
    for warps_n, warps_k in pairs:
        for splits in (1, 2, 4, 8):
            warps = tiles * warps_k * splits
            needless_split = splits > 1 and tiles * warps_k >= 16 * sms  # the tiles alone fill the GPU
            if chunks < 2 * warps_k * splits or warps < 2 * sms or needless_split:
                continue
            out.append(MmaConfig(warps_n, warps_k, splits, staged_rows=MAX_STAGED_ROWS))
    default = replace(default_mma_config(n, k, sms), staged_rows=MAX_STAGED_ROWS)
    return out if default in out else out + [default]


def tail_candidates(cfg: MmaConfig, n: int, k: int, sms: int) -> list[MmaConfig]:
    """``cfg`` with each tail partition of :data:`TAIL_PARTITIONS` on the rows past whole rounds of its blocks."""
    tiles, chunks = n // 16, -(-k // 128)
    out = []
    for warps in TAIL_WARPS_PER_SM if n % 16 == 0 else ():
        per_round = sms * warps // (cfg.warps_k * min(cfg.splits, chunks))  # tiles a round of blocks computes
        whole = tiles // per_round * per_round
        if 0 < whole < tiles:
            out += [
                replace(cfg, tail_rows=16 * (tiles - whole), tail=part)
                for part in TAIL_PARTITIONS
                if chunks >= 2 * part[1] * part[2]
            ]
    return list(dict.fromkeys(out))


def correctness(sms: int, variants) -> dict:
    """Exactness and determinism checks on this GPU (random weights with zeros, denormals, Inf; one
    16-row tile of zeros and a row of denormals, so chunks hold more escapes than a warp's window)."""
    torch.manual_seed(1)
    report = {}
    n, k = 1000, 1536
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w[5, 7] = 0
    w[9, 100] = 1e-39
    w[300, 700] = 3.0e-8
    w[480:496, 256:900] = 0
    w[700, :] = (torch.randn(k, device="cuda") * 1e-39).bfloat16()
    w12 = encode(w)
    mma = to_mma_layout(w12)
    kernels = [
        (f"triton_bn{c.block_n}_s{c.splits}_asm{int(c.use_asm)}", lambda x, c=c: w12_gemm(x, w12, config=c))
        for c in (GemmConfig(64, 2, 4, 3, True), GemmConfig(64, 2, 4, 3, False), GemmConfig(128, 1, 4, 3, True))
    ]
    kernels += [
        (
            f"mma_n{c.warps_n}_k{c.warps_k}_s{c.splits}_p{''.join(map(str, c.plan_32 + c.plan_64))}"
            f"{f'_staged{c.staged_rows}' if c.staged_rows else ''}"
            f"{'_wgmma' + ''.join(map(str, c.wgmma)) if any(c.wgmma) else ''}",
            lambda x, c=c: w12_mma_gemm(x, mma, config=c),
        )
        for c in (
            MmaConfig(4, 1, 1),
            MmaConfig(2, 4, 3),
            MmaConfig(1, 8, 2),
            MmaConfig(1, 5, 1, (2, 1)),
            MmaConfig(2, 2, 1, (2, 2), (2, 2)),
            MmaConfig(2, 4, 3, staged_rows=16),
            MmaConfig(1, 8, 2, staged_rows=8),
            MmaConfig(2, 4, 3, wgmma=(1, 2, 1)),
        )
    ]
    for key, gemm in kernels:
        if key.split("_")[0] not in variants:
            continue
        try:
            # one-hot rows pick weight columns exactly: decode (escapes included) must be bit-exact
            cols = torch.tensor([7, 100, 700, 0, 1535] + list(range(11, 40)), device="cuda")
            x = torch.zeros(cols.numel(), k, device="cuda", dtype=torch.bfloat16)
            x[torch.arange(cols.numel()), cols] = 1
            y = gemm(x)
            exact = torch.equal(y.view(torch.int16), w[:, cols].t().contiguous().view(torch.int16))
            errs, same = {}, True
            x_first = torch.randn(1, k, device="cuda").bfloat16()
            first_bits = gemm(x_first).view(torch.int16)
            for m in (1, 3, 4, 5, 8, 9, 16, 17, 32, 33, 48, 64):
                xm = torch.randn(m, k, device="cuda").bfloat16()
                xm[0] = x_first[0]
                ym = gemm(xm)
                ref = gemm_reference(xm, w12).float()
                errs[m] = ((ym.float() - ref).norm() / ref.norm()).item()
                same = same and torch.equal(ym[:1].view(torch.int16), first_bits)
            report[key] = {"onehot_bit_exact": exact, "rel_err": errs, "row_bits_same_across_M": same}
        except Exception as exc:  # record the failure, keep benchmarking the others
            report[key] = {"error": repr(exc)[:400]}
    return report


def bench_shape(
    name, n, k, sms, read_bw, quick, variants, tune_variants, tails=False, settle_s=0.0, clock=None
) -> dict:
    torch.manual_seed(0)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    w12 = encode(w, check=False)
    torch.cuda.synchronize()
    encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    stats = encode(w, check=True).stats()
    torch.cuda.synchronize()
    encode_checked_s = time.perf_counter() - t0
    w12_bytes = w12.nbytes()
    bf16_bytes = n * k * 2
    copies = max(2, math.ceil(4 * L2_BYTES / w12_bytes))
    w12s = [w12] + [encode(w, check=False) for _ in range(copies - 1)]
    mmas = [to_mma_layout(t) for t in w12s]
    ws = [w] + [w.clone() for _ in range(max(2, math.ceil(4 * L2_BYTES / bf16_bytes)) - 1)]
    wts = [t.t() for t in ws]
    result = {
        "N": n,
        "K": k,
        "w12": stats,
        "encode_s": encode_s,
        "encode_checked_s": encode_checked_s,
        "copies_w12": copies,
        "copies_bf16": len(ws),
    }
    gemms = {  # variant -> (configs, call on copy i); "triton": Triton (wgmma on sm_90), "mma": CUDA mma.sync (sm_120 variant)
        "triton": (
            candidate_configs(n, k, sms),
            lambda cfg, x, y, i, lb: w12_gemm(x, w12s[i], config=cfg, low_bits=lb, out=y),
        ),
        "mma": (
            mma_candidates(n, k, sms),
            lambda cfg, x, y, i, lb, **options: w12_mma_gemm(x, mmas[i], config=cfg, low_bits=lb, out=y, **options),
        ),
    }
    fixed = {"triton": select_config(n, k, torch.device("cuda")), "mma": select_mma_config(n, k, torch.device("cuda"))}

    def time_variant(variant, cfg, m, low_bits="exact", settle_s=0.0, **options):
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        call = gemms[variant][1]
        return (
            graph_replay_us(
                lambda i: call(cfg, x, y, i, low_bits, **options), copies, max(copies, 8), REPLAYS, settle_s
            )
            * 1e-6
        )

    def ran_as_asked(cfg, m):
        """Whether cfg's launch at m rows ran the warpgroups it asks for (a block that fits no multiprocessor runs
        with fewer, or as the per-warp kernel: timing it would time another option). A tail's warpgroups follow the
        first region's and may fall back like this by design; every fallback is noted."""
        launched = []
        w12_mma_gemm(torch.randn(m, k, device="cuda").bfloat16(), mmas[0], config=cfg, launched=launched)
        asked = [part.warpgroups(m, torch.cuda.get_device_capability()) for _, _, part in cfg.regions(n)]
        if launched != asked:
            result.setdefault("wgmma_fell_back", []).append(
                {"rows": m, "wgmma": cfg.wgmma, "tail": cfg.tail, "asked": asked, "ran": launched}
            )
        return launched[0] == asked[0]

    def time_cublas(m, settle_s=0.0):
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        return (
            graph_replay_us(lambda i: torch.matmul(x, wts[i], out=y), len(ws), max(len(ws), 8), REPLAYS, settle_s)
            * 1e-6
        )

    windows = {}  # (M, what) -> the wall-clock window it was timed in, for the clock log

    def timed_window(m, what, measure):
        start = time.time()
        seconds = measure()
        windows[(m, what)] = (start, time.time())
        return seconds

    # autotune at 1, 8, 16 and 32 rows, weighted as the rows of the 1-32 geometric mean, preferring partitions no
    # slower than cuBLAS at any of them; the chosen partition then serves every row count
    tune, best = [], {}
    cublas_tune_us = {m: time_cublas(m) * 1e6 for m in TUNE_ROWS}
    result["cublas_tune_us"] = cublas_tune_us

    def beats_cublas(entry):
        return all(entry[f"t{m}_us"] <= cublas_tune_us[m] for m in TUNE_ROWS)

    def config_of(entry):
        kind = GemmConfig if entry["variant"] == "triton" else MmaConfig
        return kind(**{f: entry[f] for f in kind.__dataclass_fields__})

    def try_config(variant, cfg, same_below_17=None):
        """Time cfg at TUNE_ROWS; same_below_17: an entry whose kernel up to 16 rows is cfg's (its times reused)."""
        entry = {"variant": variant, **asdict(cfg)}
        try:
            for m in TUNE_ROWS:
                entry[f"t{m}_us"] = (
                    same_below_17[f"t{m}_us"] if same_below_17 and m <= 16 else time_variant(variant, cfg, m) * 1e6
                )
            entry["score"] = tune_score({m: entry[f"t{m}_us"] for m in TUNE_ROWS})
            if variant not in best or entry["score"] < best[variant][1]["score"]:
                best[variant] = (cfg, entry)
        except Exception as exc:  # record the failure, keep tuning the others
            entry["error"] = repr(exc)[:300]
        tune.append(entry)
        log(name, entry)

    for variant, (configs, _) in gemms.items():
        if variant not in variants:
            continue
        if variant not in tune_variants:  # the tuned partition on file (or the default), not re-tuned
            try_config(variant, fixed[variant])
            continue
        for cfg in configs[:3] if quick else configs:
            try_config(variant, cfg)
        if variant == "mma":  # the other step plans at 17-32 rows, for the best partitions
            bases = sorted((e for e in tune if e["variant"] == "mma" and "score" in e), key=lambda e: e["score"])
            for base in bases[: 1 if quick else PLAN_BASES]:
                for plan in STEP_PLANS[32][1:]:
                    cfg = MmaConfig(
                        base["warps_n"], base["warps_k"], base["splits"], plan_32=plan, staged_rows=base["staged_rows"]
                    )
                    try_config(variant, cfg, same_below_17=base)
        ranked = sorted((e for e in tune if e["variant"] == variant and "score" in e), key=lambda e: e["score"])
        # distinct, best first; then the best that were no slower than cuBLAS at every tuned row count
        finalists = list(dict.fromkeys(config_of(e) for e in ranked))[:FINALISTS]
        finalists += [c for c in dict.fromkeys(config_of(e) for e in ranked if beats_cublas(e)) if c not in finalists][
            : FINALISTS // 2
        ]
        if len(finalists) > 1:
            times = {i: {} for i in range(len(finalists))}
            for m in TUNE_ROWS:  # each row count timed for every finalist back to back
                for i, cfg in enumerate(finalists):
                    times[i][m] = time_variant(variant, cfg, m) * 1e6
            scores = [tune_score(times[i]) for i in range(len(finalists))]
            result.setdefault("finalists", {})[variant] = [
                {**asdict(cfg), **{f"t{m}_us": t for m, t in times[i].items()}, "score": scores[i]}
                for i, cfg in enumerate(finalists)
            ]
            # the two targets in order: no row count slower than cuBLAS, then the weighted geomean
            feasible = [i for i in range(len(finalists)) if beats_cublas({f"t{m}_us": t for m, t in times[i].items()})]
            i = min(feasible or range(len(finalists)), key=scores.__getitem__)
            best[variant] = (finalists[i], result["finalists"][variant][i])
        if variant == "mma":  # 33-64 rows (outside the score): the fastest plan for the chosen partition
            cfg = best[variant][0]
            plan_us = {plan: time_variant(variant, replace(cfg, plan_64=plan), 64) * 1e6 for plan in STEP_PLANS[64]}
            result["plan_64_us"] = {",".join(map(str, p)): t for p, t in plan_us.items()}
            best[variant] = (replace(cfg, plan_64=min(plan_us, key=plan_us.get)), best[variant][1])
    if "mma" in best:  # up to how many rows to stage the weights through shared memory (tuned or not: no bit changes)
        cfg = replace(best["mma"][0], wgmma=(0, 0, 0))  # per-warp kernels first; warpgroup MMAs are chosen last
        staged_us = {
            m: {
                staged: time_variant("mma", replace(cfg, staged_rows=MAX_STAGED_ROWS if staged else 0), m) * 1e6
                for staged in (True, False)
            }
            for m in (1, 2, 4, 8, 16)
        }
        result["staged_us"] = {m: {"staged": t[True], "registers": t[False]} for m, t in staged_us.items()}
        # stage up to the row count that saves the most in the geometric mean over the timed counts (ties: fewer)
        saved, total = {0: 0.0}, 0.0
        for m, t in staged_us.items():
            total += math.log(t[False] / t[True])
            saved[m] = total
        best["mma"] = (replace(cfg, staged_rows=max(saved, key=lambda m: (round(saved[m], 3), -m))), best["mma"][1])
        # whether 17-32 rows share activations through a block's ring (tuned or not: no bit changes): the fastest at 32
        # rows of every step plan with each warp loading its activations and of whole steps sharing them, 16 warps a
        # block or fewer tiles, 4 or 6 slots
        cfg = best["mma"][0]
        tiles = sorted({t for t in (16 // cfg.warps_k, 8, 5, 4, 2) if 1 <= t and t * cfg.warps_k <= 16}, reverse=True)
        options = [replace(cfg, plan_32=plan, shared_x_32=(0, 0)) for plan in STEP_PLANS[32]]
        options += [replace(cfg, plan_32=(4, 1), shared_x_32=(t, ring)) for t in tiles for ring in (4, 6)]
        shared_us = {}
        for option in options:
            key = f"plan{''.join(map(str, option.plan_32))}_shared{','.join(map(str, option.shared_x_32))}"
            try:
                shared_us[key] = (time_variant("mma", option, 32) * 1e6, option)
            except RuntimeError as exc:  # e.g. a block larger than the register file
                result.setdefault("shared_x_errors", {})[key] = repr(exc)[:200]
        result["shared_x_32_us"] = {key: t for key, (t, _) in shared_us.items()}
        best["mma"] = (min(shared_us.values(), key=lambda v: v[0])[1], best["mma"][1])
        # sm_90: whether each row range (9-16, 17-32, 33-64) runs as warpgroup MMAs (WGMMA_GROUPS warpgroups a K class a
        # block) or per-warp mma.sync, timed at its largest row count (no bit changes); each option twice, in turn,
        # keeping its faster time (the options are often within a few percent)
        if torch.cuda.get_device_capability()[0] == 9:
            cfg, chosen, wgmma_us = best["mma"][0], [0, 0, 0], {}
            for slot, m in enumerate((16, 32, 64)):
                options = {0: cfg}
                for groups in WGMMA_GROUPS:
                    if 4 * groups * cfg.warps_k > MAX_WGMMA_WARPS_PER_BLOCK:
                        continue
                    option = replace(cfg, wgmma=tuple(groups if i == slot else 0 for i in range(3)))
                    if ran_as_asked(option, m):
                        options[groups] = option
                times = {
                    groups: min(time_variant("mma", option, m) for _ in range(2)) * 1e6
                    for groups, option in options.items()
                }
                wgmma_us[m] = {("per_warp" if groups == 0 else f"warpgroups{groups}"): t for groups, t in times.items()}
                chosen[slot] = min(times, key=times.get)
            result["wgmma_us"] = wgmma_us
            best["mma"] = (replace(cfg, wgmma=tuple(chosen)), best["mma"][1])
        # a tail partition for the rows past whole rounds (changes which partition sums those rows): tuned with the
        # partition, or asked for (--tails). A tail changes which kernel is fastest at 17-32 rows (the rounds of the
        # warpgroup kernel fill the GPU once the tail is apart), so each tail is timed with each choice there; every
        # time is the faster of two
        if "mma" in tune_variants or tails:
            cfg = best["mma"][0]
            groups_32 = [
                g
                for g in dict.fromkeys((cfg.wgmma[1], 0, *WGMMA_GROUPS))
                if torch.cuda.get_device_capability()[0] == 9 or g == 0
            ]
            tail_us, scores = [], {}
            for option in [replace(cfg, tail_rows=0, tail=(0, 0, 0))] + tail_candidates(cfg, n, k, sms):
                try:
                    times = {
                        m: min(time_variant("mma", option, m) for _ in range(2)) * 1e6 for m in TUNE_ROWS if m < 32
                    }
                except RuntimeError as exc:  # e.g. a block larger than the register file
                    tail_us.append({"tail_rows": option.tail_rows, "tail": option.tail, "error": repr(exc)[:300]})
                    continue
                for groups in groups_32:
                    if 4 * groups * cfg.warps_k > MAX_WGMMA_WARPS_PER_BLOCK:
                        continue
                    choice = replace(option, wgmma=(cfg.wgmma[0], groups, cfg.wgmma[2]))
                    if not ran_as_asked(choice, 32):
                        continue
                    entry = {"tail_rows": option.tail_rows, "tail": option.tail, "wgmma": choice.wgmma}
                    try:
                        t32 = min(time_variant("mma", choice, 32) for _ in range(2)) * 1e6
                        entry.update({f"t{m}_us": t for m, t in {**times, 32: t32}.items()})
                        entry["score"] = scores[choice] = tune_score({**times, 32: t32})
                    except RuntimeError as exc:
                        entry["error"] = repr(exc)[:300]
                    tail_us.append(entry)
            result["tail_us"] = tail_us
            one_region = min((c for c in scores if not c.tail_rows), key=scores.get)
            tailed = min(scores, key=scores.get)
            chosen = tailed if scores[tailed] < (1 - TAIL_MIN_GAIN) * scores[one_region] else one_region
            best["mma"] = (chosen, best["mma"][1])
    if "triton" in best:  # which MMA instruction the tuned Triton kernel uses
        x = torch.randn(16, k, device="cuda").bfloat16()
        y = torch.empty(16, n, device="cuda", dtype=torch.bfloat16)
        cfg = best["triton"][0]
        compiled = launch(x, w12, y, cfg, 0, torch.empty(cfg.splits * 16 * n, device="cuda"))
        result["triton_ptx"] = {"wgmma": "wgmma" in compiled.asm["ptx"], "shared_bytes": compiled.metadata.shared}
    result["autotune"] = tune
    rows = []
    for m in ROWS:
        cub = timed_window(m, "cublas", lambda m=m: time_cublas(m))
        row = {
            "M": m,
            "cublas_us": cub * 1e6,
            "cublas_TBps": bf16_bytes / cub / 1e12,
            "cublas_frac_floor": bf16_bytes / read_bw / cub,
        }
        if settle_s and m in SETTLED_ROWS:
            row["cublas_settled_us"] = timed_window(m, "cublas_settled", lambda m=m: time_cublas(m, settle_s)) * 1e6
        for variant, (cfg, _) in best.items():
            t = timed_window(m, variant, lambda v=variant, c=cfg, m=m: time_variant(v, c, m))
            if settle_s and m in SETTLED_ROWS:
                settled = timed_window(
                    m, f"{variant}_settled", lambda v=variant, c=cfg, m=m: time_variant(v, c, m, settle_s=settle_s)
                )
                row[f"{variant}_settled_us"] = settled * 1e6
                row[f"{variant}_settled_speedup"] = row["cublas_settled_us"] * 1e-6 / settled
                row[f"{variant}_settled_frac_floor"] = w12_bytes / read_bw / settled
            row[f"{variant}_us"] = t * 1e6
            row[f"{variant}_TBps"] = w12_bytes / t / 1e12
            row[f"{variant}_frac_floor"] = w12_bytes / read_bw / t
            row[f"{variant}_speedup"] = cub / t
            if m in (1, 16):
                row[f"{variant}_qpass_midpoint_us"] = time_variant(variant, cfg, m, "midpoint") * 1e6
            if variant == "mma":  # launched without overlapping the kernel before it, and the other step plans
                row["mma_no_overlap_us"] = time_variant(variant, cfg, m, overlap_prior=False) * 1e6
                if m in (32, 64):  # each plan with each warp loading its own activations
                    row["mma_plan_us"] = {
                        ",".join(map(str, p)): time_variant(
                            variant, replace(cfg, shared_x_32=(0, 0), wgmma=(0, 0, 0), **{f"plan_{m}": p}), m
                        )
                        * 1e6
                        for p in STEP_PLANS[m]
                    }
        rows.append(row)
        log(name, row)
    if clock:  # each timing's SM clock, power and power-cap throttling (its samples are all written by now)
        clocks = clock.summaries(windows)
        for row in rows:
            row["clock"] = {what: summary for (m, what), summary in clocks.items() if m == row["M"]}
    result["best"] = {v: asdict(c) for v, (c, _) in best.items()}
    result["rows"] = rows
    for copies_of in (w12s, mmas, ws, wts):  # the copies, before the next shape allocates its own
        copies_of.clear()
    torch.cuda.empty_cache()
    return result


def summarize(shapes: dict) -> dict:
    def ratios(names, variant, ms=(1, 2, 4, 8, 16, 32)):
        return [
            r[f"{variant}_speedup"]
            for nm in names
            for r in shapes[nm]["rows"]
            if r["M"] in ms and f"{variant}_speedup" in r
        ]

    def geomean(values):
        return math.exp(sum(map(math.log, values)) / len(values))

    out = {}
    for variant in ("triton", "mma"):
        proj = ratios([p for p in PROJECTIONS if p in shapes], variant)
        if proj:
            out[f"{variant}_geomean_speedup_projections_1_32"] = geomean(proj)
            out[f"{variant}_min_speedup_projections_1_32"] = min(proj)
        head = ratios(["lm_head"], variant) if "lm_head" in shapes else []
        if head:
            out[f"{variant}_lm_head_geomean_speedup_1_32"] = geomean(head)
            out[f"{variant}_lm_head_min_speedup_1_32"] = min(head)
        for nm in ("lm_head", "gate_up"):
            if nm in shapes:
                fr = [
                    r[f"{variant}_frac_floor"]
                    for r in shapes[nm]["rows"]
                    if r["M"] <= 32 and f"{variant}_frac_floor" in r
                ]
                if fr:
                    out[f"{variant}_{nm}_frac_floor_1_32_min"] = min(fr)
        settled = {
            nm: {
                r["M"]: round(r[f"{variant}_settled_speedup"], 3)
                for r in shape["rows"]
                if f"{variant}_settled_speedup" in r
            }
            for nm, shape in shapes.items()
        }
        if any(settled.values()):
            out[f"{variant}_settled_speedup"] = settled
    return out


def write_config(path: Path, gpu: str, shape: dict) -> None:
    """Merge a shape's tuned mma config into the configs file under the GPU's name (replaced whole, never half-written)."""
    tuned = json.loads(path.read_text()) if path.exists() else {}
    config = dict(shape["best"]["mma"])
    if not config.get("tail_rows"):  # one row region: the defaults, left out
        for key in ("tail_rows", "tail"):
            config.pop(key, None)
    tuned.setdefault(gpu, {})[f"{shape['N']},{shape['K']}"] = config
    staged = path.with_suffix(".json.tmp")
    one_line = lambda m: "[" + ", ".join(re.findall(r"\d+", m.group(0))) + "]"  # noqa: E731 - plans on one line
    staged.write_text(re.sub(r"\[\s+\d+(?:,\s+\d+)*\s+\]", one_line, json.dumps(tuned, indent=1)) + "\n")
    os.replace(staged, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="few configs (smoke test)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"names ({', '.join(SHAPES)}) or NxK")
    parser.add_argument(
        "--write-configs",
        type=Path,
        default=None,
        help="merge each shape's tuned mma partition into this mma_configs.json (under the GPU's name)",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--variants", default="triton,mma", help="kernels to time: triton, mma")
    parser.add_argument(
        "--tails",
        action="store_true",
        help="time tail partitions (mma.py, row regions) for the mma partition even when it is not tuned",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help=f"also time rows {', '.join(map(str, SETTLED_ROWS))} after SECONDS of untimed replays: "
        "the pace at the SM clock each kernel's power settles at under the board's power cap",
    )
    parser.add_argument(
        "--tune",
        default=None,
        help="variants to autotune (default: all timed; none: no variant); "
        "the others run their tuned partition on file",
    )
    args = parser.parse_args()
    tune = args.variants if args.tune is None else "" if args.tune == "none" else args.tune
    for flag, names in (("--variants", args.variants), ("--tune", tune)):
        unknown = [v for v in names.split(",") if v and v not in ("triton", "mma")]
        if unknown:
            parser.error(f"{flag}: unknown kernel(s) {', '.join(unknown)}; choose from triton, mma")
    for name in args.shapes.split(","):
        if name not in SHAPES and not re.fullmatch(r"\d+x\d+", name):
            parser.error(f"--shapes: {name!r} is neither a named shape ({', '.join(SHAPES)}) nor NxK (e.g. 4096x14336)")
    props = torch.cuda.get_device_properties(0)
    doc = {
        **result_header("w12_gemm_bench"),
        "weights": "synthetic: seeded N(0, 0.02) BF16",
        "method": f"CUDA-graph replay over rotating copies >= 4x{L2_BYTES >> 20} MB, median of {REPLAYS}; on sm_90+ "
        "each mma launch overlaps the tail of the call before it (programmatic dependent launch; "
        "mma_no_overlap_us: the same calls launched without); with --settle, *_settled_*: rows "
        f"{', '.join(map(str, SETTLED_ROWS))} timed after that many seconds of untimed replays; clock: "
        "each timing's SM clock, power and power-cap throttling (nvidia-smi, 100 ms samples)",
    }
    doc["read_bw_Bps"] = read_bandwidth()
    log("read bw", doc["read_bw_Bps"] / 1e12)
    doc["correctness"] = correctness(props.multi_processor_count, args.variants.split(","))
    log(json.dumps(doc["correctness"], indent=1))
    doc["shapes"] = {}
    with ClockLog() as clock:
        for name in args.shapes.split(","):
            n, k = SHAPES[name] if name in SHAPES else map(int, name.split("x"))
            doc["shapes"][name] = bench_shape(
                name,
                n,
                k,
                props.multi_processor_count,
                doc["read_bw_Bps"],
                args.quick,
                args.variants.split(","),
                tune.split(","),
                args.tails,
                args.settle,
                clock,
            )
            doc["summary"] = summarize(doc["shapes"])
            if args.out:
                write_result(doc, args.out)
            if args.write_configs and "mma" in doc["shapes"][name]["best"]:  # after every shape: a cut-off run keeps
                write_config(args.write_configs, props.name, doc["shapes"][name])  # its tuning
    enc = [(s["N"] * s["K"], s["encode_s"]) for s in doc["shapes"].values()]
    rate = sum(e for e, _ in enc) / sum(t for _, t in enc)
    doc["encode"] = {
        "weights_per_s": rate,
        "extrapolated_27e9_weights_s": 27e9 / rate,
        "note": "extrapolated from the timed shapes' encode throughput (GPU, unchecked encode); "
        "the checked encode adds one decode + compare per tensor",
    }
    doc["summary"] = summarize(doc["shapes"])
    if args.out:
        write_result(doc, args.out)
        for name, shape in doc["shapes"].items():  # a short table last; the full document is in --out
            log(name, shape["best"], shape["w12"])
            for r in shape["rows"]:
                log(
                    "  M=%-3d cublas %7.1f us" % (r["M"], r["cublas_us"]),
                    " ".join(
                        f"{v} {r[v + '_us']:7.1f} us x{r[v + '_speedup']:.2f} floor {r[v + '_frac_floor']:.2f}"
                        + (
                            f" settled x{r[v + '_settled_speedup']:.2f} floor {r[v + '_settled_frac_floor']:.2f}"
                            if v + "_settled_us" in r
                            else ""
                        )
                        for v in ("triton", "mma")
                        if v + "_us" in r
                    ),
                )
        log(json.dumps({"summary": doc["summary"], "encode": doc["encode"], "read_bw": doc["read_bw_Bps"]}))
    else:
        print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
