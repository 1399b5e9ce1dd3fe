"""Shared test setup.

Without a GPU, Triton kernels run under the interpreter (``TRITON_INTERPRET=1`` must be set before
triton is imported), and tests marked ``gpu`` are skipped with the reason.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; runs on the H200 (see benchmarks/)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
