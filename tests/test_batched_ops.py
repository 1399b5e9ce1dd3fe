"""The batched verify step's attention kernel (``specpilot_kernels.batched_ops``) against the torch reference it
shares with ``fused_ops.tree_attention`` (fp32 under the Triton interpreter), and its sm_90 compilation."""

import pytest
import torch

from specpilot_kernels import batched_ops as BO
from specpilot_kernels import fused_ops as F
from specpilot_mem.engine.system import pack_trees

TREE_AND_CHAIN = [([1, 2, 3, 4, 5], [-1, 0, 0, 1, 3]), ([1, 2], [-1, 0])]


def _inputs(gen, B, T, HQ, HKV, D, L, trees=None, gate=True):
    q = torch.randn(B, T, HQ, D, generator=gen)
    k_rows, v_rows = (torch.randn(B, T, HKV, D, generator=gen) for _ in range(2))
    caches = tuple(torch.randn(B, HKV, L, D, generator=gen) for _ in range(2)) if L else (None, None)
    g = torch.randn(B, T, HQ * D, generator=gen) if gate else None
    anc = torch.as_tensor(pack_trees(trees or [(list(range(T)), list(range(-1, T - 1)))] * B, T, 4)["anc"])
    return q, caches, k_rows, v_rows, anc, g


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (conftest)")
@pytest.mark.parametrize(
    "B, T, HQ, HKV, D, L, lengths, window, trees",
    [
        (2, 5, 4, 2, 32, 40, [7, 30], 0, TREE_AND_CHAIN),  # a tree and a padded chain, one key split
        (2, 5, 4, 2, 32, 300, [250, 37], 100, TREE_AND_CHAIN),  # the window across several splits
        (3, 17, 8, 2, 32, 200, [150, 0, 199], 0, None),  # 68 folded rows: two row blocks; an empty cache
        (2, 1, 4, 1, 64, 500, [480, 3], 0, None),  # AR rows over long caches, most splits of request 1 empty
        (2, 17, 8, 2, 32, 0, None, 0, None),  # no cache: the drafter's block, the rows' own keys only
    ],
)
def test_batched_tree_attention_matches_the_reference(B, T, HQ, HKV, D, L, lengths, window, trees):
    gen = torch.Generator().manual_seed(B * 100 + T)
    q, (kc, vc), kr, vr, anc, gate = _inputs(gen, B, T, HQ, HKV, D, L, trees, gate=window == 0)
    length = torch.tensor(lengths) if L else None
    plan = BO.batched_split(B, HKV, HQ // HKV * T, L, D, 132)
    if L >= 200:
        assert plan["splits"] > 1  # the partial results' combine is exercised
    ref = F.tree_attention_reference(q, kc, vc, kr, vr, length, anc, gate, window)
    with F.interpreted_kernels():
        out = BO.batched_tree_attention(q, kc, vc, kr, vr, length, anc, gate, window)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_batched_split_keeps_about_four_programs_per_sm():
    for B, R, L in ((8, 4, 1049), (32, 4, 1049), (32, 68, 1049), (64, 36, 1049), (1, 102, 1097)):
        plan = BO.batched_split(B, 4, R, L, 256, 132)
        programs = -(-R // plan["BM"]) * B * 4 * plan["splits"]
        assert plan["chunk"] % plan["BN"] == 0 and plan["splits"] * plan["chunk"] >= L
        assert plan["chunk"] >= 2 * plan["BN"] or plan["splits"] == 1
        assert programs <= 4 * 132 + B * 4 * 2 or plan["splits"] == 1, (B, R, plan)
    assert BO.batched_split(4, 4, 8, 0, 128, 132)["splits"] == 0  # no cache: only the rows' own keys


def test_batched_tree_attention_refuses_what_it_cannot_take():
    gen = torch.Generator().manual_seed(0)
    q, (kc, vc), kr, vr, anc, _ = _inputs(gen, 2, 3, 4, 2, 16, 8)
    lengths = torch.tensor([4, 4])
    with pytest.raises(ValueError, match="HKV dividing HQ"):
        BO.batched_tree_attention(q, kc, vc, torch.randn(2, 3, 3, 16), vr, lengths, anc)
    q70, _, kr70, vr70, anc70, _ = _inputs(gen, 1, 70, 4, 2, 16, 0)
    with pytest.raises(ValueError, match="<= 64"):
        BO.batched_tree_attention(q70, None, None, kr70, vr70, None, anc70)


COMPILE_FOR_SM90 = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specpilot_kernels import batched_ops as BO

fn = BO._batched_attention_split_kernel
ptr = "*" + sys.argv[1]
types = {"q": ptr, "kc": ptr, "vc": ptr, "kr": ptr, "vr": ptr, "lengths": "*i64", "anc": "*u8", "part_o": "*fp32",
         "part_m": "*fp32", "part_l": "*fp32", "T": "i32", "R": "i32", "HQ": "i32", "HKV": "i32", "REP": "i32",
         "kc_b": "i64", "kc_h": "i32", "S_CTX": "i32", "qk_scale": "fp32", "WINDOW": "i32"}
for D, R in ((256, 4), (256, 68), (128, 36)):
    plan = BO.batched_split(32, 4, R, 1049, D, 132)
    constants = {"PDL": True, "CHUNK": plan["chunk"], "D": D, "BD": D, "BM": plan["BM"], "BN": plan["BN"],
                 "BT": 32, "IEEE": sys.argv[1] == "fp32", "STAGES": plan["stages"]}
    names = fn.arg_names
    signature = {n: ("constexpr" if n in constants else types[n]) for n in names}
    source = ASTSource(fn, signature, constexprs={(names.index(n),): v for n, v in constants.items()})
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": plan["warps"]})
kv_types = {"kv": ptr, "lengths": "*i64", "accepted": "*i64", "accept_len": "*i64", "B": "i32", "HKV": "i32",
            "L": "i32", "T": "i32", "s_a": "i64", "s_b": "i64"}
fn = BO._commit_kv_rows_kernel
constants = {"PDL": True, "D": 256, "TP": 17}
signature = {n: ("constexpr" if n in constants else kv_types[n]) for n in fn.arg_names}
source = ASTSource(fn, signature, constexprs={(fn.arg_names.index(n),): v for n, v in constants.items()})
triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 2})
print("compiled")
"""


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_batched_attention_compiles_for_the_h200(dtype):
    """PTX for sm_90 from this machine (a process without the interpreter): what the GPU run will compile."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_SM90, dtype], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (conftest)")
