"""The system engine's fused RMSNorm / add+RMSNorm / silu*up kernels: their arithmetic against the torch references
(fp32 under the Triton interpreter, whose bf16 loads are unreliable) and their sm_90 compilation (no GPU needed)."""

import pytest
import torch

from specpilot_kernels import fused_ops as F


def _launch_cpu(kernel, rows, *args, block, grid_cols=1):
    kernel[(rows, grid_cols) if grid_cols > 1 else (rows,)](*args, BLOCK=block)


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
    got = torch.empty(5, 300)
    _launch_cpu(F._silu_mul_kernel, 5, gu, got, 300, block=128, grid_cols=3)
    torch.testing.assert_close(got, F.silu_mul_reference(gu), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (conftest)")
def test_tree_conv_and_gated_norm_kernels_match_the_references_in_fp32():
    from specpilot_mem.engine.system import pack_trees

    gen = torch.Generator().manual_seed(1)
    B, T, C, CS = 2, 5, 48, 4
    state, x = torch.randn(B, CS - 1, C, generator=gen), torch.randn(B, T, C, generator=gen)
    weight = torch.randn(C, CS, generator=gen)
    idx = torch.as_tensor(pack_trees([([1, 2, 3, 4, 5], [-1, 0, 0, 1, 3]), ([1, 2], [-1, 0])], T, CS)["conv_idx"])
    out = torch.empty_like(x)
    F._tree_conv_silu_kernel[(B * T, 1)](state, x, idx, weight, out, T, C, CS=CS, BLOCK=64)
    torch.testing.assert_close(out, F.tree_conv_silu_reference(state, x, idx, weight), rtol=1e-6, atol=1e-6)
    o, z, w = torch.randn(4, 64, generator=gen), torch.randn(4, 64, generator=gen), torch.rand(64, generator=gen)
    got = torch.empty_like(o)
    F._gated_rms_norm_kernel[(4,)](o, w, z, got, 64, 1e-6, BLOCK=64)
    torch.testing.assert_close(got, F.gated_rms_norm_reference(o, w, z, 1e-6), rtol=1e-6, atol=1e-6)


COMPILE_FOR_SM90 = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specpilot_kernels import fused_ops as F

def compile_for_sm90(fn, types, constants):
    names = fn.arg_names
    signature = {n: ("constexpr" if n in constants else types[n]) for n in names}
    source = ASTSource(fn, signature, constexprs={(names.index(n),): v for n, v in constants.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})

ptr = "*" + sys.argv[1]
compile_for_sm90(F._rms_norm_kernel, {"x": ptr, "w": ptr, "out": ptr, "N": "i32", "eps": "fp32"}, {"BLOCK": 8192})
compile_for_sm90(F._add_rms_norm_kernel, {"x": ptr, "delta": ptr, "w": ptr, "y": ptr, "out": ptr, "N": "i32",
                                          "eps": "fp32"}, {"BLOCK": 8192})
compile_for_sm90(F._silu_mul_kernel, {"gu": ptr, "out": ptr, "N": "i32"}, {"BLOCK": 1024})
compile_for_sm90(F._tree_conv_silu_kernel, {"state": ptr, "x": ptr, "idx": "*i64", "w": ptr, "out": ptr, "T": "i32",
                                            "C": "i32"}, {"CS": 4, "BLOCK": 1024})
compile_for_sm90(F._gated_rms_norm_kernel, {"x": ptr, "w": ptr, "gate": ptr, "out": ptr, "N": "i32", "eps": "fp32"},
                 {"BLOCK": 128})
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
