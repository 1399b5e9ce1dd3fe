"""The profile format (``docs/profile-format.md``): what an engine measured in one step of the system
a round starts from. JSON, validated by these models; unknown keys are errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from specpilot_mem.errors import SpecPilotError
from specpilot_mem.gpus import find_gpu

FORMAT = "specpilot-profile"
VERSION = 1
Dtype = Literal["bf16", "fp16", "fp8", "int8"]


class ProfileError(SpecPilotError):
    """A profile file that does not follow docs/profile-format.md."""


class KernelClass(BaseModel):
    """One kernel class of the step (target GEMMs, recurrent layers, attention, drafter, LM head, rest)."""

    model_config = ConfigDict(extra="forbid")
    time_ms: float = Field(ge=0, description="measured time of the class in one step")
    bytes: float = Field(ge=0, description="bytes the class must move from/to device memory in one step")
    flops: float = Field(ge=0, description="floating-point operations of the class in one step")
    dtype: Dtype = Field(description="tensor-core input type that sets the FLOP peak")
    peak_tflops: float | None = Field(
        default=None, gt=0, description="override the GPU table's peak (e.g. a CUDA-core fp32 class)"
    )


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["specpilot-profile"] = FORMAT
    version: Literal[1] = VERSION
    gpu: str = Field(description="GPU name or alias from specpilot_mem.gpus (e.g. H100 SXM, H200)")
    system: str = Field(default="", description="what was measured: engine, target, drafter, patches")
    synthetic: bool = Field(default=False, description="measured on random weights or generated inputs")
    nodes: int = Field(ge=0, description="node budget N of the measured system (its verify rows minus the root)")
    tau: float = Field(gt=0, description="tokens per step measured on the system")
    T_step_ms: float = Field(gt=0, description="step time with drafting")
    T_AR_ms: float = Field(gt=0, description="one autoregressive step on the same engine")
    kernels: dict[str, KernelClass] = Field(min_length=1)
    step_times_ms: dict[int, float] = Field(
        default_factory=dict, description="T_step(N) per node budget N, when measured"
    )
    command: str = ""
    date: str = ""
    git: dict = Field(default_factory=dict, description="the commit measured (specpilot_mem.provenance's git state)")

    @field_validator("step_times_ms")
    @classmethod
    def _positive(cls, value: dict[int, float]) -> dict[int, float]:
        for n, t in value.items():
            if n < 0 or t <= 0:
                raise ValueError(f"step_times_ms[{n}] = {t}: node budgets and times must be positive")
        return value

    @property
    def T_prof_ms(self) -> float:
        return sum(k.time_ms for k in self.kernels.values())


def load_profile(path: str | os.PathLike) -> Profile:
    where = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ProfileError(
            f"cannot read profile: {err}", where=where, fix="pass a JSON profile as described in docs/profile-format.md"
        ) from err
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileError(
            f"not a profile (format {data.get('format') if isinstance(data, dict) else None!r})",
            where=where,
            fix=f'the file must hold a JSON object with "format": "{FORMAT}"',
        )
    try:
        profile = Profile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        raise ProfileError(
            f"invalid profile: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}",
            where=where,
            fix="see docs/profile-format.md for every field",
        ) from err
    find_gpu(profile.gpu, where=f"{where}: gpu")  # an unknown GPU is the profile's error, not an option's
    return profile
