"""The Qwen3.5-style hybrid target: Gated DeltaNet layers and gated attention layers, SwiGLU MLPs.

Two entry points share every weight and every formula:

- ``forward_train(tokens)`` runs whole sequences (chunked GDN, causal attention) for training;
- ``forward_rows(rows, cache)`` runs R new rows against a request's cache. Rows form a draft tree
  (a chain and a prefill chunk are trees too): row i sees the committed tokens and its own ancestors.
  It writes the rows' keys/values at slots ``cache.length + i`` and returns each row's GDN end state
  and conv window; ``Cache.commit`` then keeps the accepted root path. Static shapes throughout, so
  the pass can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specpilot_mem.engine import gdn
from specpilot_mem.engine.config import TargetConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x, positions, theta: float):
    """Rotary embedding. x [B, T, H, D]; positions [T] or [B, T] (long)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.float()[..., None] * inv  # [(B,) T, D/2]
    cos, sin = ang.cos().unsqueeze(-2), ang.sin().unsqueeze(-2)
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


@dataclass
class Rows:
    """R new rows forming a tree. tokens [1, R]; depth [R] (root 0); anc [R, R] bool ancestor-or-self;
    conv_idx [R, conv_size] indices into cat(conv_state, rows) of each row's conv window; parents: host
    list (only the path reference needs it)."""

    tokens: torch.Tensor
    depth: torch.Tensor
    anc: torch.Tensor
    conv_idx: torch.Tensor
    parents: list[int]

    @property
    def count(self) -> int:
        return self.tokens.shape[1]


def make_rows(tokens: list[int], parents: list[int], conv_size: int, device) -> Rows:
    """Rows for a tree given by parent indices (-1 for the root row; parents precede children)."""
    R = len(tokens)
    anc = torch.zeros(R, R, dtype=torch.bool)
    depth = [0] * R
    conv_idx = torch.zeros(R, conv_size, dtype=torch.long)
    for i, p in enumerate(parents):
        if p >= i:
            raise ValueError(f"row {i} has parent {p}: parents must precede children")
        anc[i] = anc[p] if p >= 0 else anc[i]
        anc[i, i] = True
        depth[i] = depth[p] + 1 if p >= 0 else 0
        # Walk up conv_size-1 ancestors; past the root the window continues in the committed conv state.
        node, beyond = i, 0
        for t in range(conv_size - 1, -1, -1):
            if node >= 0:
                conv_idx[i, t] = (conv_size - 1) + node
                node = parents[node]
            else:
                beyond += 1
                conv_idx[i, t] = (conv_size - 1) - beyond
    return Rows(
        tokens=torch.tensor([tokens], dtype=torch.long, device=device),
        depth=torch.tensor(depth, dtype=torch.long, device=device),
        anc=anc.to(device),
        conv_idx=conv_idx.to(device),
        parents=list(parents),
    )


def chain_rows(tokens: list[int], conv_size: int, device) -> Rows:
    return make_rows(tokens, list(range(-1, len(tokens) - 1)), conv_size, device)


