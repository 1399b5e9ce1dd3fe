"""Importing SGLang's sources on a machine without a GPU (CI, laptops).

``sglang.srt.server_args`` imports with the pure-Python dependencies listed in
``scripts/install.sh``; the modules that build layers (``layers.quantization``, ``layers.linear``,
the speculative workers) also reach ``import torchvision.transforms`` through
``srt/configs/__init__.py``. Installing torchvision would drag a CUDA torch along, so
``write_torchvision_standin`` writes an import-only stand-in: the names SGLang imports at module
level exist, and using any of them raises.
"""

from __future__ import annotations

import os
from pathlib import Path

STANDIN_MARKER = "specpilot import-only torchvision stand-in"

_STANDIN_MODULES = {
    "torchvision/__init__.py": "from torchvision import io, transforms\n__version__ = '0.0+standin'\n",
    "torchvision/io.py": "",
    "torchvision/transforms/__init__.py": (
        "import enum\n\n\n"
        "class InterpolationMode(enum.Enum):\n"
        "    NEAREST = 'nearest'\n    NEAREST_EXACT = 'nearest-exact'\n    BILINEAR = 'bilinear'\n"
        "    BICUBIC = 'bicubic'\n    BOX = 'box'\n    HAMMING = 'hamming'\n    LANCZOS = 'lanczos'\n\n\n"
        "from torchvision.transforms import functional, v2  # noqa: E402  (after InterpolationMode)\n"
    ),
    "torchvision/transforms/functional.py": "from torchvision.transforms import InterpolationMode  # noqa: F401\n",
    "torchvision/transforms/v2/__init__.py": "from torchvision.transforms.v2 import functional  # noqa: F401\n",
    "torchvision/transforms/v2/functional.py": "",
}

# Other names (transformers imports a few when it sees torchvision) resolve to placeholders that
# fail loudly when called, so the import succeeds and any real use names the stand-in.
_GETATTR = (
    "\n\nclass _Unavailable(type):\n"
    "    def __getattr__(cls, name):\n"
    "        if name.startswith('__'):\n"
    "            raise AttributeError(name)\n"
    "        return _Unavailable(f'{cls.__name__}.{name}', (), {})\n\n"
    "    def __call__(cls, *args, **kwargs):\n"
    f"        raise RuntimeError(f'{{cls.__name__}} is not available: this is the {STANDIN_MARKER}')\n\n\n"
    "def __getattr__(name):\n"
    "    if name.startswith('__'):\n"
    "        raise AttributeError(name)\n"
    "    return _Unavailable(f'{__name__}.{name}', (), {})\n"
)


def write_torchvision_standin(dest: Path) -> Path:
    """Write the stand-in package under ``dest`` (put ``dest`` on sys.path) and return ``dest``."""
    for relative, body in _STANDIN_MODULES.items():
        path = dest / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'"""{STANDIN_MARKER}."""\n' + body + _GETATTR)
    return dest


def import_environment(package_root: Path, standin: Path) -> dict[str, str]:
    """Environment for a fresh process that imports SGLang from ``package_root`` (an export) on a CPU."""
    path = os.pathsep.join([str(package_root), str(standin)])
    return {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}
