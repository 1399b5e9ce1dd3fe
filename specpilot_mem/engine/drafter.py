"""A DFlash2-style block drafter and its lattice.

One forward pass drafts a block of masked positions after an anchor token (the last committed token,
whose target state is not computed yet), attending to the target's hidden states at the
``context_window`` positions before the anchor (features of a few target layers, injected as keys and
values into every drafter layer) and, bidirectionally, to the block itself. It reuses the target's
embedding and LM head (frozen), as DFlash does, so it adds few weights.

Per drafted position it yields the top-K candidates and a low-rank selector: the score of candidate y
given candidate y' at the previous position is

    base_s(y) + < W1[y'] * (1 + P h_s), W2[y] >

(the paper's Eq. 1 with the pair term modulated by the position's hidden state h_s). Candidates and
scores form the lattice of §2.2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specpilot_mem.engine.config import DrafterConfig, TargetConfig
from specpilot_mem.engine.model import RMSNorm, SwiGLU, rope


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.heads, self.head_dim, self.theta = cfg.heads, cfg.head_dim, cfg.rope_theta
        inner = cfg.heads * cfg.head_dim
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.q = nn.Linear(cfg.d_model, inner, bias=False)
        self.kv = nn.Linear(cfg.d_model, 2 * inner, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.out = nn.Linear(inner, cfg.d_model, bias=False)
        self.norm_mlp = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.ffn_dim)

    def forward(self, x, context, positions, mask):
        """x [N, S, d] block; context [N, W, d]; positions [N, W + S]; mask [N, 1, 1, W + S] bool."""
        N, S, _ = x.shape
        h = self.norm(x)
        src = torch.cat([context, h], dim=1)
        q = self.q(h).view(N, S, self.heads, self.head_dim)
        k, v = self.kv(src).view(N, src.shape[1], 2, self.heads, self.head_dim).unbind(2)
        q = rope(self.q_norm(q), positions[:, -S:], self.theta)
        k = rope(self.k_norm(k), positions, self.theta)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        x = x + self.out(o.transpose(1, 2).reshape(N, S, -1))
        return x + self.mlp(self.norm_mlp(x))


@dataclass
class Lattice:
    """One drafted block. cand [m, K] token ids; unary [m, K] log-softmax of the base logits;
    pair [m, K, K]: pair[s, a, b] scores cand[s, b] given cand[s-1, a] (given the anchor at s = 0, so
    every row of pair[0] is the same)."""

    cand: torch.Tensor
    unary: torch.Tensor
    pair: torch.Tensor

    def to(self, device) -> "Lattice":
        return Lattice(self.cand.to(device), self.unary.to(device), self.pair.to(device))

    def chain(self) -> list[int]:
        """The stock chain: at each position the selector's best candidate given the previous pick."""
        picks, prev = [], 0
        for s in range(self.cand.shape[0]):
            prev = int(self.pair[s, prev].argmax())
            picks.append(int(self.cand[s, prev]))
        return picks


class BlockDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, target_cfg: TargetConfig):
        super().__init__()
        if cfg.d_model != target_cfg.d_model:
            raise ValueError("the drafter shares the target's embedding: its d_model must equal the target's")
        self.cfg = cfg
        self.feature_norm = RMSNorm(target_cfg.feature_dim, cfg.norm_eps)
        self.feature_proj = nn.Linear(target_cfg.feature_dim, cfg.d_model, bias=False)
        self.mask_embed = nn.Parameter(torch.randn(cfg.d_model) * 0.02)
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.pair_prev = nn.Embedding(target_cfg.vocab_size, cfg.selector_rank)
        self.pair_next = nn.Embedding(target_cfg.vocab_size, cfg.selector_rank)
        self.pair_gate = nn.Linear(cfg.d_model, cfg.selector_rank, bias=False)
        for p in (self.pair_prev.weight, self.pair_next.weight):
            nn.init.normal_(p, std=0.02)
        nn.init.zeros_(self.pair_gate.weight)

    def forward(self, embed, features, context_valid, anchors, anchor_pos, block: int | None = None):
        """Hidden states of the drafted positions.

        embed: the target's embedding module; features [N, W, feature_dim] (target features at the W
        positions before the anchor); context_valid [N, W] bool; anchors [N] token ids; anchor_pos [N]
        absolute positions; block: masked positions in the forward (default the trained block_size; a
        smaller block is fewer drafter rows, as a per-request drafter block drafts). Returns
        h [N, block, d] for positions anchor_pos + 1 ... + block.
        """
        N, W, _ = features.shape
        block = self.cfg.block_size if block is None else block
        if not 1 <= block <= self.cfg.block_size:
            raise ValueError(f"block={block}: the drafter drafts 1..{self.cfg.block_size} positions per forward")
        S = block + 1
        context = self.feature_proj(self.feature_norm(features))
        block = torch.cat([embed(anchors)[:, None], self.mask_embed.to(context.dtype).expand(N, S - 1, -1)], dim=1)
        offsets = torch.arange(-W, S, device=features.device)
        positions = (anchor_pos[:, None] + offsets[None]).clamp(min=0)
        mask = torch.cat([context_valid, context_valid.new_ones(N, S)], dim=1)[:, None, None, :]
        x = block
        for layer in self.layers:
            x = layer(x, context, positions, mask)
        return self.norm(x[:, 1:])

    def pair_logits(self, hidden, prev_tokens, next_tokens):
        """Selector pair term. hidden [..., d]; prev_tokens [..., P]; next_tokens [..., Q] -> [..., P, Q]."""
        gate = 1 + self.pair_gate(hidden).float()  # [..., r]
        prev = self.pair_prev(prev_tokens).float() * gate[..., None, :]
        return prev @ self.pair_next(next_tokens).float().transpose(-1, -2)

    def pair_logits_full(self, hidden, prev_tokens):
        """Pair term against the whole vocabulary. hidden [..., d]; prev_tokens [...] -> [..., V]."""
        gate = 1 + self.pair_gate(hidden).float()
        return (self.pair_prev(prev_tokens).float() * gate) @ self.pair_next.weight.float().t()

    def lattice(self, hidden, base_logits, anchor: int, positions: int) -> Lattice:
        """Lattice of one block. hidden [block_size, d]; base_logits [block_size, V]."""
        anchors = torch.tensor([anchor], device=hidden.device)
        cand, unary, pair = self.lattice_batch(hidden[None], base_logits[None], anchors, positions)
        return Lattice(cand=cand[0], unary=unary[0], pair=pair[0])

    def lattice_batch(self, hidden, base_logits, anchors, positions: int):
        """Lattices of N blocks. hidden [N, S, d]; base_logits [N, S, V]; anchors [N].

        Returns cand [N, m, K], unary [N, m, K] (log-softmax of the base logits), pair [N, m, K, K].
        """
        K = self.cfg.top_k
        logp = torch.log_softmax(base_logits[:, :positions].float(), dim=-1)
        unary, cand = logp.topk(K, dim=-1)
        first = anchors[:, None, None].expand(-1, 1, K).to(cand.dtype)
        prev = torch.cat([first, cand[:, :-1]], dim=1)
        pair = unary[:, :, None, :] + self.pair_logits(hidden[:, :positions], prev, cand)
        return cand, unary, pair