class Cache:
    """One request's decoding state: attention KV, GDN states and conv windows, drafter features."""

    def __init__(self, cfg: TargetConfig, max_len: int, device, dtype):
        self.cfg = cfg
        self.max_len = max_len
        self.length = 0
        self.length_t = torch.zeros((), dtype=torch.long, device=device)
        self.keys, self.values, self.state, self.conv = {}, {}, {}, {}
        conv_channels = 3 * cfg.gdn_heads * cfg.gdn_head_dim
        for i, kind in enumerate(cfg.layer_types):
            if kind == "attn":
                shape = (1, max_len, cfg.attn_kv_heads, cfg.attn_head_dim)
                self.keys[i] = torch.zeros(shape, device=device, dtype=dtype)
                self.values[i] = torch.zeros(shape, device=device, dtype=dtype)
            else:
                self.state[i] = torch.zeros(1, cfg.gdn_heads, cfg.gdn_head_dim, cfg.gdn_head_dim, device=device)
                self.conv[i] = torch.zeros(1, cfg.conv_size - 1, conv_channels, device=device, dtype=dtype)
        self.features = torch.zeros(max_len, cfg.feature_dim, device=device, dtype=dtype)

    def reset(self) -> None:
        self.length = 0
        self.length_t.zero_()
        for buf in (*self.state.values(), *self.conv.values()):
            buf.zero_()

    def commit(self, pending: "Pending", path: list[int]) -> None:
        """Keep the rows on ``path`` (row indices from the root, increasing) of the last forward_rows."""
        n = len(path)
        if self.length + n > self.max_len:
            raise ValueError(f"sequence exceeds the cache ({self.max_len} tokens)")
        L = self.length
        src = torch.tensor(path, dtype=torch.long, device=self.length_t.device)
        if path != list(range(n)):  # a tree path: move its keys/values to consecutive slots
            for i in self.keys:
                self.keys[i][:, L : L + n] = self.keys[i][:, L + src]
                self.values[i][:, L : L + n] = self.values[i][:, L + src]
        last = path[-1]
        for i in self.state:
            self.state[i].copy_(pending.states[i][:, :, last])
            self.conv[i].copy_(pending.conv[i][:, last])
        self.features[L : L + n] = pending.features[0, src]
        self.length += n
        self.length_t.fill_(self.length)


@dataclass
class Pending:
    """Per-row results of forward_rows that commit needs: GDN end states [1, H, R, K, V], conv windows
    [1, R, conv_size-1, C] per GDN layer, drafter features [1, R, F]."""

    states: dict
    conv: dict
    features: torch.Tensor


