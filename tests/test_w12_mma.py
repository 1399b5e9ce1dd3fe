"""W12 mma.sync kernel (CUDA C++; the sm_120 variant): fragment layout on CPU, kernel on the GPU, sm_120 build."""

import json
import re
import shutil
import subprocess
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from specpilot_kernels.cuda_extension import SHARED_HEADERS
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12 import mma as mma_module
from specpilot_kernels.w12.format import W12Error, escape_positions, nibbles_from_kernel_layout
from specpilot_kernels.w12.mma import (
    CSRC,
    MmaConfig,
    default_mma_config,
    escape_entries,
    planes_from_mma_layout,
    to_mma_layout,
    w12_mma_gemm,
)
from specpilot_kernels.w12.reference import gemm_reference, qpass_weight_reference

CONFIGS = [MmaConfig(4, 1, 1), MmaConfig(2, 4, 3), MmaConfig(1, 8, 2)]
# the same K partitions with other step plans (K = 1536: 12 chunks, odd and even counts a warp; 63 tiles: an odd
# count, so with two tiles a warp the last warp repeats a tile and stores nothing for it)
PLAN_CONFIGS = [
    MmaConfig(4, 1, 1, (2, 2), (2, 2)),
    MmaConfig(2, 4, 3, (2, 1), (2, 2)),
    MmaConfig(1, 5, 1, (2, 2), (4, 1)),
    MmaConfig(3, 3, 2, (2, 1), (2, 2)),
]


def weight(n=200, k=300, seed=0, device="cpu"):
    torch.manual_seed(seed)
    w = (torch.randn(n, k) * 0.02).bfloat16()
    w[3, 5] = 0.0
    w[130, 200] = 4.0
    w[131, 64] = 1e-9
    w[17, 299] = -0.0
    return w.to(device)


def test_fragment_layout_is_a_permutation_of_the_planes():
    w12 = encode(weight())
    mma = to_mma_layout(w12)
    view, low = planes_from_mma_layout(mma)
    assert torch.equal(view, w12.view)
    assert torch.equal(low, nibbles_from_kernel_layout(w12.nibbles))
    # lane 5 = (g 1, t 1): its first byte is row 1, column 8 of the first 16x32 block
    assert int(mma.view[0, 0, 5, 0]) == int(w12.view[1, 8])


def test_escape_entries_are_found_by_tile_and_chunk_words():
    w12 = encode(weight())
    mma = to_mma_layout(w12)
    rows, cols = escape_positions(w12)
    assert int(mma.esc_tile[-1]) == w12.num_escapes == mma.esc_entry.numel()
    chunks = w12.padded_shape[1] // 128
    for r, c in zip(rows.tolist(), cols.tolist()):
        tile, chunk = r // 16, c // 128
        word = int(mma.esc_chunk[tile * chunks + chunk])
        begin = int(mma.esc_tile[tile]) + (word >> 12)
        entries = mma.esc_entry[begin : begin + (word & 0xFFF)]
        position, _ = escape_entries(torch.tensor([r]), torch.tensor([c]), w12.esc_val[:1])
        assert int(position) in (entries >> 16).tolist()  # the escape is in its chunk's list
        assert torch.all(entries[1:] > entries[:-1])  # sorted by fragment position


def test_partition_reads_n_k_and_multiprocessors_only():
    # the v11 partition sweeps' and the v12 step-plan sweep's best on the H200 (132 multiprocessors), or within 5%
    assert default_mma_config(10240, 5120, sms=132) == MmaConfig(1, 3, 1, plan_32=(2, 1))
    assert default_mma_config(34816, 5120, sms=132) == MmaConfig(1, 4, 1, (2, 2), (2, 2))
    assert default_mma_config(248320, 5120, sms=132) == MmaConfig(4, 1, 1, (2, 2), (2, 2))
    assert default_mma_config(5120, 8192, sms=132) == MmaConfig(1, 5, 1, plan_32=(2, 1))
    assert default_mma_config(4096, 14336, sms=132) == MmaConfig(1, 8, 1, plan_32=(2, 1))
    assert default_mma_config(24576, 4096, sms=132) == MmaConfig(1, 4, 1, (2, 2), (2, 2))
    assert default_mma_config(5120, 8192, sms=66) == MmaConfig(1, 3, 1, plan_32=(2, 1))  # fewer multiprocessors
    assert MmaConfig(splits=3).chunks_per_split(8192) == 22  # 64 chunks in 3 splits of 22, 22, 20


