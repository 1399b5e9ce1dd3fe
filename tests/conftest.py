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


@pytest.fixture(scope="session")
def stock_fork_home(tmp_path_factory):
    """A memory home (``specpilot_mem.home.Home``) whose sglang-fork was built by ``init`` from the pinned
    SGLang wheel (cached; downloaded once if the cache is empty), with an empty ``entries/``.

    Shared by the whole session: do not record entries into it — use ``stock_home_copy`` for that.
    """
    from specpilot_mem.home import Home
    from specpilot_mem.store import init_memory

    root = tmp_path_factory.mktemp("stock-home")
    (root / "entries").mkdir()
    home = Home(root)
    init_memory(home)
    return home


@pytest.fixture
def stock_home_copy(stock_fork_home, tmp_path):
    """A private memory home whose fork shares the session fork's objects (``git clone --shared``, no
    checkout): cheap, and free to record entries into."""
    from specpilot_mem.git import Repo, run_git
    from specpilot_mem.home import Home

    root = tmp_path / "home"
    (root / "entries").mkdir(parents=True)
    run_git(["clone", "--quiet", "--shared", "--no-checkout", str(stock_fork_home.fork), str(root / "sglang-fork")], root)
    source, copy = Repo(stock_fork_home.fork), Repo(root / "sglang-fork")
    copy.git("update-ref", "refs/heads/stock", source.rev_parse("refs/heads/stock"))
    for key in ("specpilot.stock", "specpilot.packageprefix", "specpilot.pinned"):
        copy.config_set(key, source.config_get(key) or "")
    return Home(root)
