"""The Q pass's Triton GEMM over the exact pass's own records (interpreter on CPU, compiled on GPU) against the
pure-torch reference: one-hot rows read the Q-pass weights bit for bit, random rows agree within the fp32 sums'
rounding, and the INT8 copy variant against its own reference."""

from dataclasses import replace

import pytest
import torch

from specpilot_kernels.w12 import W12Error, encode, to_mma_layout
from specpilot_kernels.w12.gemm import interpreting
from specpilot_kernels.w12.int8_copy import int8_copy, int8_qpass_gemm, int8_weight_reference
from specpilot_kernels.w12.qpass import QpassConfig, qpass_gemm_reference, w12_qpass_gemm
from specpilot_kernels.w12.reference import qpass_weight_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONFIGS = [
    QpassConfig(tiles=2, blocks=2, splits=1),
    QpassConfig(tiles=2, blocks=4, splits=3),
    QpassConfig(tiles=8, blocks=2, splits=2),
]
# The interpreter converts fp32 to bf16 by truncation (up to 2**-8 relative), the GPU rounds to nearest.
ROUNDING = 2.0**-7 if interpreting() else 2.0**-8


def weight_with_escapes(n=200, k=300, seed=0):
    torch.manual_seed(seed)
    w = (torch.randn(n, k) * 0.02).bfloat16()
    w[3, 5] = 0.0
    w[100, 299] = 1e-39  # denormal: an escape whose view byte reads as zero
    w[130, 200] = 4.0  # far above the row's window -> the view's top code (448 x window)
    w[131, 64] = 1e-9  # far below the window -> zero
    w[150] = 0.0  # a row of zeros (window base 0)
    return w.to(DEVICE)


def assert_close_to_reference(y, ref):
    """Each output within one bf16 rounding of the fp32 reference plus the fp32 sums' own rounding."""
    slack = ROUNDING * ref.abs() + 1e-5 * ref.abs().max()
    assert ((y.float() - ref).abs() <= slack).all(), float(((y.float() - ref).abs() - slack).max())


@pytest.mark.parametrize("low_bits", ["midpoint", "truncated"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"t{c.tiles}_b{c.blocks}_s{c.splits}")
def test_one_hot_rows_read_the_qpass_weights_bit_for_bit(low_bits, config):
    # a one-hot row picks one weight column: every product is exact, so the view's decode shows as it is
    w = weight_with_escapes()
    w12 = encode(w)
    cols = torch.tensor([5, 299, 200, 64, 0, 127, 128, 255], device=DEVICE)
    x = torch.zeros(cols.numel(), 300, device=DEVICE, dtype=torch.bfloat16)
    x[torch.arange(cols.numel(), device=DEVICE), cols] = 1.0
    y = w12_qpass_gemm(x, to_mma_layout(w12), low_bits, config=config)
    expected = qpass_weight_reference(w12, low_bits)[:, cols].t().contiguous()
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))


@pytest.mark.parametrize("low_bits", ["midpoint", "truncated"])
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_random_rows_match_the_reference(low_bits, rows):
    w12 = encode(weight_with_escapes())
    torch.manual_seed(rows)
    x = torch.randn(rows, 300, device=DEVICE).bfloat16()
    for config in CONFIGS:
        y = w12_qpass_gemm(x, to_mma_layout(w12), low_bits, config=config)
        assert y.shape == (rows, 200) and y.dtype == torch.bfloat16
        assert_close_to_reference(y, qpass_gemm_reference(x, w12, low_bits))


def test_large_activations_are_multiplied_as_they_are():
    # BF16 activations enter the MMA unconverted: a value far beyond FP16's range still gives the reference's sums
    w12 = encode(weight_with_escapes())
    x = torch.randn(2, 300, device=DEVICE).bfloat16()
    x[0, 7] = 1e6
    for config in CONFIGS[:2]:
        y = w12_qpass_gemm(x, to_mma_layout(w12), config=config)
        assert_close_to_reference(y, qpass_gemm_reference(x, w12))


def test_the_qpass_reads_the_exact_pass_records_without_a_copy():
    # the kernel is handed the W12MmaTensor the exact kernels read; a W12Tensor or a copied view is not accepted
    w12 = encode(weight_with_escapes())
    mma = to_mma_layout(w12)
    x = torch.randn(3, 300, device=DEVICE).bfloat16()
    before = mma.view.clone()
    w12_qpass_gemm(x, mma)
    assert torch.equal(mma.view, before)
    with pytest.raises(W12Error, match="W12MmaTensor"):
        w12_qpass_gemm(x, w12)
    with pytest.raises(W12Error, match="low_bits"):
        w12_qpass_gemm(x, mma, "exact")
    with pytest.raises(W12Error, match="bf16"):
        w12_qpass_gemm(x.float(), mma)
    with pytest.raises(W12Error, match="tiles"):
        QpassConfig(tiles=1)


def test_k_splits_leave_their_counters_zero_for_the_next_call():
    # the last program of each row block sums the splits and resets its counter: repeated calls give the same bits
    from specpilot_kernels.w12.qpass import _COUNTERS

    mma = to_mma_layout(encode(weight_with_escapes()))
    x = torch.randn(4, 300, device=DEVICE).bfloat16()
    first = w12_qpass_gemm(x, mma, config=CONFIGS[1])
    assert int(_COUNTERS[x.device].abs().sum()) == 0
    assert torch.equal(w12_qpass_gemm(x, mma, config=CONFIGS[1]).view(torch.int16), first.view(torch.int16))


@pytest.mark.parametrize("rows", [1, 40])
def test_int8_copy_matches_its_reference(rows):
    w = weight_with_escapes()
    copy = int8_copy(w)
    assert copy.weight.dtype == torch.int8 and copy.weight.shape == w.shape
    assert copy.nbytes() == w.numel() + 4 * w.shape[0]
    torch.manual_seed(rows)
    x = torch.randn(rows, 300, device=DEVICE).bfloat16()
    ref = x.float() @ int8_weight_reference(copy).float().t()
    assert_close_to_reference(int8_qpass_gemm(x, copy), ref)
    # per channel: the largest weight of each row is +-127 steps, so the error is at most half a step
    err = (int8_weight_reference(copy).float() - w.float()).abs()
    assert (err <= copy.scale[:, None] * (0.5 + 1e-5)).all()


@pytest.mark.gpu
def test_qpass_bits_do_not_depend_on_the_row_count():
    w12 = encode(weight_with_escapes(n=1000, k=1536))
    mma = to_mma_layout(w12)
    x = torch.randn(32, 1536, device="cuda").bfloat16()
    alone = w12_qpass_gemm(x[:1], mma)
    for rows in (2, 9, 17, 32):
        assert torch.equal(w12_qpass_gemm(x[:rows], mma)[:1].view(torch.int16), alone.view(torch.int16)), rows


@pytest.mark.gpu
@pytest.mark.parametrize("low_bits", ["midpoint", "truncated"])
def test_ptx_conversion_equals_the_plain_ops(low_bits):
    w12 = encode(weight_with_escapes(n=1000, k=1536))
    mma = to_mma_layout(w12)
    x = torch.randn(16, 1536, device="cuda").bfloat16()
    for config in CONFIGS:
        asm = w12_qpass_gemm(x, mma, low_bits, config=config)
        plain = w12_qpass_gemm(x, mma, low_bits, config=replace(config, use_asm=False))
        assert torch.equal(asm.view(torch.int16), plain.view(torch.int16))
