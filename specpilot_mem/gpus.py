"""GPU spec table: names, arch ids and the peak rates the cost model's byte floors use.

Dense (not sparse) tensor-core peaks from the vendors' datasheets; ``measured_bandwidth`` where we
measured it (H200: ``shared/reference/kernel-notes.md``; RTX PRO 6000: the paper's §5.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from specpilot_mem.errors import SpecPilotError


@dataclass(frozen=True)
class GPU:
    name: str
    aliases: tuple[str, ...]
    arch: str
    bf16_tflops: float  # dense peak
    fp8_tflops: float  # dense peak; 0 where the chip has no FP8 tensor cores
    hbm_tbps: float  # datasheet peak
    sms: int
    l2_mb: float
    smem_per_block_kb: int  # largest opt-in shared memory per thread block
    wgmma: bool
    measured_tbps: float | None = None

    @property
    def bandwidth_tbps(self) -> float:
        return self.measured_tbps or self.hbm_tbps


GPUS: tuple[GPU, ...] = (
    GPU("H100 SXM", ("H100", "H100-SXM", "H100 SXM5"), "sm_90", 989.0, 1979.0, 3.35, 132, 50, 227, True),
    GPU("H200", ("H200 SXM", "H200-SXM"), "sm_90", 989.0, 1979.0, 4.8, 132, 60, 227, True, measured_tbps=4.46),
    GPU(
        "RTX PRO 6000",
        ("RTX PRO 6000 Blackwell", "RTX PRO 6000 Blackwell Server", "RTX-PRO-6000", "PRO 6000"),
        "sm_120",
        503.8,
        1007.6,
        1.792,
        188,
        128,
        99,
        False,
        measured_tbps=1.51,
    ),
    GPU("B200", ("B200 SXM",), "sm_100", 2250.0, 4500.0, 8.0, 148, 126, 227, False),
    GPU("A100 SXM", ("A100", "A100-SXM", "A100 80GB"), "sm_80", 312.0, 0.0, 2.039, 108, 40, 163, False),
)

ARCHES: tuple[str, ...] = tuple(sorted({g.arch for g in GPUS}))


def name_key(text: str) -> str:
    """A name as matching sees it: lower case, letters and digits only ("RTX-PRO 6000" ~ "rtxpro6000")."""
    return "".join(ch for ch in text.lower() if ch.isalnum())


def find_gpu(name: str, where: str = "--gpu") -> GPU:
    """A GPU by name or alias, case and punctuation insensitive ("rtx-pro-6000" finds RTX PRO 6000);
    ``where`` is where an unknown name came from (an option, or a file and its field)."""
    wanted = name_key(name)
    for gpu in GPUS:
        if wanted in {name_key(gpu.name), *(name_key(a) for a in gpu.aliases)}:
            return gpu
    raise SpecPilotError(
        f"unknown GPU {name!r}",
        where=where,
        fix="use one of: " + ", ".join(g.name for g in GPUS) + " or an arch id: " + ", ".join(ARCHES),
    )


def resolve_gpu_or_arch(text: str) -> tuple[GPU | None, str]:
    """``--gpu`` accepts a GPU name or an arch id; returns (gpu or None, arch)."""
    lowered = text.strip().lower()
    if lowered.startswith("sm_"):
        if lowered not in ARCHES:
            raise SpecPilotError(
                f"unknown arch {text!r}",
                where="--gpu/--arch",
                fix="use one of: " + ", ".join(ARCHES) + " or a GPU name: " + ", ".join(g.name for g in GPUS),
            )
        return None, lowered
    gpu = find_gpu(text)
    return gpu, gpu.arch
