"""W12 GEMM: the Triton kernel (interpreter on CPU, compiled on GPU) against the pure-torch reference."""

import pytest
import torch

from specpilot_kernels.w12 import W12Error, encode, qpass_linear, w12_gemm, w12_linear
from specpilot_kernels.w12.configs import GemmConfig, default_config, select_config
from specpilot_kernels.w12.gemm import interpreting
from specpilot_kernels.w12.reference import gemm_reference, qpass_weight_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONFIGS = [GemmConfig(block_n=32, splits=1), GemmConfig(block_n=64, splits=3), GemmConfig(block_n=128, splits=2)]


def weight_with_escapes(n=200, k=300, seed=0):
    torch.manual_seed(seed)
    w = (torch.randn(n, k) * 0.02).bfloat16()
    w[3, 5] = 0.0
    w[100, 299] = 1e-39  # denormal
    w[130, 200] = 4.0  # far above the row's window of small weights -> top binade
    w[131, 64] = 1e-9  # far below the window
    return w.to(DEVICE)


# The interpreter converts fp32 to bf16 by truncation (up to 1 ulp, 2**-8 relative), the GPU rounds to nearest.
TOLERANCE = 1e-2 if interpreting() else 4e-3


def rel_err(y, ref):
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"bn{c.block_n}_s{c.splits}")
@pytest.mark.parametrize("rows", [1, 40])
def test_gemm_matches_reference(config, rows):
    w = weight_with_escapes()
    w12 = encode(w)
    torch.manual_seed(rows)
    x = torch.randn(rows, 300, device=DEVICE).bfloat16()
    y = w12_gemm(x, w12, config=config)
    assert y.shape == (rows, 200) and y.dtype == torch.bfloat16
    assert rel_err(y, gemm_reference(x, w12)) < TOLERANCE


@pytest.mark.parametrize("config", CONFIGS[:2], ids=lambda c: f"bn{c.block_n}_s{c.splits}")
def test_one_hot_rows_read_weights_bit_exactly_including_escapes(config):
    # A one-hot row picks one weight column: every product is exact, so decode + escape patching show.
    w = weight_with_escapes()
    w12 = encode(w)
    cols = torch.tensor([5, 299, 200, 64, 0, 127, 128, 255], device=DEVICE)
    x = torch.zeros(cols.numel(), 300, device=DEVICE, dtype=torch.bfloat16)
    x[torch.arange(cols.numel(), device=DEVICE), cols] = 1.0
    y = w12_gemm(x, w12, config=config)
    expected = w[:, cols].t().contiguous()
    # Products of denormal weights follow the MMA's (or numpy's) denormal rules, not the decode's.
    normal = (expected.view(torch.int16) & 0x7F80) != 0
    normal |= expected == 0
    assert torch.equal(y.view(torch.int16)[normal], expected.view(torch.int16)[normal])
    assert int((~normal).sum()) == 1  # only the denormal at [100, 299]


def test_row_bits_do_not_depend_on_row_count():
    w12 = encode(weight_with_escapes(seed=1))
    torch.manual_seed(7)
    x = torch.randn(33, 300, device=DEVICE).bfloat16()
    config = GemmConfig(block_n=64, splits=3)
    alone = w12_gemm(x[:1], w12, config=config)
    for rows in (2, 17, 33):
        together = w12_gemm(x[:rows], w12, config=config)
        assert torch.equal(together[:1].view(torch.int16), alone.view(torch.int16)), rows


def test_partition_reads_only_n_k_and_gpu():
    # select_config has no row-count argument: the partition cannot follow M.
    assert select_config(5120, 8192, torch.device(DEVICE)) == select_config(5120, 8192, torch.device(DEVICE))
    config = default_config(5120, 17408, sms=132)
    assert config.splits > 1 and 17408 // 128 % config.effective_splits(17408) == 0
    assert GemmConfig(splits=16).effective_splits(17408) == 8  # 136 steps: largest divisor <= 16


@pytest.mark.parametrize("low_bits", ["truncated", "midpoint"])
def test_qpass_reads_the_view_only(low_bits):
    w12 = encode(weight_with_escapes(seed=2))
    torch.manual_seed(3)
    x = torch.randn(4, 300, device=DEVICE).bfloat16()
    ref = x.float() @ qpass_weight_reference(w12, low_bits).float().t()
    assert rel_err(w12_gemm(x, w12, low_bits=low_bits, config=CONFIGS[0]), ref) < TOLERANCE
    assert rel_err(qpass_linear(x, w12, low_bits), ref) < TOLERANCE


def test_linear_equals_unquantized_linear_on_cpu():
    w = weight_with_escapes(seed=4).cpu()
    bias = torch.randn(200).bfloat16()
    x = torch.randn(2, 3, 300).bfloat16()
    assert torch.equal(w12_linear(x, encode(w), bias), torch.nn.functional.linear(x, w, bias))


def test_gemm_rejects_wrong_input_dtype():
    w12 = encode(weight_with_escapes())
    with pytest.raises(W12Error, match="bf16"):
        w12_gemm(torch.randn(2, 300, device=DEVICE), w12)


@pytest.mark.gpu
def test_interpreter_upcast_is_off_on_gpu():
    # bf16 tl.dot is only upcast to fp32 under the interpreter; on the GPU the MMA takes bf16 directly.
    from specpilot_kernels.w12.gemm import launch

    assert not interpreting()
    w12 = encode(weight_with_escapes())
    x = torch.randn(3, 300, device="cuda").bfloat16()
    y = torch.empty(3, 200, device="cuda", dtype=torch.bfloat16)
    compiled = launch(x, w12, y, GemmConfig(block_n=64, splits=1), 0, None)
    assert compiled.src.constants[(compiled.src.fn.arg_names.index("DOT_FP32"),)] is False
    ptx = compiled.asm["ptx"]
    assert "mma" in ptx and "lop3.b32" in ptx  # bf16 MMA fed by the PTX decode


@pytest.mark.gpu
def test_gpu_asm_decode_equals_plain_decode():
    w12 = encode(weight_with_escapes(n=1000, k=1536))
    torch.manual_seed(8)
    x = torch.randn(16, 1536, device="cuda").bfloat16()
    asm = w12_gemm(x, w12, config=GemmConfig(block_n=64, splits=2, use_asm=True))
    plain = w12_gemm(x, w12, config=GemmConfig(block_n=64, splits=2, use_asm=False))
    assert torch.equal(asm.view(torch.int16), plain.view(torch.int16))
