"""The system engine: one batched verify step at the paper's shapes, stock by default, each SpecPilot mechanism an
option (``SystemOptions``), all of them under one CUDA graph per (requests, rows) bucket.

A step takes B requests' draft trees (ragged: padded to T rows, ``num_nodes`` real), runs the target over all
B*T rows at once against each request's cache (attention KV, GDN state, conv window), picks the accepted root
path of every tree on the device, and commits it — no host synchronisation until the caller reads the tokens.

- Linears: fused QKV(+gate) and gate_up; cuBLAS BF16 (stock) or the W12 mma kernel (``linears="w12"``).
- GDN verify: SGLang 0.5.23's kernel writing a state snapshot per drafted position, commit = copy of the
  accepted snapshot (stock); or ``specpilot_kernels.gdn_tree`` path verify + commit (``gdn_verify="path"``).
  AR steps use SGLang's decode (state updated in place).
- Attention: q/k norm + RoPE + the rows' cache write in one kernel, then tree attention over the dense cache
  split over the keys (the tree mask from ``anc`` and the lengths, no mask tensor): ``fused_ops.tree_attention``
  for one request, ``batched_ops.batched_tree_attention`` for a batch (``batched_ops.verify_attention``).
- LM head: BF16 (stock), W12, or the certified head with fixed-size survivor buffers and the guarded exact
  fallback in the graph (``certified_argmax_in_graph``).

Hooks for other mechanisms (``docs/engine.md``): ``SystemModel.forward(..., weights_view=...)`` runs the pass
over another view of the linears (the TLV Q pass over the W12 8-bit view) and ``write_cache=False`` leaves
caches and states untouched; ``StepBuffers`` is what a batching policy fills per step.

On a CPU the GDN kernels run under ``TRITON_INTERPRET=1`` where they can (path verify, commit) and otherwise as
the kernels' own torch references (SGLang's kernel does not run in the interpreter); W12 linears decode exactly.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from specpilot_kernels.fused_ops import (
    add_rms_norm,
    conv_commit,
    gated_rms_norm,
    qk_norm_rope,
    rms_norm,
    row_argmax,
    select_states,
    silu_mul,
    tree_accept,
    tree_conv_silu,
)
from specpilot_kernels.batched_ops import commit_kv_rows, row_topk, verify_attention
from specpilot_mem.engine.options import SystemOptions
from specpilot_mem.engine.shapes import SystemShape

_CAPTURE_LOCK = threading.Lock()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# -- weights ---------------------------------------------------------------------------------------------------


class Linear:
    """One fused linear: its BF16 weight [N, K] and, once asked for, its W12 forms (made on the weight's device)."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self._w12 = None
        self._mma = None
        self._decoded = None

    def _convert(self) -> None:
        """The W12 form, made once on the weight's device: for a bf16 model on a GPU only the mma layout (the
        planes' second copy would double the W12 bytes); else the W12Tensor too (fp32 inputs take its exact decode)."""
        if self._w12 is None and self._mma is None:
            from specpilot_kernels.w12 import encode, to_mma_layout

            w12 = encode(self.weight.to(torch.bfloat16).contiguous(), check=True)
            if self.weight.is_cuda:
                self._mma = to_mma_layout(w12)
            if not self.weight.is_cuda or self.weight.dtype != torch.bfloat16:
                self._w12 = w12

    def __call__(self, x, mode: str = "bf16"):
        """y = x W^T. mode: "bf16" (cuBLAS), "w12" (the W12 mma kernel, exact weights), "q8_truncated" /
        "q8_midpoint" (the same kernel over the 8-bit view, the dropped bits zero or at their midpoint: the TLV Q
        pass's weights), or "fp8_truncated" / "fp8_midpoint" (those weights on the FP8 tensor cores, activations in
        E4M3 per row: ``w12_fp8_qpass_gemm``, sm_89+); the Q modes GPU only."""
        if mode == "bf16":
            return F.linear(x, self.weight)
        self._convert()
        if self._mma is not None and x.dtype == torch.bfloat16:
            from specpilot_kernels.w12 import w12_mma_gemm
            from specpilot_kernels.w12.qpass_fp8 import w12_fp8_qpass_gemm

            flat = x.reshape(-1, x.shape[-1]).contiguous()
            if mode.startswith("fp8_"):
                y = w12_fp8_qpass_gemm(flat, self._mma, mode.removeprefix("fp8_"))
            else:
                y = w12_mma_gemm(flat, self._mma, low_bits="exact" if mode == "w12" else mode.removeprefix("q8_"))
            return y.reshape(*x.shape[:-1], y.shape[-1])
        if mode != "w12":
            raise ValueError(f"linear mode {mode!r} needs the W12 mma kernel (a CUDA GPU and bf16 inputs)")
        if self._w12 is None:
            raise ValueError("a bf16 model's W12 linears take bf16 inputs (the mma kernel)")
        if self._decoded is None or self._decoded.dtype != x.dtype:
            from specpilot_kernels.w12 import decode

            self._decoded = decode(self._w12).to(x.dtype)
        return F.linear(x, self._decoded)  # the exact decoded weight (the library's CPU path; fp32 inputs)

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


class Weights:
    """Every tensor of a target (and its synthetic drafter block) for one SystemShape."""

    def __init__(self, shape: SystemShape, tensors: dict, device, dtype):
        self.shape, self.device, self.dtype = shape, torch.device(device), dtype
        self.t = tensors
        self.linears = {name: Linear(w) for name, w in tensors.items() if name.endswith(".w")}
        self._certified = None

    def lin(self, name: str) -> Linear:
        return self.linears[name]

    @property
    def head(self) -> torch.Tensor:
        # a tied head's own tensor when one is set: the fault study's head-only low-precision verify
        return self.t["head"] if "head" in self.t else self.t["embed"]

    def quantized(self, fmt: str, scope: str = "all") -> "Weights":
        """A copy whose target linears, embedding and head (``scope`` "all") or only the head ("head") are rounded
        to ``fmt`` (``engine.model.quantize_weight``): the fault study's low-precision verify pass."""
        from specpilot_mem.engine.model import quantize_weight

        t = dict(self.t)
        t["head"] = quantize_weight(self.head, fmt)
        if scope == "all":
            for name, w in self.t.items():
                if name.endswith(".w") and name.startswith("layers."):
                    t[name] = quantize_weight(w, fmt)
            t["embed"] = quantize_weight(self.t["embed"], fmt)
        return Weights(self.shape, t, self.device, self.dtype)

    def head_linear(self) -> Linear:
        if "head.w" not in self.linears:
            self.linears["head.w"] = Linear(self.head)
        return self.linears["head.w"]

    def certified(self):
        if self._certified is None:
            from specpilot_kernels.certified_head import quantize_head

            w = self.head.to(torch.bfloat16).contiguous()
            self._certified = quantize_head(w, exact_depth=w.shape[1])
        return self._certified

    @classmethod
    def synthetic(cls, shape: SystemShape, device, dtype=torch.bfloat16, seed: int = 0) -> "Weights":
        """Seeded N(0, 0.02) weights made directly on ``device`` (25 B parameters never pass through the host)."""
        device = torch.device(device)
        gen = torch.Generator(device=device).manual_seed(seed)

        def normal(*size, std=0.02):  # a BF16 checkpoint's values, whatever dtype the engine runs in
            return (torch.randn(*size, generator=gen, device=device, dtype=torch.float32) * std).bfloat16().to(dtype)

        def ones(n):
            return torch.ones(n, device=device, dtype=dtype)

        s, lin = shape, shape.linear_shapes()
        t = {"embed": normal(s.vocab_size, s.d_model), "final_norm": ones(s.d_model)}
        if not s.tied_head:
            t["head"] = normal(s.vocab_size, s.d_model)
        for i, kind in enumerate(s.layer_types):
            p = f"layers.{i}."
            t[p + "norm1"], t[p + "norm2"] = ones(s.d_model), ones(s.d_model)
            for name in s.layer_linears(kind):
                t[p + name + ".w"] = normal(*lin[name])
            if kind == "gdn":
                hv = s.gdn_value_heads
                t[p + "conv"] = normal(s.gdn_conv_channels, s.conv_size, std=0.5)
                t[p + "A_log"] = torch.log(torch.rand(hv, generator=gen, device=device) * 15 + 1)
                t[p + "dt_bias"] = torch.rand(hv, generator=gen, device=device) * 0.5 - 4.0
                t[p + "out_norm"] = ones(s.gdn_head_dim)
            elif s.qk_norm:
                t[p + "q_norm"], t[p + "k_norm"] = ones(s.attn_head_dim), ones(s.attn_head_dim)
        for i in range(s.drafter_layers):
            p = f"drafter.{i}."
            t[p + "norm1"], t[p + "norm2"] = ones(s.d_model), ones(s.d_model)
            for name in ("attn_qkv", "attn_out", "gate_up", "down"):
                t[p + name + ".w"] = normal(*lin[name])
            if s.qk_norm:
                t[p + "q_norm"], t[p + "k_norm"] = ones(s.attn_head_dim), ones(s.attn_head_dim)
        t["drafter.norm"] = ones(s.d_model)
        return cls(shape, t, device, dtype)

    @classmethod
    def from_target(cls, target) -> tuple[SystemShape, "Weights"]:
        """The trained pair's target (``specpilot_mem.engine.model.HybridTarget``) as system weights (same tensors)."""
        cfg = target.cfg
        shape = SystemShape(
            name="trained-pair",
            d_model=cfg.d_model,
            layer_types=tuple(cfg.layer_types),
            ffn_dim=cfg.ffn_dim,
            vocab_size=cfg.vocab_size,
            gdn_key_heads=cfg.gdn_heads,
            gdn_value_heads=cfg.gdn_heads,
            gdn_head_dim=cfg.gdn_head_dim,
            conv_size=cfg.conv_size,
            attn_heads=cfg.attn_heads,
            attn_kv_heads=cfg.attn_kv_heads,
            attn_head_dim=cfg.attn_head_dim,
            tied_head=True,
            rope_theta=cfg.rope_theta,
            norm_eps=cfg.norm_eps,
            drafter_layers=0,
            synthetic=False,
        )
        p0 = next(target.parameters())
        t = {"embed": target.embed.weight.data, "final_norm": target.norm.weight.data}
        for i, block in enumerate(target.blocks):
            p, m = f"layers.{i}.", block.mixer
            t[p + "norm1"], t[p + "norm2"] = block.norm_mixer.weight.data, block.norm_mlp.weight.data
            t[p + "gate_up.w"], t[p + "down.w"] = block.mlp.gate_up.weight.data, block.mlp.down.weight.data
            if block.kind == "gdn":
                t[p + "gdn_in.w"] = torch.cat([m.qkv.weight, m.z.weight, m.ab.weight]).data
                t[p + "gdn_out.w"] = m.out.weight.data
                t[p + "conv"] = m.conv_weight.data
                t[p + "A_log"], t[p + "dt_bias"] = m.A_log.data.float(), m.dt_bias.data.float()
                t[p + "out_norm"] = m.out_norm.weight.data
            else:
                t[p + "attn_qkv.w"] = torch.cat([m.q.weight, m.kv.weight]).data
                t[p + "attn_out.w"] = m.out.weight.data
                t[p + "q_norm"], t[p + "k_norm"] = m.q_norm.weight.data, m.k_norm.weight.data
        return shape, cls(shape, t, p0.device, p0.dtype)


# -- per-step inputs and per-request state ------------------------------------------------------------------------


@dataclass
class StepBuffers:
    """One bucket's static inputs (device tensors, filled by ``fill`` before each replay).

    tokens [B, T] long; parents [B, T] long (-1: the root, the request's pending token); depth [B, T] long;
    anc [B, T, T] bool (ancestor-or-self); conv_idx [B, T, conv_size] long (each row's conv window as indices
    into cat(conv state, rows)); num_nodes [B] int32 (real rows, the rest padding); slots32 [B] int32 (request b
    uses cache slot b: the kernels' state indices); active [B] bool (inactive slots commit nothing); forced [B] long
    (>= 0: accept the root path to that node whatever the target says; the benchmark's fixed acceptance); out_len [B]
    long (output tokens each request has, the pending one included: row i predicts output out_len + depth[i]; the
    injected fault's trigger).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    anc: torch.Tensor
    conv_idx: torch.Tensor
    num_nodes: torch.Tensor
    slots32: torch.Tensor
    active: torch.Tensor
    forced: torch.Tensor
    out_len: torch.Tensor

    @classmethod
    def empty(cls, B: int, T: int, conv_size: int, device) -> "StepBuffers":
        z = dict(device=device, dtype=torch.long)
        return cls(
            torch.zeros(B, T, **z),
            torch.full((B, T), -1, **z),
            torch.zeros(B, T, **z),
            torch.zeros(B, T, T, dtype=torch.bool, device=device),
            torch.zeros(B, T, conv_size, **z),
            torch.ones(B, dtype=torch.int32, device=device),
            torch.arange(B, dtype=torch.int32, device=device),
            torch.ones(B, dtype=torch.bool, device=device),
            torch.full((B,), -1, **z),
            torch.zeros(B, **z),
        )

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.tokens.shape)

    def fill(self, packed: dict) -> None:
        for name, value in packed.items():
            getattr(self, name).copy_(torch.as_tensor(value), non_blocking=True)


def pack_trees(trees: list[tuple[list[int], list[int]]], T: int, conv_size: int) -> dict:
    """Host arrays of B trees (tokens, parents with -1 for the root), each padded to T rows as a chain after its
    last node (padding is computed and never accepted)."""
    B = len(trees)
    tokens = np.zeros((B, T), np.int64)
    parents = np.full((B, T), -1, np.int64)
    depth = np.zeros((B, T), np.int64)
    anc = np.zeros((B, T, T), bool)
    conv_idx = np.zeros((B, T, conv_size), np.int64)
    num = np.zeros(B, np.int32)
    for b, (toks, pars) in enumerate(trees):
        n = len(toks)
        if n > T:
            raise ValueError(f"tree {b} has {n} rows, the bucket {T}")
        num[b] = n
        full_p = list(pars) + [i - 1 for i in range(n, T)]
        tokens[b, :n] = toks
        for i, p in enumerate(full_p):
            if p >= i:
                raise ValueError(f"tree {b}: row {i} has parent {p}; parents must precede children")
            parents[b, i] = p
            if p >= 0:
                anc[b, i] = anc[b, p]
                depth[b, i] = depth[b, p] + 1
            anc[b, i, i] = True
            node, beyond = i, 0
            for t in range(conv_size - 1, -1, -1):
                if node >= 0:
                    conv_idx[b, i, t] = (conv_size - 1) + node
                    node = full_p[node]
                else:
                    beyond += 1
                    conv_idx[b, i, t] = (conv_size - 1) - beyond
    return {"tokens": tokens, "parents": parents, "depth": depth, "anc": anc, "conv_idx": conv_idx, "num_nodes": num}


@dataclass
class Segment:
    """A prompt segment riding in a step's forward (prompt admission): ``buf`` [1, S] holds a chain of the next S
    prompt tokens of one request, forced to be accepted whole (``forced`` S - 1, ``out_len`` as a prefill pass sets
    it), over ``caches``, that request's own slot (``Caches.view``). Its rows share the step's projection and MLP
    GEMMs; its attention and recurrence run over its slot as a chunked prefill's would (no fault options, the state
    advanced in place), and the commit keeps all S rows. ``tag`` keeps its scratch buffers apart from the step's."""

    buf: StepBuffers
    caches: "Caches"
    tag: int = 1
    saved: dict = field(default_factory=dict)
    ctx: dict | None = None
    feats: torch.Tensor | None = None