class GDNLayer(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        H, D = cfg.gdn_heads, cfg.gdn_head_dim
        self.heads, self.head_dim, self.conv_size = H, D, cfg.conv_size
        self.qkv = nn.Linear(cfg.d_model, 3 * H * D, bias=False)
        self.z = nn.Linear(cfg.d_model, H * D, bias=False)
        self.ab = nn.Linear(cfg.d_model, 2 * H, bias=False)
        self.conv_weight = nn.Parameter(torch.randn(3 * H * D, cfg.conv_size) / math.sqrt(cfg.conv_size))
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(1, 16)))
        dt = torch.exp(torch.empty(H).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.out_norm = RMSNorm(D, cfg.norm_eps)
        self.out = nn.Linear(H * D, cfg.d_model, bias=False)

    def _gates(self, x):
        a, b = self.ab(x).float().chunk(2, dim=-1)
        log_decay = -self.A_log.float().exp() * F.softplus(a + self.dt_bias.float())
        return log_decay.transpose(1, 2), torch.sigmoid(b).transpose(1, 2)  # [B, H, T]

    def _split(self, mixed):
        B, T, _ = mixed.shape
        q, k, v = mixed.view(B, T, 3, self.heads, self.head_dim).unbind(2)
        q = F.normalize(q.float(), dim=-1) * self.head_dim**-0.5
        k = F.normalize(k.float(), dim=-1)
        return (t.transpose(1, 2) for t in (q, k, v.float()))  # [B, H, T, D]

    def _finish(self, o, x):
        B, H, T, D = o.shape
        o = self.out_norm(o.transpose(1, 2).to(x.dtype)) * F.silu(self.z(x)).view(B, T, H, D)
        return self.out(o.reshape(B, T, H * D))

    def forward_train(self, x, chunk_size: int):
        T = x.shape[1]
        mixed = self.qkv(x).transpose(1, 2)
        mixed = F.conv1d(
            mixed, self.conv_weight.to(mixed.dtype)[:, None, :], padding=self.conv_size - 1, groups=mixed.shape[1]
        )[..., :T]
        q, k, v = self._split(F.silu(mixed.transpose(1, 2)))
        log_decay, beta = self._gates(x)
        state = x.new_zeros(x.shape[0], self.heads, self.head_dim, self.head_dim, dtype=torch.float32)
        o, _ = gdn.chunked(q, k, v, log_decay, beta, state, chunk_size)
        return self._finish(o, x)

    def forward_rows(self, x, rows: Rows, state, conv_state, method: str):
        window = torch.cat([conv_state, self.qkv(x)], dim=1)[:, rows.conv_idx]  # [1, R, cs, C]
        mixed = F.silu((window * self.conv_weight.t().to(window.dtype)).sum(2))
        q, k, v = self._split(mixed)
        log_decay, beta = self._gates(x)
        if method == "path":
            o, ends = gdn.tree_path_reference(q, k, v, log_decay, beta, state, rows.parents)
        else:
            o, ends = gdn.masked_wy(q, k, v, log_decay, beta, state, rows.anc)
        return self._finish(o, x), ends, window[:, :, 1:]


class AttnLayer(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.hq, self.hkv, self.d = cfg.attn_heads, cfg.attn_kv_heads, cfg.attn_head_dim
        self.theta = cfg.rope_theta
        self.q = nn.Linear(cfg.d_model, 2 * self.hq * self.d, bias=False)  # query and output gate
        self.kv = nn.Linear(cfg.d_model, 2 * self.hkv * self.d, bias=False)
        self.q_norm = RMSNorm(self.d, cfg.norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.norm_eps)
        self.out = nn.Linear(self.hq * self.d, cfg.d_model, bias=False)

    def _project(self, x, positions):
        B, T, _ = x.shape
        q, gate = self.q(x).view(B, T, 2, self.hq, self.d).unbind(2)
        k, v = self.kv(x).view(B, T, 2, self.hkv, self.d).unbind(2)
        q = rope(self.q_norm(q), positions, self.theta)
        k = rope(self.k_norm(k), positions, self.theta)
        return q, k, v, gate

    def _attend(self, q, k, v, gate, mask):
        B, T = q.shape[:2]
        rep = self.hq // self.hkv
        k = k.repeat_interleave(rep, dim=2).transpose(1, 2)
        v = v.repeat_interleave(rep, dim=2).transpose(1, 2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, is_causal=mask is None)
        return self.out((o.transpose(1, 2) * torch.sigmoid(gate)).reshape(B, T, self.hq * self.d))

    def forward_train(self, x):
        q, k, v, gate = self._project(x, torch.arange(x.shape[1], device=x.device))
        return self._attend(q, k, v, gate, None)

    def forward_rows(
        self, x, rows: Rows, keys, values, length_t, window: int, rope_offset: int = 0, attn_window: int | None = None
    ):
        """``rope_offset`` and ``attn_window`` are the fault study's position and context faults (0 and
        None in every lossless pass): rotate this many positions too far; see only the last
        ``attn_window`` committed tokens."""
        R = rows.count
        q, k, v, gate = self._project(x, length_t + rows.depth + rope_offset)
        slots = length_t + torch.arange(R, device=x.device)
        keys.index_copy_(1, slots, k.to(keys.dtype))
        values.index_copy_(1, slots, v.to(values.dtype))
        committed = torch.arange(window, device=x.device)[None, :]
        mask = committed < length_t
        if attn_window is not None:
            mask = mask & (committed >= length_t - attn_window)
        mask = mask.expand(R, window).index_copy(1, slots, rows.anc)
        return self._attend(q, keys[:, :window], values[:, :window], gate, mask)


class Block(nn.Module):
    def __init__(self, cfg: TargetConfig, kind: str):
        super().__init__()
        self.kind = kind
        self.norm_mixer = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer = GDNLayer(cfg) if kind == "gdn" else AttnLayer(cfg)
        self.norm_mlp = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.ffn_dim)


class HybridTarget(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        for kind in cfg.layer_types:
            if kind not in ("gdn", "attn"):
                raise ValueError(f"unknown layer type {kind!r}; use 'gdn' or 'attn'")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, kind) for kind in cfg.layer_types)
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        nn.init.normal_(self.embed.weight, std=0.02)
        for name, p in self.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                nn.init.normal_(
                    p,
                    std=0.02 / math.sqrt(2 * cfg.n_layers)
                    if name.endswith("out.weight") or name.endswith("down.weight")
                    else 0.02,
                )

    @property
    def lm_head_weight(self):
        return self.embed.weight  # tied, as in Qwen's small models

    def forward_train(self, tokens, chunk_size: int = 64):
        """tokens [B, T] -> (final normed hidden [B, T, d], drafter features [B, T, feature_dim])."""
        x = self.embed(tokens)
        feats = []
        for i, block in enumerate(self.blocks):
            h = block.norm_mixer(x)
            x = x + (block.mixer.forward_train(h, chunk_size) if block.kind == "gdn" else block.mixer.forward_train(h))
            x = x + block.mlp(block.norm_mlp(x))
            if i in self.cfg.feature_layers:
                feats.append(x)
        return self.norm(x), torch.cat(feats, dim=-1)

    def forward_rows(
        self,
        rows: Rows,
        cache: Cache,
        gdn_method: str = "wy",
        window: int | None = None,
        rope_offset: int = 0,
        attn_window: int | None = None,
    ):
        """rows against cache -> (final normed hidden [1, R, d], Pending). Writes rows' keys/values.
        ``rope_offset`` and ``attn_window``: see ``AttnLayer.forward_rows`` (faults, off by default)."""
        window = cache.max_len if window is None else window
        x = self.embed(rows.tokens)
        feats, states, convs = [], {}, {}
        for i, block in enumerate(self.blocks):
            h = block.norm_mixer(x)
            if block.kind == "gdn":
                out, states[i], convs[i] = block.mixer.forward_rows(h, rows, cache.state[i], cache.conv[i], gdn_method)
            else:
                out = block.mixer.forward_rows(
                    h, rows, cache.keys[i], cache.values[i], cache.length_t, window, rope_offset, attn_window
                )
            x = x + out
            x = x + block.mlp(block.norm_mlp(x))
            if i in self.cfg.feature_layers:
                feats.append(x)
        return self.norm(x), Pending(states=states, conv=convs, features=torch.cat(feats, dim=-1))


