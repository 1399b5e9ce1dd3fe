"""The W12 GEMM's partition, chosen from (N, K, GPU) only — never from the row count.

``configs.json`` holds the tuned partitions (written from ``benchmarks/w12_gemm_bench.py`` runs, keyed by
the GPU's name as torch reports it and "N,K"); other shapes get a rule of thumb that also reads only
N, K and the GPU's multiprocessor count.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import torch

TUNED_PATH = Path(__file__).with_name("configs.json")
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


@lru_cache(maxsize=None)
def _tuned() -> dict:
    return json.loads(TUNED_PATH.read_text()) if TUNED_PATH.exists() else {}


def _device_facts(device: torch.device) -> tuple[str, int]:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.name, props.multi_processor_count
    return "cpu-interpreter", 4


def default_config(n: int, k: int, sms: int) -> GemmConfig:
    """Enough programs for about two per multiprocessor, splitting K only when rows alone are too few."""
    block_n = 64 if n >= 64 * sms else 32 if n < 32 * sms else 64
    programs = -(-n // block_n)
    steps = -(-k // STEP)
    splits = max(1, min(steps // 4, -(-2 * sms // programs))) if programs < 2 * sms else 1
    return GemmConfig(block_n=block_n, splits=splits)


def select_config(n: int, k: int, device: torch.device) -> GemmConfig:
    name, sms = _device_facts(device)
    tuned = _tuned().get(name, {}).get(f"{n},{k}")
    return GemmConfig(**tuned) if tuned else default_config(n, k, sms)
