"""Batched serving policies (§4.4): a node budget shared by the batch, a drafter block per request, and
prompt admission into the verify step. Each is engine-independent torch code that runs on the GPU
without host synchronisation (decisions stay tensors), with numpy references in ``replay``.

    from specpilot_mem.batching import CostCurve, SharedBudget, DrafterBlocks, PromptAdmission

Imports only torch and numpy (runs on the bare H200 with ``PYTHONPATH=kernels:.``).
"""

from specpilot_mem.batching.admission import PromptAdmission
from specpilot_mem.batching.blocks import DrafterBlocks
from specpilot_mem.batching.budget import SharedBudget, equal_shares, shared_shares
from specpilot_mem.batching.costs import CostCurve, StepCosts

__all__ = [
    "CostCurve",
    "DrafterBlocks",
    "PromptAdmission",
    "SharedBudget",
    "StepCosts",
    "equal_shares",
    "shared_shares",
]
