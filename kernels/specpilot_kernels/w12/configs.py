"""The Triton W12 GEMM's partition, chosen from (N, K, GPU) only — never from the row count.

A rule of thumb over N, K and the GPU's multiprocessor count (the mma.sync kernel, the fast path, has
tuned partitions per GPU and shape in ``mma_configs.json``; see ``mma.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

STEP = 128


@dataclass(frozen=True)
class GemmConfig:
    block_n: int = 64  # output channels per program: 16, 32, 64 or 128 (a divisor of the 128-row bucket)
    splits: int = 1  # K splits, reduced in fixed order through a workspace
    num_warps: int = 4
    num_stages: int = 3
    use_asm: bool = True  # PTX decode on packed lanes (GPU); the interpreter always uses plain Triton ops

    def effective_splits(self, kp: int) -> int:
        """The largest divisor of the 128-column step count not above ``splits``: equal-length splits."""
        steps = kp // STEP
        return max(d for d in range(1, min(self.splits, steps) + 1) if steps % d == 0)

    def to_dict(self) -> dict:
        return asdict(self)


def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def default_config(n: int, k: int, sms: int) -> GemmConfig:
    """Enough programs for about two per multiprocessor, splitting K only when rows alone are too few."""
    block_n = 64 if n >= 64 * sms else 32 if n < 32 * sms else 64
    programs = -(-n // block_n)
    steps = -(-k // STEP)
    splits = max(1, min(steps // 4, -(-2 * sms // programs))) if programs < 2 * sms else 1
    return GemmConfig(block_n=block_n, splits=splits)


def select_config(n: int, k: int, device: torch.device) -> GemmConfig:
    return default_config(n, k, _multiprocessors(device))
