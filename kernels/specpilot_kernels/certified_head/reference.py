"""Pure-torch definition of the certified LM head.

An INT8 copy of the head (per-row scale ``s_r = max|w_r| / 127``) gives approximate logits
``I_r = s_r (x . q_r)``. Every row carries a radius that bounds, in exact arithmetic *and* including
the float error of both computed dot products, how far the exact head's computed logit ``L_r`` can be
from the computed ``I_r``:

    |L_r - I_r| <= ||x|| * c_r + slack,   c_r = e_r + gamma_K (2 ||s_r q_r|| + e_r),   e_r = ||w_r - s_r q_r||

``e_r`` is the Cauchy–Schwarz term (``|x.w - x.s q| <= ||x|| ||w - s q||``); ``gamma_K = K u / (1 - K u)``
with ``u = 2^-23`` bounds FP32 accumulation of exact products (bf16 x bf16 and bf16 x int8 products are
exact in FP32; one ulp per addition covers round-to-nearest and the truncating accumulation of tensor
cores); the slack covers the few FP32 roundings of the bound itself. A row whose upper bound is
below the best lower bound provably is not the argmax; the survivors are rescored with the exact
head's own arithmetic, so the result is the exact head's argmax (ties: lowest index, as
``torch.argmax``). When more rows survive than ``max_survivors``, the row falls back to the full head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fragments import to_fragments

ACCUMULATION_UNIT = 2.0 ** -23
BOUND_SLACK = 2.0 ** -16  # relative slack for the FP32 arithmetic of the bound itself
NORM_INFLATION = 1.0 + 2.0 ** -10  # ||x|| computed in FP32: relative error <= ~K * 2^-24 / 2


def accumulation_gamma(k: int) -> float:
    return k * ACCUMULATION_UNIT / (1.0 - k * ACCUMULATION_UNIT)


def _round_up_fp32(values: torch.Tensor) -> torch.Tensor:
    """FP64 -> FP32 rounded towards +inf (the bound must never shrink)."""
    down = values.to(torch.float32)
    return torch.where(down.double() < values, torch.nextafter(down, torch.full_like(down, float("inf"))), down)


@dataclass
class CertifiedHead:
    """The exact head and its certified INT8 copy.

    weight: [N, K] bf16 (the exact head); qweight: [N, K] int8; scale: [N] fp32;
    radius_coef: [N] fp32, ``c_r`` above (rounded up); fragments: qweight in the CUDA pass's layout,
    uint8 [ceil(N/64)*4, K/32, 32, 16] (:mod:`.fragments`), or None where that pass is not used.
    """

    weight: torch.Tensor
    qweight: torch.Tensor
    scale: torch.Tensor
    radius_coef: torch.Tensor
    fragments: torch.Tensor | None = None

    @property
    def vocab(self) -> int:
        return self.weight.shape[0]


def quantize_head(weight: torch.Tensor, chunk_rows: int = 8192, fragments: bool | None = None) -> CertifiedHead:
    """INT8 copy with per-row scale and the per-row radius coefficient, computed in FP64 per row chunk.

    weight: [N, K] bf16 on any device. Returns a :class:`CertifiedHead` on the same device. ``fragments``
    adds the CUDA pass's copy of the INT8 weights (by default on GPUs of compute capability 8.0 or more,
    with K a multiple of 128).
    """
    if weight.dtype != torch.bfloat16 or weight.dim() != 2:
        raise ValueError(f"the head must be a 2-D bf16 tensor, got {weight.dtype} {tuple(weight.shape)}")
    N, K = weight.shape
    gamma = accumulation_gamma(K)
    qweight = torch.empty((N, K), dtype=torch.int8, device=weight.device)
    scale = torch.empty(N, dtype=torch.float32, device=weight.device)
    coef = torch.empty(N, dtype=torch.float32, device=weight.device)
    for start in range(0, N, chunk_rows):
        w = weight[start:start + chunk_rows].double()
        s = (w.abs().amax(1) / 127.0).to(torch.float32)
        s = torch.where(s > 0, s, torch.ones_like(s))
        q = torch.round(w / s.double()[:, None]).clamp_(-127, 127)
        deq = q * s.double()[:, None]
        err = (w - deq).norm(dim=1) * (1 + 1e-12)
        qnorm = deq.norm(dim=1) * (1 + 1e-12)
        qweight[start:start + chunk_rows] = q.to(torch.int8)
        scale[start:start + chunk_rows] = s
        coef[start:start + chunk_rows] = _round_up_fp32((err + gamma * (2 * qnorm + err)) * (1 + 1e-9))
    if fragments is None:
        fragments = weight.is_cuda and K % 128 == 0 and torch.cuda.get_device_capability(weight.device) >= (8, 0)
    return CertifiedHead(weight=weight, qweight=qweight, scale=scale, radius_coef=coef,
                         fragments=to_fragments(qweight, chunk_rows) if fragments else None)


def input_norm(x: torch.Tensor) -> torch.Tensor:
    """Upper bound of ||x|| per row, FP32: [M]."""
    xf = x.float()
    return torch.linalg.vector_norm(xf, dim=-1).mul_(NORM_INFLATION)


SCALED_RANGE = (2.0 ** -50, 2.0 ** 50)  # max|x| outside it: the row takes the full head in the CUDA pass


def scaled_fp16_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CUDA pass's activations: each row times 2^e with max|x| 2^e in [2^14, 2^15), in fp16.

    x: [M, K] bf16. Returns (x16 [M, K] fp16, inv_scale [M] fp32 = 2^-e, ok [M] bool). A row is ok when
    max|x| lies in ``SCALED_RANGE`` and every element survives the conversion exactly (fp16 keeps
    bf16's 8 significant bits down to 2^-17, i.e. 2^-31 below the row's max), so x16 * inv_scale == x;
    a row that is not ok takes the full-head fallback (its candidate count is set above the capacity).
    """
    xf = x.float()
    amax = xf.abs().amax(1)
    ok = (amax >= SCALED_RANGE[0]) & (amax < SCALED_RANGE[1]) & torch.isfinite(xf.square().sum(1))
    shift = torch.where(ok, 15 - torch.frexp(amax).exponent, torch.zeros_like(amax, dtype=torch.int32))
    scaled = xf * torch.pow(2.0, shift.float())[:, None]  # a power of two inside fp32's range: exact
    x16 = scaled.half()
    ok &= (x16.float() == scaled).all(1)
    return x16, torch.pow(2.0, -shift.float()), ok


