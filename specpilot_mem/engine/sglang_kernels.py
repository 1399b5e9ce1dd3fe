"""SGLang 0.5.23's Gated DeltaNet Triton kernel, vendored from the pinned wheel, as the engine's stock GDN path.

The GPU machine has no SGLang, so ``prepare(DIR)`` (run here, where the wheel is cached) copies
``fused_sigmoid_gating_recurrent.py`` unmodified out of the wheel (sha256 checked) into DIR with import shims
for the five helpers it imports from SGLang's utils; DIR (default ``.sglang_gdn`` at the repository root)
then travels with the working tree. That one kernel is SGLang's decode step (state updated in place) and its
target-verify pass (``intermediate_states_buffer``: one state snapshot per drafted position, trees through
``retrieve_parent_token``); SGLang's commit copies the accepted position's snapshot into the pool.

    python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn      # here, once
    from specpilot_mem.engine.sglang_kernels import fused_recurrent        # anywhere DIR is importable
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import zipfile
from pathlib import Path

from specpilot_mem.errors import SpecPilotError

WHEEL = os.path.expanduser("~/.cache/specpilot/wheels/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl")
WHEEL_SHA256 = "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"
KERNEL = "sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py"
KERNEL_MODULE = KERNEL.removesuffix(".py").replace("/", ".")
DEFAULT_DIR = Path(__file__).resolve().parents[2] / ".sglang_gdn"
SHIMS = {
    # the five helpers the kernel module imports, with SGLang 0.5.23's semantics on an NVIDIA GPU (and False
    # without one, so the module imports on a CPU machine for the Triton interpreter)
    "sglang/srt/utils.py": """import torch


def is_hip():
    return torch.version.hip is not None


def is_cuda():
    return torch.cuda.is_available() and torch.version.cuda is not None


def get_device_sm():
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def is_gfx95_supported():
    return False


def is_sm90_supported():
    cuda = tuple(int(p) for p in (torch.version.cuda or "0.0").split(".")[:2])
    return is_cuda() and torch.cuda.get_device_capability()[0] == 9 and cuda >= (12, 3)
""",
    "sglang/kernels/jit/utils.py": """import torch


def is_arch_support_pdl():
    return torch.cuda.is_available() and torch.version.hip is None and torch.cuda.get_device_capability()[0] >= 9
""",
}


class SGLangKernelMissing(SpecPilotError):
    pass


def prepare(target: str | os.PathLike = DEFAULT_DIR, wheel: str = WHEEL) -> dict:
    """Vendor SGLang's GDN kernel from the pinned wheel into ``target`` (checked by sha256)."""
    if not os.path.exists(wheel):
        raise SGLangKernelMissing(
            f"the pinned SGLang wheel is not at {wheel}",
            where=wheel,
            fix="run scripts/install.sh (it caches the wheel) on this machine",
        )
    with open(wheel, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    if digest != WHEEL_SHA256:
        raise SGLangKernelMissing(
            f"{wheel}: sha256 {digest}, expected {WHEEL_SHA256}",
            where=wheel,
            fix="download the pinned sglang 0.5.23 wheel again",
        )
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read(KERNEL)
    files = {KERNEL: source, **{path: text.encode() for path, text in SHIMS.items()}}
    for path, data in files.items():
        full = os.path.join(target, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as fh:
            fh.write(data)
        package = os.path.dirname(path)
        while package:
            init = os.path.join(target, package, "__init__.py")
            if not os.path.exists(init):
                open(init, "w").close()
            package = os.path.dirname(package)
    return {"vendored": KERNEL, "from": wheel, "sha256": digest, "into": str(target)}


def fused_recurrent(directory: str | os.PathLike | None = None):
    """SGLang's ``fused_sigmoid_gating_delta_rule_update``, imported from the vendored copy."""
    try:
        return importlib.import_module(KERNEL_MODULE).fused_sigmoid_gating_delta_rule_update
    except ImportError:
        pass
    folder = Path(directory or os.environ.get("SPECPILOT_SGLANG_GDN", DEFAULT_DIR))
    if not (folder / KERNEL).exists():
        raise SGLangKernelMissing(
            f"SGLang's GDN kernel is not vendored in {folder}",
            where=str(folder / KERNEL),
            fix="run `python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn` "
            "where the wheel is cached, and carry .sglang_gdn to the GPU machine",
        )
    sys.path.insert(0, str(folder))
    return importlib.import_module(KERNEL_MODULE).fused_sigmoid_gating_delta_rule_update


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    prep = sub.add_parser("prepare", help="vendor the kernel from the pinned wheel")
    prep.add_argument("target", nargs="?", default=str(DEFAULT_DIR))
    args = parser.parse_args(argv)
    print(json.dumps(prepare(args.target)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
