"""Saving and loading the target/drafter pair as safetensors, configs in the file's metadata."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open

from specpilot_mem.engine.config import DrafterConfig, TargetConfig
from specpilot_mem.engine.drafter import BlockDrafter
from specpilot_mem.engine.model import HybridTarget

# The committed trained pair (models/ at the repository root); see models/README.md.
DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[2] / "models"
TARGET_FILE = "target.safetensors"
DRAFTER_FILE = "drafter.safetensors"


def save_module(
    module: torch.nn.Module, path: Path, config_json: str, extra: dict | None = None, dtype=torch.bfloat16
) -> None:
    """Write ``module``'s weights (as ``dtype``) atomically, with its config and ``extra`` as metadata."""
    tensors = {name: t.detach().to("cpu", dtype).contiguous() for name, t in module.state_dict().items()}
    meta = {"config": config_json, **{k: json.dumps(v) for k, v in (extra or {}).items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_metadata(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    return {k: (v if k == "config" else json.loads(v)) for k, v in meta.items()}


def load_target(path: Path, device="cpu", dtype=torch.float32) -> HybridTarget:
    cfg = TargetConfig.from_json(read_metadata(path)["config"])
    model = HybridTarget(cfg)
    model.load_state_dict(load_file(str(path)))
    return model.to(device=device, dtype=dtype).eval()


def load_drafter(path: Path, target_cfg: TargetConfig, device="cpu", dtype=torch.float32) -> BlockDrafter:
    cfg = DrafterConfig.from_json(read_metadata(path)["config"])
    model = BlockDrafter(cfg, target_cfg)
    model.load_state_dict(load_file(str(path)))
    return model.to(device=device, dtype=dtype).eval()


def has_trained_pair(model_dir: Path = DEFAULT_MODEL_DIR) -> bool:
    return (model_dir / TARGET_FILE).exists() and (model_dir / DRAFTER_FILE).exists()
