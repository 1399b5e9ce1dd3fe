"""W12 for Hugging Face Transformers: convert a loaded causal LM's ``nn.Linear`` layers in one call.

    from specpilot_kernels.w12.hf import convert_model
    stats = convert_model(model)            # every BF16 nn.Linear except the LM head, checked bit for bit
    stats = convert_model(model, lm_head=True)

Each converted layer becomes a :class:`W12Linear` holding the W12 planes (its BF16 weight is freed);
its forward is :func:`specpilot_kernels.w12.w12_linear` (the W12 GEMM on CUDA, the exact decoded weight
on the CPU). Works with static caches and CUDA-graph capture: the forward allocates only its output.
"""

from __future__ import annotations

from dataclasses import fields

import torch
from torch import nn

from .codec import encode
from .format import W12Tensor
from .linear import w12_linear
from .mma import W12MmaTensor, to_mma_layout

class W12Linear(nn.Module):
    """A drop-in for a BF16 ``nn.Linear`` whose weight is stored as W12 (the tensors are buffers).

    On CUDA the weight is kept in the mma.sync fragment layout (:class:`W12MmaTensor`, the fast kernel);
    on the CPU as a :class:`W12Tensor` (exact decode + F.linear).
    """

    def __init__(self, w12: W12Tensor, bias: torch.Tensor | None):
        super().__init__()
        stored = to_mma_layout(w12) if w12.device.type == "cuda" else w12
        self.out_features, self.in_features = w12.shape
        self._kind = type(stored)
        self._meta = {}
        for field in fields(stored):
            value = getattr(stored, field.name)
            if isinstance(value, torch.Tensor):
                self.register_buffer(f"w12_{field.name}", value)
            else:
                self._meta[field.name] = value
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @property
    def w12(self) -> W12Tensor | W12MmaTensor:
        tensors = {f.name: getattr(self, f"w12_{f.name}") for f in fields(self._kind) if f.name not in self._meta}
        return self._kind(**tensors, **self._meta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return w12_linear(x, self.w12, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, W12"


def convert_model(model: nn.Module, *, lm_head: bool = False) -> dict[str, dict]:
    """Replace every BF16 ``nn.Linear`` of ``model`` by a :class:`W12Linear`, in place.

    Each weight is encoded on its own device and its decode compared with it bit for bit (``W12Error`` on
    any difference, before that layer is replaced). The output embedding (LM head) is converted only
    with ``lm_head=True``; a head tied to the input embedding stays BF16 because the embedding needs it.
    Returns per-layer statistics (bits per weight with headers and escapes, escape fraction).
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = head is not None and embed is not None and head.weight is embed.weight
    targets = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or module.weight.dtype != torch.bfloat16:
            continue
        if module is head and (not lm_head or tied):
            continue
        targets.append(name)
    del head, embed
    stats = {}
    # names, not modules, are kept so each BF16 weight is freed as soon as its layer is replaced: the peak
    # stays one layer above the BF16 model instead of BF16 + W12 for the whole model
    for name in targets:
        module = model.get_submodule(name)
        w12 = encode(module.weight.data, check=True, name=name)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, W12Linear(w12, module.bias))
        stats[name] = w12.stats()
        del module, w12
    return stats
