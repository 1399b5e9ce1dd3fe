"""W12 on the GPU in one call: build, bit-exactness at every row count 1-256 and escape fraction, then timing against
cuBLAS on the five 27B-class shapes (bursts, with escapes, and settled), and optionally a tune of the 33-256-row kernel.

    PYTHONPATH=kernels:. python benchmarks/w12_device_check.py --out benchmarks/results/w12-v2-device-check-h200.json
        [--settle 1.0] [--tune [--tune-budget 120] [--multicast]] [--write-configs mma_configs.json] [--sections ...]

--tune times, per shape and row range (17-32, 33-64, 65-128, 129-256), every bit-neutral choice (step plans, rings,
warpgroups; the wide kernel's warpgroups, slots, stages, slab and multicast) with each candidate's bits checked, and
times the shape with the winners; --write-configs writes mma_configs.json with them (scripts/device_stages/w12.sh puts
it in $RESULTS to commit). ``--sections multicast`` checks the multicast configs' bits alone (the stage runs it first,
in its own process).

Every section catches its own error and the result file is rewritten after each (a failure keeps the rest). Method:
CUDA-graph replay over rotating weight copies larger than L2, median of REPLAYS (the issue-4 method); W12 and cuBLAS
(torch.matmul, BF16) timed alike in one process. Weights: seeded N(0, 0.02) BF16 with injected outliers (zeros, tiny
and huge values) at the stated fractions; the escape fraction each produced under the v2 window is reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch


from specpilot_kernels.w12 import encode  # noqa: E402
from specpilot_kernels.w12.mma import (  # noqa: E402
    CSRC,
    SOURCES,
    STEP_PLANS,
    TUNED_PATH,
    WIDE_BUCKETS,
    MmaConfig,
    W12MmaTensor,
    select_mma_config,
    to_mma_layout,
    w12_mma_gemm,
    wide_token_tiles,
)
from specpilot_kernels.w12.reference import gemm_reference  # noqa: E402
from specpilot_mem.bench.cuda_timing import ClockLog, graph_replay_us, read_bandwidth, record_section  # noqa: E402
from specpilot_mem.bench.runs import log  # noqa: E402
from specpilot_mem.bench.shapes import PROJECTIONS, SHAPES  # noqa: E402
from specpilot_mem.provenance import result_header, write_result  # noqa: E402

ROWS = (1, 2, 4, 8, 9, 16, 17, 32, 33, 48, 64, 65, 96, 128, 192, 256)
ESCAPE_FRACTIONS = (0.0, 1e-4, 1e-3, 1e-2)
ESCAPE_ROWS = (1, 8, 16, 32, 64, 128, 256)
SETTLED_ROWS = (1, 16, 32)
L2_BYTES = 60 * 2**20
REPLAYS = 12
# --tune: per shape, each bit-neutral choice of a row range timed at these rows (the winner by geometric mean)
TUNE_BUCKETS = {"17-32": (17, 24, 32), "33-64": (33, 48, 64), "65-128": (96, 128), "129-256": (192, 256)}
WIDE_TUNE = dict(groups=(4, 2, 1), slots=(4, 6, 3, 2), stages=(2, 3, 4))  # likeliest first: a budget may stop it
TUNE_REPLAYS = 5
SMEM_PER_SM = 227 * 1024  # the H200's shared memory a block may have
# kernels compared for bits: the per-warp kernel 64 rows at a time is the reference every other must equal
PLAIN = dict(wgmma=(0, 0, 0), shared_x_32=(0, 0), wide=(0, 2, 2), wide_rows=())
CHECK_CONFIGS = {
    "n4_k1_s1": MmaConfig(4, 1, 1),
    "n1_k3_s1_wgmma": MmaConfig(1, 3, 1, wgmma=(1, 1, 1)),
    "n1_k3_s2_cluster6": MmaConfig(1, 3, 2, wide=(1, 2, 3)),
    "n1_k8_s2_workspace": MmaConfig(1, 8, 2, wide=(1, 3, 2)),
    "n2_k4_s3_wide2": MmaConfig(2, 4, 3, wide=(2, 2, 3)),
    "n1_k2_s1_wide4": MmaConfig(1, 2, 1, wide=(4, 2, 2)),
    "tail": MmaConfig(1, 2, 1, wgmma=(1, 2, 2), tail_rows=256, tail=(1, 8, 2), wide=(1, 2, 3)),
    "n1_k3_s2_one_slab": MmaConfig(1, 3, 2, wide_rows=((4, 6, 2, 8), (2, 4, 4, 16), (2, 2, 2, 32))),
    "n1_k8_s2_deep": MmaConfig(1, 8, 2, wide_rows=((2, 6, 6, 8), (1, 6, 6, 16), (1, 2, 6, 24))),
    # the narrow kernels the tuned 27B-class configs run at 1-32 rows: staged weights, shared activations (with K
    # splits in a cluster), warpgroups
    "n1_k3_s1_staged_shared_x": MmaConfig(1, 3, 1, staged_rows=16, shared_x_32=(5, 6)),
    "n1_k3_s2_staged_shared_x": MmaConfig(1, 3, 2, staged_rows=16, shared_x_32=(5, 6)),
    "n4_k1_s1_staged_wgmma": MmaConfig(4, 1, 1, plan_32=(2, 2), staged_rows=16, wgmma=(5, 2, 2)),
    "n1_k1_s1_wgmma_half": MmaConfig(1, 1, 1, plan_32=(2, 1), wgmma=(2, 2, 4)),
}
# the wide kernel's activation multicast (clusters along x), checked in a process of its own first (section
# "multicast"): a fault there must not cost the rest of the run
MULTICAST_CONFIGS = {
    "n1_k3_s2_multicast2": MmaConfig(1, 3, 2, wide_rows=((1, 3, 2, 8, 2), (2, 3, 2, 16, 2), (1, 2, 2, 32, 2))),
    "n1_k1_s1_multicast4": MmaConfig(1, 1, 1, wide_rows=((1, 4, 2, 8, 4), (2, 2, 3, 16, 4), (1, 2, 2, 16, 4))),
    "n1_k8_s1_multicast2": MmaConfig(1, 8, 1, wide_rows=((4, 2, 2, 8, 2), (2, 3, 2, 16, 2), (2, 2, 2, 32, 2))),
    "tail_multicast": MmaConfig(
        1,
        2,
        1,
        wgmma=(1, 2, 2),
        tail_rows=256,
        tail=(1, 8, 2),
        wide_rows=((1, 2, 2, 8, 2), (2, 2, 2, 16, 4), (1, 2, 2, 32, 2)),
    ),
}
# ... on weights of 1024 rows and of 1040 (65 tiles: clusters of tile groups with blocks past the last one)
MULTICAST_ROWS = (1024, 1040)


def with_outliers(w: torch.Tensor, fraction: float, seed: int = 3) -> torch.Tensor:
    """w with ``fraction`` of its weights replaced by values no 16-binade window of a N(0, 0.02) row holds: zeros,
    tiny (1e-30) and huge (+-3e4) weights, in equal shares at random positions."""
    if fraction <= 0:
        return w
    out = w.clone()
    flat = out.view(-1)
    gen = torch.Generator(device=w.device).manual_seed(seed)
    count = int(flat.numel() * fraction)
    at = torch.randint(0, flat.numel(), (count,), device=w.device, generator=gen)
    values = torch.tensor([0.0, 1e-30, 3e4, -3e4], device=w.device).bfloat16()
    flat[at] = values[torch.arange(count, device=w.device) % 4]
    return out


def clone_mma(mma: W12MmaTensor) -> W12MmaTensor:
    return W12MmaTensor(
        mma.shape,
        mma.padded_shape,
        *(t.clone() for t in (mma.view, mma.nibbles, mma.base, mma.esc_tile, mma.esc_chunk, mma.esc_entry)),
    )


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def build() -> dict:
    from specpilot_kernels.cuda_extension import load_cuda_extension

    start = time.perf_counter()
    load_cuda_extension("specpilot_w12_mma", CSRC, SOURCES)
    return {"seconds": time.perf_counter() - start, "sources": list(SOURCES)}


def check_bits(configs: dict[str, MmaConfig] = CHECK_CONFIGS, n: int = 1024, rows: tuple[int, ...] = ROWS) -> dict:
    """Every config of ``configs`` at each of ``rows`` and every escape fraction on an [n, 1536] weight: y's bits equal
    the per-warp kernel's (64 rows a launch), each row's bits do not depend on the row count, one-hot rows read every
    weight exactly at 8-64 of ``rows``, and y is close to the fp32 reference. Q pass (midpoint) too, at a few
    row counts."""
    out = {}
    k = 1536
    torch.manual_seed(1)
    base = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    x = torch.randn(max(ROWS), k, device="cuda").bfloat16()
    for fraction in ESCAPE_FRACTIONS:
        w = with_outliers(base, fraction)
        w[480:496, 256:900] = 0.0  # a tile whose chunks hold more escapes than one round of the warp's patch
        w12 = encode(w)
        mma = to_mma_layout(w12)
        entry = {"escape_fraction": w12.stats()["escape_fraction"]}
        cols = torch.tensor([256, 300, 7, 899, 1535] + list(range(11, 262)), device="cuda")
        onehot = torch.zeros(cols.numel(), k, device="cuda", dtype=torch.bfloat16)
        onehot[torch.arange(cols.numel()), cols] = 1
        expected = bits((w[:, cols].t().float() + 0.0).bfloat16())
        eye = torch.eye(k, device="cuda", dtype=torch.bfloat16)
        every = bits((w.t().float() + 0.0).bfloat16())  # [k, n]: row c is column c of w
        for name, config in configs.items():
            try:
                plain = replace(config, **PLAIN)
                alone = bits(w12_mma_gemm(x[:1], mma, config=config))
                failures, worst = [], 0.0
                for m in rows:
                    y = w12_mma_gemm(x[:m], mma, config=config)
                    if not torch.equal(bits(y), bits(w12_mma_gemm(x[:m], mma, config=plain))):
                        failures.append(f"rows {m}: differs from the per-warp kernel")
                    if not torch.equal(bits(y[:1]), alone):
                        failures.append(f"rows {m}: row 0 differs from the 1-row launch")
                    ref = gemm_reference(x[:m], w12).float()
                    worst = max(worst, ((y.float() - ref).norm() / ref.norm()).item())
                for m in (1, 64, 256):
                    if not torch.equal(bits(w12_mma_gemm(onehot[:m], mma, config=config)), expected[:m]):
                        failures.append(f"one-hot rows {m}: weights not read exactly")
                # every weight, m columns a launch, where the kernel changes (fewer rows run 8 rows' kernels; wide: the
                # 256 above)
                for m in (m for m in rows if m in (8, 16, 24, 32, 48, 64)):
                    wrong = torch.zeros((), dtype=torch.bool, device="cuda")
                    for c0 in range(0, k, m):
                        y = bits(w12_mma_gemm(eye[c0 : c0 + m], mma, config=config))
                        wrong |= (y != every[c0 : c0 + m]).any()
                    if wrong.item():
                        failures.append(f"one-hot rows {m}: some weight not read exactly")
                for m in (9, 33, 128, 256):
                    q = w12_mma_gemm(x[:m], mma, config=config, low_bits="midpoint")
                    if not torch.equal(bits(q), bits(w12_mma_gemm(x[:m], mma, config=plain, low_bits="midpoint"))):
                        failures.append(f"Q pass rows {m}: differs from the per-warp kernel")
                launched = []
                w12_mma_gemm(x[:256], mma, config=config, launched=launched)
                entry[name] = {
                    "ok": not failures,
                    "failures": failures[:12],
                    "max_rel_err": worst,
                    "launched_at_256": launched,
                }
            except Exception as exc:  # noqa: BLE001 - record and go on with the other configs
                entry[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
            log("bits", fraction, name, entry[name])
        out[f"escapes_{fraction:g}"] = entry
    out["all_ok"] = all(v.get("ok", True) for e in out.values() for v in e.values() if isinstance(v, dict))
    return out


def check_multicast() -> dict:
    """check_bits of the multicast configs on MULTICAST_ROWS-row weights; all_ok only if every one is."""
    out = {f"n{n}": check_bits(MULTICAST_CONFIGS, n) for n in MULTICAST_ROWS}
    out["all_ok"] = all(out[f"n{n}"]["all_ok"] for n in MULTICAST_ROWS)
    return out


class Shape:
    """One weight shape's tensors: BF16 copies for cuBLAS, W12 copies per escape fraction."""

    def __init__(self, name: str, n: int, k: int):
        self.name, self.n, self.k = name, n, k
        torch.manual_seed(0)
        self.w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
        self.bf16 = [self.w.t()] + [
            self.w.clone().t() for _ in range(max(1, math.ceil(4 * L2_BYTES / (2 * n * k))) - 1)
        ]
        self.w12 = {}
        self.stats = {}

    def mma(self, fraction: float) -> list[W12MmaTensor]:
        if fraction not in self.w12:
            w = with_outliers(self.w, fraction)
            torch.cuda.synchronize()
            start = time.perf_counter()
            w12 = encode(w, check=True)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            stats = w12.stats()
            one = to_mma_layout(w12)
            del w12
            copies = max(1, math.ceil(4 * L2_BYTES / one.nbytes()))
            self.w12 = {fraction: [one] + [clone_mma(one) for _ in range(copies - 1)]}  # one fraction held at a time
            self.stats[f"{fraction:g}"] = {
                "encode_checked_s": seconds,
                "weights_per_s": self.n * self.k / seconds,
                **stats,
            }
        return self.w12[fraction]

    def w12_us(
        self,
        m: int,
        fraction: float = 0.0,
        config: MmaConfig | None = None,
        settle_s: float = 0.0,
        replays: int = REPLAYS,
    ) -> float:
        mmas = self.mma(fraction)
        x = torch.randn(m, self.k, device="cuda").bfloat16()
        y = torch.empty(m, self.n, device="cuda", dtype=torch.bfloat16)
        return graph_replay_us(
            lambda i: w12_mma_gemm(x, mmas[i], config=config, out=y), len(mmas), max(len(mmas), 8), replays, settle_s
        )

    def cublas_us(self, m: int, settle_s: float = 0.0) -> float:
        x = torch.randn(m, self.k, device="cuda").bfloat16()
        y = torch.empty(m, self.n, device="cuda", dtype=torch.bfloat16)
        return graph_replay_us(
            lambda i: torch.matmul(x, self.bf16[i], out=y), len(self.bf16), max(len(self.bf16), 8), REPLAYS, settle_s
        )


