"""The registry on a generated memory of 1,000 entries (synthetic records): `query` against an independent
reference implementation of its rules, incremental sync after editing one record, and rebuild equivalence."""

from __future__ import annotations

import shutil

import pytest
from test_registry_support import table_contents

from specpilot_mem.gpus import find_gpu, resolve_gpu_or_arch
from specpilot_mem.home import Home
from specpilot_mem.registry.query import QueryFilters, query_entries
from specpilot_mem.registry.sync import connect, sync
from specpilot_mem.registry.synthetic import generate_memory

N_ENTRIES = 1000


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Home, dict]:
    """The home and its records (as generated, so the reference never reads them through the registry)."""
    root = tmp_path_factory.mktemp("generated")
    records = {r.id: r for r in generate_memory(root, N_ENTRIES, seed=3)}
    home = Home(root)
    report = sync(home)
    assert report.rebuilt and report.records == N_ENTRIES
    return home, records


def run_query(home, **filters) -> dict[str, str | None]:
    con = connect(home)
    try:
        return {m.id: m.hardware for m in query_entries(con, QueryFilters(**filters))}
    finally:
        con.close()


def name_key(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def reference(records, gpu_text=None, regime=None, drafter=None, model=None, text=None, validated_only=False):
    """The documented matching rules, written directly over the records: entry id -> hardware class."""
    gpu, arch = resolve_gpu_or_arch(gpu_text) if gpu_text else (None, None)
    setting = regime or drafter or model
    expected = {}
    for record in records.values():
        fits = [
            e
            for e in record.evidence
            if (regime is None or e.deployment.regime == regime)
            and (drafter is None or name_key(drafter) in name_key(e.deployment.drafter or "\0"))
            and (model is None or name_key(model) in name_key(e.deployment.target or "\0"))
        ]
        hardware = None
        if arch:
            on_arch = [e for e in fits if e.deployment.arch == arch]
            if gpu and any(find_gpu(e.deployment.gpu).name == gpu.name for e in on_arch):
                hardware = "gpu"
            elif on_arch:
                hardware = "arch"
            elif any(arch in v.hardware for v in record.variants) and (fits or not setting):
                hardware = "variant"
            else:
                continue
        elif setting and not fits:
            continue
        words = "\n".join([record.title, record.summary, *record.limits]).lower()
        if text and not all(w in words for w in text.lower().split()):
            continue
        validated = any(e.kind == "paired-run" and not e.synthetic for e in record.evidence) and not any(
            (e.verdict or "").startswith("reject") for e in record.evidence
        )
        if validated_only and not validated:
            continue
        expected[record.id] = hardware
    return expected


@pytest.mark.parametrize(
    "filters",
    [
        {"gpu_text": "sm_120"},
        {"gpu_text": "H200"},
        {"gpu_text": "H100", "regime": "batch", "model": "qwen3.8"},
        {"regime": "batch", "drafter": "DSpark"},
        {"text": "lossless weight"},
        {"gpu_text": "B200", "drafter": "eagle", "validated_only": True},
    ],
)
def test_generated_memory_matches_reference(generated, filters):
    home, records = generated
    expected = reference(records, **filters)
    assert expected, "the filter should select something in the generated memory"
    query = {("gpu" if k == "gpu_text" else k): v for k, v in filters.items()}
    assert run_query(home, **query) == expected


def test_incremental_sync_equals_rebuild(generated, tmp_path):
    source, records = generated
    home = Home(tmp_path / "copy")
    shutil.copytree(source.root, home.root, ignore=shutil.ignore_patterns(".specpilot"))
    edited, removed = sorted(records)[10], sorted(records)[20]
    path = home.entry_dir(edited) / "entry.yaml"
    path.write_text(path.read_text().replace("Generated record", "Edited record"))
    shutil.rmtree(home.entry_dir(removed))
    report = sync(home)
    assert (report.rebuilt, report.changed, report.removed, report.added) == (
        False,
        [f"entries/{edited}/entry.yaml"],
        [f"entries/{removed}/entry.yaml"],
        [],
    )
    assert sync(home).wrote is False
    incremental = table_contents(home.registry)
    sync(home, rebuild=True)
    assert table_contents(home.registry) == incremental
    assert len(incremental["entries"]) == N_ENTRIES - 1
