"""Pure-torch definition of the certified LM head.

An INT8 copy of the head (per-row scale ``s_r = max|w_r| / 127``) gives approximate logits
``I_r = s_r (x . q_r)``. Every row carries a radius that bounds, in exact arithmetic *and* including
the float error of both computed dot products, how far the exact head's computed logit ``L_r`` can be
from the computed ``I_r``:

    |L_r - I_r| <= ||x|| * c_r + slack,   c_r = e_r + gamma_K ||s_r q_r|| + gamma_D (||s_r q_r|| + e_r),
    e_r = ||w_r - s_r q_r||

``e_r`` is the Cauchy–Schwarz term (``|x.w - x.s q| <= ||x|| ||w - s q||``); ``gamma_n = n u / (1 - n u)``
with ``u = 2^-23`` bounds FP32 accumulation of exact products (bf16 x bf16 and bf16 x int8 products are
exact in FP32; one ulp per addition covers round-to-nearest and the truncating accumulation of tensor
cores) where no product passes through more than n additions: a sum whose every term is multiplied by at
most n factors (1 + delta), |delta| <= u, is off by at most gamma_n times the sum of the terms' magnitudes,
and sum |x_i w_i| <= ||x|| ||w|| <= ||x|| (||s q|| + e_r). The INT8 pass's sum (tensor cores, any order) takes
gamma_K; the exact head's takes gamma_D with D its summation depth (``exact_depth``): K for any order (the
Triton exact head), K/32 + 5 for the CUDA one (each lane adds K/32 products in sequence, a 5-step butterfly adds
the lanes: :func:`exact_head_warp_order`), a radius about 6% smaller on a Gaussian head. The slack covers the
few FP32 roundings of the bound itself. A row whose upper bound is below the best lower bound provably is not
the argmax; the survivors are rescored with the exact head's own arithmetic, so the result is the exact head's
argmax (ties: lowest index, as ``torch.argmax``). When more rows survive than ``max_survivors``, the row falls
back to the full head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fragments import to_fragments

ACCUMULATION_UNIT = 2.0**-23
BOUND_SLACK = 2.0**-16  # relative slack for the FP32 arithmetic of the bound itself
NORM_INFLATION = 1.0 + 2.0**-10  # ||x|| computed in FP32: relative error <= ~K * 2^-24 / 2


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
    uint8 [ceil(N/64)*4, K/32, 32, 16] (:mod:`.fragments`), or None where that pass is not used;
    exact_depth: the summation depth D of the exact heads ``radius_coef`` is valid for (None: K, any order).
    """

    weight: torch.Tensor
    qweight: torch.Tensor
    scale: torch.Tensor
    radius_coef: torch.Tensor
    fragments: torch.Tensor | None = None
    exact_depth: int | None = None

    @property
    def vocab(self) -> int:
        return self.weight.shape[0]

    @property
    def max_exact_depth(self) -> int:
        """The deepest exact-head sum the radius covers."""
        return self.exact_depth or self.weight.shape[1]