def lm_head(hidden, weight, mode: str = "dense", chunks: int = 4, fp32: bool = False):
    """Logits [..., V] from hidden [..., d] and the head weight [V, d].

    ``dense`` is one matmul; ``splitk`` sums ``chunks`` partial products over slices of d in float32,
    a lossless variant with another reduction order. ``fp32`` computes in float32 (the scorer's head).
    """
    if fp32:
        hidden, weight = hidden.float(), weight.float()
    if mode == "dense":
        return hidden @ weight.t()
    if mode == "splitk":
        parts = zip(hidden.chunk(chunks, dim=-1), weight.chunk(chunks, dim=-1))
        total = None
        for h, w in parts:
            part = (h @ w.t()).float()
            total = part if total is None else total + part
        return total.to(hidden.dtype)
    raise ValueError(f"unknown LM head mode {mode!r}; use 'dense' or 'splitk'")


WEIGHT_FORMATS = ("fp8", "int8", "int6", "int4")


def quantize_weight(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """``weight`` [out, in] rounded to a low-precision format with one scale per output channel, back in
    its own dtype (fake quantization: what a verify pass on such weights computes with). ``fp8`` is
    E4M3 scaled so each row's largest magnitude maps to 448; ``intN`` rounds to the nearest of the
    2^(N-1)-1 levels each side of zero."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    if fmt == "fp8":
        scale = amax / 448.0
        q = (w / scale).to(torch.float8_e4m3fn).float() * scale
    elif fmt in ("int8", "int6", "int4"):
        levels = 2 ** (int(fmt[3:]) - 1) - 1
        scale = amax / levels
        q = torch.round(w / scale).clamp(-levels, levels) * scale
    else:
        raise ValueError(f"unknown weight format {fmt!r}; use one of {WEIGHT_FORMATS}")
    return q.to(weight.dtype)


def quantized_copy(target: HybridTarget, fmt: str) -> HybridTarget:
    """A copy of ``target`` with every linear layer's weight and the (tied) head in ``fmt``; norms, the
    GDN's conv and gates stay as they are."""
    import copy

    clone = copy.deepcopy(target)
    with torch.no_grad():
        for module in clone.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(quantize_weight(module.weight, fmt))
        clone.embed.weight.copy_(quantize_weight(clone.embed.weight, fmt))
    return clone.eval()
