"""W12: lossless 12-bit BF16 weights (8-bit FP8-readable view + 4-bit low mantissa) and its GEMM.

Public API (used by the SGLang ``w12`` method and the HF converter):

    encode(weight) -> W12Tensor        BF16 [N, K] on CPU or GPU, checked bit for bit
    encode_or_keep(weight)             (W12Tensor or None where W12 does not pay, conversion report)
    decode(w12) -> Tensor              exact BF16 [N, K]
    check_roundtrip(weight, w12)       raises W12Error on any differing bit; returns stats
    to_mma_layout(w12) -> W12MmaTensor the same bytes re-laid for the CUDA mma.sync kernel (the fast path)
    w12_linear(x, w, bias=None)        F.linear drop-in, any row count: CUDA kernels for a W12MmaTensor, Triton kernel
                                       for a W12Tensor on CUDA, exact decode + F.linear on the CPU
    w12_gemm(x, w12), w12_mma_gemm(x, mma)   the GEMMs themselves, x bf16 [M, K] -> [M, N]
    fp8_view(w12), qpass_linear(...)   the 8-bit view as Q-pass weights, no copy
    to_canonical / from_canonical      the on-disk form (version 3: one unpadded byte record per tensor;
                                       versions 1 and 2's 12 KB tile records still load)

The format is specified in docs/w12-format.md.
"""

from .codec import check_roundtrip, decode, encode, encode_or_keep
from .format import FORMAT_VERSION, W12Error, W12Tensor, from_canonical, to_canonical
from .linear import w12_linear
from .mma import W12MmaTensor, to_mma_layout, w12_mma_gemm
from .qview import fp8_view, qpass_linear


def w12_gemm(*args, **kwargs):
    """The Triton W12 GEMM (:func:`specpilot_kernels.w12.gemm.w12_gemm`), imported on first use: the codec, the
    CUDA kernels and the CPU path need no Triton."""
    from .gemm import w12_gemm as triton_gemm

    return triton_gemm(*args, **kwargs)


__all__ = [
    "FORMAT_VERSION",
    "W12Error",
    "W12MmaTensor",
    "W12Tensor",
    "check_roundtrip",
    "decode",
    "encode",
    "encode_or_keep",
    "fp8_view",
    "from_canonical",
    "qpass_linear",
    "to_canonical",
    "to_mma_layout",
    "w12_gemm",
    "w12_linear",
    "w12_mma_gemm",
]