KERNEL_33_64 = re.compile(r"w12_mma_kernelILi8E")  # <8 token tiles, ...>: the 33-64-row plans


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (CUDA 12.8+ for sm_120)")
def test_kernel_builds_for_sm_120(tmp_path):
    out = tmp_path / "w12_mma_sm120.o"
    result = subprocess.run(
        [
            "nvcc",
            "-O3",
            "-std=c++17",
            "-gencode=arch=compute_120,code=sm_120",
            "-Xptxas",
            "-v",
            f"-I{SHARED_HEADERS}",
            f"-I{CSRC}",
            "-c",
            str(CSRC / "w12_warp.cu"),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    stores = dict(re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores", result.stderr, re.S))
    spilled = sorted(name for name, count in stores.items() if count != "0")
    assert stores and all(KERNEL_33_64.search(name) for name in spilled), spilled
    # sm_120's register file spills only in 33-64-row plans (a few bytes to 72); 1-32 rows: none
    assert out.stat().st_size > 0


@pytest.mark.gpu
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"n{c.warps_n}_k{c.warps_k}_s{c.splits}")
def test_mma_gemm_matches_reference_and_reads_weights_exactly(config):
    w = weight(n=1000, k=1536, device="cuda")
    w12 = encode(w)
    mma = to_mma_layout(w12)
    for rows in (1, 9, 33, 64, 70):
        x = torch.randn(rows, 1536, device="cuda").bfloat16()
        ref = gemm_reference(x, w12).float()
        y = w12_mma_gemm(x, mma, config=config).float()
        assert ((y - ref).norm() / ref.norm()).item() < 4e-3
    cols = torch.tensor([5, 200, 64, 299, 0, 1535], device="cuda")
    onehot = torch.zeros(cols.numel(), 1536, device="cuda", dtype=torch.bfloat16)
    onehot[torch.arange(cols.numel()), cols] = 1.0
    y = w12_mma_gemm(onehot, mma, config=config)
    expected = (w[:, cols].t().float() + 0.0).bfloat16()  # -0 weights sum to +0 with the +0 products
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("staged_rows", [0, 8])
def test_mma_row_bits_do_not_depend_on_row_count(staged_rows):
    # 1-64 rows run 1, 2, 4 or 8 token tiles with one partition and one order of sums (staged up to 8 rows or not)
    mma = to_mma_layout(encode(weight(n=1000, k=1536, device="cuda")))
    x = torch.randn(64, 1536, device="cuda").bfloat16()
    config = MmaConfig(2, 4, 3, staged_rows=staged_rows)
    alone = w12_mma_gemm(x[:1], mma, config=config).view(torch.int16)
    for rows in (2, 4, 5, 8, 9, 16, 17, 32, 33, 64):
        assert torch.equal(w12_mma_gemm(x[:rows], mma, config=config)[:1].view(torch.int16), alone), rows


@pytest.mark.gpu
@pytest.mark.parametrize("config", PLAN_CONFIGS, ids=str)
def test_mma_step_plans_give_the_same_bits(config):
    w = weight(n=1000, k=1536, device="cuda")
    w[480:496, 256:900] = 0.0  # chunks with more escapes than a window, in every step of them
    mma = to_mma_layout(encode(w))
    whole = MmaConfig(config.warps_n, config.warps_k, config.splits)
    x = torch.randn(64, 1536, device="cuda").bfloat16()
    for rows in (17, 24, 32, 33, 64):
        planned = w12_mma_gemm(x[:rows], mma, config=config)
        assert torch.equal(planned.view(torch.int16), w12_mma_gemm(x[:rows], mma, config=whole).view(torch.int16)), rows
    for low_bits in ("truncated", "midpoint"):
        for rows in (32, 64):
            assert torch.equal(
                w12_mma_gemm(x[:rows], mma, config=config, low_bits=low_bits).view(torch.int16),
                w12_mma_gemm(x[:rows], mma, config=whole, low_bits=low_bits).view(torch.int16),
            )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config", CONFIGS + [MmaConfig(3, 3, 2)], ids=lambda c: f"n{c.warps_n}_k{c.warps_k}_s{c.splits}"
)
def test_mma_staged_weights_give_the_same_bits(config):
    # weights staged through shared memory (up to 16 rows) against registers: the same order of sums, so the same
    # bits, escapes (more than a window's worth in some chunks) and the Q pass's low bits included
    w = weight(n=1000, k=1536, device="cuda")
    w[480:496, 256:900] = 0.0
    mma = to_mma_layout(encode(w))
    staged = MmaConfig(config.warps_n, config.warps_k, config.splits, staged_rows=16)
    x = torch.randn(16, 1536, device="cuda").bfloat16()
    for low_bits in ("exact", "truncated", "midpoint"):
        for rows in (1, 3, 8, 9, 16):
            assert torch.equal(
                w12_mma_gemm(x[:rows], mma, config=staged, low_bits=low_bits).view(torch.int16),
                w12_mma_gemm(x[:rows], mma, config=config, low_bits=low_bits).view(torch.int16),
            ), rows


SHARED_X_CONFIGS = [
    MmaConfig(1, 3, 1, shared_x_32=(5, 4)),
    MmaConfig(1, 3, 2, shared_x_32=(5, 6)),
    MmaConfig(1, 2, 3, (2, 1), shared_x_32=(3, 2)),
    MmaConfig(4, 1, 1, shared_x_32=(8, 3)),
    MmaConfig(1, 4, 5, shared_x_32=(2, 2)),
    MmaConfig(1, 2, 6, shared_x_32=(2, 2)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("config", SHARED_X_CONFIGS, ids=str)
def test_mma_shared_activations_give_the_same_bits(config):
    # 17-32 rows with activations shared through a block's ring (producer warp, bulk copies) against each warp loading
    # its own: the same chunks per warp in the same order, so the same bits, with escapes (more than a window's
    # worth in some chunks), K splits in a cluster (2-4) and through the workspace (5), rows past m, the Q pass's
    # low bits, and repeated calls (the ring's barriers start afresh)
    w = weight(n=1000, k=1536, device="cuda")
    w[480:496, 256:900] = 0.0
    mma = to_mma_layout(encode(w))
    plain = replace(config, shared_x_32=(0, 0))
    x = torch.randn(32, 1536, device="cuda").bfloat16()
    for low_bits in ("exact", "truncated", "midpoint"):
        for rows in (17, 24, 25, 31, 32, 32):  # 17-24 rows run 3 token tiles, 25-32 four
            assert torch.equal(
                w12_mma_gemm(x[:rows], mma, config=config, low_bits=low_bits).view(torch.int16),
                w12_mma_gemm(x[:rows], mma, config=plain, low_bits=low_bits).view(torch.int16),
            ), rows


def test_shared_activations_outside_what_the_kernel_is_built_for_are_refused():
    for bad in (
        dict(shared_x_32=(5, 1)),
        dict(shared_x_32=(5, 9)),
        dict(warps_k=4, shared_x_32=(5, 4)),
        dict(plan_32=(2, 2), shared_x_32=(4, 4)),
    ):
        with pytest.raises(W12Error, match="shared_x_32"):
            MmaConfig(**{"warps_n": 1, "warps_k": 3, **bad})
    assert MmaConfig(1, 3, 1, shared_x_32=[5, 4]).shares_activations(17) == (5, 4)
    assert MmaConfig(1, 3, 1, shared_x_32=(5, 4)).shares_activations(16) == (0, 0)
    assert MmaConfig(1, 3, 1, shared_x_32=(5, 4)).shares_activations(33) == (0, 0)


WGMMA_CONFIGS = [
    MmaConfig(4, 1, 1, wgmma=(1, 2, 1)),
    MmaConfig(2, 4, 3, wgmma=(1, 2, 1)),
    MmaConfig(1, 3, 1, wgmma=(2, 1, 1)),
    MmaConfig(1, 2, 6, wgmma=(3, 1, 2)),
    MmaConfig(1, 8, 2, wgmma=(1, 1, 1)),
    MmaConfig(4, 1, 1, wgmma=(1, 5, 1)),
]


# wgmma exists on sm_90a only; elsewhere the per-warp kernel runs with the same bits (the other GPU tests cover it)
needs_wgmma = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="needs an sm_90a GPU: warpgroup MMAs run there only (elsewhere the per-warp kernel runs)",
)


@pytest.mark.gpu
@needs_wgmma
@pytest.mark.parametrize("config", WGMMA_CONFIGS, ids=str)
def test_mma_warpgroup_mmas_give_the_same_bits(config):
    # 9-64 rows as warpgroup MMAs (sm_90a) against per-warp mma.sync: the same k16 products summed in the same order
    # per tile, so the same bits, with escapes (more than a window's worth in some chunks), K splits in a cluster
    # (2-3) and through the workspace (6), 1-5 warpgroups sharing a block's activations, warpgroups past the last tile
    # (63 tiles), rows past m and the Q pass's low bits
    w = weight(n=1000, k=1536, device="cuda")
    w[480:496, 256:900] = 0.0
    mma = to_mma_layout(encode(w))
    plain = replace(config, wgmma=(0, 0, 0))
    x = torch.randn(64, 1536, device="cuda").bfloat16()
    for low_bits in ("exact", "truncated", "midpoint"):
        for rows in (9, 16, 17, 24, 32, 33, 48, 64):
            assert torch.equal(
                w12_mma_gemm(x[:rows], mma, config=config, low_bits=low_bits).view(torch.int16),
                w12_mma_gemm(x[:rows], mma, config=plain, low_bits=low_bits).view(torch.int16),
            ), rows
    # activations read in place from a wider tensor (row stride 1600, not K): the permute kernel follows the stride
    wide = torch.randn(64, 1600, device="cuda").bfloat16()[:, :1536]
    for rows in (12, 32, 40):
        assert torch.equal(
            w12_mma_gemm(wide[:rows], mma, config=config).view(torch.int16),
            w12_mma_gemm(wide[:rows], mma, config=plain).view(torch.int16),
        ), rows


@pytest.mark.gpu
@needs_wgmma
def test_mma_reports_the_warpgroups_each_launch_ran():
    mma = to_mma_layout(encode(weight(n=1024, k=1536, device="cuda")))
    x = torch.randn(70, 1536, device="cuda").bfloat16()
    cases = [
        (MmaConfig(1, 2, 1, wgmma=(0, 2, 0)), 32, [2]),
        (MmaConfig(1, 1, 1, wgmma=(0, 5, 0)), 32, [5]),  # 20 warps: one block a multiprocessor, weights staged
        # 8 K classes of one warpgroup: 32 warps of over 100 registers fit no multiprocessor, so per-warp
        (MmaConfig(1, 8, 1, wgmma=(0, 1, 0)), 32, [0]),
        (MmaConfig(1, 2, 1, wgmma=(0, 2, 0), tail_rows=256, tail=(1, 8, 1)), 32, [2, 0]),
        (MmaConfig(1, 8, 1, wgmma=(0, 1, 0), tail_rows=256, tail=(1, 2, 1)), 32, [0, 1]),
        (MmaConfig(1, 2, 1, wgmma=(0, 2, 2), tail_rows=256, tail=(2, 2, 1)), 70, [2, 2, 0, 0]),  # 64 + 6 rows
        (MmaConfig(1, 2, 1, wgmma=(2, 2, 2)), 8, [0]),
    ]  # up to 8 rows: per-warp
    for config, rows, expected in cases:
        launched = []
        w12_mma_gemm(x[:rows], mma, config=config, launched=launched)
        assert launched == expected, (config, rows)


def test_warpgroup_mmas_outside_what_the_kernel_is_built_for_are_refused():
    for bad in (dict(wgmma=(1, 1)), dict(wgmma=(0, -1, 0)), dict(warps_k=3, wgmma=(0, 0, 3))):
        with pytest.raises(W12Error, match="wgmma"):
            MmaConfig(**{"warps_n": 1, "warps_k": 2, **bad})
    config = MmaConfig(1, 2, 1, wgmma=[1, 2, 4])
    assert config.wgmma == (1, 2, 4)
    assert [config.warpgroups(m, (9, 0)) for m in (8, 9, 16, 17, 32, 33, 64)] == [0, 1, 1, 2, 2, 4, 4]
    assert [config.warpgroups(m, (12, 0)) for m in (9, 32, 64)] == [0, 0, 0]  # sm_120 has no wgmma


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [
        MmaConfig(2, 4, 3, (2, 1)),
        MmaConfig(2, 4, 3, (2, 1), staged_rows=16),
        MmaConfig(2, 4, 3, (2, 1), wgmma=(1, 1, 1), tail_rows=512, tail=(1, 8, 1)),
    ],
    ids=str,
)
def test_mma_overlapped_launches_wait_for_the_kernel_before(config):
    # a chain where each product is the next one's input (square weight): launched to overlap the kernel before
    # (programmatic dependent launch), each must still read its input only once the previous one has written it;
    # with a tail, the next product's first region waits for both of the previous one's regions
    mma = to_mma_layout(encode(weight(n=1536, k=1536, device="cuda")))
    x0 = torch.randn(32, 1536, device="cuda").bfloat16()

    def chain(overlap, rows, links=12):
        ys = [x0[:rows]]
        for _ in range(links):
            ys.append(w12_mma_gemm(ys[-1], mma, config=config, overlap_prior=overlap))
        return torch.stack(ys).view(torch.int16)

    for rows in (1, 16, 32):
        serial = chain(False, rows)
        assert torch.equal(chain(True, rows), serial), rows
        graph = torch.cuda.CUDAGraph()  # and captured in a graph, as the benchmarks and decoders replay it
        with torch.cuda.graph(graph):
            captured = chain(True, rows)
        graph.replay()
        assert torch.equal(captured, serial), rows


def test_step_plans_outside_the_built_set_are_refused():
    with pytest.raises(W12Error, match="plan_32"):
        MmaConfig(plan_32=(1, 1))
    assert MmaConfig(plan_64=[2, 2]).step_plan(40) == (2, 2)  # a JSON list names a plan too
    assert MmaConfig(plan_32=(2, 1)).step_plan(16) == (4, 1)
    with pytest.raises(W12Error, match="staged_rows"):
        MmaConfig(staged_rows=17)
    assert [MmaConfig(staged_rows=8).stages_weights(m) for m in (1, 8, 9)] == [True, True, False]


def test_row_regions_are_views_of_the_weight():
    w = weight(n=1024, k=300)
    w[1000:1010, 10:20] = 0.0  # escapes in the tail's tiles
    mma = to_mma_layout(encode(w))
    view, low = planes_from_mma_layout(mma)
    for first, end in ((0, 768), (768, 1024), (16, 32)):
        region = mma.rows(first, end)
        assert region.shape == (end - first, 300) and region.view.data_ptr() == mma.view[first // 16].data_ptr()
        region_view, region_low = planes_from_mma_layout(region)
        assert torch.equal(region_view, view[first:end]) and torch.equal(region_low, low[first:end])
        # the escape offsets stay absolute: bucket (tile t, chunk c) of the region is bucket (first // 16 + t, c)
        chunks = mma.padded_shape[1] // 128
        assert torch.equal(region.esc_tile, mma.esc_tile[first // 16 : end // 16 + 1])
        assert torch.equal(region.esc_chunk, mma.esc_chunk[first // 16 * chunks : end // 16 * chunks])
        assert region.esc_entry is mma.esc_entry
        assert mma.rows(first, end) is region  # made once: a GEMM with a tail asks on every call
    for first, end in ((8, 64), (0, 1000), (512, 512), (0, 1040)):
        with pytest.raises(W12Error, match="16-row tile"):
            mma.rows(first, end)


def test_tails_partition_the_last_rows_and_keep_the_rest_of_the_config():
    config = MmaConfig(
        1, 2, 1, (4, 1), (4, 1), staged_rows=8, shared_x_32=(6, 4), wgmma=(0, 2, 2), tail_rows=1024, tail=[1, 8, 1]
    )
    (a, b, first), (c, d, tail) = config.regions(34816)
    assert (a, b, c, d) == (0, 33792, 33792, 34816)
    assert first == MmaConfig(1, 2, 1, (4, 1), (4, 1), staged_rows=8, shared_x_32=(6, 4), wgmma=(0, 2, 2))
    # 8 K classes: 1 warpgroup a class fills a block; activations read warp by warp
    assert tail == MmaConfig(1, 8, 1, (4, 1), (4, 1), staged_rows=8, wgmma=(0, 1, 1))
    assert MmaConfig(1, 2, 1).regions(100) == ((0, 100, MmaConfig(1, 2, 1)),)
    for bad in (
        dict(tail_rows=1000, tail=(1, 8, 1)),
        dict(tail_rows=16),
        dict(tail=(1, 2, 1)),
        dict(tail_rows=16, tail=(4, 8, 1)),
        dict(tail_rows=16, tail=(1, 0, 1)),
    ):
        with pytest.raises(W12Error, match="tail"):
            MmaConfig(**bad)
    for n in (1024, 1000):  # no first region; N not whole tiles
        with pytest.raises(W12Error, match="tail_rows"):
            MmaConfig(tail_rows=1024, tail=(1, 8, 1)).regions(n)


# (first region's partition, tail): K splits in a cluster (2) and through the workspace (6, and two tiles a warp at
# 33-64 rows), warpgroup MMAs in both regions or (a first region whose warpgroup block fits no multiprocessor) only in
# the tail, which then writes the activation image itself, shared activations
TAIL_CONFIGS = [
    MmaConfig(2, 4, 3, tail_rows=256, tail=(1, 8, 1)),
    MmaConfig(4, 1, 1, (2, 2), (2, 2), tail_rows=512, tail=(1, 4, 2)),
    MmaConfig(1, 2, 1, staged_rows=8, wgmma=(1, 2, 2), tail_rows=256, tail=(1, 2, 6)),
    MmaConfig(1, 8, 1, wgmma=(1, 1, 1), tail_rows=256, tail=(1, 2, 1)),
    MmaConfig(1, 3, 1, shared_x_32=(5, 4), tail_rows=768, tail=(4, 1, 2)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("config", TAIL_CONFIGS, ids=str)
def test_mma_row_regions_sum_each_row_with_its_regions_partition(config):
    # two launches (the tail right behind the first region, reading x without waiting for it): each row's bits are
    # those of its region's partition launched over the whole weight, at every row count, escapes and the Q pass
    # included, in eager calls and replayed from a CUDA graph
    w = weight(n=1024, k=1536, device="cuda")
    w[992:1008, 256:900] = 0.0  # a tail tile with more escapes than a window
    mma = to_mma_layout(encode(w))
    (_, split, first), (_, _, tail) = config.regions(1024)
    x = torch.randn(70, 1536, device="cuda").bfloat16()
    for low_bits in ("exact", "midpoint"):
        for rows in (1, 9, 16, 17, 32, 33, 64, 70):
            y = w12_mma_gemm(x[:rows], mma, config=config, low_bits=low_bits).view(torch.int16)
            head = w12_mma_gemm(x[:rows], mma, config=first, low_bits=low_bits).view(torch.int16)[:, :split]
            rest = w12_mma_gemm(x[:rows], mma, config=tail, low_bits=low_bits).view(torch.int16)[:, split:]
            assert torch.equal(y, torch.cat((head, rest), dim=1)), (low_bits, rows)
            assert torch.equal(y[:1], w12_mma_gemm(x[:1], mma, config=config, low_bits=low_bits).view(torch.int16))
    expected = w12_mma_gemm(x[:32], mma, config=config)
    out = torch.empty_like(expected)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w12_mma_gemm(x[:32], mma, config=config, out=out)
    graph.replay()
    assert torch.equal(out.view(torch.int16), expected.view(torch.int16))


@pytest.mark.gpu
def test_mma_blocks_with_more_warps_than_registers_allow_still_run():
    # 16 warps of the four-token-tile kernel need more than 64K registers: the launch halves the tiles a block
    mma = to_mma_layout(encode(weight(n=1000, k=1536, device="cuda")))
    x = torch.randn(64, 1536, device="cuda").bfloat16()
    for rows in (32, 64):
        wide = w12_mma_gemm(x[:rows], mma, config=MmaConfig(8, 2, 1))
        assert torch.equal(
            wide.view(torch.int16), w12_mma_gemm(x[:rows], mma, config=MmaConfig(1, 2, 1)).view(torch.int16)
        )


@pytest.mark.gpu
def test_mma_chunks_with_more_escapes_than_a_window():
    w = weight(n=1000, k=1536, device="cuda")
    w[480:496, 256:900] = 0.0  # one 16-row tile of zeros: hundreds of escapes per 128-column chunk
    w[700] = (torch.randn(1536, device="cuda") * 1e-39).bfloat16()  # a row of denormals
    mma = to_mma_layout(encode(w))
    cols = torch.arange(250, 890, 20, device="cuda")  # through the zero tile's columns
    onehot = torch.eye(1536, device="cuda", dtype=torch.bfloat16)[cols]
    expected = (w[:, cols].t().float() + 0.0).bfloat16()
    for config in CONFIGS + PLAN_CONFIGS:
        assert torch.equal(w12_mma_gemm(onehot, mma, config=config).view(torch.int16), expected.view(torch.int16))
        wide = torch.cat((onehot, onehot))  # 64 rows a launch
        assert torch.equal(
            w12_mma_gemm(wide, mma, config=config).view(torch.int16), torch.cat((expected, expected)).view(torch.int16)
        )
        for r0 in range(0, 32, 4):
            y = w12_mma_gemm(onehot[r0 : r0 + 4], mma, config=config).view(torch.int16)
            assert torch.equal(y, expected[r0 : r0 + 4].view(torch.int16)), (config, r0)


@pytest.mark.gpu
@pytest.mark.parametrize("low_bits", ["truncated", "midpoint"])
def test_mma_qpass(low_bits):
    w12 = encode(weight(n=1000, k=1536, device="cuda"))
    x = torch.randn(16, 1536, device="cuda").bfloat16()
    ref = x.float() @ qpass_weight_reference(w12, low_bits).float().t()
    for rows in (1, 16):
        y = w12_mma_gemm(x[:rows], to_mma_layout(w12), low_bits=low_bits, config=MmaConfig(2, 4, 3)).float()
        assert ((y - ref[:rows]).norm() / ref[:rows].norm()).item() < 4e-3


def emulate_kernel_decode(mma, patch=False):
    """The kernel's integer decode in torch, register by register (prmt of view and nibble bytes; mask and
    shift, sign or base, one add), placed through the fragment map: int64 BF16 bits [Np, Kp]; with ``patch``, each
    escape entry overwritten where the kernel's overlay puts it (group, lane, register, half of its chunk)."""
    words = mma.view.view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [T, B, 32, 4]
    nibs = mma.nibbles.view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [T, B, 32, 2]
    tiles, blocks = words.shape[:2]
    lane = torch.arange(32)
    base = mma.base.to(torch.int64).view(tiles, 1, 16)
    regs = torch.empty(tiles, blocks, 32, 8, dtype=torch.int64)
    for w in range(4):
        source = nibs[..., w >> 1] if w % 2 == 0 else (nibs[..., w >> 1] << 4) & 0xFFFFFFFF
        for p in range(2):
            byte = lambda value, i: (value >> (8 * i)) & 0xFF  # noqa: E731
            v = (
                byte(source, 2 * p)
                | byte(words[..., w], 2 * p) << 8
                | byte(source, 2 * p + 1) << 16
                | byte(words[..., w], 2 * p + 1) << 24
            )  # prmt 0x1504 / 0x3726
            row_base = base[..., lane // 4 + 8 * p].expand(tiles, blocks, 32) * 0x00800080
            regs[..., 2 * w + p] = (((v & 0x7FF07FF0) >> 4) + ((v & 0x80008000) | row_base)) & 0xFFFFFFFF
    if patch:  # the kernel's overlay: halfword (lane << 3 | (register & 3) << 1 | half) of group 2 x block + step
        chunks = mma.padded_shape[1] // 128
        for tile in range(tiles):
            for chunk in range(chunks):
                word = int(mma.esc_chunk[tile * chunks + chunk])
                begin = int(mma.esc_tile[tile]) + (word >> 12)
                for entry in mma.esc_entry[begin : begin + (word & 0xFFF)].tolist():
                    position, value = entry >> 16, entry & 0xFFFF
                    group, lane_, reg, half = position >> 8, (position >> 3) & 31, (position >> 1) & 3, position & 1
                    block, reg = chunk * 4 + (group >> 1), 4 * (group & 1) + reg
                    old = int(regs[tile, block, lane_, reg])
                    regs[tile, block, lane_, reg] = (old & ~(0xFFFF << (16 * half))) | (value << (16 * half))
    halves = torch.stack((regs & 0xFFFF, regs >> 16), dim=-1).view(tiles, blocks, 32, 16)  # byte order i
    rows, cols = mma_module._fragment_index("cpu")
    out = torch.empty(tiles, blocks, 16, 32, dtype=torch.int64)
    out[:, :, rows, cols] = halves
    np_, kp = mma.padded_shape
    return out.permute(0, 2, 1, 3).reshape(np_, kp)


def test_kernel_decode_arithmetic_on_the_fragment_layout_reproduces_the_weights():
    w = weight(n=256, k=384, seed=3)
    w12 = encode(w)
    bits = emulate_kernel_decode(to_mma_layout(w12))[:256, :384]
    exact = w.view(torch.int16).to(torch.int64) & 0xFFFF
    escaped = torch.zeros_like(exact, dtype=torch.bool)
    rows, cols = escape_positions(w12)
    inside = (rows < 256) & (cols < 384)
    escaped[rows[inside], cols[inside]] = True
    assert torch.equal(bits[~escaped], exact[~escaped])  # escapes are patched after this decode
    assert escaped.any()
    assert torch.equal(emulate_kernel_decode(to_mma_layout(w12), patch=True)[:256, :384], exact)


def test_kernel_escape_patch_reproduces_weights_with_many_outliers():
    # escape fractions up to 1e-2 and a chunk with more than 32 escapes (two rounds of the warp's patch)
    torch.manual_seed(11)
    w = (torch.randn(64, 512) * 0.02).bfloat16()
    flat = w.view(-1)
    picks = torch.randperm(flat.numel())[: flat.numel() // 100]
    flat[picks] = torch.tensor([0.0, 1e-30, 3e4, -7e-9]).bfloat16().repeat(len(picks) // 4 + 1)[: len(picks)]
    w[16:32, 128:192] = 0.0  # 1024 zeros in one chunk
    mma = to_mma_layout(encode(w))
    assert int((mma.esc_chunk & 0xFFF).max()) > 32
    assert torch.equal(emulate_kernel_decode(mma, patch=True)[:64, :512], w.view(torch.int16).to(torch.int64) & 0xFFFF)


def emulate_qpass_decode(mma, low_bits):
    """The Q mode's decode in torch (csrc/w12_common.cuh decode_block_q, then the escape patch's zero codes, then the
    rows' windows on the sums): fp32 weights [Np, Kp] as the kernel's MMA effectively multiplies them."""
    words = mma.view.view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [T, B, 32, 4]
    tiles, blocks = words.shape[:2]
    bias = 0x38083808 if low_bits == "midpoint" else 0x38003800
    regs = torch.empty(tiles, blocks, 32, 8, dtype=torch.int64)
    for w in range(4):
        for p in range(2):
            b0, b1 = ((words[..., w] >> (8 * (2 * p + i))) & 0xFF for i in range(2))
            sign = lambda b: torch.where(b >= 0x80, 0xFF, 0)  # noqa: E731 - prmt's sign-replicate selector
            u = b0 | sign(b0) << 8 | b1 << 16 | sign(b1) << 24  # prmt 0x9180 / 0xB3A2
            regs[..., 2 * w + p] = (((u << 4) & 0x87F087F0) | bias) & 0xFFFFFFFF
    halves = torch.stack((regs & 0xFFFF, regs >> 16), dim=-1).view(tiles, blocks, 32, 16)
    rows, cols = mma_module._fragment_index("cpu")
    out = torch.empty(tiles, blocks, 16, 32, dtype=torch.int64)
    out[:, :, rows, cols] = halves
    np_, kp = mma.padded_shape
    bits = out.permute(0, 2, 1, 3).reshape(np_, kp)
    # the patch sets a listed escape's halfword to its sign where it decoded as the zero code (no offset, no mantissa);
    # inside the tensor every zero code is a listed escape (the test below checks it), so all of them here
    zero_code = (bits & 0x07F0) == 0
    bits = torch.where(zero_code, bits & 0x8000, bits)
    values = (bits.to(torch.int32) << 16).view(torch.float32)
    scale = ((mma.base.to(torch.int32) + 15) << 23).view(torch.float32)
    return values * scale[:, None], zero_code


@pytest.mark.parametrize("low_bits", ["truncated", "midpoint"])
def test_qpass_decode_arithmetic_reproduces_the_views_weights(low_bits):
    torch.manual_seed(5)
    w = with_outliers((torch.randn(96, 640) * 0.02).bfloat16(), 0.02)  # zeros, tiny, huge: every escape kind
    w12 = encode(w)
    mma = to_mma_layout(w12)
    got, zero_code = emulate_qpass_decode(mma, low_bits)
    want = qpass_weight_reference(w12, low_bits).float()
    assert torch.equal(got[:96, :640], want)
    # every code the patch zeroes is an escape below the window (the patch reads only the escape list)
    rows, cols = escape_positions(w12)
    listed = torch.zeros_like(zero_code)
    listed[rows, cols] = True
    assert not (zero_code[:96, :640] & ~listed[:96, :640]).any() and zero_code[:96, :640].any()


def test_kernel_escape_owner_mapping_matches_the_fragment_layout():
    # the kernels patch escape (row r, column c of a 128-column chunk) into lane (r % 8) * 4 + (c >> 3) % 4,
    # register 4 s + 2 q + r // 8 (s, q: bits 2 and 1 of c), half c % 2, of block c >> 5; that byte of the
    # fragment must hold (r, c % 32).
    rows, cols = mma_module._fragment_index("cpu")
    for r in range(16):
        for c in range(128):
            lane = (r & 7) * 4 + ((c >> 3) & 3)
            reg = 4 * ((c >> 2) & 1) + 2 * ((c >> 1) & 1) + (r >> 3)
            byte = 4 * (reg >> 1) + 2 * (reg & 1) + (c & 1)
            assert (int(rows[lane, byte]), int(cols[lane, byte])) == (r, c & 31)


def test_wide_launch_shapes_and_config():
    from specpilot_kernels.w12.mma import wide_token_tiles

    rows = (33, 48, 49, 64, 65, 96, 97, 128, 129, 192, 193, 256)
    assert [wide_token_tiles(m) for m in rows] == [
        (6, 1),
        (6, 1),
        (8, 1),
        (8, 1),
        (12, 1),
        (12, 1),
        (16, 1),
        (16, 1),
        (12, 2),
        (12, 2),
        (16, 2),
        (16, 2),
    ]
    assert [wide_token_tiles(m, 32) for m in (129, 192, 193, 256)] == [(24, 1), (24, 1), (32, 1), (32, 1)]
    assert MmaConfig(wide=[2, 3, 2]).wide == (2, 3, 2)
    assert MmaConfig().uses_wide(33, (9, 0)) and not MmaConfig().uses_wide(32, (9, 0))
    assert not MmaConfig().uses_wide(64, (12, 0)) and not MmaConfig(wide=(0, 2, 2)).uses_wide(64, (9, 0))
    per_bucket = MmaConfig(wide_rows=[[4, 4, 2, 8], [0, 2, 2, 16], [2, 2, 2, 32]])
    assert per_bucket.wide_launch(64) == (4, 4, 2, 8, 1) and per_bucket.wide_launch(200) == (2, 2, 2, 32, 1)
    assert MmaConfig(wide_rows=[[1, 2, 2, 8, 4]] * 3).wide_launch(40) == (1, 2, 2, 8, 4)
    assert per_bucket.uses_wide(48, (9, 0)) and not per_bucket.uses_wide(96, (9, 0))
    decoded = MmaConfig(wide_rows=[[4, 4, 2, 8, 1, 1], [2, 4, 2, 16, 1, 0], [1, 2, 3, 32, 1, 1]])
    assert decoded.wide_decoded(64) and not decoded.wide_decoded(96) and decoded.wide_decoded(256)
    assert decoded.wide_launch(64) == (4, 4, 2, 8, 1) and not per_bucket.wide_decoded(64)
    split = MmaConfig(wide_rows=[[4, 3, 3, 8, 1, 2], [2, 3, 2, 8, 1, 2], [1, 2, 3, 32, 1, 0]])
    assert split.wide_kernel(48) == mma_module.CLASS_SPLIT_KERNEL == split.wide_kernel(128)
    assert split.wide_kernel(200) == mma_module.WIDE_KERNEL and not split.wide_decoded(64)
    assert decoded.wide_kernel(64) == mma_module.DECODED_KERNEL and per_bucket.wide_kernel(64) == mma_module.WIDE_KERNEL
    for bad in ((5, 2, 2), (1, 1, 2), (1, 2, 7), (1, 2)):
        with pytest.raises(W12Error, match="wide"):
            MmaConfig(wide=bad)
    for bad in (
        ((1, 2, 2, 16),),
        ((1, 2, 2, 10),) * 3,
        ((1, 7, 2, 16),) * 3,
        ((1, 2, 2, 16, 3),) * 3,
        ((1, 2, 2, 16, 2, 1),) * 3,  # the decoded-weight kernel: no multicast
        ((1, 2, 4, 16, 1, 1),) * 3,  # ... and at most 3 decoded slots
        ((1, 2, 2, 24, 1, 2),) * 3,  # the class-split kernel: slabs of 6, 8, 12 or 16 token tiles
        ((1, 3, 4, 8, 1, 2),) * 3,  # ... a weight ring of 2 or 3
        ((1, 3, 2, 8, 2, 2),) * 3,  # ... no multicast
        ((1, 3, 2, 8, 1, 3),) * 3,
    ):
        with pytest.raises(W12Error, match="wide_rows"):
            MmaConfig(wide_rows=bad)


def with_outliers(w, fraction):
    flat = w.clone().view(-1)
    at = torch.randperm(flat.numel(), device=w.device)[: int(flat.numel() * fraction)]
    flat[at] = torch.tensor([0.0, 1e-30, 3e4, -3e4], device=w.device).bfloat16().repeat(len(at) // 4 + 1)[: len(at)]
    return flat.view_as(w)


@pytest.mark.gpu
@pytest.mark.parametrize("fraction", [0.0, 1e-4, 1e-3, 1e-2])
@pytest.mark.parametrize(
    "config",
    [
        MmaConfig(1, 3, 2, wide=(1, 2, 3)),
        MmaConfig(1, 8, 2, wgmma=(1, 1, 1), wide=(2, 3, 2)),
        MmaConfig(1, 3, 2, wide_rows=((4, 6, 2, 8), (2, 4, 4, 16), (2, 2, 2, 32))),
        MmaConfig(1, 3, 2, wide_rows=((1, 3, 2, 8, 2), (2, 3, 2, 16, 4), (1, 2, 2, 32, 2))),
        MmaConfig(1, 3, 2, wide_rows=((4, 4, 2, 8, 1, 1), (2, 4, 2, 16, 1, 1), (1, 2, 2, 32, 1, 1))),
        MmaConfig(1, 8, 2, wide_rows=((2, 3, 3, 8, 1, 1), (1, 2, 2, 16, 1, 1), (2, 3, 2, 16, 1, 1))),
        # the class-split kernel: 6 and 16 (class, split) blocks a tile group, classes without chunks, slabs of 48-128
        # rows, a row tail
        MmaConfig(1, 3, 2, wide_rows=((4, 3, 3, 8, 1, 2), (2, 3, 2, 8, 1, 2), (1, 3, 3, 8, 1, 2))),
        MmaConfig(1, 8, 2, wide_rows=((1, 3, 2, 8, 1, 2), (2, 3, 2, 16, 1, 2), (1, 3, 3, 16, 1, 2))),
        MmaConfig(1, 2, 1, wgmma=(1, 2, 2), tail_rows=256, tail=(1, 8, 2), wide_rows=((2, 3, 3, 8, 1, 2),) * 3),
        MmaConfig(1, 1, 1, wide_rows=((4, 3, 3, 8, 1, 2), (2, 3, 2, 16, 1, 2), (4, 3, 2, 8, 1, 2))),  # sums are y
    ],
    ids=str,
)
def test_mma_rows_1_to_256_with_outliers_give_the_per_warp_bits(fraction, config):
    # every row count 1-256 (the wide kernel from 33 rows on sm_90a) against the per-warp kernel 64 rows at a time,
    # with escape fractions 0 to 1e-2 (parallel patching, chunks with more than 32 escapes), K splits in a cluster
    # (6 blocks) and through the workspace (8 classes x 2 splits), and each row's bits the same at 1 and 256 rows
    torch.manual_seed(12)
    w = with_outliers(weight(n=1024, k=1536, device="cuda"), fraction)
    w[480:496, 256:900] = 0.0
    mma = to_mma_layout(encode(w))
    plain = replace(config, wgmma=(0, 0, 0), shared_x_32=(0, 0), wide=(0, 2, 2), wide_rows=())
    x = torch.randn(256, 1536, device="cuda").bfloat16()
    alone = w12_mma_gemm(x[:1], mma, config=config).view(torch.int16)
    for rows in (1, 8, 9, 16, 17, 32, 33, 40, 48, 64, 65, 96, 128, 129, 192, 200, 256):
        y = w12_mma_gemm(x[:rows], mma, config=config).view(torch.int16)
        assert torch.equal(y, w12_mma_gemm(x[:rows], mma, config=plain).view(torch.int16)), rows
        assert torch.equal(y[:1], alone), rows
    onehot = torch.eye(1536, device="cuda", dtype=torch.bfloat16)[:256]
    expected = (w[:, :256].t().float() + 0.0).bfloat16()
    assert torch.equal(w12_mma_gemm(onehot, mma, config=config).view(torch.int16), expected.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("fraction", [0.0, 1e-4, 1e-3, 1e-2])
@pytest.mark.parametrize(
    "config",
    [
        MmaConfig(1, 3, 1, staged_rows=16, shared_x_32=(5, 6)),
        MmaConfig(1, 3, 2, staged_rows=16, shared_x_32=(5, 6)),
        MmaConfig(1, 1, 1, staged_rows=16, shared_x_32=(4, 3)),
        MmaConfig(4, 1, 1, (2, 2), staged_rows=16, wgmma=(5, 2, 2)),
        MmaConfig(1, 1, 1, (2, 1), wgmma=(2, 2, 4)),
        MmaConfig(2, 4, 3, (2, 1), (2, 2)),
    ],
    ids=str,
)
def test_narrow_kernels_read_outlier_weights_exactly_at_1_to_32_rows(fraction, config):
    # the kernels the tuned configs run at 1-32 rows (staged weights, whose escape overlay is the buffer half just
    # read; shared activations, whose overlay is the warp's slot of the reduction or, with one K class, its own
    # region; staged warpgroups; half steps), escape fractions 0 to 1e-2 and a tile with more than 32 escapes a chunk:
    # one-hot rows give every weight bit for bit, and x's rows the per-warp kernel's bits at every row count
    torch.manual_seed(13)
    w = with_outliers(weight(n=1024, k=1536, device="cuda"), fraction)
    w[480:496, 256:900] = 0.0
    mma = to_mma_layout(encode(w))
    eye = torch.eye(1536, device="cuda", dtype=torch.bfloat16)
    expected = (w.t().float() + 0.0).bfloat16().view(torch.int16)
    for rows in (1, 8, 16, 24, 32):
        for c0 in range(0, 1536, rows if rows in (16, 32) else 128):  # every column at 16 and 32 rows
            cols = torch.arange(c0, min(c0 + rows, 1536), device="cuda")
            y = w12_mma_gemm(eye[cols], mma, config=config).view(torch.int16)
            assert torch.equal(y, expected[cols]), (rows, c0)
    plain = replace(config, staged_rows=0, wgmma=(0, 0, 0), shared_x_32=(0, 0), wide=(0, 2, 2), wide_rows=())
    x = torch.randn(32, 1536, device="cuda").bfloat16()
    for rows in (1, 2, 4, 8, 9, 16, 17, 24, 32):
        y = w12_mma_gemm(x[:rows], mma, config=config).view(torch.int16)
        assert torch.equal(y, w12_mma_gemm(x[:rows], mma, config=plain).view(torch.int16)), rows


def test_device_check_tune_candidates_are_valid_and_fit(tmp_path):
    # the H200 stage's --tune (benchmarks/w12_device_check.py) on the CPU: every row range of every tuned shape gets
    # candidates, each a valid config with the shape's partition (no bit may depend on the choice), wide blocks that fit
    from benchmarks import w12_device_check as check

    tuned = json.loads(mma_module.TUNED_PATH.read_text())["NVIDIA H200"]
    for key in ("10240,5120", "34816,5120", "248320,5120"):
        base = MmaConfig(**tuned[key])
        for bucket, rows in check.TUNE_BUCKETS.items():
            options = check.tune_candidates(base, bucket, multicast_too=True)
            assert len(options) >= 8, (key, bucket)
            for option in options.values():
                assert (option.warps_n, option.warps_k, option.splits) == (base.warps_n, base.warps_k, base.splits)
                if bucket != "17-32" and option.uses_wide(rows[-1], (9, 0)):
                    assert check.wide_fits(*option.wide_launch(rows[-1])[:4], rows[-1])
    assert not check.wide_fits(4, 6, 4, 32, 256) and check.wide_fits(1, 2, 2, 8, 64)
    # --write-configs: the committed file with the tuned shapes replaced, every config still loadable
    config = asdict(check.tune_candidates(MmaConfig(**tuned["10240,5120"]), "33-64")["wide(4, 4, 2, 8)"])
    out = tmp_path / "mma_configs.json"
    check.write_configs(out, {"10240,5120": config}, "NVIDIA H200")
    written = json.loads(out.read_text())["NVIDIA H200"]
    assert written["10240,5120"] == json.loads(json.dumps(config)) and written["5120,8192"] == tuned["5120,8192"]
    assert MmaConfig(**written["10240,5120"]).wide_launch(64) == (4, 4, 2, 8, 1)
    # the summary and headline re-made from a committed H200 result
    doc = json.loads((Path(check.__file__).parent / "results" / "w12-v2-device-check-h200.json").read_text())
    doc["summary"] = check.summarize(doc)
    assert check.headline(doc).startswith("bits exact; projections 1-32 rows 1.34x cuBLAS")
    assert 0.8 < doc["summary"]["projections_1_32_min_every_row_count"] < doc["summary"]["projections_1_32_min"]


def test_wide_check_candidates_are_decoded_settings_that_fit():
    # the H200 stage w12wide (benchmarks/w12_wide_check.py) on the CPU: each candidate replaces one row range's setting
    # of the committed config with a decoded-weight one, keeps the partition (no bit may depend on the choice), and
    # fits a multiprocessor's shared memory at every timed row count of its range
    from benchmarks import w12_wide_check as check

    tuned = json.loads(mma_module.TUNED_PATH.read_text())["NVIDIA H200"]
    for key in ("10240,5120", "34816,5120", "248320,5120"):
        base = MmaConfig(**tuned[key])
        for candidates in (check.CANDIDATES, check.TWO_MMA_CANDIDATES):
            for bucket, settings in candidates.items():
                for setting in settings:
                    config = check.with_setting(base, bucket, setting)
                    assert (config.warps_n, config.warps_k, config.splits) == (base.warps_n, base.warps_k, base.splits)
                    for m in (m for m in check.TIMED_ROWS if check.bucket_of(m) == bucket):
                        assert config.wide_decoded(m) and config.wide_launch(m)[:4] == setting
                        assert check.decoded_fits(*setting, m), (setting, m)
                    others = [top for top in mma_module.WIDE_BUCKETS if top != bucket]
                    assert all(config.wide_launch(top) == base.wide_launch(top) for top in others)
    assert check.groups_built(8, 4) == 4 and check.groups_built(16, 4) == 2 and check.groups_built(32, 2) == 2
    assert not check.decoded_fits(4, 6, 3, 8, 64) and not check.decoded_fits(2, 3, 2, 32, 256)


def test_wide_check_picks_only_candidates_that_beat_the_library_with_its_bits(tmp_path):
    # w12_wide_check --pick: a row range takes the candidate with the best geometric-mean gain over the library when
    # it is no slower at any timed row and its bits are the library's; otherwise the range keeps the library's setting
    from benchmarks import w12_wide_check as check

    tuned = json.loads(mma_module.TUNED_PATH.read_text())["NVIDIA H200"]
    base = tuned["10240,5120"]

    def row(m, library_us, **candidates):
        return {"M": m, "cublas_us": 30.0, "library_us": library_us, **candidates}

    fast = {"us": 20.0, "bits_equal_library": True}
    shapes = {
        "qkv": {
            "N": 10240,
            "K": 5120,
            "library_config": base,
            "rows": [
                row(33, 40.0, g4_s4_d2_t8=fast, g2_s4_d2_t8={"us": 10.0, "bits_equal_library": False}),
                row(64, 40.0, g4_s4_d2_t8=fast, g2_s4_d2_t8=fast),
                row(96, 40.0, g2_s4_d2_t16=fast),
                row(128, 19.0, g2_s4_d2_t16=fast),  # slower than the library at 128 rows: not taken
                row(256, 40.0, g1_s2_d2_t32={"us": 39.5, "bits_equal_library": True}),  # under the 2% margin
            ],
        }
    }
    picked = check.pick_configs(shapes)
    config = MmaConfig(**picked["10240,5120"])
    assert config.wide_decoded(48) and config.wide_launch(48)[:4] == (4, 4, 2, 8)
    assert not config.wide_decoded(96) and config.wide_launch(96) == MmaConfig(**base).wide_launch(96)
    assert not config.wide_decoded(256)
    shapes["qkv"]["rows"] = shapes["qkv"]["rows"][2:]
    assert check.pick_configs(shapes) == {}


def test_device_check_refuses_unknown_tune_buckets_and_check_configs(monkeypatch, capsys):
    # bad --tune-buckets / --check-configs stop the run before it touches a GPU, naming the entry and the valid ones
    from benchmarks import w12_device_check as check

    for bad in (["--tune-buckets", "33-64,1-999"], ["--check-configs", "n1_k3_s2_one_slab,nope"]):
        monkeypatch.setattr("sys.argv", ["w12_device_check.py", "--out", "unused.json", *bad])
        with pytest.raises(SystemExit):
            check.main()
        err = capsys.readouterr().err
        assert bad[1].split(",")[-1] in err and "n1_k3_s2_one_slab" in err
    # the multicast configs are offered only with --multicast
    monkeypatch.setattr(
        "sys.argv", ["w12_device_check.py", "--out", "unused.json", "--check-configs", "n1_k3_s2_multicast2"]
    )
    with pytest.raises(SystemExit):
        check.main()
    assert "need --multicast" in capsys.readouterr().err


def test_device_check_shapes_are_names_or_n_by_k(monkeypatch, capsys):
    # --shapes takes the 27B-class names or NxK (the engine's shapes outside SHAPES), and refuses anything else
    from benchmarks import w12_device_check as check

    assert check.shape_dims("qkv") == (10240, 5120) and check.shape_dims("14336x5120") == (14336, 5120)
    assert check.shape_dims("14336x") is None and check.shape_dims("0x5120") is None
    monkeypatch.setattr("sys.argv", ["w12_device_check.py", "--out", "unused.json", "--shapes", "qkv,big"])
    with pytest.raises(SystemExit):
        check.main()
    assert "big" in capsys.readouterr().err
    # at 33-64 rows 64 rows a launch comes before the wide settings (a tune budget may stop the sweep)
    tuned = json.loads(mma_module.TUNED_PATH.read_text())["NVIDIA H200"]
    assert list(check.tune_candidates(MmaConfig(**tuned["14336,5120"]), "33-64"))[1].startswith("off_plan")
