"""Best-first draft trees on DFlash2 / DSpark lattices: build, verify layout, greedy acceptance.

- :func:`best_first_tree_layout` — the top-N nodes by path score of each request's lattice, one Triton program per
  request (log-softmax of the selector or Markov-head scores given each node's parent, computed in the kernel),
  and their verify layout (mask, positions, parent columns, SGLang's ``retrieve_next_token`` /
  ``retrieve_next_sibling``) in the same launch; :func:`best_first_tree` the same trees with the child lists only.
- :func:`child_lists` — those child lists for trees built elsewhere (a combined tree, a chain).
- :func:`verify_layout` — tree mask, positions, retrieve indices and parent columns of the verify pass.
- :func:`greedy_accept` — the longest matching root path plus the bonus token, the committed tokens and the column
  order the commit gathers with (one launch).
``reference.py`` defines the exact semantics (a heap builder, brute-force layout, a walking acceptance).
"""

from .accept import greedy_accept
from .build import best_first_tree, best_first_tree_layout, child_lists, max_tree_depth, verify_layout
from .reference import (
    Acceptance,
    DraftTree,
    VerifyLayout,
    best_first_tree_reference,
    edge_logp_reference,
    greedy_accept_reference,
    lattice_edge_logp,
    tree_tokens,
    verify_layout_reference,
)

__all__ = [
    "Acceptance",
    "DraftTree",
    "VerifyLayout",
    "best_first_tree",
    "best_first_tree_layout",
    "child_lists",
    "max_tree_depth",
    "best_first_tree_reference",
    "edge_logp_reference",
    "greedy_accept",
    "greedy_accept_reference",
    "lattice_edge_logp",
    "tree_tokens",
    "verify_layout",
    "verify_layout_reference",
]
