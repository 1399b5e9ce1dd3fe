"""The memory store: the deterministic stock fork, entries as branches + records, the resolver, verify.

Public API (other packages call these; the CLI is a thin layer over them):

- ``load_entries(home) -> dict[str, EntryRecord]``, ``load_entry(home, id)``, ``save_entry(home, record)``
- ``record_entry(home, id, source, requires, meta) -> EntryRecord``; ``add_variant``, ``add_evidence``
- ``init_memory(home, wheel=None, fork_url=None, stock_rev=None, package_prefix="", checkout=True) -> InitResult``
- ``vendor_kernels(home, worktree, files) -> {vendored path: sha256}``
- ``specpilot_mem.store.resolver.apply_entries(home, ids, onto="stock", branch=None, worktree=None)``
- ``specpilot_mem.store.fork.open_fork(home) -> Fork``; ``specpilot_mem.store.verify.verify_memory(home)``
"""

# Loaded on first use (PEP 562): `query` reads records through store.records, and must not pay for the
# resolver, git plumbing and init that importing the whole store costs.
_PUBLIC = {
    "InitResult": "init",
    "init_memory": "init",
    "vendor_kernels": "kernels",
    "add_evidence": "record",
    "add_variant": "record",
    "record_entry": "record",
    "load_entries": "records",
    "load_entry": "records",
    "save_entry": "records",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
