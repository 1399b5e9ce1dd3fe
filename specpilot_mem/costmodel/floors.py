"""Byte floors (§3.1): the time a kernel class needs at least on a GPU, the larger of its FLOP time
at a fraction of peak dense throughput and its byte time at a fraction of peak bandwidth.

The paper's setting is 60% / 90% of the datasheet peaks; Appendix B uses full peaks.
"""

from __future__ import annotations

from specpilot_mem.costmodel.profile import KernelClass, ProfileError
from specpilot_mem.gpus import GPU


def peak_tflops(gpu: GPU, kernel: KernelClass) -> float:
    if kernel.peak_tflops is not None:
        return kernel.peak_tflops
    peak = {"bf16": gpu.bf16_tflops, "fp16": gpu.bf16_tflops, "fp8": gpu.fp8_tflops, "int8": gpu.fp8_tflops}[
        kernel.dtype
    ]
    if peak <= 0:
        raise ProfileError(
            f"{gpu.name} has no {kernel.dtype} tensor cores in the GPU table",
            where="profile kernels",
            fix="give the class a peak_tflops, or the dtype it really runs in",
        )
    return peak


def byte_floor_ms(kernel: KernelClass, gpu: GPU, flop_fraction: float = 0.6, byte_fraction: float = 0.9) -> float:
    """max(FLOPs / (flop_fraction · peak), bytes / (byte_fraction · datasheet bandwidth)), in ms."""
    flop_ms = kernel.flops / (flop_fraction * peak_tflops(gpu, kernel) * 1e12) * 1e3
    byte_ms = kernel.bytes / (byte_fraction * gpu.hbm_tbps * 1e12) * 1e3
    return max(flop_ms, byte_ms)
