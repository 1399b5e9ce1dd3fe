"""The system engine's fused RMSNorm / add+RMSNorm / silu*up kernels: their arithmetic against the torch references
(fp32 under the Triton interpreter, whose bf16 loads are unreliable) and their sm_90 compilation (no GPU needed)."""

import pytest
import torch

from specpilot_kernels import fused_ops as F


def _launch_cpu(kernel, rows, *args, block):
    kernel[(rows,)](*args, BLOCK=block)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (conftest)")
def test_kernels_match_the_references_in_fp32():
    gen = torch.Generator().manual_seed(0)
    x, d = torch.randn(6, 200, generator=gen), torch.randn(6, 200, generator=gen)
    w = torch.rand(200, generator=gen) + 0.5
    out = torch.empty_like(x)
    _launch_cpu(F._rms_norm_kernel, 6, x, w, out, 200, 1e-6, block=256)
    torch.testing.assert_close(out, F.rms_norm_reference(x, w, 1e-6), rtol=1e-6, atol=1e-6)
    y, normed = torch.empty_like(x), torch.empty_like(x)
    _launch_cpu(F._add_rms_norm_kernel, 6, x, d, w, y, normed, 200, 1e-6, block=256)
    want_y, want_h = F.add_rms_norm_reference(x, d, w, 1e-6)
    assert torch.equal(y, want_y)
    torch.testing.assert_close(normed, want_h, rtol=1e-6, atol=1e-6)
    gu = torch.randn(5, 600, generator=gen)
    for rows_a_program in (1, 2, 4):  # row tiles: the last program's rows partly past the end
        got = torch.empty(5, 300)
        F._silu_mul_kernel[(-(-5 // rows_a_program), 3)](gu, got, 5, 300, BR=rows_a_program, BLOCK=128)
        torch.testing.assert_close(got, F.silu_mul_reference(gu), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (conftest)")
def test_tree_conv_and_gated_norm_kernels_match_the_references_in_fp32():
    from specpilot_mem.engine.system import pack_trees

    gen = torch.Generator().manual_seed(1)
    B, T, C, CS = 2, 5, 48, 4
    state, x = torch.randn(B, CS - 1, C, generator=gen), torch.randn(B, T, C, generator=gen)
    weight = torch.randn(C, CS, generator=gen)
    idx = torch.as_tensor(pack_trees([([1, 2, 3, 4, 5], [-1, 0, 0, 1, 3]), ([1, 2], [-1, 0])], T, CS)["conv_idx"])
    want = F.tree_conv_silu_reference(state, x, idx, weight)
    for br, block in ((1, 64), (4, 32), (8, 64)):  # row tiles across the requests' boundary, and past the end
        out = torch.empty_like(x)
        grid = (-(-B * T // br), -(-C // block))
        F._tree_conv_silu_kernel[grid](
            state, x, idx, weight, out, out, B * T, T, C, C, CS=CS, BR=br, BLOCK=block, RAW=False
        )
        torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    o, z, w = torch.randn(5, 64, generator=gen), torch.randn(5, 64, generator=gen), torch.rand(64, generator=gen)
    for br in (1, 4):
        got = torch.empty_like(o)
        F._gated_rms_norm_kernel[(-(-5 // br),)](o, w, z, got, 5, 64, 1, 64, 1e-6, BR=br, BLOCK=64)
        torch.testing.assert_close(got, F.gated_rms_norm_reference(o, w, z, 1e-6), rtol=1e-6, atol=1e-6)


COMPILE_FOR_SM90 = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specpilot_kernels import fused_ops as F

def compile_for_sm90(fn, types, constants):
    constants = {"PDL": True, **constants}  # the variant the H200 launches
    names = fn.arg_names
    signature = {n: ("constexpr" if n in constants else types[n]) for n in names}
    source = ASTSource(fn, signature, constexprs={(names.index(n),): v for n, v in constants.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})

ptr = "*" + sys.argv[1]
compile_for_sm90(F._rms_norm_kernel, {"x": ptr, "w": ptr, "out": ptr, "N": "i32", "eps": "fp32"}, {"BLOCK": 8192})
compile_for_sm90(F._add_rms_norm_kernel, {"x": ptr, "delta": ptr, "w": ptr, "y": ptr, "out": ptr, "N": "i32",
                                          "eps": "fp32"}, {"BLOCK": 8192})
for br in (1, 4):
    compile_for_sm90(F._silu_mul_kernel, {"gu": ptr, "out": ptr, "ROWS": "i32", "N": "i32"}, {"BR": br, "BLOCK": 1024})
for br in (1, 4):
    compile_for_sm90(F._tree_conv_silu_kernel, {"state": ptr, "x": ptr, "idx": "*i64", "w": ptr, "out": ptr,
                                                "raw": ptr, "BT": "i32", "T": "i32", "C": "i32", "sx": "i32"},
                     {"CS": 4, "BR": br, "BLOCK": 1024, "RAW": True})
    compile_for_sm90(F._gated_rms_norm_kernel, {"x": ptr, "w": ptr, "gate": ptr, "out": ptr, "ROWS": "i32", "N": "i32",
                                                "HEADS": "i32", "sg": "i32", "eps": "fp32"}, {"BR": br, "BLOCK": 128})
compile_for_sm90(F._qk_norm_rope_kernel, {"q": ptr, "k": ptr, "v": ptr, "cos": "*fp32", "sin": "*fp32", "qw": ptr,
                                          "kw": ptr, "q_out": ptr, "k_out": ptr, "v_out": ptr, "kc": ptr, "vc": ptr,
                                          "slots": "*i64", "sq": "i32", "sk": "i32", "sv": "i32", "kc_b": "i64",
                                          "kc_h": "i32", "BT": "i32", "T": "i32", "HQ": "i32", "HKV": "i32",
                                          "eps": "fp32"},
                 {"D": 256, "HALF": 128, "BR": 2, "QK_NORM": True, "WRITE": True})
split_types = {"q": ptr, "kc": ptr, "vc": ptr, "kr": ptr, "vr": ptr, "lengths": "*i64", "anc": "*u8",
               "part_o": "*fp32", "part_m": "*fp32", "part_l": "*fp32", "T": "i32", "R": "i32", "HQ": "i32",
               "HKV": "i32", "REP": "i32", "kc_b": "i64", "kc_h": "i32", "S": "i32", "scale": "fp32", "WINDOW": "i32"}
for bm, bn in ((16, 32), (64, 32), (64, 64)):
    compile_for_sm90(F._tree_attention_split_kernel, split_types, {"CHUNK": 128, "D": 256, "BD": 256, "BM": bm, "BN": bn,
                     "HAS_CACHE": True, "IEEE": sys.argv[1] == "fp32"})
compile_for_sm90(F._tree_attention_combine_kernel, {"part_o": "*fp32", "part_m": "*fp32", "part_l": "*fp32",
                                                    "gate": ptr, "out": ptr, "T": "i32", "R": "i32", "HQ": "i32",
                                                    "HKV": "i32", "REP": "i32", "S": "i32", "sg": "i32"},
                 {"D": 256, "BD": 256, "SP": 32, "HAS_GATE": True})
compile_for_sm90(F._select_states_kernel, {"dst": "*fp32", "src": "*fp32", "index": "*i64", "keep": "*u8", "B": "i32",
                                           "T": "i32", "E": "i32", "dst_g": "i64", "dst_b": "i64"}, {"BLOCK": 4096})
compile_for_sm90(F._conv_commit_kernel, {"conv": ptr, "raw": ptr, "idx": "*i64", "deepest": "*i64", "keep": "*u8",
                                         "B": "i32", "T": "i32", "C": "i32", "conv_g": "i64", "conv_b": "i32"},
                 {"CS": 4, "WP": 4, "BLOCK": 1024})
compile_for_sm90(F._tree_accept_kernel, {"tokens": "*i64", "parents": "*i64", "depth": "*i64", "anc": "*u8",
                                         "num_nodes": "*i32", "forced": "*i64", "active": "*u8", "pred": "*i64",
                                         "accepted": "*i64", "accept_len": "*i64", "deepest": "*i64", "out": "*i64",
                                         "T": "i32"}, {"TP": 64})
compile_for_sm90(F._row_argmax_partial_kernel, {"x": ptr, "m_out": "*fp32", "nan_out": "*i32", "i_out": "*i32",
                                                "N": "i32", "sx": "i32", "NCH": "i32"}, {"CH": 4096})
compile_for_sm90(F._row_argmax_merge_kernel, {"m_in": "*fp32", "nan_in": "*i32", "i_in": "*i32", "out": "*i64",
                                              "NCH": "i32", "BIG": "i32"}, {"P": 64})
print("compiled")
"""


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_kernels_compile_for_the_h200(dtype):
    """PTX for sm_90 from this machine (a process without the interpreter): what the GPU run will compile."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_SM90, dtype], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-2000:]


def _interpreted():
    return F.interpreted_kernels()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (conftest)")
def test_strided_conv_and_gated_norm_read_the_projection_in_place():
    """The conv and the gated norm read views of one projection (no copies) and match the references."""
    from specpilot_mem.engine.system import pack_trees

    gen = torch.Generator().manual_seed(2)
    B, T, C, CS, HV, N = 2, 5, 48, 4, 3, 16
    proj = torch.randn(B, T, C + HV * N + 7, generator=gen)
    x, z = proj[..., :C], proj[..., C : C + HV * N].view(B, T, HV, N)
    state, weight = torch.randn(B, CS - 1, C, generator=gen), torch.randn(C, CS, generator=gen)
    idx = torch.as_tensor(pack_trees([([1, 2, 3, 4, 5], [-1, 0, 0, 1, 3]), ([1, 2], [-1, 0])], T, CS)["conv_idx"])
    raw = torch.empty(B, T, C)
    with _interpreted():
        got = F.tree_conv_silu(state, x, idx, weight, raw=raw)
        o = torch.randn(B, T, HV, N, generator=gen)
        w = torch.rand(N, generator=gen)
        normed = F.gated_rms_norm(o, w, z, 1e-6)
    torch.testing.assert_close(got, F.tree_conv_silu_reference(state, x, idx, weight), rtol=1e-6, atol=1e-6)
    assert torch.equal(raw, x)
    torch.testing.assert_close(normed, F.gated_rms_norm_reference(o, w, z, 1e-6), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (conftest)")
def test_qk_norm_rope_and_tree_attention_match_the_references(norm):
    """q/k norm + RoPE + cache write, then tree attention with the output gate: a tree of 5 rows and a chain of 2
    padded to 5, over caches of different lengths, and without a cache (the drafter's block)."""
    from specpilot_mem.engine.system import pack_trees

    gen = torch.Generator().manual_seed(3)
    B, T, HQ, HKV, D, L = 2, 5, 4, 2, 32, 40
    sizes = [HQ * D, HQ * D, HKV * D, HKV * D]
    proj = torch.randn(B, T, sum(sizes), generator=gen)
    q, gate, k, v = proj.split(sizes, dim=-1)
    q, k, v = q.view(B, T, HQ, D), k.view(B, T, HKV, D), v.view(B, T, HKV, D)
    pos = torch.tensor([[7, 8, 8, 9, 10], [30, 31, 32, 33, 34]])
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = pos.float()[..., None] * inv
    cos, sin = ang.cos(), ang.sin()
    qw, kw = (torch.rand(D, generator=gen) + 0.5 if norm else None for _ in range(2))
    lengths = torch.tensor([7, 30])
    slots = lengths[:, None] + torch.arange(T)
    anc = torch.as_tensor(pack_trees([([1, 2, 3, 4, 5], [-1, 0, 0, 1, 3]), ([1, 2], [-1, 0])], T, 4)["anc"])
    caches = [torch.randn(B, HKV, L, D, generator=gen) for _ in range(2)]
    want_caches = [c.clone() for c in caches]
    want = F.qk_norm_rope_reference(q, k, v, cos, sin, qw, kw, 1e-6, *want_caches, slots)
    with _interpreted():
        got = F.qk_norm_rope(q, k, v, cos, sin, qw, kw, 1e-6, *caches, slots)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    for a, b in zip(caches, want_caches):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    qr, kr, vr = want
    for cache, length, g, window in (
        (caches, lengths, gate, 0),
        (caches, lengths, None, 5),
        ((None, None), None, None, 0),
    ):
        ref = F.tree_attention_reference(qr, *cache, kr, vr, length, anc, g, window)
        with _interpreted():
            out = F.tree_attention(qr, *cache, kr, vr, length, anc, g, window)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # a longer context: the key range split over several programs, then combined
    long_k, long_v = (torch.randn(B, HKV, 300, D, generator=gen) for _ in range(2))
    long_len = torch.tensor([250, 37])
    ref = F.tree_attention_reference(qr, long_k, long_v, kr, vr, long_len, anc, gate)
    assert F._attention_split(B, HKV, HQ // HKV * T, 300 + T, D, 132)[1] > 1
    with _interpreted():
        out = F.tree_attention(qr, long_k, long_v, kr, vr, long_len, anc, gate)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (conftest)")
def test_tree_attention_window_holds_across_key_splits():
    """The context fault's window (attn_window, SystemOptions) inside the split kernel: a request whose last 100
    keys lie in several programs' key ranges sees only those, one whose cache is shorter than the window sees it
    all; the rows' own keys stay visible."""
    from specpilot_mem.engine.system import pack_trees

    gen = torch.Generator().manual_seed(4)
    B, T, HQ, HKV, D, L = 2, 5, 4, 2, 32, 300
    q = torch.randn(B, T, HQ, D, generator=gen)
    k_rows, v_rows = (torch.randn(B, T, HKV, D, generator=gen) for _ in range(2))
    k_cache, v_cache = (torch.randn(B, HKV, L, D, generator=gen) for _ in range(2))
    lengths, window = torch.tensor([250, 37]), 100
    anc = torch.as_tensor(pack_trees([([1, 2, 3, 4, 5], [-1, 0, 0, 1, 3]), ([1, 2], [-1, 0])], T, 4)["anc"])
    assert F._attention_split(B, HKV, HQ // HKV * T, L + T, D, 132)[1] > 1
    args = (q, k_cache, v_cache, k_rows, v_rows, lengths, anc, None)
    with _interpreted():
        windowed, full = F.tree_attention(*args, window), F.tree_attention(*args)
    torch.testing.assert_close(windowed, F.tree_attention_reference(*args, window), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(full, F.tree_attention_reference(*args), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(windowed[0], full[0], atol=1e-3)  # request 0 lost its first 150 keys
    torch.testing.assert_close(windowed[1], full[1], rtol=0, atol=0)  # 37 keys: all inside the window


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (conftest)")
def test_layer_stacked_commits_match_the_references():
    """Every layer's snapshot and conv-window commit in one launch each, on slices of stacked pools; an inactive
    request keeps its state."""
    from specpilot_mem.engine.system import pack_trees

    gen = torch.Generator().manual_seed(4)
    G, slots, B, T, CS, C = 3, 4, 2, 5, 4, 24
    pool = torch.randn(G, slots, 2, 3, 3, generator=gen)
    snaps = torch.randn(G, B, T, 2, 3, 3, generator=gen)
    conv = torch.randn(G, slots, CS - 1, C, generator=gen)
    raw = torch.randn(G, B, T, C, generator=gen)
    idx = torch.as_tensor(pack_trees([([1, 2, 3, 4, 5], [-1, 0, 0, 1, 3]), ([1, 2], [-1, 0])], T, CS)["conv_idx"])
    deepest, keep = torch.tensor([4, 1]), torch.tensor([True, False])
    want_pool, want_conv = pool.clone(), conv.clone()
    F.select_states_reference(want_pool[:, 1 : 1 + B], snaps, deepest, keep)
    F.conv_commit_reference(want_conv[:, 1 : 1 + B], raw, idx, deepest, keep)
    with _interpreted():
        F.select_states(pool[:, 1 : 1 + B], snaps, deepest, keep)
        F.conv_commit(conv[:, 1 : 1 + B], raw, idx, deepest, keep)
    assert torch.equal(pool, want_pool) and torch.equal(conv, want_conv)
    assert torch.equal(want_pool[:, 1], snaps[:, 0, 4]) and not torch.equal(want_pool[:, 2], snaps[:, 1, 1])
    assert torch.equal(want_conv[:, 1, 2], raw[:, 0, 4]) and torch.equal(want_conv[:, 1, 1], raw[:, 0, 3])


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (conftest)")
def test_tree_accept_kernel_matches_the_reference():
    """Random ragged trees (padding, forced nodes, an inactive request) against random target tokens."""
    from specpilot_mem.engine.system import pack_trees

    gen = torch.Generator().manual_seed(5)
    T, trees = 7, []
    for b in range(5):
        n = [7, 5, 3, 7, 1][b]
        parents = [-1] + [int(torch.randint(0, i, (), generator=gen)) for i in range(1, n)]
        trees.append((torch.randint(0, 3, (n,), generator=gen).tolist(), parents))
    packed = {k: torch.as_tensor(v) for k, v in pack_trees(trees, T, 4).items()}
    pred = torch.randint(0, 3, (5, T), generator=gen)
    forced = torch.tensor([-1, -1, 2, -1, -1])
    active = torch.tensor([True, True, True, False, True])
    args = (packed["tokens"], packed["parents"], packed["depth"], packed["anc"], packed["num_nodes"], forced, active)
    want = F.tree_accept_reference(*args, pred)
    with _interpreted():
        got = F.tree_accept(*args, pred)
    for a, b in zip(got, want):
        assert torch.equal(a, b), (a, b)
    assert want[1].tolist()[3] == 0 and want[1].max() > 1  # the inactive request commits nothing; some accept


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (conftest)")
def test_row_tiles_change_no_bit(monkeypatch):
    """The conv, gated norm and silu*up give the same bits whatever their row tile (FUSED_TILES), rows not a multiple
    of it; the q/k norm + RoPE (whose per-head reduction follows its warps on a GPU) has one tile for every row count,
    and matches its reference under any."""
    assert len(F.FUSED_TILES["qk_norm_rope"]) == 1
    from specpilot_mem.engine.system import pack_trees

    gen = torch.Generator().manual_seed(6)
    B, T, C, CS, HQ, HKV, D = 2, 5, 48, 4, 4, 2, 32
    proj = torch.randn(B, T, C + 3 * 16 + 7, generator=gen)
    x, z = proj[..., :C], proj[..., C : C + 3 * 16].view(B, T, 3, 16)
    state, weight = torch.randn(B, CS - 1, C, generator=gen), torch.randn(C, CS, generator=gen)
    idx = torch.as_tensor(pack_trees([([1, 2, 3, 4, 5], [-1, 0, 0, 1, 3]), ([1, 2], [-1, 0])], T, CS)["conv_idx"])
    o, w = torch.randn(B, T, 3, 16, generator=gen), torch.rand(16, generator=gen)
    gu = torch.randn(B, T, 2 * 40, generator=gen)
    q, k, v = (torch.randn(B, T, h, D, generator=gen) for h in (HQ, HKV, HKV))
    ang = torch.randn(B, T, D // 2, generator=gen)
    cos, sin, qw, kw = ang.cos(), ang.sin(), torch.rand(D, generator=gen), torch.rand(D, generator=gen)

    def run():
        with _interpreted():
            return (
                F.tree_conv_silu(state, x, idx, weight),
                F.gated_rms_norm(o, w, z, 1e-6),
                F.silu_mul(gu),
                *F.qk_norm_rope(q, k, v, cos, sin, qw, kw, 1e-6),
            )

    outs = []
    for tile in (F.RowTile(1, 16, 1), F.RowTile(2, 32, 2), F.RowTile(4, 64, 4), F.RowTile(16, 16, 4)):
        monkeypatch.setattr(F, "FUSED_TILES", {op: ((1 << 30, tile),) for op in F.FUSED_TILES})
        outs.append(run())
    for got in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(got[:3], outs[0][:3]))
    want = (
        F.tree_conv_silu_reference(state, x, idx, weight),
        F.gated_rms_norm_reference(o, w, z, 1e-6),
        F.silu_mul_reference(gu),
        *F.qk_norm_rope_reference(q, k, v, cos, sin, qw, kw, 1e-6),
    )
    for a, b in zip(outs[0], want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_row_argmax_is_torch_argmax_bit_for_bit(monkeypatch):
    """The head's two-launch argmax against torch.argmax: ties (within a chunk and across chunks) go to the lowest
    index, a NaN beats every number (the first NaN wins), all -inf rows give 0; rows span several chunks and a
    partial last one."""
    monkeypatch.setattr(F, "_ARGMAX_CHUNK", 64)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 64 * 3 + 17, generator=gen)
    x[1, 5] = x[1, 70] = x[1, 200] = 9.0  # a tie across chunks
    x[2, 80] = x[2, 81] = 9.0  # a tie inside a chunk
    x[3, 150], x[3, 20] = float("nan"), float("inf")  # NaN above +inf
    x[4, 100] = x[4, 199] = float("nan")
    x[5] = float("-inf")
    x[6, -1] = 9.0  # the partial last chunk
    with F.interpreted_kernels():
        got = F.row_argmax(x)
    assert got.dtype == torch.long and torch.equal(got, x.argmax(-1))
    assert got.tolist()[:6] == [x[0].argmax().item(), 5, 80, 150, 100, 0]
    with pytest.raises(ValueError, match="unit stride"):
        F.row_argmax(x.t())


def test_tile_tables_cover_every_row_count():
    """Each op's row ranges end unbounded and grow; the attention's cover both head-dim classes."""
    for op, table in F.FUSED_TILES.items():
        tops = [top for top, _ in table]
        assert tops == sorted(tops) and tops[-1] >= 1 << 20, op
        assert F.row_tile(op, 1) == table[0][1] and F.row_tile(op, 10**6) == table[-1][1]
    for D in (64, 128, 256):
        for R in (1, 48, 49, 200, 10**5):
            tile = F.attention_tile(R, D)
            assert tile.block_n in (32, 64) and tile.num_stages >= 1
    with pytest.raises(ValueError, match="head dims"):
        F.attention_tile(8, 512)
    with pytest.raises(ValueError, match="powers of two"):
        F.RowTile(3, 1024)
