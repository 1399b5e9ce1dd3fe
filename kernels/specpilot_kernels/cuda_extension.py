"""Building a folder of CUDA C++ sources as a torch extension for the GPU at hand (torch.utils.cpp_extension).

One build per (name, compute capability), cached in-process; torch caches the compiled module on disk.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch


@lru_cache(maxsize=None)
def load_cuda_extension(name: str, csrc: Path, sources: tuple[str, ...]):
    """Compile ``csrc/<source>`` for the current GPU's architecture (headers found in ``csrc``) and import it."""
    from torch.utils.cpp_extension import load

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    return load(
        name=f"{name}_sm{arch}",
        sources=[str(csrc / source) for source in sources],
        extra_cuda_cflags=["-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        extra_include_paths=[str(csrc)],
        verbose=False,
    )