class Caches:
    """Per-request state for ``slots`` requests: attention KV [slots, kv heads, max_len, head dim] per attention
    layer (all layers' K and V one tensor, ``kv_all`` [A, 2, slots, HKV, max_len, D]: a tree's commit moves them in
    one launch), GDN states [slots, HV, V, K] (SGLang's pool layout, fp32) and conv windows per GDN layer, lengths.

    The GDN states and conv windows of all layers are one tensor each (``state_all`` [G, slots, HV, V, K],
    ``conv_all`` [G, slots, CS-1, C], SGLang's layer-stacked mamba pool), so a step commits every layer in one
    launch; ``state[i]`` / ``conv[i]`` are layer i's views of them."""

    def __init__(self, shape: SystemShape, slots: int, max_len: int, device, dtype, feature_dim: int = 0):
        s = shape
        self.max_len = max_len
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.k, self.v = {}, {}
        self.gdn_ids = tuple(i for i, kind in enumerate(s.layer_types) if kind == "gdn")
        G, D = s.gdn_layers, s.gdn_head_dim
        self.state_all = torch.zeros(G, slots, s.gdn_value_heads, D, D, device=device)
        self.conv_all = torch.zeros(G, slots, s.conv_size - 1, s.gdn_conv_channels, device=device, dtype=dtype)
        attn_ids = [i for i, kind in enumerate(s.layer_types) if kind == "attn"]
        self.kv_all = torch.zeros(
            len(attn_ids), 2, slots, s.attn_kv_heads, max_len, s.attn_head_dim, device=device, dtype=dtype
        )
        self.k = {i: self.kv_all[a, 0] for a, i in enumerate(attn_ids)}
        self.v = {i: self.kv_all[a, 1] for a, i in enumerate(attn_ids)}
        self._gdn_views()
        self.features = torch.zeros(slots, max_len, feature_dim, device=device, dtype=dtype) if feature_dim else None

    def view(self, first: int, count: int = 1) -> "Caches":
        """Slots first .. first + count - 1 as a Caches of their own (views: writes land in this one)."""
        part = object.__new__(Caches)
        part.max_len = self.max_len
        rows = slice(first, first + count)
        part.lengths = self.lengths[rows]
        part.kv_all = self.kv_all[:, :, rows]
        part.k, part.v = {i: t[rows] for i, t in self.k.items()}, {i: t[rows] for i, t in self.v.items()}
        part.gdn_ids = self.gdn_ids
        part.state_all, part.conv_all = self.state_all[:, rows], self.conv_all[:, rows]
        part._gdn_views()
        part.features = self.features[rows] if self.features is not None else None
        return part

    def _gdn_views(self) -> None:
        self.state = {i: self.state_all[g] for g, i in enumerate(self.gdn_ids)}
        self.conv = {i: self.conv_all[g] for g, i in enumerate(self.gdn_ids)}

    def reset(self, slot: int | None = None) -> None:
        where = slice(None) if slot is None else slot
        self.lengths[where] = 0
        for buf in (*self.state.values(), *self.conv.values()):
            buf[where] = 0

    def randomize(self, context: int, seed: int = 0) -> None:
        """Synthetic context for timing: ``context`` tokens' worth of random KV, states and conv windows."""
        gen = torch.Generator(device=self.lengths.device).manual_seed(seed)
        for buf in (*self.k.values(), *self.v.values(), *self.conv.values()):
            buf.normal_(0, 1, generator=gen)
        for buf in self.state.values():
            buf.normal_(0, 0.05, generator=gen)
        self.lengths.fill_(context)


