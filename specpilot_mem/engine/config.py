"""Model configurations of the pure-torch engine: a Qwen3.5-style hybrid target and a block drafter.

Plain dataclasses (no pydantic: this package must import on the bare H200), stored as JSON in the
safetensors metadata so a weights file is self-describing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields


class _JsonConfig:
    """to_json / from_json for the config dataclasses (unknown keys ignored, JSON lists back to tuples)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str):
        known = {f.name for f in fields(cls)}
        values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in json.loads(text).items() if k in known}
        return cls(**values)


@dataclass(frozen=True)
class TargetConfig(_JsonConfig):
    vocab_size: int = 4096
    d_model: int = 256
    # One entry per layer: "gdn" (Gated DeltaNet) or "attn" (full attention), as in Qwen3.5's 3:1 mix.
    layer_types: tuple[str, ...] = ("gdn", "gdn", "attn", "gdn", "gdn", "attn")
    ffn_dim: int = 768
    # Gated DeltaNet: heads with key and value dimension each.
    gdn_heads: int = 4
    gdn_head_dim: int = 64
    conv_size: int = 4
    # Attention: grouped-query heads.
    attn_heads: int = 4
    attn_kv_heads: int = 2
    attn_head_dim: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    max_seq_len: int = 2048
    # Layers whose outputs (concatenated) condition the drafter, DFlash-style.
    feature_layers: tuple[int, ...] = (1, 3, 5)

    @property
    def n_layers(self) -> int:
        return len(self.layer_types)

    @property
    def feature_dim(self) -> int:
        return self.d_model * len(self.feature_layers)


@dataclass(frozen=True)
class DrafterConfig(_JsonConfig):
    d_model: int = 256
    n_layers: int = 2
    heads: int = 4
    head_dim: int = 64
    ffn_dim: int = 768
    # Masked positions drafted per forward pass (the trained block size; the engine may draft more).
    block_size: int = 16
    # Target positions before the anchor whose hidden states the block attends to.
    context_window: int = 64
    # Candidates kept per drafted position, and the rank of the selector's pair term.
    top_k: int = 16
    selector_rank: int = 64
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0


@dataclass
class EngineOptions:
    """Options of one engine instance. Defaults reproduce the stock engine (chain, no fault)."""

    # "chain" (stock: the selector's greedy chain) or a builder name of specpilot_mem.replay.trees.
    tree: str = "chain"
    # Drafted positions per step, and the node budget of tree builders (ignored by the chain).
    positions: int = 8
    nodes: int = 32
    # Injected fault of the paper's §6.2: +fault_bias on every fault_stride-th vocabulary id once
    # fault_after output tokens exist. None switches it off.
    fault_after: int | None = None
    fault_bias: float = 2.0
    fault_stride: int = 7
    # Lossless variants for the fault study: LM head reduction order ("dense" or "splitk") and the
    # GDN verify method ("wy": masked WY form over the tree; "path": recurrence along each root path).
    lm_head: str = "dense"
    splitk_chunks: int = 4
    gdn_verify: str = "wy"
    # Prompt tokens per prefill chunk of the GDN's chunked form.
    chunk_size: int = 64
    # Lossy verify passes for token forcing's fault study (all off by default). Low-precision weights in
    # the verify pass: verify_weights is "fp8" (E4M3), "int8", "int6" or "int4" (per-output-channel
    # scales, rounded to nearest), on the LM head only (verify_weight_scope "head") or on every linear
    # layer and the head ("all"). flip_rate: each output position's prediction is replaced by the
    # verify logits' runner-up with this probability (seeded by flip_seed and the request). rope_offset:
    # the verify pass rotates queries and keys this many positions too far. attn_window: the verify
    # pass's attention sees only the last attn_window committed tokens. stop_after: outputs end after
    # this many tokens. fault_requests: the share of requests (chosen by a hash of the prompt) that
    # these faults and the §6.2 fault apply to; the rest are served as stock serves them.
    verify_weights: str | None = None
    verify_weight_scope: str = "all"
    flip_rate: float = 0.0
    flip_seed: int = 0
    rope_offset: int = 0
    attn_window: int | None = None
    stop_after: int | None = None
    fault_requests: float = 1.0
    # CUDA graphs for verify/draft passes (ignored on CPU).
    cuda_graphs: bool = True