def _quantize_rows(weight: torch.Tensor, exact_depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [n, K] int8, s [n] fp32 and c [n] fp32 (rounded up) of bf16 rows [n, K], in FP64."""
    K = weight.shape[1]
    w = weight.double()
    s = (w.abs().amax(1) / 127.0).to(torch.float32)
    s = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.round(w / s.double()[:, None]).clamp_(-127, 127)
    deq = q * s.double()[:, None]
    err = (w - deq).norm(dim=1) * (1 + 1e-12)
    qnorm = deq.norm(dim=1) * (1 + 1e-12)
    coef = err + accumulation_gamma(K) * qnorm + accumulation_gamma(exact_depth) * (qnorm + err)
    return q.to(torch.int8), s, _round_up_fp32(coef * (1 + 1e-9))


def radius_coefficients(weight: torch.Tensor, exact_depth: int | None = None, chunk_rows: int = 8192) -> torch.Tensor:
    """``c_r`` [N] fp32 of the bf16 head [N, K] for exact heads of summation depth up to ``exact_depth`` (None: K)."""
    depth = exact_depth or weight.shape[1]
    return torch.cat(
        [
            _quantize_rows(weight[start : start + chunk_rows], depth)[2]
            for start in range(0, weight.shape[0], chunk_rows)
        ]
    )


def quantize_head(
    weight: torch.Tensor, chunk_rows: int = 8192, fragments: bool | None = None, exact_depth: int | None = None
) -> CertifiedHead:
    """INT8 copy with per-row scale and the per-row radius coefficient, computed in FP64 per row chunk.

    weight: [N, K] bf16 on any device. Returns a :class:`CertifiedHead` on the same device. ``fragments``
    adds the CUDA pass's copy of the INT8 weights (by default on GPUs of compute capability 8.0 or more,
    with K a multiple of 128). ``exact_depth``: the deepest exact-head sum the radius must cover; by default
    the CUDA exact head's where it runs (:func:`.exact_cuda.default_exact_depth`), else K (any order).
    """
    if weight.dtype != torch.bfloat16 or weight.dim() != 2:
        raise ValueError(f"the head must be a 2-D bf16 tensor, got {weight.dtype} {tuple(weight.shape)}")
    N, K = weight.shape
    if exact_depth is None:
        from .exact_cuda import default_exact_depth  # imported here: exact_cuda builds on cuda_pass, which imports this

        exact_depth = default_exact_depth(weight)
    qweight = torch.empty((N, K), dtype=torch.int8, device=weight.device)
    scale = torch.empty(N, dtype=torch.float32, device=weight.device)
    coef = torch.empty(N, dtype=torch.float32, device=weight.device)
    for start in range(0, N, chunk_rows):
        rows = slice(start, start + chunk_rows)
        qweight[rows], scale[rows], coef[rows] = _quantize_rows(weight[rows], exact_depth)
    if fragments is None:
        fragments = weight.is_cuda and K % 128 == 0 and torch.cuda.get_device_capability(weight.device) >= (8, 0)
    return CertifiedHead(
        weight=weight,
        qweight=qweight,
        scale=scale,
        radius_coef=coef,
        fragments=to_fragments(qweight, chunk_rows) if fragments else None,
        exact_depth=None if exact_depth >= K else exact_depth,
    )


def input_norm(x: torch.Tensor) -> torch.Tensor:
    """Upper bound of ||x|| per row, FP32: [M]."""
    xf = x.float()
    return torch.linalg.vector_norm(xf, dim=-1).mul_(NORM_INFLATION)


SCALED_RANGE = (2.0**-50, 2.0**50)  # max|x| outside it: the row takes the full head in the CUDA pass


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


def warp_order_depth(k: int) -> int:
    """The most FP32 additions a product passes through in :func:`exact_head_warp_order`'s sum of K products:
    K/32 in a lane's sequence (ceil: K/8 pieces over 32 lanes, 8 products a piece), then 5 butterfly steps."""
    return -(-k // 256) * 8 + 5


def exact_head_warp_order(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The CUDA exact head's logits [M, N] FP32 (:mod:`.exact_cuda`), bit for bit: x [M, K] and weight [N, K] bf16.

    Lane l of a warp takes the 16-byte pieces l, l + 32, ... of both rows (8 elements each) and adds their
    products one after another to an FP32 sum starting at +0 (each product is exact in FP32, so the kernel's
    FMA rounds once, as this addition does); the 32 lane sums are then added in a xor butterfly (offsets 16, 8,
    4, 2, 1), of which lane 0's value is the halving v[:h] + v[h:] (FP32 addition commutes). Lanes past the row's
    last piece hold +0, and adding +0 changes no sum (none is ever -0: sums start at +0), so only the lanes up to
    the next power of two past the last piece are summed.
    """
    pieces = -(-x.shape[1] // 256)
    lanes = 1 << max(0, (min(32, -(-x.shape[1] // 8)) - 1).bit_length())
    pad = pieces * 256 - x.shape[1]
    xs = torch.nn.functional.pad(x.float(), (0, pad)).view(x.shape[0], 1, pieces, 32, 8)[..., :lanes, :]
    ws = torch.nn.functional.pad(weight.float(), (0, pad)).view(1, weight.shape[0], pieces, 32, 8)[..., :lanes, :]
    acc = torch.zeros(x.shape[0], weight.shape[0], lanes, dtype=torch.float32, device=x.device)
    for c in range(pieces):
        for e in range(8):
            acc += xs[:, :, c, :, e] * ws[:, :, c, :, e]
    while acc.shape[-1] > 1:
        half = acc.shape[-1] // 2
        acc = acc[..., :half] + acc[..., half:]
    return acc[..., 0].contiguous()


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


def certified_argmax_chunked(
    chunks, head: CertifiedHead, max_survivors: int = 4096, exact=exact_head_reference
) -> dict:
    """Vectorized check over many inputs (an iterable of [m, K] bf16 chunks) against the exact head
    (``exact(x, head)``: logits [m, N]; by default the FP64 one, which a radius for any order covers).

    Returns counts: rows, disagreements with the exact argmax, bound violations (an exact logit outside
    [I - r, I + r]), rows that fell back, and the total / largest survivor counts.
    """
    stats = {
        "rows": 0,
        "disagreements": 0,
        "bound_violations": 0,
        "fallback_rows": 0,
        "survivors_sum": 0,
        "survivors_max": 0,
    }
    for xs in chunks:
        exact_logits = exact(xs, head)
        approx, radius = int8_logits_and_radius(xs, head)
        stats["bound_violations"] += int((torch.sub(exact_logits, approx).abs_() > radius).sum())
        tokens, counts = certify(exact_logits, approx, radius, max_survivors)
        stats["disagreements"] += int((tokens != exact_logits.argmax(1)).sum())
        stats["fallback_rows"] += int((counts > max_survivors).sum())
        stats["survivors_sum"] += int(counts.sum())
        stats["survivors_max"] = max(stats["survivors_max"], int(counts.max()))
        stats["rows"] += xs.shape[0]
    return stats