# -- the model ---------------------------------------------------------------------------------------------------


class SystemModel:
    """The target's verify pass, the acceptance walk and the commit, over StepBuffers and Caches."""

    def __init__(self, weights: Weights, options: SystemOptions, feature_layers: tuple[int, ...] = ()):
        self.w, self.shape = weights, weights.shape
        self.options = options.validate(self.shape)
        self.device, self.dtype = weights.device, weights.dtype
        self.feature_layers = tuple(feature_layers)
        self.mode = options.linears
        self._gdn_index = {i: g for g, i in enumerate(i for i, k in enumerate(self.shape.layer_types) if k == "gdn")}
        self._inter: dict = {}  # per (B, T): every GDN layer's state snapshots [G, B, T, HV, V, K] (stock verify)
        self._raw: dict = {}  # per (B, T): every GDN layer's conv inputs of the rows [G, B, T, C] (the conv commit)
        self._indices: dict = {}  # per (B, T): SGLang's kernel's cu_seqlens and snapshot indices
        self._rope: dict = {}  # per (device, T): RoPE's inverse frequencies and the rows' offsets
        self._fallback = None
        self._graphs: dict = {}
        self._stream = None
        self.graph_error: str | None = None

    def with_options(self, options: SystemOptions) -> "SystemModel":
        return SystemModel(self.w, options, self.feature_layers)

    # -- layers -----------------------------------------------------------------------------------------------

    def _gdn(
        self, i, h, buf: StepBuffers, caches: Caches, ar: bool, saved: dict, write_cache: bool, mode: str, segments=()
    ):
        """Layer i's GDN mixer over the step's rows and, after them in ``h``, each prompt segment's (``Segment``): the
        projections are one GEMM over all rows; the conv and the recurrence run per part, over its own cache."""
        p = f"layers.{i}."
        proj = self.w.lin(p + "gdn_in.w")(h, mode)
        parts = [self._gdn_mix(i, proj, buf, caches, "ar" if ar else self.options.gdn_verify, saved, write_cache)]
        offset = buf.tokens.numel()
        for seg in segments:
            parts.append(
                self._gdn_mix(i, proj[offset:], seg.buf, seg.caches, "snapshot", seg.saved, write_cache, seg.tag)
            )
            offset += seg.buf.tokens.numel()
        o = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self.w.lin(p + "gdn_out.w")(o, mode)

    def _gdn_mix(
        self, i, proj, buf: StepBuffers, caches: Caches, kind: str, saved: dict, write_cache: bool, tag: int = 0
    ):
        """The conv, the recurrence and the gated norm of one part's rows (the first B*T rows of ``proj``). kind:
        "ar" advances the state in place (SGLang's decode), "snapshot" writes a state per row (stock verify; a prompt
        segment's rows, as the decoder's prefill pass writes them, padding included), "path" SpecPilot's path verify."""
        s, t = self.shape, self.w.t
        p = f"layers.{i}."
        B, T = buf.shape
        H, HV, D, C = s.gdn_key_heads, s.gdn_value_heads, s.gdn_head_dim, s.gdn_conv_channels
        qkv, z, ab = proj[: B * T].view(B, T, -1).split([C, HV * D, 2 * HV], dim=-1)
        # the conv reads qkv inside the projection and keeps a copy of it for the commit (a write pass only)
        raw = self._raw_inputs(B, T, tag)[self._gdn_index[i]] if write_cache else None
        mixed = tree_conv_silu(caches.conv[i][:B], qkv, buf.conv_idx, t[p + "conv"], raw=raw)
        # views, as SGLang's backend passes them: its kernel reads q, k, v, a, b through their token strides
        q, k, v = mixed.split([H * D, H * D, HV * D], dim=-1)
        q, k, v = q.view(B, T, H, D), k.view(B, T, H, D), v.view(B, T, HV, D)
        a, b = ab.split([HV, HV], dim=-1)
        A_log, dt_bias = t[p + "A_log"], t[p + "dt_bias"]
        pool, slots32 = caches.state[i], buf.slots32
        if kind == "ar":  # SGLang's decode: one token per request, state advanced in place
            o = self._sglang(q, k, v, a, b, A_log, dt_bias, pool, slots32, None, None, update=write_cache)
        elif kind == "snapshot":
            inter = self._snapshots(i, B, T, tag)
            o = self._sglang(q, k, v, a, b, A_log, dt_bias, pool, slots32, inter, buf.parents)
        else:
            q, k, v, a, b = self._path_inputs(q, k, v, a, b)
            o = self._path_verify(q, k, v, a, b, A_log, dt_bias, pool, slots32, saved["schedule"])
            saved[i] = (q, k, v, a, b)
        o = gated_rms_norm(o.to(proj.dtype), t[p + "out_norm"], z.view(B, T, HV, D), s.norm_eps)
        return o.reshape(B * T, HV * D)

    @staticmethod
    def _path_inputs(q, k, v, a, b):
        """The path kernels' contiguous inputs from the strided views: one copy launch each, none where the view is
        contiguous already (one request's one-row step). ``torch.split_with_sizes_copy`` is no cheaper: without
        ``out=`` it clones each split (one launch apiece), and at one row it copies what needs no copy."""
        return tuple(x.contiguous() for x in (q, k, v, a, b))

    @staticmethod
    def _commit_indices(accepted, accept_len):
        """The accepted path as the path commit's int32 (cast once a step: ``gdn_tree_commit`` casts whatever it
        gets: two launches in every GDN layer's call when handed tree_accept's int64)."""
        return accepted.to(torch.int32).contiguous(), accept_len.to(torch.int32).contiguous()

    @staticmethod
    def _key(B, T, tag: int):
        """A part's scratch key: the bucket, and for a prompt segment its ``tag`` (the parts of one pass never share)."""
        return (B, T) if tag == 0 else (B, T, tag)

    def _snapshot_buffer(self, B, T, tag: int = 0):
        """Every GDN layer's state snapshots of a part's rows (one tensor: one commit launch)."""
        key = self._key(B, T, tag)
        if key not in self._inter:
            s = self.shape
            D = s.gdn_head_dim
            self._inter[key] = torch.empty(s.gdn_layers, B, T, s.gdn_value_heads, D, D, device=self.device)
        return self._inter[key]

    def _snapshots(self, i, B, T, tag: int = 0):
        """Layer i's view of the part's snapshot buffer."""
        return self._snapshot_buffer(B, T, tag)[self._gdn_index[i]]

    def _raw_inputs(self, B, T, tag: int = 0):
        """Every GDN layer's conv inputs of a part's rows."""
        key = self._key(B, T, tag)
        if key not in self._raw:
            s = self.shape
            self._raw[key] = torch.empty(s.gdn_layers, B, T, s.gdn_conv_channels, device=self.device, dtype=self.dtype)
        return self._raw[key]

    def _sglang_indices(self, B, T, device):
        """cu_seqlens and snapshot indices of a bucket, made once (not two arange launches per layer and step)."""
        if (B, T) not in self._indices:
            self._indices[B, T] = (
                torch.arange(0, B * T + 1, T, dtype=torch.int32, device=device),
                torch.arange(B, dtype=torch.int32, device=device),
            )
        return self._indices[B, T]

    def _sglang(self, q, k, v, a, b, A_log, dt_bias, pool, slots, inter, parents, update=False):
        """SGLang's kernel as its GDN backend calls it (target verify with snapshots, or decode)."""
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        if q.is_cuda:
            from specpilot_mem.engine.sglang_kernels import fused_recurrent

            tree = parents if (parents is not None and self.options.tree != "chain") else None
            cu_seqlens, inter_idx = self._sglang_indices(B, T, q.device)
            o = fused_recurrent()(
                A_log=A_log,
                a=a.view(B * T, HV),
                dt_bias=dt_bias,
                softplus_beta=1.0,
                softplus_threshold=20.0,
                q=q.view(1, B * T, H, K),
                k=k.view(1, B * T, H, K),
                v=v.view(1, B * T, HV, V),
                b=b.view(B * T, HV),
                initial_state_source=pool,
                initial_state_indices=slots,
                use_qk_l2norm_in_kernel=True,
                cu_seqlens=cu_seqlens,
                disable_state_update=inter is not None or not update,
                intermediate_states_buffer=inter,
                intermediate_state_indices=inter_idx if inter is not None else None,
                cache_steps=T if inter is not None else None,
                retrieve_parent_token=tree.to(torch.int32) if tree is not None else None,
            )
            return o.view(B, T, HV, V)
        return _snapshot_reference(q, k, v, a, b, A_log, dt_bias, pool, slots, inter, parents, update)

    def _path_verify(self, q, k, v, a, b, A_log, dt_bias, pool, slots, schedule):
        from specpilot_kernels.gdn_tree import gdn_tree_path_verify
        from specpilot_kernels.gdn_tree import reference as R

        if q.is_cuda or interpreting():
            extra = {} if q.is_cuda else {"block_v": v.shape[-1], "lanes_per_column": None}
            return gdn_tree_path_verify(q, k, v, a, b, A_log, dt_bias, pool, slots, schedule[0], **extra)
        return R.path_verify_reference(q, k, v, a, b, A_log, dt_bias, pool, slots, schedule[1], schedule[2])

    def _attn_context(self, buf: StepBuffers, caches: Caches | None, write_cache: bool, prompt: bool = False) -> dict:
        """What every attention layer of one pass shares, computed once per pass: RoPE's cos/sin at each row's
        position, the cache slots the rows write, the cache lengths they see and their ancestor mask. ``prompt``: a
        prompt segment's rows, which no fault option touches (a prefill pass's)."""
        B, T = buf.shape
        dev = buf.tokens.device
        inv, steps = self._rope_constants(dev, T)
        if caches is None:  # the drafter's block: bidirectional over its own rows
            ang = buf.depth.float()[..., None] * inv
            full = torch.ones(B, T, T, dtype=torch.bool, device=dev)
            return {"cos": ang.cos(), "sin": ang.sin(), "lengths": None, "anc": full, "slots": None, "window": 0}
        L = caches.max_len
        lengths = caches.lengths[:B]
        offset, window = (0, 0) if prompt else (self.options.rope_offset, self.options.attn_window)
        pos = lengths[:, None] + buf.depth
        ang = (pos + offset if offset else pos).float()[..., None] * inv
        # attn_window (the context fault): only the last attn_window committed tokens are seen (0: all)
        ctx = {
            "cos": ang.cos(),
            "sin": ang.sin(),
            "lengths": lengths,
            "anc": buf.anc,
            "window": window,
        }
        # clamped so that no write can leave the cache (callers keep lengths + T <= max_len; see SystemDecoder)
        ctx["slots"] = (lengths[:, None] + steps).clamp(max=L - 1) if write_cache else None
        return ctx

    def _rope_constants(self, device, T: int):
        """RoPE's inverse frequencies and arange(T), made once per (device, T) and not by four launches a step
        (the same values: the same torch ops, run once)."""
        key = (device, T)
        if key not in self._rope:
            D = self.shape.attn_head_dim
            inv = 1.0 / (self.shape.rope_theta ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
            self._rope[key] = (inv, torch.arange(T, device=device))
        return self._rope[key]

    def _attn(
        self,
        i,
        h,
        buf: StepBuffers,
        caches: Caches | None,
        write_cache: bool,
        ctx: dict,
        prefix: str = "layers",
        mode: str | None = None,
        segments=(),
    ):
        """Layer i's attention over the step's rows and, after them in ``h``, each prompt segment's: the projections
        are one GEMM over all rows; RoPE, the cache write and the attention run per part, over its own cache."""
        p = f"{prefix}.{i}."
        mode = mode or self.mode
        proj = self.w.lin(p + "attn_qkv.w")(h, mode)
        parts = [self._attn_mix(i, proj, buf, caches, ctx, p)]
        offset = buf.tokens.numel()
        for seg in segments:
            parts.append(self._attn_mix(i, proj[offset:], seg.buf, seg.caches, seg.ctx, p))
            offset += seg.buf.tokens.numel()
        o = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self.w.lin(p + "attn_out.w")(o, mode)

    def _attn_mix(self, i, proj, buf: StepBuffers, caches: Caches | None, ctx: dict, p: str):
        """q/k norms, RoPE, the cache write and the tree attention of one part's rows (the first B*T of ``proj``)."""
        s, t = self.shape, self.w.t
        B, T = buf.shape
        hq, hkv, D = s.attn_heads, s.attn_kv_heads, s.attn_head_dim
        sizes = [hq * D] * (2 if s.attn_output_gate else 1) + [hkv * D, hkv * D]
        parts = proj[: B * T].view(B, T, -1).split(sizes, dim=-1)
        q, k, v = parts[0].view(B, T, hq, D), parts[-2].view(B, T, hkv, D), parts[-1].view(B, T, hkv, D)
        norms = (t[p + "q_norm"], t[p + "k_norm"]) if s.qk_norm else (None, None)
        kc = vc = None
        if caches is not None:
            kc, vc = caches.k[i][:B], caches.v[i][:B]
        # one launch: q/k norms, RoPE at length + depth, the rows' K/V written at length + i (a write pass only);
        # the attention then reads the cache's first `length` keys and the rows' own keys beside it
        write = ctx["slots"] is not None
        q, k, v = qk_norm_rope(
            q,
            k,
            v,
            ctx["cos"],
            ctx["sin"],
            *norms,
            s.norm_eps,
            kc if write else None,
            vc if write else None,
            ctx["slots"],
        )
        gate = parts[1] if s.attn_output_gate else None
        o = verify_attention(q, kc, vc, k, v, ctx["lengths"], ctx["anc"], gate, window=ctx["window"])
        return o.reshape(B * T, hq * D)

    def _mlp(self, p, h, mode: str | None = None):
        mode = mode or self.mode
        return self.w.lin(p + "down.w")(silu_mul(self.w.lin(p + "gate_up.w")(h, mode)), mode)

    def draft(self, buf: StepBuffers, positions: int, top_k: int = 8):
        """The synthetic block drafter's pass (timing at the paper's shapes): BF16 dense layers over each request's
        block (anchor + masked positions, ``buf.tokens`` [B, S], bidirectional), then the target's LM head on the
        drafted positions and their top-k (``top_k=1``: each position's argmax, all a greedy chain needs, as
        SGLang's DFlash takes it). Returns (top-k ids, top-k logits), each [B, positions, top_k]."""
        s, t = self.shape, self.w.t
        B, S = buf.shape
        x = F.embedding(buf.tokens.view(-1), t["embed"])
        ctx = self._attn_context(buf, None, False)
        for i in range(s.drafter_layers):
            p = f"drafter.{i}."
            x = x + self._attn(i, rms_norm(x, t[p + "norm1"], s.norm_eps), buf, None, False, ctx, "drafter", "bf16")
            x = x + self._mlp(p, rms_norm(x, t[p + "norm2"], s.norm_eps), "bf16")
        h = rms_norm(x, t["drafter.norm"], s.norm_eps).view(B, S, -1)[:, 1 : positions + 1].reshape(B * positions, -1)
        logits = self.w.head_linear()(h, "w12") if self.options.lm_head == "w12" else h @ self.w.head.t()
        if top_k == 1:
            top = logits.view(B, positions, -1).max(dim=-1, keepdim=True)
            return top.indices, top.values
        values, indices = row_topk(logits.contiguous(), top_k)
        return indices.view(B, positions, top_k), values.view(B, positions, top_k)

    # -- the pass ---------------------------------------------------------------------------------------------

    def forward(
        self,
        buf: StepBuffers,
        caches: Caches,
        ar: bool = False,
        write_cache: bool = True,
        linear_mode: str | None = None,
        segments: tuple[Segment, ...] | list[Segment] = (),
    ):
        """Final hidden [B*T (+ the segments' rows), d], drafter features [B, T, F] (or None) and each GDN layer's
        saved inputs.

        Hooks: ``linear_mode`` runs every target linear in another mode (``Linear.__call__``; "q8_midpoint": the W12
        kernel over the 8-bit view, the TLV Q pass); ``write_cache=False`` leaves KV, GDN states and conv windows as
        they are (the rows see the cache and each other, nothing is stored), so a Q pass can precede the exact pass of
        the same rows; ``segments``: prompt segments whose rows join every GEMM of the pass (``Segment``; their
        features go to ``Segment.feats``)."""
        mode = linear_mode or self.mode
        s, t = self.shape, self.w.t
        B, T = buf.shape
        tokens = [buf.tokens.view(-1)] + [seg.buf.tokens.view(-1) for seg in segments]
        x = F.embedding(tokens[0] if len(tokens) == 1 else torch.cat(tokens), t["embed"])
        saved: dict = {}
        if s.gdn_layers and not ar and self.options.gdn_verify == "path":
            from specpilot_kernels.gdn_tree import tree_schedule

            kernels = buf.tokens.is_cuda or interpreting()
            saved["schedule"] = (
                tree_schedule(buf.parents, buf.num_nodes) if kernels else None,
                buf.parents,
                buf.num_nodes,
            )
        feats, seg_feats = [], [[] for _ in segments]
        ctx = self._attn_context(buf, caches, write_cache) if s.attn_layers else None
        for seg in segments:
            seg.ctx = self._attn_context(seg.buf, seg.caches, write_cache, prompt=True) if s.attn_layers else None
        h = rms_norm(x, t["layers.0.norm1"], s.norm_eps)
        for i, kind in enumerate(s.layer_types):
            p = f"layers.{i}."
            out = (
                self._gdn(i, h, buf, caches, ar, saved, write_cache, mode, segments)
                if kind == "gdn"
                else self._attn(i, h, buf, caches, write_cache, ctx, mode=mode, segments=segments)
            )
            x, h = add_rms_norm(x, out, t[p + "norm2"], s.norm_eps)
            # the residual add and the next norm (the next layer's, or the final one) in one launch
            following = f"layers.{i + 1}.norm1" if i + 1 < s.n_layers else "final_norm"
            x, h = add_rms_norm(x, self._mlp(p, h, mode), t[following], s.norm_eps)
            if i in self.feature_layers:
                feats.append(x[: B * T].view(B, T, -1))
                offset = B * T
                for seg, mine in zip(segments, seg_feats):
                    S = seg.buf.tokens.numel()
                    mine.append(x[offset : offset + S].view(1, S, -1))
                    offset += S
        for seg, mine in zip(segments, seg_feats):
            seg.feats = torch.cat(mine, dim=-1) if mine else None
        return h, (torch.cat(feats, dim=-1) if feats else None), saved

    def head_argmax(
        self,
        hidden: torch.Tensor,
        mode: str | None = None,
        predicted_index: torch.Tensor | None = None,
        flips: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The LM head's greedy token per row of hidden [M, d] -> [M] long. ``predicted_index`` [M]: the output
        index each row predicts (the injected fault's trigger, when the options switch it on). ``flips`` [B, L]
        bool: per request (rows are B blocks of M / B) the output indices whose prediction is the runner-up."""
        mode = mode or self.options.lm_head
        if mode in ("bf16", "w12"):
            logits = hidden @ self.w.head.t() if mode == "bf16" else self.w.head_linear()(hidden, "w12")
            logits = self._fault(logits, predicted_index)
            if flips is None or predicted_index is None:
                return row_argmax(logits.contiguous())
            top2 = logits.topk(2, dim=-1).indices
            slot = torch.arange(logits.shape[0], device=logits.device) // (logits.shape[0] // flips.shape[0])
            flip = flips[slot, predicted_index.clamp(0, flips.shape[1] - 1)]
            return torch.where(flip, top2[:, 1], top2[:, 0])
        from specpilot_kernels.certified_head import certified_argmax_in_graph

        head = self.w.certified()
        if self._fallback is None:
            self._fallback = torch.empty(32, self.shape.vocab_size, device=self.device)
        x = hidden.to(torch.bfloat16).contiguous()
        return torch.cat(
            [
                certified_argmax_in_graph(x[r : r + 32], head, self._fallback, max_survivors=self.options.max_survivors)
                for r in range(0, x.shape[0], 32)
            ]
        )

    def _fault(self, logits: torch.Tensor, predicted_index: torch.Tensor | None) -> torch.Tensor:
        """The §6.2 fault: +fault_bias on every fault_stride-th vocabulary id for output indices >= fault_after."""
        opts = self.options
        if opts.fault_after < 0 or predicted_index is None:
            return logits
        hit = (predicted_index >= opts.fault_after).to(logits.dtype)[:, None]
        bias = torch.zeros(logits.shape[-1], device=logits.device, dtype=logits.dtype)
        bias[:: opts.fault_stride] = opts.fault_bias
        return logits + hit * bias

    def accept(self, buf: StepBuffers, pred: torch.Tensor):
        """The accepted root path of each tree, on the device. pred [B, T] (the target's token after each row).

        Returns (accepted [B, T] node indices root first, accept_len [B], deepest [B], out_tokens [B, T]: the
        tokens this step commits, the accepted drafted ones then the target's next); one launch on a GPU
        (``fused_ops.tree_accept``)."""
        return tree_accept(
            buf.tokens, buf.parents, buf.depth, buf.anc, buf.num_nodes, buf.forced, buf.active, pred.contiguous()
        )

    def commit(
        self,
        buf: StepBuffers,
        caches: Caches,
        saved: dict,
        feats,
        accepted,
        accept_len,
        deepest,
        ar: bool = False,
        tag: int = 0,
    ):
        """Keep each request's accepted path: KV moved to consecutive slots, GDN states and conv windows advanced,
        features written, lengths grown (by 0 for inactive requests). ``tag`` > 0: a prompt segment's part (its
        rows one chain: no KV move, its states from its own snapshots, as the decoder's prefill pass commits)."""
        B, T = buf.shape
        dev = accepted.device
        lengths = caches.lengths[:B]
        if self.options.tree != "chain" and not ar and not tag and caches.k:
            commit_kv_rows(caches.kv_all[:, :, :B], lengths, accepted, accept_len)  # every attention layer, K and V
        if caches.state:
            keep = accept_len > 0
            # every GDN layer at once: the accepted row's conv window (the last conv_size - 1 inputs along its root
            # path), and in stock the accepted position's state snapshot (SGLang's one index copy over its
            # layer-stacked pool); the decode kernel advanced AR's states already, path verify replays per layer
            conv_commit(caches.conv_all[:, :B], self._raw_inputs(B, T, tag), buf.conv_idx, deepest, keep)
            if not ar and (tag or self.options.gdn_verify == "snapshot"):
                select_states(caches.state_all[:, :B], self._snapshot_buffer(B, T, tag), deepest, keep)
            elif not ar:
                path, length = self._commit_indices(accepted, accept_len)
                for i in caches.state:
                    q, k, v, a, b = saved[i]
                    self._commit_path(i, q, k, v, a, b, caches.state[i][:B], buf.slots32, path, length)
        if caches.features is not None and feats is not None:
            steps = torch.arange(T, device=dev)[None, :]
            src = torch.where(steps < accept_len[:, None], accepted, steps)
            bidx = torch.arange(B, device=dev)[:, None]
            caches.features[:B][bidx, (lengths[:, None] + steps).clamp(max=caches.max_len - 1)] = feats.gather(
                1, src[..., None].expand(B, T, feats.shape[-1])
            )
        caches.lengths[:B] = lengths + accept_len

    def _commit_path(self, i, q, k, v, a, b, pool, slots, accepted, accept_len):
        from specpilot_kernels.gdn_tree import gdn_tree_commit
        from specpilot_kernels.gdn_tree import reference as R

        t, p = self.w.t, f"layers.{i}."
        if q.is_cuda or interpreting():
            extra = {} if q.is_cuda else {"block_v": v.shape[-1], "lanes_per_column": None}
            gdn_tree_commit(q, k, v, a, b, t[p + "A_log"], t[p + "dt_bias"], pool, slots, accepted, accept_len, **extra)
        else:
            pool.copy_(
                R.commit_reference(k, v, a, b, t[p + "A_log"], t[p + "dt_bias"], pool, slots, accepted, accept_len)
            )

    def step(self, buf: StepBuffers, caches: Caches, ar: bool = False, flips: torch.Tensor | None = None):
        """One whole step: verify, accept, commit. Returns (out_tokens [B, T], accept_len [B]). ``flips``: the flip
        fault's table (``head_argmax``), a static [B, L] buffer."""
        B, T = buf.shape
        hidden, feats, saved = self.forward(buf, caches, ar=ar)
        index = (buf.out_len[:, None] + buf.depth).view(-1)
        pred = self.head_argmax(hidden, predicted_index=index, flips=flips).view(B, T)
        accepted, accept_len, deepest, out = self.accept(buf, pred)
        self.commit(buf, caches, saved, feats, accepted, accept_len, deepest, ar=ar)
        return out, accept_len

    def step_with_segments(
        self, buf: StepBuffers, caches: Caches, segments: list[tuple[StepBuffers, Caches]], ar: bool = False
    ):
        """One step with prompt segments in its forward (prompt admission): ``step``'s verify, accept and commit of
        ``buf``, and each (segment buffers [1, S], that request's one-slot caches) committed whole, as a chunked
        prefill pass of those S rows would commit them. Returns (out_tokens [B, T], accept_len [B], and per segment
        its out tokens [1, S]: the last one is the target's token after the segment, the first output token when the
        segment ends its prompt)."""
        B, T = buf.shape
        parts = [Segment(seg_buf, seg_caches, tag=k + 1) for k, (seg_buf, seg_caches) in enumerate(segments)]
        hidden, feats, saved = self.forward(buf, caches, ar=ar, segments=parts)
        index = torch.cat([(b.out_len[:, None] + b.depth).view(-1) for b in [buf] + [seg.buf for seg in parts]])
        pred = self.head_argmax(hidden, predicted_index=index)
        accepted, accept_len, deepest, out = self.accept(buf, pred[: B * T].view(B, T))
        self.commit(buf, caches, saved, feats, accepted, accept_len, deepest, ar=ar)
        offset, seg_out = B * T, []
        for seg in parts:
            S = seg.buf.tokens.numel()
            acc, length, deep, tokens = self.accept(seg.buf, pred[offset : offset + S].view(1, S))
            self.commit(seg.buf, seg.caches, seg.saved, seg.feats, acc, length, deep, tag=seg.tag)
            seg_out.append(tokens)
            offset += S
        return out, accept_len, seg_out

    # -- CUDA graphs ------------------------------------------------------------------------------------------

    def release_buffers(self) -> None:
        """Drop the captured graphs and the per-bucket snapshot buffers (their memory goes back to the allocator)."""
        self._graphs.clear()
        self._inter.clear()
        self._raw.clear()

    def graphed(self, key, fn):
        """``fn()``, as a CUDA graph captured under ``key`` and replayed on later calls; eager on a CPU, or when
        capture failed (``graph_error`` says why). ``fn`` must read only static buffers.

        The first call runs ``fn`` once eagerly — that run is the call's result (kernel builds, W12 conversion and
        workspaces happen in it) — and then captures it; capturing executes nothing, so a step that commits
        state commits exactly once per call."""
        if self.device.type != "cuda" or not self.options.cuda_graphs or self.graph_error:
            return fn()
        if key in self._graphs:
            graph, out = self._graphs[key]
            graph.replay()
            return out
        with _CAPTURE_LOCK, torch.cuda.device(self.device):
            if self._stream is None:
                self._stream = torch.cuda.Stream(self.device)
            side, main = self._stream, torch.cuda.current_stream(self.device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                result = fn()
            main.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                    out = fn()
            except RuntimeError as err:
                self.graph_error = f"{key}: {str(err)[:300]}"
                return result
            self._graphs[key] = (graph, out)
        return result


def _snapshot_reference(q, k, v, a, b, A_log, dt_bias, pool, slots, inter, parents, update):
    """SGLang's kernel's semantics in torch (CPU only: the kernel does not run in the Triton interpreter):
    outputs, each position's state snapshot into ``inter`` (tree rows from their parent's snapshot), the pool
    advanced in place when ``update`` (decode)."""
    from specpilot_kernels.gdn_tree import reference as R

    qf, kf, vf, g, beta = R._prepare(q, k, v, a, b, A_log, dt_bias, None, True, 1.0, 20.0)
    B, T = q.shape[:2]
    o = torch.zeros(v.shape, dtype=torch.float32)
    for r in range(B):
        slot = int(slots[r])
        states = []
        for i in range(T):
            parent = int(parents[r, i]) if parents is not None else i - 1
            h = pool[slot].transpose(-1, -2).float() if parent < 0 else states[parent]
            h = R.gdn_step(h, kf[r, i], vf[r, i], g[r, i], beta[r, i])
            states.append(h)
            o[r, i] = torch.einsum("hkv,hk->hv", h, qf[r, i])
            if inter is not None:
                inter[r, i] = h.transpose(-1, -2)
        if update:
            pool[slot] = states[-1].transpose(-1, -2).to(pool.dtype)
    return o.to(q.dtype)
