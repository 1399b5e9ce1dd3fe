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
print("compiled")
"""


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_kernels_compile_for_the_h200(dtype):
    """PTX for sm_90 from this machine (a process without the interpreter): what the GPU run will compile."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90, dtype], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-2000:]