def int8_logits_and_radius(x: torch.Tensor, head: CertifiedHead) -> tuple[torch.Tensor, torch.Tensor]:
    """Approximate logits ``I`` [M, N] (FP32, from the INT8 copy) and their radius [M, N] (FP32)."""
    approx = torch.mm(x.float(), head.qweight.float().T).mul_(head.scale[None, :])
    radius = approx.abs().mul_(BOUND_SLACK)
    radius.addcmul_(input_norm(x)[:, None], head.radius_coef[None, :], value=1 + BOUND_SLACK)
    return approx, radius


def exact_head_reference(x: torch.Tensor, head: CertifiedHead) -> torch.Tensor:
    """The exact head's logits [M, N] on the CPU: the FP32 rounding of the FP64 dot product.

    (bf16 products are exact in FP64, so equal rows give equal logits wherever they sit in the
    matrix; an FP32 BLAS product does not promise that.)
    """
    return torch.mm(x.double(), head.weight.double().T).float()


def certify(exact: torch.Tensor, approx: torch.Tensor, radius: torch.Tensor, max_survivors: int = 4096):
    """Certified argmax from the exact logits, the INT8 logits and their radius (all [M, N]).

    Returns (token ids [M] int64, survivors per row [M] int64). Only the survivors' exact logits are
    read, except for rows with more than ``max_survivors`` survivors, which fall back to the full row.
    """
    best_lower = torch.sub(approx, radius).amax(1, keepdim=True)
    keep = torch.add(approx, radius) >= best_lower
    counts = keep.sum(1)
    keep |= (counts > max_survivors)[:, None]
    return exact.masked_fill(~keep, float("-inf")).argmax(1), counts


def certified_argmax_reference(x: torch.Tensor, head: CertifiedHead, max_survivors: int = 4096):
    """Certified argmax of ``x @ weight.T`` for x [M, K] bf16: (token ids [M] int64, survivors [M] int64)."""
    return certify(exact_head_reference(x, head), *int8_logits_and_radius(x, head), max_survivors)


def certified_argmax_chunked(chunks, head: CertifiedHead, max_survivors: int = 4096) -> dict:
    """Vectorized check over many inputs (an iterable of [m, K] bf16 chunks) against the exact head.

    Returns counts: rows, disagreements with the exact argmax, bound violations (an exact logit outside
    [I - r, I + r]), rows that fell back, and the total / largest survivor counts.
    """
    stats = {"rows": 0, "disagreements": 0, "bound_violations": 0, "fallback_rows": 0,
             "survivors_sum": 0, "survivors_max": 0}
    for xs in chunks:
        exact = exact_head_reference(xs, head)
        approx, radius = int8_logits_and_radius(xs, head)
        stats["bound_violations"] += int((torch.sub(exact, approx).abs_() > radius).sum())
        tokens, counts = certify(exact, approx, radius, max_survivors)
        stats["disagreements"] += int((tokens != exact.argmax(1)).sum())
        stats["fallback_rows"] += int((counts > max_survivors).sum())
        stats["survivors_sum"] += int(counts.sum())
        stats["survivors_max"] = max(stats["survivors_max"], int(counts.max()))
        stats["rows"] += xs.shape[0]
    return stats