def time_shape(
    shape: Shape,
    read_bw: float,
    settle_s: float,
    config: MmaConfig | None,
    row_counts: tuple[int, ...] = ROWS,
    escape_rows: tuple[int, ...] = ESCAPE_ROWS,
) -> dict:
    n, k = shape.n, shape.k
    mmas = shape.mma(0.0)
    config = config or select_mma_config(n, k, torch.device("cuda"))
    x = torch.randn(256, k, device="cuda").bfloat16()
    same = torch.equal(
        bits(w12_mma_gemm(x[:1], mmas[0], config=config)), bits(w12_mma_gemm(x, mmas[0], config=config)[:1])
    )
    floor_s = mmas[0].nbytes() / read_bw
    rows = []
    for m in row_counts:
        row = {"M": m, "cublas_us": shape.cublas_us(m), "w12_us": shape.w12_us(m, config=config)}
        row["speedup"] = row["cublas_us"] / row["w12_us"]
        row["w12_frac_floor"] = floor_s * 1e6 / row["w12_us"]
        rows.append(row)
        log(shape.name, row)
    escapes = {}
    for fraction in ESCAPE_FRACTIONS[1:]:
        try:
            # untimed first: the first timing after an encode (the GPU idle meanwhile) ran up to 15% slow at any escape
            # fraction (LM head, 1 row: 1.15x the escape-free time at 1e-4, 1.01x at 8 rows)
            shape.w12_us(escape_rows[0], fraction, config, replays=3)
            escapes[f"{fraction:g}"] = {m: shape.w12_us(m, fraction, config) for m in escape_rows}
        except Exception as exc:  # noqa: BLE001
            escapes[f"{fraction:g}"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        log(shape.name, "escapes", fraction, escapes[f"{fraction:g}"])
    shape.mma(0.0)
    settled = {}
    if settle_s:
        for m in SETTLED_ROWS:
            settled[m] = {
                "cublas_us": shape.cublas_us(m, settle_s),
                "w12_us": shape.w12_us(m, config=config, settle_s=settle_s),
            }
            settled[m]["speedup"] = settled[m]["cublas_us"] / settled[m]["w12_us"]
    return {
        "N": n,
        "K": k,
        "config": asdict(config),
        "row_bits_same_at_1_and_256": same,
        "rows": rows,
        "escapes_w12_us": escapes,
        "settled": settled,
        "encode": shape.stats,
    }


def wide_fits(groups: int, slots: int, stages: int, slab_tiles: int, m: int) -> bool:
    """Whether a wide block's shared memory (csrc/w12_wide.cu wide_smem_bytes) fits a multiprocessor at ``m`` rows."""
    tiles, _ = wide_token_tiles(m, slab_tiles)
    warps = 4 * groups
    loop = slots * tiles * 2048 + warps * stages * 3072 + 16 * slots + warps * 1024
    return max(loop, warps * 32 * tiles * 16) <= SMEM_PER_SM


def tune_candidates(base: MmaConfig, bucket: str, multicast_too: bool = False) -> dict[str, MmaConfig]:
    """Bit-neutral variants of ``base`` for one row range: step plans, shared activations and warpgroups at 17-32 rows;
    the wide kernel's warpgroups, slots, stages (and at 129-256 one slab or two; with ``multicast_too`` activation
    multicast to 2 or 4 tile groups) above, or 64 rows a launch of the per-warp / warpgroup kernels at 33-64."""
    out = {"current": base}
    if bucket == "17-32":
        rings = {(0, 0), tuple(base.shared_x_32), (4, 4), (5, 6), (8, 4), (2, 8)}
        for plan in STEP_PLANS[32]:
            for ring in sorted(rings):
                if ring[1] and (plan[1] != 1 or ring[0] * base.warps_k > 16):
                    continue
                out[f"plan{plan}_ring{ring}"] = replace(
                    base, plan_32=plan, shared_x_32=ring, wgmma=(*base.wgmma[:1], 0, base.wgmma[2])
                )
        for groups in (1, 2, 4):
            if 4 * groups * base.warps_k <= 32:
                out[f"wgmma{groups}"] = replace(base, wgmma=(base.wgmma[0], groups, base.wgmma[2]))
        return out
    index = list(TUNE_BUCKETS).index(bucket) - 1
    rows = base.wide_rows or tuple((*base.wide, 16) for _ in WIDE_BUCKETS)
    top = WIDE_BUCKETS[index]
    slabs = (16, 32) if bucket == "129-256" else (8,) if bucket == "33-64" else (16,)
    # 33-64 rows: 64 rows a launch of the per-warp / warpgroup kernels first (it beat every wide setting on all five
    # 27B-class shapes in the 2026-12-02 tune), so a budget that stops the sweep has timed them
    if bucket == "33-64":
        for plan in STEP_PLANS[64]:
            for groups in (0, 1, 2, 4):
                if 4 * groups * base.warps_k > 32:
                    continue
                setting = list(rows)
                setting[0] = (0, 2, 2, 8)
                out[f"off_plan{plan}_wgmma{groups}"] = replace(
                    base, plan_64=plan, wide_rows=tuple(setting), wgmma=(*base.wgmma[:2], groups)
                )
    for groups in WIDE_TUNE["groups"]:
        for slots in WIDE_TUNE["slots"]:
            for stages in WIDE_TUNE["stages"]:
                for slab in slabs:
                    if not wide_fits(groups, slots, stages, slab, top):
                        continue
                    setting = list(rows)
                    setting[index] = (groups, slots, stages, slab)
                    out[f"wide{(groups, slots, stages, slab)}"] = replace(base, wide_rows=tuple(setting))
    cluster_y = base.warps_k * base.splits if base.warps_k * base.splits <= 8 else base.warps_k
    for multicast in (2, 4) if multicast_too else ():
        for groups in (4, 2, 1):
            for slots in (4, 3, 2):
                for stages in (2, 3):
                    slab = slabs[-1]
                    if multicast * cluster_y > 16 or not wide_fits(groups, slots, stages, slab, top):
                        continue
                    setting = list(rows)
                    setting[index] = (groups, slots, stages, slab, multicast)
                    out[f"wide{(groups, slots, stages, slab, multicast)}"] = replace(base, wide_rows=tuple(setting))
    return out


def tune_shape(
    shape: Shape, deadline: float, multicast: bool = False, buckets: tuple[str, ...] = tuple(TUNE_BUCKETS)
) -> dict:
    """Every row range's candidates (tune_candidates) timed at its TUNE_BUCKETS rows; a candidate whose bits differ
    from the per-warp kernel's, or whose launch ran fewer warpgroups than asked, is recorded and not chosen. Returns the
    times, the winners and the config made of them (the shape's partition unchanged: no bit depends on any choice).
    Each row range may take its share of the time left to ``deadline`` (time.monotonic()), keeping the best so far;
    the current config is always the first candidate, so a stopped range never ends worse than it was."""
    base = select_mma_config(shape.n, shape.k, torch.device("cuda"))
    mmas = shape.mma(0.0)
    x = torch.randn(256, shape.k, device="cuda").bfloat16()
    plain = replace(base, **PLAIN)
    tuned = {bucket: TUNE_BUCKETS[bucket] for bucket in buckets}
    reference = {m: bits(w12_mma_gemm(x[:m], mmas[0], config=plain)) for b in tuned.values() for m in b}
    chosen, report = base, {}
    for index, (bucket, rows) in enumerate(tuned.items()):
        times, best = {}, None
        share = time.monotonic() + (deadline - time.monotonic()) / (len(tuned) - index)
        for name, option in tune_candidates(chosen, bucket, multicast).items():
            if time.monotonic() > share:
                times["stopped"] = "tune budget spent"
                break
            try:
                ran = []
                w12_mma_gemm(x[: rows[-1]], mmas[0], config=option, launched=ran)
                wide = option.uses_wide(rows[-1], (9, 0)) and option.wide_launch(rows[-1])[0]
                if wide and ran[:1] != [wide]:  # fewer warpgroups fit: the same launch as another candidate
                    times[name] = {"fell_back": ran}
                    continue
                bad = [
                    m for m in rows if not torch.equal(bits(w12_mma_gemm(x[:m], mmas[0], config=option)), reference[m])
                ]
                if bad:
                    times[name] = {"bits_differ_at": bad}
                    continue
                t = {m: shape.w12_us(m, config=option, replays=TUNE_REPLAYS) for m in rows}
            except Exception as exc:  # noqa: BLE001 - e.g. a block that fits no multiprocessor
                times[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                continue
            score = math.exp(sum(map(math.log, t.values())) / len(t))
            times[name] = {**t, "score": score, "launched": ran}
            if best is None or score < best[2]:
                best = (name, option, score)
        if best:
            chosen = best[1]
        report[bucket] = {"times": times, "best": best[0] if best else None, "score": best[2] if best else None}
        log(shape.name, "tune", bucket, report[bucket]["best"], report[bucket]["score"])
    return {"buckets": report, "config": asdict(chosen)}


def summarize(doc: dict) -> dict:
    shapes = {name: s for name, s in doc.get("shapes", {}).items() if isinstance(s, dict) and "rows" in s}

    def ratios(names, lo, hi):
        return [r["speedup"] for nm in names if nm in shapes for r in shapes[nm]["rows"] if lo <= r["M"] <= hi]

    def geomean(v):
        return math.exp(sum(map(math.log, v)) / len(v)) if v else None

    out = {}
    proj = [
        r["speedup"] for nm in PROJECTIONS if nm in shapes for r in shapes[nm]["rows"] if r["M"] in (1, 2, 4, 8, 16, 32)
    ]
    out["projections_1_32_geomean"], out["projections_1_32_min"] = geomean(proj), min(proj, default=None)
    every = ratios(PROJECTIONS, 1, 32)  # every timed row count, 9 and 17 included
    out["projections_1_32_min_every_row_count"] = min(every, default=None)
    head = ratios(["lm_head"], 1, 32)
    out["lm_head_1_32_min"] = min(head, default=None)
    mid = ratios(list(SHAPES), 33, 64)
    out["all_33_64_geomean"], out["all_33_64_min"] = geomean(mid), min(mid, default=None)
    high = ratios(list(SHAPES), 65, 256)
    out["all_65_256_min"] = min(high, default=None)
    esc = {}
    for nm, s in shapes.items():
        clean = {r["M"]: r["w12_us"] for r in s["rows"]}
        cub = {r["M"]: r["cublas_us"] for r in s["rows"]}
        for fraction, times in s["escapes_w12_us"].items():
            if "error" in times:
                continue
            esc.setdefault(fraction, {})[nm] = {
                m: {"vs_escape_free": t / clean[int(m)], "speedup_vs_cublas": cub[int(m)] / t} for m, t in times.items()
            }
    out["escapes"] = esc
    # the escape targets at 1-32 rows: 1e-3 within 10% of the escape-free time, 1e-2 still >= 1.0x cuBLAS
    narrow = {
        f: [(nm, int(m), r) for nm, rows in by_shape.items() for m, r in rows.items() if int(m) <= 32]
        for f, by_shape in esc.items()
    }
    if narrow.get("0.001"):
        out["escapes_1e-3_1_32_worst_vs_escape_free"] = max(r["vs_escape_free"] for _, _, r in narrow["0.001"])
    if narrow.get("0.01"):
        worst = min(narrow["0.01"], key=lambda e: e[2]["speedup_vs_cublas"])
        out["escapes_1e-2_1_32_min_vs_cublas"] = worst[2]["speedup_vs_cublas"]
        out["escapes_1e-2_1_32_min_at"] = f"{worst[0]} {worst[1]} rows"
    settled = [v["speedup"] for nm in PROJECTIONS if nm in shapes for v in shapes[nm]["settled"].values()]
    out["settled_projections_geomean"] = geomean(settled)
    out["row_bits_same_at_1_and_256"] = {nm: s["row_bits_same_at_1_and_256"] for nm, s in shapes.items()}
    return out


def headline(doc: dict) -> str:
    """One line of the summary for the results index."""
    summary = doc.get("summary", {})
    bits_ok = doc.get("bits", {}).get("all_ok")

    def x(key):
        value = summary.get(key)
        return "-" if value is None else f"{value:.2f}x"

    return (
        f"bits {'exact' if bits_ok else 'NOT exact' if bits_ok is False else 'unchecked'}; projections 1-32 rows "
        f"{x('projections_1_32_geomean')} cuBLAS (min {x('projections_1_32_min')}); 33-64 rows "
        f"{x('all_33_64_geomean')} (min {x('all_33_64_min')}); 65-256 min {x('all_65_256_min')}; settled "
        f"{x('settled_projections_geomean')}; escapes at 1-32 rows: 1e-3 worst "
        f"{x('escapes_1e-3_1_32_worst_vs_escape_free')} the escape-free time, 1e-2 min "
        f"{x('escapes_1e-2_1_32_min_vs_cublas')} cuBLAS"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help=f"of {list(SHAPES)} or NxK (e.g. 14336x5120), comma-separated"
    )
    parser.add_argument(
        "--sections",
        default="build,bits,timing",
        help="build, multicast (bits of the multicast configs alone), bits, timing (in this order)",
    )
    parser.add_argument("--settle", type=float, default=1.0, help="seconds of untimed replays before settled timings")
    parser.add_argument(
        "--tune",
        action="store_true",
        help="before timing a shape, time every bit-neutral candidate of each row range 17-256 and use the winners",
    )
    parser.add_argument("--tune-budget", type=float, default=150.0, help="seconds --tune may take over all shapes")
    parser.add_argument(
        "--tune-buckets", default=",".join(TUNE_BUCKETS), help=f"the row ranges --tune tunes, of {list(TUNE_BUCKETS)}"
    )
    parser.add_argument(
        "--check-configs",
        default=None,
        help=f"the bits section's configs (default: all of {list(CHECK_CONFIGS)}, with --multicast also the "
        "multicast ones)",
    )
    parser.add_argument(
        "--multicast",
        action="store_true",
        help="also check and tune the wide kernel's activation multicast (after a clean 'multicast' "
        "section in a process of its own)",
    )
    parser.add_argument(
        "--rows", default=",".join(map(str, ROWS)), help="row counts the bits and timing sections run (default: 1-256)"
    )
    parser.add_argument("--escape-rows", default=",".join(map(str, ESCAPE_ROWS)), help="row counts timed with escapes")
    parser.add_argument(
        "--write-configs",
        type=Path,
        default=None,
        help="write mma_configs.json with --tune's winners for this GPU to this path",
    )
    args = parser.parse_args()
    row_counts = tuple(int(m) for m in args.rows.split(","))
    escape_rows = tuple(int(m) for m in args.escape_rows.split(","))
    if not all(1 <= m <= max(ROWS) for m in row_counts + escape_rows):
        parser.error(
            f"--rows / --escape-rows: row counts 1-{max(ROWS)}, comma-separated (got {args.rows!r}, "
            f"{args.escape_rows!r})"
        )
    buckets = tuple(args.tune_buckets.split(","))
    offered = {**CHECK_CONFIGS, **(MULTICAST_CONFIGS if args.multicast else {})}
    checked = offered if args.check_configs is None else dict.fromkeys(args.check_configs.split(","))
    unknown = [b for b in buckets if b not in TUNE_BUCKETS] + [c for c in checked if c not in offered]
    if unknown:
        parser.error(
            f"unknown --tune-buckets / --check-configs entries {unknown}: use names of {list(TUNE_BUCKETS)} / "
            f"{list(offered)} (multicast configs need --multicast)"
        )
    bad_shapes = [name for name in args.shapes.split(",") if shape_dims(name) is None]
    if bad_shapes:
        parser.error(f"unknown --shapes entries {bad_shapes}: use names of {list(SHAPES)} or NxK, e.g. 14336x5120")
    checked = {name: offered[name] for name in checked}
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 8))  # ninja builds the kernel files in parallel
    doc = {
        **result_header("w12_device_check"),
        "method": "CUDA-graph replay over rotating copies >= 4 x 60 MB, median "
        f"of {REPLAYS}; settled: after --settle seconds of untimed replays",
        "shapes": {},
    }
    record_section(doc, "read_bw_Bps", read_bandwidth, args.out)
    sections = args.sections.split(",")
    if "build" in sections:
        record_section(doc, "build", build, args.out)
    if "multicast" in sections:
        record_section(doc, "multicast", check_multicast, args.out)
    if "bits" in sections:
        record_section(
            doc,
            "bits",
            lambda: check_bits(checked, rows=row_counts),
            args.out,
        )
    tuned = {}
    deadline = time.monotonic() + args.tune_budget
    names = args.shapes.split(",") if "timing" in sections else ()
    with ClockLog():
        for index, name in enumerate(names):
            shape = Shape(name, *shape_dims(name))
            config = None
            if args.tune:  # each shape gets its share of what is left of the budget
                share = time.monotonic() + (deadline - time.monotonic()) / (len(names) - index)
                record_section(
                    doc.setdefault("tune", {}),
                    name,
                    lambda s=shape, d=share: tune_shape(s, d, args.multicast, buckets),
                    None,
                )
                if "config" in doc["tune"][name]:
                    config = MmaConfig(**doc["tune"][name]["config"])
                    tuned[f"{shape.n},{shape.k}"] = doc["tune"][name]["config"]
            record_section(
                doc["shapes"],
                name,
                lambda s=shape, c=config: time_shape(s, doc["read_bw_Bps"], args.settle, c, row_counts, escape_rows),
                None,
            )
            doc["summary"] = summarize(doc)
            write_result(doc, args.out)
            del shape
            torch.cuda.empty_cache()
    if args.write_configs and tuned:
        write_configs(args.write_configs, tuned, torch.cuda.get_device_properties(0).name)
    doc["summary"] = summarize(doc)
    doc["headline"] = headline(doc)
    write_result(doc, args.out)
    log(doc["summary"])


def shape_dims(name: str) -> tuple[int, int] | None:
    """(N, K) of a --shapes entry: a name of SHAPES or NxK (e.g. 14336x5120, the engine's qkv); None if neither."""
    if name in SHAPES:
        return SHAPES[name]
    n, _, k = name.partition("x")
    return (int(n), int(k)) if n.isdigit() and k.isdigit() and int(n) > 0 and int(k) > 0 else None


def write_configs(path: Path, tuned: dict, gpu: str) -> None:
    """The committed configs (mma_configs.json) with ``gpu``'s tuned shapes replaced, written atomically to ``path``."""
    configs = json.loads(TUNED_PATH.read_text())
    configs.setdefault(gpu, {}).update(tuned)
    staged = path.with_name(path.name + ".tmp")
    staged.write_text(json.dumps(configs, indent=1) + "\n")
    os.replace(staged, path)


if __name__ == "__main__":
    main()
