"""The memory store: the deterministic stock fork, entries as branches + records, the resolver, verify.

Public API (other packages call these; the CLI is a thin layer over them):

- ``load_entries(home) -> dict[str, EntryRecord]``, ``load_entry(home, id)``, ``save_entry(home, record)``
- ``record_entry(home, id, source, requires, meta) -> EntryRecord``; ``add_variant``, ``add_evidence``
- ``init_memory(home, wheel=None, fork_url=None, stock_rev=None, package_prefix="", checkout=True) -> InitResult``
- ``vendor_kernels(home, worktree, files) -> {vendored path: sha256}``
- ``specpilot_mem.store.resolver.apply_entries(home, ids, onto="stock", branch=None, worktree=None)``
- ``specpilot_mem.store.fork.open_fork(home) -> Fork``; ``specpilot_mem.store.verify.verify_memory(home)``
"""

from specpilot_mem.store.init import InitResult, init_memory
from specpilot_mem.store.kernels import vendor_kernels
from specpilot_mem.store.record import add_evidence, add_variant, record_entry
from specpilot_mem.store.records import load_entries, load_entry, save_entry

__all__ = ["InitResult", "add_evidence", "add_variant", "init_memory", "load_entries", "load_entry",
           "record_entry", "save_entry", "vendor_kernels"]
