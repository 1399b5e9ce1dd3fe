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


def tiny_pair(*, vocab_size=256, d_model=32, block_size=4, top_k=None, head_dim=16, **target_fields):
    """A (TargetConfig, DrafterConfig) small enough for the CPU: by default a GDN + attention target whose two
    layers feed the drafter, and a one-layer drafter of the target's width that drafts ``block_size`` positions
    from twice as many context positions, keeping ``top_k`` (default ``block_size``) candidates each.

    ``target_fields`` override the target's other fields (``layer_types``, ``feature_layers``, ``max_seq_len``...).
    A plain function, not a fixture: test modules build their engines from it at import time.
    """
    from specpilot_mem.engine.config import DrafterConfig, TargetConfig

    target = TargetConfig(
        **{
            "vocab_size": vocab_size,
            "d_model": d_model,
            "layer_types": ("gdn", "attn"),
            "ffn_dim": 2 * d_model,
            "gdn_heads": 2,
            "gdn_head_dim": head_dim,
            "attn_heads": 2,
            "attn_kv_heads": 1,
            "attn_head_dim": head_dim,
            "feature_layers": (0, 1),
            **target_fields,
        }
    )
    drafter = DrafterConfig(
        d_model=d_model,
        n_layers=1,
        heads=2,
        head_dim=head_dim,
        ffn_dim=2 * d_model,
        block_size=block_size,
        context_window=2 * block_size,
        top_k=block_size if top_k is None else top_k,
        selector_rank=8,
    )
    return target, drafter


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
    init_memory(home, checkout=False)  # the resolver never reads the work tree
    return home


@pytest.fixture
def stock_home_copy(stock_fork_home, tmp_path):
    """A private memory home whose fork shares the session fork's objects (``git clone --shared``, no
    checkout): cheap, and free to record entries into."""
    root = tmp_path / "home"
    (root / "entries").mkdir(parents=True)
    return _shared_fork_home(stock_fork_home, root)


def _shared_fork_home(stock_fork_home, root):
    """``root`` as a memory home whose fork is a ``git clone --shared`` of the session fork (no checkout)."""
    from specpilot_mem.git import Repo, run_git
    from specpilot_mem.home import Home

    run_git(
        ["clone", "--quiet", "--shared", "--no-checkout", str(stock_fork_home.fork), str(root / "sglang-fork")], root
    )
    source, copy = Repo(stock_fork_home.fork), Repo(root / "sglang-fork")
    copy.git("update-ref", "refs/heads/stock", source.rev_parse("refs/heads/stock"))
    for key in ("specpilot.stock", "specpilot.packageprefix", "specpilot.pinned"):
        copy.config_set(key, source.config_get(key) or "")
    return Home(root)


@pytest.fixture(scope="session")
def project_entries_home(stock_fork_home, tmp_path_factory):
    """A memory home holding a copy of this project's recorded entries (records, deltas, sources) and a
    link to its kernel library, on a fork that shares the session fork's objects, with every entry
    materialized by ``init``. Shared by the session: read it, never record into it."""
    import shutil
    from pathlib import Path

    from specpilot_mem.store import init_memory

    project = Path(__file__).resolve().parents[1]
    root = tmp_path_factory.mktemp("project-entries-home")
    (root / "entries").mkdir()
    for record in sorted((project / "entries").glob("*/entry.yaml")):
        shutil.copytree(
            record.parent, root / "entries" / record.parent.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    (root / "kernels").symlink_to(project / "kernels")
    home = _shared_fork_home(stock_fork_home, root)
    init_memory(home, checkout=False)  # the resolver never reads the work tree
    return home


@pytest.fixture(scope="session")
def sglang_entries_export(project_entries_home):
    """Every SGLang entry of the project applied onto stock (branch ``deploy/sglang-entries`` of
    ``project_entries_home``) and exported once per tree: (export folder, application order)."""
    from specpilot_mem.sglang.entry_src import sglang_entry_ids
    from specpilot_mem.sglang.export import cached_export
    from specpilot_mem.store.resolver import apply_entries

    home = project_entries_home
    result = apply_entries(home, sglang_entry_ids(home), branch="deploy/sglang-entries", force=True)
    return cached_export(home, "deploy/sglang-entries", result.order), result.order


@pytest.fixture(scope="module")
def one_torch_thread():
    """Small ops and the 2-core CI machine: extra intra-op threads only spin or contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
