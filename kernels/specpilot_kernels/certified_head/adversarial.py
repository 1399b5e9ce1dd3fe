"""Synthetic heads and inputs that stress the certificate (labelled synthetic wherever used).

The head mixes Gaussian rows with exact duplicates (ties the argmax must break towards the lowest
index), near-duplicates one bf16 ulp apart, rows with one outlier element (large INT8 scale, large
quantization error) and rescaled rows. Inputs mix Gaussian rows with rows aimed at a duplicate or
near-duplicate pair (ties and near-ties at the top) and rows of extreme norm. Everything is drawn on
the generator's device.
"""

from __future__ import annotations

import torch


def adversarial_head(vocab: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A [vocab, k] bf16 head and the index pairs [P, 2] (i < j) of its duplicate / near-duplicate rows."""
    dev = gen.device
    w = (torch.randn(vocab, k, generator=gen, device=dev) * 0.02).to(torch.bfloat16)
    n_special = max(vocab // 16, 4)
    picks = torch.randperm(vocab, generator=gen, device=dev)[: 4 * n_special].view(4, n_special)
    dup_src, dup_dst, outliers, rescaled = picks
    w[dup_dst] = w[dup_src]
    near = dup_dst[n_special // 2 :]
    col = torch.randint(0, k, (near.numel(),), generator=gen, device=dev)
    bits = w[near, col].view(torch.int16) + 1  # one ulp away in magnitude
    w[near, col] = bits.view(torch.bfloat16)
    cols = torch.randint(0, k, (n_special,), generator=gen, device=dev)
    w[outliers, cols] = w[outliers, cols] * 64
    w[rescaled] = (w[rescaled].float() * 4).to(torch.bfloat16)
    pairs = torch.stack([torch.minimum(dup_src, dup_dst), torch.maximum(dup_src, dup_dst)], 1)
    return w, pairs


def adversarial_inputs(weight: torch.Tensor, pairs: torch.Tensor, rows: int, gen: torch.Generator) -> torch.Tensor:
    """[rows, k] bf16 inputs: a quarter Gaussian, half aimed at a tied pair, a quarter at extreme norms."""
    dev = gen.device
    k = weight.shape[1]
    x = torch.randn(rows, k, generator=gen, device=dev)
    aimed = torch.rand(rows, generator=gen, device=dev) < 0.5
    pick = pairs[torch.randint(0, pairs.shape[0], (rows,), generator=gen, device=dev).to(pairs.device)].to(dev)
    w = weight.to(dev)
    target = w[pick[:, 0]].float() + w[pick[:, 1]].float()
    target = target / target.norm(dim=1, keepdim=True).clamp_min(1e-30)
    x = torch.where(aimed[:, None], target * k**0.5 * 4 + x * 0.05, x)
    extreme = torch.rand(rows, generator=gen, device=dev) < 0.25
    exponent = torch.randint(-3, 4, (rows,), generator=gen, device=dev).float()
    scale = torch.where(extreme, 10.0**exponent, torch.ones_like(exponent))
    return (x * scale[:, None]).to(torch.bfloat16).to(weight.device)
