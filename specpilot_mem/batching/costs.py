"""Step costs of a batched server: the measured c(R) curves the policies decide from.

A ``CostCurve`` is the time of one pass over R rows, measured at increasing row counts (the target's
GEMMs are flat while the weight stream dominates, then step up tile by tile once compute does). A
``StepCosts`` composes a step: the target's verify pass over R rows, the drafter's pass over its rows, and
a per-request term (each request's KV cache and recurrent state read in the verify pass).

Where no GPU measurement is at hand, ``StepCosts.roofline`` models the curves from the shapes (bytes at
the H200's measured read bandwidth, FLOPs at a realistic tensor-core rate, rows rounded up to a tile);
such costs say ``measured: False`` everywhere they are reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specpilot_mem.errors import SpecPilotError


class BatchingError(SpecPilotError):
    """A batching option or input outside what the policies, the drafter or the verify buffers support."""


@dataclass(frozen=True)
class Shape:
    """Linear shapes of a target (one layer's GEMMs as (in, out), repeated ``layers`` times) and its
    DFlash-style drafter (``drafter_layers`` layers of the target's width plus the target's LM head)."""

    name: str
    d_model: int
    layers: int
    attn_layers: int
    linears: tuple[tuple[int, int], ...]
    vocab: int
    kv_heads: int
    head_dim: int
    gdn_state_bytes: int  # one request's recurrent state over all GDN layers (fp32)
    drafter_layers: int = 5

    @property
    def layer_params(self) -> int:
        return sum(i * o for i, o in self.linears)

    def kv_bytes(self, context: int) -> int:
        """bf16 keys and values of one request over all attention layers."""
        return self.attn_layers * 2 * context * self.kv_heads * self.head_dim * 2


SHAPES = {
    # Qwen3.5-27B-like hybrid: 48 GDN + 16 gated-attention layers (the shapes of the cuBLAS reference).
    "27b": Shape(
        "27b",
        5120,
        64,
        16,
        ((5120, 10240), (8192, 5120), (5120, 34816), (17408, 5120)),
        248320,
        4,
        256,
        48 * 32 * 128 * 128 * 4,
    ),
    # Qwen3.5-4B-like hybrid: 24 GDN + 8 gated-attention layers.
    "4b": Shape(
        "4b",
        2560,
        32,
        8,
        ((2560, 6144), (4096, 2560), (2560, 18432), (9216, 2560)),
        248320,
        4,
        256,
        24 * 16 * 128 * 128 * 4,
    ),
}

# Roofline constants of the H200 (bf16): read bandwidth measured by the cuBLAS reference
# (/work/shared/reference/h200_cublas_issue_shapes.json, 4.46 TB/s) at the weight-stream efficiency cuBLAS
# reaches there (~0.82); dense tensor-core rate cuBLAS sustains at large M; rows round up to its M tile.
H200_READ_TBPS = 4.46 * 0.82
H200_TFLOPS = 650.0
M_TILE = 64
LAUNCH_US = 4.0

ROW_GRID = (
    1,
    2,
    4,
    8,
    16,
    24,
    32,
    48,
    64,
    80,
    96,
    112,
    128,
    160,
    192,
    224,
    256,
    320,
    384,
    448,
    512,
    640,
    768,
    896,
    1024,
    1280,
    1536,
    1792,
    2048,
)


def roofline_gemm_ms(rows: int, k: int, n: int) -> float:
    """Modelled time of a bf16 [rows, k] x [k, n] GEMM: the larger of its weight stream and its tiled FLOPs."""
    stream = 2 * k * n / (H200_READ_TBPS * 1e12)
    compute = 2 * math.ceil(rows / M_TILE) * M_TILE * k * n / (H200_TFLOPS * 1e12)
    return (max(stream, compute) + LAUNCH_US * 1e-6) * 1e3


@dataclass(frozen=True)
class CostCurve:
    """c(R) in ms for R rows, measured at increasing row counts ``rows``.

    Between measured counts a pass costs what the next measured count costs (a GEMM's tile costs the
    same however full); past the last, time grows in proportion to rows (compute-bound). Decisions use
    the monotone envelope (running maximum), so measurement noise never makes more rows look cheaper.
    """

    rows: tuple[int, ...]
    ms: tuple[float, ...]
    source: str = ""

    def __post_init__(self):
        rows, ms = np.asarray(self.rows), np.asarray(self.ms, dtype=np.float64)
        if rows.ndim != 1 or rows.size == 0 or rows.shape != ms.shape:
            raise BatchingError(
                "a cost curve needs one time per row count",
                where=self.source or "CostCurve",
                fix="give rows and ms as equal-length lists",
            )
        if rows[0] < 1 or np.any(np.diff(rows) <= 0) or not np.all(np.isfinite(ms)) or np.any(ms <= 0):
            raise BatchingError(
                "cost curve rows must increase from 1 and times be positive",
                where=self.source or "CostCurve",
                fix="measure c(R) at increasing row counts R >= 1",
            )

    @property
    def envelope(self) -> np.ndarray:
        return np.maximum.accumulate(np.asarray(self.ms, dtype=np.float64))

    @property
    def max_rows(self) -> int:
        return int(self.rows[-1])

    def at(self, rows: int) -> float:
        """Time of a pass over ``rows`` rows (0 rows: no pass)."""
        if rows <= 0:
            return 0.0
        env = self.envelope
        i = int(np.searchsorted(self.rows, rows))
        if i < len(self.rows):
            return float(env[i])
        return float(env[-1] * rows / self.rows[-1])

    def plateau_end(self, rows: int, tolerance: float = 0.05, limit: int | None = None) -> int:
        """The end of the plateau a pass over ``rows`` rows is on: from the measured count that covers
        ``rows``, onward while each next measured count costs at most (1 + tolerance) x the one before
        (flat until the next tile step) and at most (1 + 4 x tolerance) x the start (no slow drift).
        ``limit`` caps the answer (e.g. the verify buffers); ``rows`` itself when nothing further fits."""
        top = self.max_rows if limit is None else min(limit, self.max_rows)
        if rows >= top:
            return int(rows)
        env, counts = self.envelope, self.rows
        i = int(np.searchsorted(counts, rows))
        if counts[i] > top:
            return int(rows)
        end = i
        while (
            end + 1 < len(counts)
            and counts[end + 1] <= top
            and env[end + 1] <= env[end] * (1 + tolerance)
            and env[end + 1] <= env[i] * (1 + 4 * tolerance)
        ):
            end += 1
        return max(int(rows), int(counts[end]))

    def to_dict(self) -> dict:
        return {"rows": [int(r) for r in self.rows], "ms": [float(t) for t in self.ms], "source": self.source}


@dataclass(frozen=True)
class StepCosts:
    """One batched step: verify_ms(R, B) = target(R) + B x per_request_ms; draft_ms(R) = drafter(R)."""

    shape: str
    target: CostCurve
    drafter: CostCurve
    per_request_ms: float
    measured: bool
    source: str = ""

    def verify_ms(self, rows: int, requests: int) -> float:
        return self.target.at(rows) + requests * self.per_request_ms

    def draft_ms(self, rows: int, requests: int | None = None) -> float:
        return self.drafter.at(rows)

    def ar_ms(self, requests: int) -> float:
        return self.verify_ms(requests, requests)

    def prefill_ms(self, prompt_rows: int) -> float:
        """A separate prefill pass of one prompt (stock scheduling: prompts never share a verify pass)."""
        return self.verify_ms(prompt_rows, 1)

    def rows_curve(self, requests: int) -> CostCurve:
        """c(R) of a verify step of ``requests`` requests over R rows: where its plateaus are is what prompt
        admission reads (here the target's GEMMs: the per-request term does not grow with rows)."""
        return self.target

    @classmethod
    def roofline(cls, shape: str, context: int = 1024) -> "StepCosts":
        """Modelled costs of ``shape`` (see the module docstring): measured=False."""
        s = _shape(shape)
        target = [
            s.layers * sum(roofline_gemm_ms(r, i, o) for i, o in s.linears) + roofline_gemm_ms(r, s.d_model, s.vocab)
            for r in ROW_GRID
        ]
        drafter = [
            s.drafter_layers * sum(roofline_gemm_ms(r, i, o) for i, o in s.linears)
            + roofline_gemm_ms(r, s.d_model, s.vocab)
            for r in ROW_GRID
        ]
        return cls(
            shape,
            CostCurve(ROW_GRID, tuple(target), f"roofline {shape}"),
            CostCurve(ROW_GRID, tuple(drafter), f"roofline {shape} drafter"),
            per_request_ms(s, context),
            measured=False,
            source="roofline (H200 constants in batching.costs)",
        )

    @classmethod
    def from_measurement(cls, doc: dict, shape: str, context: int = 1024) -> "StepCosts":
        """From ``benchmarks/batched_costs.py``'s result: its per-shape ``layer_ms`` and ``lm_head_ms``
        curves (CUDA-graph replay on the GPU), composed over the shape's layers."""
        s = _shape(shape)
        where = doc.get("source", "batched_costs result")
        try:
            part = doc["shapes"][shape]
            rows = tuple(int(r) for r in part["rows"])
            layer = np.asarray(part["layer_ms"], dtype=np.float64)
            head = np.asarray(part["lm_head_ms"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as err:
            raise BatchingError(
                f"the cost measurement lacks shape {shape!r} ({err})",
                where=where,
                fix="run benchmarks/batched_costs.py for that shape on the GPU",
            ) from None
        target = CostCurve(rows, tuple(s.layers * layer + head), f"{where}: {shape} target")
        drafter = CostCurve(rows, tuple(s.drafter_layers * layer + head), f"{where}: {shape} drafter")
        return cls(shape, target, drafter, per_request_ms(s, context), measured=True, source=where)

    def to_dict(self) -> dict:
        return {
            "shape": self.shape,
            "measured": self.measured,
            "source": self.source,
            "per_request_ms": self.per_request_ms,
            "target": self.target.to_dict(),
            "drafter": self.drafter.to_dict(),
        }


class EngineStepCosts(StepCosts):
    """Step times of the composed engine itself (``benchmarks/batched_engine_costs.py``: T_AR(B), the draft
    pass per block and the verify step at T rows per request, for B requests), interpolated bilinearly in
    (B, rows per request); ``rows / B`` rows per request is a ragged verify's average. The policies still
    decide from the GEMM curves (``target``, ``drafter``). A prompt is prefilled in 64-row passes of one
    request, as the engine's decoder does (``engine.decode.PREFILL_CHUNK``). ``variant``: the option set whose
    verify steps to use (``VARIANTS``: stock's snapshot GDN verify, SpecPilot's path verify; or "best": per
    bucket the faster of the two, as an engine capturing each (B, rows) bucket with its own option would)."""

    VARIANTS = {"stock": "T_step_ms", "path": "T_step_path_ms"}

    def __init__(self, base: StepCosts, doc: dict, variant: str = "stock"):
        where = f"{doc.get('source', 'batched_engine_costs result')}"
        self.substituted: list[str] = []  # "B/rows" buckets timed by another option set (see below)
        if variant == "best":  # per (B, rows) bucket the faster GDN verify of the two (each graph captures its own)
            doc = {
                **doc,
                "by_batch": {
                    b: {
                        **e,
                        "T_step_best_ms": {
                            r: min(e.get("T_step_ms", {}).get(r, t), t)
                            for r, t in {**e.get("T_step_ms", {}), **e.get("T_step_path_ms", {})}.items()
                        },
                    }
                    for b, e in doc["by_batch"].items()
                },
            }
            key = "T_step_best_ms"
        elif variant in self.VARIANTS:
            key = self.VARIANTS[variant]
            if variant == "stock" and any("T_step_path_ms" in e for e in doc["by_batch"].values()):
                # a bucket stock's snapshot buffers could not hold (out of memory, e.g. 27B-like 32 x 17 rows) takes
                # the path verify's time: faster than stock's wherever both ran there, so it flatters stock
                self.substituted = [
                    f"{b}/{r}"
                    for b, e in doc["by_batch"].items()
                    for r in e.get("T_step_path_ms", {})
                    if r not in e.get(key, {})
                ]
                doc = {
                    **doc,
                    "by_batch": {
                        b: {**e, key: {**e.get("T_step_path_ms", {}), **e.get(key, {})}}
                        for b, e in doc["by_batch"].items()
                    },
                }
        else:
            raise BatchingError(f"unknown engine variant {variant!r}", where=where, fix="use stock, path or best")
        super().__init__(
            base.shape,
            base.target,
            base.drafter,
            0.0,
            measured=True,
            source=f"{where} (engine steps, {variant})",
        )
        self.variant = variant
        rows = sorted({int(t) for e in doc["by_batch"].values() for t in e.get(key, {})})
        blocks = sorted({int(k) for e in doc["by_batch"].values() for k in e["T_draft_ms"]})
        complete = [
            b
            for b, e in doc["by_batch"].items()
            if rows and len(e.get(key, {})) == len(rows) and len(e["T_draft_ms"]) == len(blocks)
        ]
        if not complete:
            raise BatchingError(
                f"the engine measurement has no batch size with every row count of {key} and every draft block",
                where=self.source,
                fix=f"rerun benchmarks/batched_engine_costs.py (--variants {variant})",
            )
        self.batches = np.array(sorted(int(b) for b in complete), dtype=np.float64)
        self.rows = np.array([1] + rows, dtype=np.float64)
        self.blocks = np.array(blocks, dtype=np.float64)
        by = doc["by_batch"]
        self.step = np.array(
            [[by[str(int(b))]["T_AR_ms"]] + [by[str(int(b))][key][str(t)] for t in rows] for b in self.batches]
        )
        self.draft = np.array([[by[str(int(b))]["T_draft_ms"][str(k)] for k in blocks] for b in self.batches])

    def to_dict(self) -> dict:
        return {**super().to_dict(), "variant": self.variant, "substituted_from_path_verify": self.substituted}

    @staticmethod
    def _interp(grid_b, grid_x, table, b: float, x: float) -> float:
        """Bilinear in (b, x); past the last point in x, linear from the last two."""
        per_b = []
        for row in table:
            if x <= grid_x[-1]:
                per_b.append(np.interp(x, grid_x, row))
            else:
                slope = (row[-1] - row[-2]) / (grid_x[-1] - grid_x[-2])
                per_b.append(row[-1] + slope * (x - grid_x[-1]))
        per_b = np.array(per_b)
        if b <= grid_b[-1]:
            return float(np.interp(b, grid_b, per_b))
        return float(per_b[-1] * b / grid_b[-1])

    def verify_ms(self, rows: int, requests: int) -> float:
        requests = max(requests, 1)
        return self._interp(self.batches, self.rows, self.step, requests, max(rows / requests, 1.0))

    def draft_ms(self, rows: int, requests: int | None = None) -> float:
        if rows <= 0:
            return 0.0
        requests = max(requests or 1, 1)
        return self._interp(self.batches, self.blocks, self.draft, requests, rows / requests - 1)

    def ar_ms(self, requests: int) -> float:
        return self.verify_ms(requests, requests)

    def prefill_ms(self, prompt_rows: int) -> float:
        return math.ceil(prompt_rows / 64) * self.verify_ms(64, 1)

    def rows_curve(self, requests: int) -> CostCurve:
        """The engine's measured step over R rows at ``requests`` requests, at the row counts it was measured at (the
        roots, then each measured row count per request): every row past the roots costs what the engine pays for it
        (KV, GDN, attention as well as the GEMMs), so admission sees no free rows where the engine has none. Only
        measured counts: between them the step is interpolated, and a curve sampled there too would read the rows
        up to its next sample as free (a CostCurve costs a pass what the next count costs), so spare rows would come
        and go as the rows a step needs crossed a sample."""
        requests = max(requests, 1)
        rows = tuple(int(requests * r) for r in self.rows)
        return CostCurve(rows, tuple(self.verify_ms(r, requests) for r in rows), f"{self.source} at B={requests}")


def per_request_ms(shape: Shape, context: int) -> float:
    """Each request's KV cache (read) and recurrent state (read and written) in one step, at the read
    bandwidth: the part of a step that grows with requests, not rows (modelled)."""
    return (shape.kv_bytes(context) + 2 * shape.gdn_state_bytes) / (H200_READ_TBPS * 1e12) * 1e3


def _shape(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise BatchingError(
            f"unknown shape {name!r}", where="--shapes", fix="use any of: " + ", ".join(SHAPES)
        ) from None