def test_commit_kv_rows_moves_each_accepted_path_like_the_reference():
    """Four requests: a tree path 0 -> 2 -> 4 (rows moved), a chain prefix (in place), nothing accepted, a path
    reaching past the cache's end (clamped as the reference clamps); every layer's K and V."""
    gen = torch.Generator().manual_seed(5)
    A, B, HKV, L, D = 3, 4, 2, 24, 16
    kv = torch.randn(A, 2, B, HKV, L, D, generator=gen)
    lengths = torch.tensor([4, 9, 21, 20])
    accepted = torch.tensor([[0, 2, 4, 0, 0], [0, 1, 2, 0, 0], [0, 0, 0, 0, 0], [0, 2, 4, 0, 0]])
    accept_len = torch.tensor([3, 3, 0, 3])
    want = kv.clone()
    BO.commit_kv_rows_reference(want, lengths, accepted, accept_len)
    assert torch.equal(want[:, :, 0, :, 5], kv[:, :, 0, :, 6]) and torch.equal(want[:, :, 0, :, 6], kv[:, :, 0, :, 8])
    with F.interpreted_kernels():
        BO.commit_kv_rows(kv, lengths, accepted, accept_len)
    assert torch.equal(kv, want)


def test_commit_kv_rows_refuses_a_cache_of_another_layout():
    kv = torch.zeros(2, 3, 1, 1, 8, 16)
    with pytest.raises(ValueError, match=r"\[A, 2, B, HKV, L, D\]"):
        BO.commit_kv_rows(
            kv, torch.zeros(1, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, dtype=torch.long)
        )
