"""Certified LM head (the paper's §4.1): INT8 copy + per-row Cauchy–Schwarz bound + exact rescoring.

- :func:`quantize_head` — the INT8 copy, per-row scales and radius coefficients (once per model), and
  on CUDA GPUs the same copy in the CUDA pass's fragment layout (:mod:`.fragments`).
- :func:`certified_argmax` — the exact head's argmax; :func:`certified_argmax_graphable` without sync;
  :func:`certified_argmax_in_graph` with its exact fallback in the same launches.
- :func:`exact_head_logits` — the exact head whose argmax is certified (same arithmetic as rescoring).
- :func:`int8_pass` — the INT8 pass alone (bounds and candidate lists), for timing it apart; the CUDA
  C++ pass (:mod:`.cuda_pass`, partition :class:`CudaPassConfig`) where it runs, else the Triton pass.
``reference.py`` defines the exact semantics.
"""

from .cuda_pass import CudaPassConfig
from .head import certified_argmax, certified_argmax_graphable, certified_argmax_in_graph, exact_head_logits, int8_pass
from .reference import CertifiedHead, quantize_head

__all__ = [
    "CertifiedHead",
    "CudaPassConfig",
    "certified_argmax",
    "certified_argmax_graphable",
    "certified_argmax_in_graph",
    "exact_head_logits",
    "int8_pass",
    "quantize_head",
]
