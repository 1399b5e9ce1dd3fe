"""Synthetic lattices with explicit statistics, for tests and studies. Labelled synthetic in the
file's metadata (``meta["synthetic"] = True`` and the generator's parameters under
``meta["generator"]``), and every report that reads them says so.

The model, per step (position p of a request) and drafted position d:

* rank of the target's greedy token among the candidates: with probability ``path_correlation`` the
  rank at d-1 again (misses persist along a path), otherwise a fresh draw from
  ``rank_probs * depth_decay**d`` (the rest of the mass: not in the top K);
* unary scores (the drafter's confidence): ``-confidence * log(1 + rank)`` plus Gaussian
  ``score_noise``, sorted so that rank order is score order;
* pair scores: the unary score plus uniform noise of standard deviation ``pair_noise``, plus ``selector_boost`` for the greedy
  token given the greedy token at d-1 (what a selector knows that marginals do not). For the
  ``markov`` kind the file stores only the pair term (the unary score is added on reading).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from specpilot_mem.replay.lattice import SCORE_DTYPE, Lattice, make_meta, validate

CHUNK_STEPS = 8192  # steps generated at once: bounds the float32 temporaries (~130 MB)


@dataclass(frozen=True)
class SyntheticSpec:
    requests: int = 8
    length: int = 256  # greedy tokens per request
    positions: int = 16
    candidates: int = 16
    vocab: int = 32000
    kind: str = "selector"
    rank_probs: tuple[float, ...] = (
        0.62,
        0.12,
        0.06,
        0.04,
        0.025,
        0.02,
        0.015,
        0.01,
        0.008,
        0.006,
        0.005,
        0.004,
        0.003,
        0.003,
        0.002,
        0.002,
    )
    depth_decay: float = 0.97
    path_correlation: float = 0.3
    confidence: float = 2.0
    score_noise: float = 0.3
    pair_noise: float = 0.5
    selector_boost: float = 1.5
    labels: tuple[str, ...] = ("synthetic",)
    seed: int = 0
    extra: dict = field(default_factory=dict)


def generate(spec: SyntheticSpec) -> Lattice:
    """A lattice set recorded at every position of every request (teacher-forced)."""
    rng = np.random.default_rng(spec.seed)
    m, k, r = spec.positions, spec.candidates, spec.requests
    probs = np.zeros(k)
    probs[: min(k, len(spec.rank_probs))] = spec.rank_probs[:k]
    if probs.sum() > 1.0 + 1e-9 or (probs < 0).any():
        raise ValueError("rank_probs must be non-negative and sum to at most 1")
    greedy = rng.integers(0, spec.vocab, size=(r, spec.length), dtype=np.int64)
    step_request = np.repeat(np.arange(r, dtype=np.int32), spec.length)
    step_position = np.tile(np.arange(spec.length, dtype=np.int32), r)
    s = r * spec.length
    cand = np.empty((s, m, k), dtype=np.int32)
    unary = np.empty((s, m, k), dtype=SCORE_DTYPE)
    pair = np.empty((s, m, k, k), dtype=SCORE_DTYPE)
    for start in range(0, s, CHUNK_STEPS):
        stop = min(s, start + CHUNK_STEPS)
        req, pos = step_request[start:stop], step_position[start:stop]
        c, u, p = _chunk(spec, probs, greedy, req, pos, rng)
        cand[start:stop], unary[start:stop], pair[start:stop] = c, u, p
    labels = np.array([spec.labels[i % len(spec.labels)] for i in range(r)], dtype=np.str_)
    meta = make_meta(
        spec.kind,
        m,
        k,
        {"synthetic": True, "generator": _jsonable(asdict(spec)), "source": "specpilot_mem.replay.synthetic"},
    )
    lat = Lattice(
        meta=meta,
        request_ids=np.array([f"synthetic-{i}" for i in range(r)], dtype=np.str_),
        labels=labels,
        greedy_offsets=np.arange(r + 1, dtype=np.int64) * spec.length,
        greedy_tokens=greedy.reshape(-1).astype(np.int32),
        step_request=step_request,
        step_position=step_position,
        cand=cand,
        unary=unary,
        pair=pair,
        source="synthetic",
    )
    validate(lat, "synthetic")
    return lat


def _chunk(spec: SyntheticSpec, probs, greedy, req, pos, rng):
    m, k = spec.positions, spec.candidates
    b = req.shape[0]
    # ranks of the greedy token along the drafted positions (k = not among the candidates)
    ranks = np.empty((b, m), dtype=np.int64)
    for d in range(m):
        p_d = probs * spec.depth_decay**d
        cdf = np.cumsum(np.append(p_d, 1.0 - p_d.sum()))
        fresh = np.minimum(np.searchsorted(cdf, rng.random(b), side="right"), k)
        if d == 0:
            ranks[:, d] = fresh
        else:
            ranks[:, d] = np.where(rng.random(b) < spec.path_correlation, ranks[:, d - 1], fresh)
    target_pos = pos[:, None] + np.arange(m)[None, :]
    inside = target_pos < spec.length
    truth = np.where(inside, greedy[req[:, None], np.minimum(target_pos, spec.length - 1)], -1)
    ranks = np.where(inside, ranks, k)
    # distractors: distinct offsets from the greedy token, so no distractor equals it or another
    stride = (spec.vocab - 1) // k
    offsets = 1 + np.arange(k)[None, None, :] * stride + rng.integers(0, stride, size=(b, m, k))
    base = np.where(truth >= 0, truth, rng.integers(0, spec.vocab, size=(b, m)))
    cand = (base[:, :, None] + offsets) % spec.vocab
    placed = ranks < k
    rows, cols = np.nonzero(placed)
    cand[rows, cols, ranks[rows, cols]] = truth[rows, cols]
    unary = -spec.confidence * np.log1p(np.arange(k, dtype=np.float32))[
        None, None, :
    ] + spec.score_noise * rng.standard_normal((b, m, k), dtype=np.float32)
    unary = -np.sort(-unary, axis=2)
    # uniform noise with standard deviation pair_noise (int8 draws: Gaussian ones cost 20x more here)
    term = rng.integers(-128, 128, size=(b, m, k, k), dtype=np.int8).astype(np.float32)
    term *= np.float32(spec.pair_noise * np.sqrt(3.0) / 128.0)
    parent_rank = np.concatenate([np.zeros((b, 1), np.int64), ranks[:, :-1]], axis=1)
    boost = placed & (parent_rank < k)
    bi, bd = np.nonzero(boost)
    term[bi, bd, parent_rank[bi, bd], ranks[bi, bd]] += spec.selector_boost
    term[:, 0] = term[:, 0, :1]  # position 0 has one parent (the committed token): identical rows
    if spec.kind == "selector":
        term += unary[:, :, None, :]
    return cand.astype(np.int32), unary.astype(SCORE_DTYPE), term.astype(SCORE_DTYPE)


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
