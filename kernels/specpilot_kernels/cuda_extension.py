"""Building a folder of CUDA C++ sources as a torch extension for the GPU at hand (torch.utils.cpp_extension).

One build per (name, compute capability), cached in-process; torch caches the compiled module on disk.
"""

from __future__ import annotations

import warnings
from functools import lru_cache
from pathlib import Path

import torch


SHARED_HEADERS = Path(__file__).with_name("csrc")  # headers every op's kernels may include (e.g. pdl.cuh)


@lru_cache(maxsize=None)
def load_cuda_extension(name: str, csrc: Path, sources: tuple[str, ...]):
    """Compile ``csrc/<source>`` for the current GPU's architecture (headers found in ``csrc`` and
    :data:`SHARED_HEADERS`) and import it."""
    from torch.utils.cpp_extension import load

    major, minor = torch.cuda.get_device_capability()
    # sm_90a: Hopper's architecture-specific instructions (wgmma) are only assembled for the "a" target
    arch = f"{major}{minor}{'a' if major == 9 else ''}"
    return load(
        name=f"{name}_sm{arch}",
        sources=[str(csrc / source) for source in sources],
        extra_cuda_cflags=["-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        extra_include_paths=[str(csrc), str(SHARED_HEADERS)],
        verbose=False,
    )


@lru_cache(maxsize=None)
def cuda_extension_builds(name: str, csrc: Path, sources: tuple[str, ...], what: str, fallback: str) -> bool:
    """Whether ``name`` can run here: a GPU of compute capability >= 8.0 (cp.async) on which it builds.
    A failed build is reported once, as a warning naming ``what`` did not build and the ``fallback`` used."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        return False
    try:
        load_cuda_extension(name, csrc, sources)
    except Exception as exc:  # noqa: BLE001 - any build failure means: use the fallback
        warnings.warn(
            f"{what} did not build ({type(exc).__name__}: {exc}); using {fallback}", RuntimeWarning, stacklevel=3
        )
        return False
    return True
