"""The ``w12`` weight method: BF16 checkpoints converted to W12 at load time, bit for bit.

``--quantization w12`` gives every decoder linear layer (``LinearBase``: fused QKV, gate/up, down,
output and GDN projections) the ``W12LinearMethod``; ``--specpilot-w12-lm-head`` adds an untied LM
head. Weights load as BF16 exactly as stock loads them; after loading, each is encoded to W12 (format
v2: per channel the window covering the most weights) where W12 pays (``encode_or_keep``: a tensor whose
W12 form would need more than 90% of BF16's bytes, or more than 2% escapes, stays BF16 and runs stock's
GEMM), the encoding is checked against the loaded tensor bit for bit (a differing bit stops the load,
naming the tensor), and the BF16 copy is released. On CUDA the planes are re-laid for the vendored
kernels (decode in registers, reduction order fixed by (N, K, GPU), never by the row count); off the
GPU the exact decoded weight goes through ``F.linear``, so the output equals the unquantized method's
bit for bit.

Without ``--quantization w12`` nothing here runs: stock behaviour.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers.quantization.base_config import (
    LinearMethodBase,
    QuantizationConfig,
    QuantizeMethodBase,
)
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.specpilot import option_value
from sglang.srt.specpilot.tlv_state import qpass_low_bits
from sglang.srt.specpilot.kernels.w12 import (
    W12MmaTensor,
    W12Tensor,
    decode,
    encode_or_keep,
    to_mma_layout,
    w12_linear,
)

logger = logging.getLogger(__name__)


class W12Config(QuantizationConfig):
    """Online W12 conversion of a BF16 checkpoint (no quantization config file is read)."""

    def __init__(self, lm_head: Optional[bool] = None, qpass: Optional[str] = None):
        super().__init__()
        # None: the running server's --specpilot-w12-lm-head (SGLang builds this config without arguments).
        self.lm_head = option_value("--specpilot-w12-lm-head") if lm_head is None else lm_head
        # tlv's Q-pass product (--specpilot-tlv-qpass); "int8" makes each layer's INT8 copy at load, only with TLV on
        if qpass is None:
            qpass = option_value("--specpilot-tlv-qpass")
            if qpass == "int8" and not option_value("--specpilot-tlv"):
                qpass = "fp8"  # no Q pass runs: no copy is made
        self.qpass = qpass

    def get_name(self) -> str:
        return "w12"

    def get_supported_act_dtypes(self) -> List[torch.dtype]:
        return [torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80  # BF16 tensor cores

    @staticmethod
    def get_config_filenames() -> List[str]:
        return []

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "W12Config":
        return cls()

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Optional[QuantizeMethodBase]:
        # Imported here, as SGLang's own methods do: at module level they close an import cycle
        # (memory_pool -> quantization -> this module -> vocab_parallel_embedding -> ... -> memory_pool).
        from sglang.srt.layers.linear import LinearBase
        from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead

        if isinstance(layer, LinearBase):
            return W12LinearMethod(prefix, qpass=self.qpass)
        if isinstance(layer, ParallelLMHead):
            return W12LinearMethod(prefix, lm_head=True, qpass=self.qpass) if self.lm_head else None
        return None  # embeddings, MoE experts, norms: stock methods

    def get_scaled_act_names(self) -> List[str]:
        return []


class W12LinearMethod(LinearMethodBase):
    """BF16 weights at load, W12 planes (as layer buffers) after ``process_weights_after_loading``."""

    def __init__(self, prefix: str = "", lm_head: bool = False, qpass: str = "fp8"):
        self.prefix = prefix
        self.lm_head = lm_head
        self.qpass = qpass  # tlv's Q-pass product: "fp8" / "bf16" read the 8-bit view, "int8" a copy made at load
        self._loading = UnquantizedLinearMethod()

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: List[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs):
        if params_dtype != torch.bfloat16:
            raise ValueError(
                f"--quantization w12 converts BF16 weights; {self.prefix or 'this layer'} loads as {params_dtype}. "
                "Serve the model with --dtype bfloat16."
            )
        # Exactly stock's BF16 parameter, so every checkpoint and weight loader works unchanged.
        self._loading.create_weights(layer, input_size_per_partition, output_partition_sizes, input_size,
                                     output_size, params_dtype, **extra_weight_attrs)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        weight = layer.weight.data
        if self.lm_head and weight.is_cuda and _fp32_lm_head():
            raise ValueError(
                "--specpilot-w12-lm-head feeds the W12 GEMM BF16 activations; --enable-fp32-lm-head asks for "
                "FP32 ones. Drop one of the two flags."
            )
        # raises W12Error naming the tensor on any differing bit, which stops the load
        w12, report = encode_or_keep(weight, name=self.prefix or "weight")
        layer.w12_report = report
        if w12 is None:  # W12 does not pay for this tensor: it stays BF16 on stock's method
            logger.info("W12 %s kept as BF16: %s", self.prefix, report["reason"])
            layer.w12_layout = None
            return
        logger.debug("W12 %s: %.3f bits/weight, escape fraction %.2e", self.prefix, report["bits_per_weight"],
                     report["escape_fraction"])
        layer.w12_version = w12.version  # tlv: the Q pass reads the 8-bit view of versions that have one
        if self.qpass == "int8":  # tlv's INT8 Q-pass copy, from the BF16 weight before it goes: 8 more bits a weight
            from sglang.srt.specpilot.kernels.w12.int8_copy import int8_copy

            copy = int8_copy(weight)
            layer.register_buffer("tlv_int8_weight", copy.weight, persistent=False)
            layer.register_buffer("tlv_int8_scale", copy.scale, persistent=False)
        stored = to_mma_layout(w12) if weight.is_cuda else w12
        del layer.weight  # the point of the format: the BF16 copy does not stay resident
        meta = {}
        for field in dataclasses.fields(stored):
            value = getattr(stored, field.name)
            if isinstance(value, torch.Tensor):
                layer.register_buffer(f"w12_{field.name}", value, persistent=False)
            else:
                meta[field.name] = value
        layer.w12_layout = (type(stored), meta)

    @staticmethod
    def w12_tensor(layer: torch.nn.Module) -> W12Tensor | W12MmaTensor:
        layout, meta = layer.w12_layout
        planes = {f.name: getattr(layer, f"w12_{f.name}") for f in dataclasses.fields(layout) if f.name not in meta}
        return layout(**meta, **planes)

    @staticmethod
    def int8_copy(layer: torch.nn.Module):
        """tlv's INT8 Q-pass copy of this layer (``Int8Copy``), None without one."""
        if not hasattr(layer, "tlv_int8_weight"):
            return None
        from sglang.srt.specpilot.kernels.w12.int8_copy import Int8Copy

        return Int8Copy(layer.tlv_int8_weight, layer.tlv_int8_scale)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        if layer.w12_layout is None:  # kept as BF16
            return self._loading.apply(layer, x, bias)
        w12 = self.w12_tensor(layer)
        low_bits = qpass_low_bits()
        if low_bits is not None:  # tlv's Q pass: the 8-bit view of this very record, no second copy
            from sglang.srt.specpilot.tlv import qpass_apply

            return qpass_apply(w12, x, bias, low_bits, self.qpass, self.int8_copy(layer))
        if isinstance(w12, W12Tensor) and x.dtype != torch.bfloat16:
            # Off the GPU an FP32 input (e.g. --enable-fp32-lm-head) meets the exact weight, widened.
            return F.linear(x, decode(w12).to(x.dtype), None if bias is None else bias.to(x.dtype))
        return w12_linear(x, w12, bias)


def _fp32_lm_head() -> bool:
    from sglang.srt.runtime_context import get_exec

    return bool(get_exec().features.enable_fp32_lm_head)
