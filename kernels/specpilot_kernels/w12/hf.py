"""W12 for Hugging Face Transformers: convert a loaded causal LM's ``nn.Linear`` layers in one call.

    from specpilot_kernels.w12.hf import convert_model
    stats = convert_model(model)            # every BF16 nn.Linear except the LM head, checked bit for bit
    stats = convert_model(model, lm_head=True)
    stats = convert_model(model, lm_head=True, decoder=False)  # later: only the head (kept layers stay as they are)

Each converted layer becomes a :class:`W12Linear` holding the W12 planes (its BF16 weight is freed);
its forward is :func:`specpilot_kernels.w12.w12_linear` (the W12 GEMM on CUDA, the exact decoded weight
on the CPU). Works with static caches and CUDA-graph capture: the forward allocates only its output.

Optionally, before converting, ``fuse_shared_input_projections(model)`` turns q/k/v and gate/up into one
GEMM each (weights concatenated along the output dimension), as serving engines do; it works on BF16
layers, so the BF16 and W12 models it makes are compared like for like.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

import torch
from torch import nn

from .codec import encode_or_keep
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


def convert_model(model: nn.Module, *, lm_head: bool = False, decoder: bool = True) -> dict[str, dict]:
    """Replace every BF16 ``nn.Linear`` of ``model`` by a :class:`W12Linear` where W12 pays, in place.

    Each weight is encoded on its own device (format v3) and its decode compared with it bit for bit (``W12Error``
    naming the layer on any difference, before that layer is replaced); a layer whose W12 form would not pay
    (``encode_or_keep``: more than 90% of BF16's bytes in memory, or more than 2% escapes) stays BF16. The output embedding
    (LM head) is converted only with ``lm_head=True``; a head tied to the input embedding stays BF16 because the
    embedding needs it. ``decoder=False`` leaves every other layer alone, so a model converted earlier gets its
    head converted without its kept-as-BF16 layers being encoded (and reported) again. Returns the conversion
    report per candidate layer (bits per weight with headers and escapes, escape fraction, kept_bf16 and why).
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
        if module is not head and not decoder:
            continue
        targets.append(name)
    del head, embed
    stats = {}
    # names, not modules, are kept so each BF16 weight is freed as soon as its layer is replaced: the peak
    # stays one layer above the BF16 model instead of BF16 + W12 for the whole model
    for name in targets:
        module = model.get_submodule(name)
        w12, stats[name] = encode_or_keep(module.weight.data, name=name)
        if w12 is not None:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, W12Linear(w12, module.bias))
        del module, w12
    return stats


# sibling projections that decoder layers (Llama, Qwen2/3, Mistral, Gemma, ...) call on one input tensor
SHARED_INPUT_PROJECTIONS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class SharedInputProjection(nn.Module):
    """One GEMM for sibling linear layers that read the same input: ``fused`` holds their weights
    concatenated along the output dimension (an ``nn.Linear``, or a :class:`W12Linear` after conversion).

    The first member called with an input computes every member's output; the others, called with the
    same tensor (same object, not modified in place since), take their slice. A member called with any
    other input recomputes, so results never depend on the order of the calls, only the cost does.
    """

    def __init__(self, fused: nn.Module, sizes: Sequence[int]):
        super().__init__()
        self.fused = fused
        self.sizes = list(sizes)
        self._last = None  # [input, its version counter, outputs, members that have not read them yet]

    def output(self, member: int, x: torch.Tensor) -> torch.Tensor:
        last = self._last
        if last is None or last[0] is not x or last[1] != x._version or member not in last[3]:
            last = self._last = [x, x._version, self.fused(x).split(self.sizes, dim=-1), set(range(len(self.sizes)))]
        last[3].discard(member)
        if not last[3]:
            self._last = None  # all members have read: hold no activations between forwards
        return last[2][member]


class ProjectionSlice(nn.Module):
    """Stands where one of the fused layers was: its output is its slice of the group's output."""

    def __init__(self, group: SharedInputProjection, member: int, in_features: int, out_features: int):
        super().__init__()
        self.__dict__["group"] = group  # not a submodule: the group is registered once, on the parent
        self.member, self.in_features, self.out_features = member, in_features, out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(self.member, x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, member {self.member} of a group"


def fuse_shared_input_projections(model: nn.Module) -> int:
    """Replace each q/k/v and gate/up set of BF16 ``nn.Linear`` layers by one :class:`SharedInputProjection`
    (registered on their parent as ``fused_q_k_v`` / ``fused_gate_up``) and per-layer slices of it, in place.

    Only sets whose layers share input size, dtype, device and bias presence are fused. Run it before
    :func:`convert_model`, which then converts each group's concatenated layer. Returns the number of groups.
    """
    groups = 0
    for parent in list(model.modules()):
        for names in SHARED_INPUT_PROJECTIONS:
            layers = [getattr(parent, name, None) for name in names]
            if not all(type(layer) is nn.Linear for layer in layers):
                continue
            first = layers[0]
            if any(
                layer.in_features != first.in_features
                or layer.weight.dtype != first.weight.dtype
                or layer.weight.device != first.weight.device
                or (layer.bias is None) != (first.bias is None)
                for layer in layers
            ):
                continue
            sizes = [layer.out_features for layer in layers]
            fused = nn.Linear(first.in_features, sum(sizes), bias=first.bias is not None, device="meta")
            fused.weight = nn.Parameter(torch.cat([layer.weight.detach() for layer in layers]), requires_grad=False)
            if first.bias is not None:
                fused.bias = nn.Parameter(torch.cat([layer.bias.detach() for layer in layers]), requires_grad=False)
            group = SharedInputProjection(fused, sizes)
            parent.add_module("fused_" + "_".join(name.removesuffix("_proj") for name in names), group)
            for member, (name, layer) in enumerate(zip(names, layers)):
                setattr(parent, name, ProjectionSlice(group, member, layer.in_features, layer.out_features))
            groups += 1
    return groups
