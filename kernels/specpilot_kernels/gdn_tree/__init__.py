"""GDN (gated delta rule) verification over draft trees without per-node state, and its commit.

- :func:`tree_schedule` — the depth-first visiting schedule of a batch of trees, with the branch states
  to keep and restore (once per verify step).
- :func:`gdn_tree_path_verify` — every node's output along its root path (path kernel: the CUDA step loop
  of ``lanes.py`` by default on a GPU, else Triton), with :func:`prepare_node_inputs` (q/k norms, gates).
- :func:`gdn_tree_wy_verify` — the same outputs in the WY form on tensor cores (TreeWY), with
  :func:`tree_ancestors` (once per verify step).
- :func:`gdn_tree_commit` — replay the accepted root path into the state pool.
``reference.py`` defines the exact semantics.
"""

from .commit import gdn_tree_commit
from .path_verify import TreeSchedule, gdn_tree_path_verify, prepare_node_inputs, tree_schedule
from .wy_verify import gdn_tree_wy_verify, tree_ancestors

__all__ = [
    "TreeSchedule",
    "gdn_tree_commit",
    "gdn_tree_path_verify",
    "gdn_tree_wy_verify",
    "prepare_node_inputs",
    "tree_ancestors",
    "tree_schedule",
]
