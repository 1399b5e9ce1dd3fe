"""The lattice format: recorded drafting steps, teacher-forced at every position of the greedy output.

One ``.npz`` file holds many steps of many requests (layout and semantics: ``docs/lattice-format.md``).
A step is the drafter's output after the committed prefix ``greedy[:position]``: for each of ``m``
drafted positions the top-``K`` candidate tokens, their unary scores, and the ``K x K`` pair scores of
each candidate given each candidate at the previous position. ``kind`` says how they combine:

* ``selector`` (DFlash2): score(child j at d | parent i at d-1) = ``pair[d, i, j]``;
* ``markov`` (DSpark, Eq. 1): score = ``unary[d, j] + pair[d, i, j]``.

At ``d = 0`` the parent is the committed token, so every row ``i`` of ``pair[0]`` is the same.
Engines write with ``LatticeRecorder``; everything else reads with ``load_lattice``.
"""

from __future__ import annotations

import json
import zipfile
import zlib
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specpilot_mem.errors import SpecPilotError

FORMAT = "specpilot-lattice"
VERSION = 1
KINDS = ("selector", "markov")
SCORE_DTYPE = np.float16  # bf16 engine scores convert exactly (fp16 has more mantissa bits) in range
VALIDATE_CHUNK = 8192  # steps checked at once
ARRAYS = (
    "request_ids",
    "labels",
    "greedy_offsets",
    "greedy_tokens",
    "step_request",
    "step_position",
    "cand",
    "unary",
    "pair",
)


class LatticeError(SpecPilotError):
    """A lattice file or recording that does not follow docs/lattice-format.md."""


@dataclass
class Lattice:
    """A loaded lattice file (or one built in memory by the recorder or the synthetic generator).

    Shapes: ``S`` steps, ``R`` requests, ``T`` greedy tokens in all, ``m`` drafted positions,
    ``K`` candidates per position.
    """

    meta: dict
    request_ids: np.ndarray  # [R] str
    labels: np.ndarray  # [R] str, benchmark/split label such as "gsm8k/dev"
    greedy_offsets: np.ndarray  # [R+1] int64, request r's greedy tokens are greedy_tokens[o[r]:o[r+1]]
    greedy_tokens: np.ndarray  # [T] int32, the target's greedy output (committed sequence)
    step_request: np.ndarray  # [S] int32, index into request_ids
    step_position: np.ndarray  # [S] int32, committed length when the step drafted
    cand: np.ndarray  # [S, m, K] int32 candidate token ids, rank order as the drafter gave them
    unary: np.ndarray  # [S, m, K] float16
    pair: np.ndarray  # [S, m, K, K] float16, pair[s, d, i, j]: candidate j at d given candidate i at d-1
    source: str = ""
    _lookup: np.ndarray | None = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def positions(self) -> int:
        return int(self.cand.shape[1])

    @property
    def candidates(self) -> int:
        return int(self.cand.shape[2])

    @property
    def synthetic(self) -> bool:
        return bool(self.meta.get("synthetic", False))

    @property
    def num_steps(self) -> int:
        return int(self.cand.shape[0])

    @property
    def num_requests(self) -> int:
        return int(self.request_ids.shape[0])

    def step_lookup(self) -> np.ndarray:
        """[T] int64: the step recorded at each (request, position) of the greedy output, -1 if none."""
        if self._lookup is None:
            lookup = np.full(self.greedy_tokens.shape[0], -1, dtype=np.int64)
            flat = self.greedy_offsets[self.step_request] + self.step_position
            lookup[flat] = np.arange(self.num_steps)
            self._lookup = lookup
        return self._lookup

    def conditional_scores(self, steps: np.ndarray) -> np.ndarray:
        """[B, m, K, K] float32: score of candidate j at position d given candidate i at d-1 (per ``kind``)."""
        return conditional(self.kind, self.pair[steps], self.unary[steps][:, :, None, :])

    def greedy_windows(self, requests: np.ndarray, positions: np.ndarray, length: int) -> np.ndarray:
        """[B, length] int64: greedy[p : p+length] of each request, -1 past the end of its output."""
        start = self.greedy_offsets[requests] + positions
        end = self.greedy_offsets[requests + 1]
        idx = start[:, None] + np.arange(length)[None, :]
        inside = idx < end[:, None]
        safe = np.minimum(idx, self.greedy_tokens.shape[0] - 1)
        return np.where(inside, self.greedy_tokens[safe].astype(np.int64), -1)


def conditional(kind: str, pair: np.ndarray, unary: np.ndarray) -> np.ndarray:
    """float32 score of a child given its parent from pair rows and the child's unary scores
    (broadcastable): ``selector`` -> pair; ``markov`` -> unary + pair (Eq. 1)."""
    scores = pair.astype(np.float32)
    if kind == "markov":
        scores += unary
    return scores


def _check_meta(meta: dict, where: str) -> None:
    if meta.get("format") != FORMAT:
        raise LatticeError(
            f"not a lattice file (format {meta.get('format')!r})",
            where=where,
            fix=f"write lattices with specpilot_mem.replay.lattice.LatticeRecorder (format {FORMAT!r})",
        )
    if meta.get("version") != VERSION:
        raise LatticeError(
            f"lattice format version {meta.get('version')!r} is not supported (this reader: {VERSION})",
            where=where,
            fix="re-record the lattice with this version of specpilot-mem",
        )
    if meta.get("kind") not in KINDS:
        raise LatticeError(f"unknown lattice kind {meta.get('kind')!r}", where=where, fix=f"use one of {KINDS}")


def validate(lat: Lattice, where: str) -> None:
    """Shape and range checks shared by the reader and the recorder (nothing is written on failure)."""
    _check_meta(lat.meta, where)
    s, m, k = lat.cand.shape
    if lat.unary.shape != (s, m, k) or lat.pair.shape != (s, m, k, k):
        raise LatticeError(
            f"unary {lat.unary.shape} / pair {lat.pair.shape} do not match cand {lat.cand.shape}",
            where=where,
            fix="unary must be [S, m, K] and pair [S, m, K, K]",
        )
    r = lat.request_ids.shape[0]
    if lat.labels.shape != (r,) or lat.greedy_offsets.shape != (r + 1,):
        raise LatticeError(
            "labels / greedy_offsets do not match request_ids",
            where=where,
            fix="one label per request and R+1 greedy offsets",
        )
    if lat.step_request.shape != (s,) or lat.step_position.shape != (s,):
        raise LatticeError(
            "step_request / step_position must have one entry per step",
            where=where,
            fix="record every step through LatticeRecorder.add",
        )
    if s and (lat.step_request.min() < 0 or lat.step_request.max() >= r):
        raise LatticeError(
            "a step names a request the file does not hold",
            where=where,
            fix="call set_greedy for every request that has steps",
        )
    lengths = np.diff(lat.greedy_offsets)
    if s and (lat.step_position.min() < 0 or np.any(lat.step_position >= lengths[lat.step_request])):
        bad = int(np.flatnonzero((lat.step_position < 0) | (lat.step_position >= lengths[lat.step_request]))[0])
        raise LatticeError(
            f"step {bad} of request {lat.request_ids[lat.step_request[bad]]!r} is at position "
            f"{int(lat.step_position[bad])}, outside its greedy output of {int(lengths[lat.step_request[bad]])} tokens",
            where=where,
            fix="positions count committed output tokens: 0 <= position < len(greedy)",
        )
    flat = lat.greedy_offsets[lat.step_request] + lat.step_position
    if np.unique(flat).shape[0] != s:
        raise LatticeError(
            "two steps recorded at the same (request, position)",
            where=where,
            fix="record each position of the greedy output once",
        )
    for lo in range(0, s, VALIDATE_CHUNK):  # chunked: a full-size boolean temporary would double memory
        part = slice(lo, lo + VALIDATE_CHUNK)
        unary, pair = lat.unary[part], lat.pair[part]
        if np.isnan(unary).any() or np.isnan(pair).any() or (unary == np.inf).any() or (pair == np.inf).any():
            raise LatticeError(
                "the lattice holds NaN or +inf scores",
                where=where,
                fix="record finite scores (-inf marks a candidate slot that holds no token)",
            )
        if not np.all(lat.pair[part, 0] == lat.pair[part, 0, :1]):
            raise LatticeError(
                "pair[:, 0] differs between rows",
                where=where,
                fix="position 0 has one parent (the committed token): repeat its scores in every row",
            )


def load_lattice(path: str | os.PathLike) -> Lattice:
    where = str(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [name for name in ("meta", *ARRAYS) if name not in data.files]
            if missing:
                raise LatticeError(
                    f"lattice file lacks arrays {missing}", where=where, fix="write lattices with LatticeRecorder"
                )
            meta = json.loads(str(data["meta"]))
            arrays = {name: data[name] for name in ARRAYS}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        # a truncated or damaged .npz fails inside zipfile/zlib, not only with OSError
        raise LatticeError(
            f"cannot read lattice file ({type(err).__name__}: {err}); it is damaged or truncated",
            where=where,
            fix="record it again, or pass a complete .npz file written by LatticeRecorder",
        ) from err
    lat = Lattice(meta=meta, source=where, **arrays)
    validate(lat, where)
    return lat


def save_lattice(lat: Lattice, path: str | os.PathLike) -> None:
    """Write atomically (temp file + ``os.replace``) after validating."""
    path = Path(path)
    validate(lat, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".lattice-", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(
                handle,
                meta=np.array(json.dumps(lat.meta, sort_keys=True)),
                **{name: getattr(lat, name) for name in ARRAYS},
            )
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def make_meta(kind: str, positions: int, candidates: int, meta: dict | None = None) -> dict:
    base = dict(meta or {})
    base.update(
        format=FORMAT,
        version=VERSION,
        kind=kind,
        positions=positions,
        candidates=candidates,
        score_dtype=np.dtype(SCORE_DTYPE).name,
    )
    base.setdefault("synthetic", False)
    return base


class LatticeRecorder:
    """Collects steps from an engine and writes one lattice file on ``close``.

    >>> rec = LatticeRecorder("run.npz", kind="selector", positions=16, meta={"target": "...", "drafter": "..."})
    >>> rec.add("req-0", position=0, cand_tokens=c, unary=u, pair=p)   # c [m,K], u [m,K], p [m,K,K]
    >>> rec.set_greedy("req-0", tokens, label="gsm8k/dev")
    >>> rec.close()

    Record a step at EVERY position of each request's greedy output (teacher-forced), so that any
    builder's replay finds the lattice its own trajectory needs. Nothing is written until ``close``
    has checked everything.
    """

    def __init__(
        self, path: str | os.PathLike, kind: str, positions: int, candidates: int = 16, meta: dict | None = None
    ):
        if kind not in KINDS:
            raise LatticeError(
                f"unknown lattice kind {kind!r}", where="LatticeRecorder(kind=...)", fix=f"use one of {KINDS}"
            )
        self.path = Path(path)
        self.meta = make_meta(kind, positions, candidates, meta)
        self.m, self.k = positions, candidates
        self._steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._greedy: dict[str, tuple[np.ndarray, str]] = {}
        self._closed = False

    def add(self, request_id: str, position: int, cand_tokens, unary, pair) -> None:
        """One step: cand_tokens [m, K] int, unary [m, K] float, pair [m, K, K] float (torch or numpy)."""
        self.add_batch([request_id], [position], _np(cand_tokens)[None], _np(unary)[None], _np(pair)[None])

    def add_batch(self, request_ids: Sequence[str], positions, cand_tokens, unary, pair) -> None:
        """B steps at once: positions [B], cand_tokens [B, m, K], unary [B, m, K], pair [B, m, K, K]."""
        if self._closed:
            raise LatticeError("the recorder is closed", where=str(self.path), fix="open a new LatticeRecorder")
        cand, un, pr = _np(cand_tokens), _np(unary), _np(pair)
        b = len(request_ids)
        want = {
            "cand_tokens": (cand, (b, self.m, self.k)),
            "unary": (un, (b, self.m, self.k)),
            "pair": (pr, (b, self.m, self.k, self.k)),
        }
        for name, (arr, shape) in want.items():
            if arr.shape != shape:
                raise LatticeError(
                    f"{name} has shape {arr.shape}, expected {shape}",
                    where=f"{self.path}: add",
                    fix=f"m={self.m} positions and K={self.k} candidates, as the recorder was opened",
                )
        self._steps.append(
            (
                np.asarray([str(x) for x in request_ids], dtype=object),
                np.asarray(_np(positions), dtype=np.int64),
                cand.astype(np.int32),
                un.astype(SCORE_DTYPE),
                pr.astype(SCORE_DTYPE),
            )
        )

    def set_greedy(self, request_id: str, tokens, label: str = "") -> None:
        """The target's greedy output of the request (the committed sequence) and its benchmark/split label."""
        self._greedy[str(request_id)] = (_np(tokens).astype(np.int32).reshape(-1), label)

    def close(self) -> Lattice:
        lat = self.build()
        save_lattice(lat, self.path)
        self._closed = True
        return lat

    def build(self) -> Lattice:
        names = list(self._greedy)
        index = {name: i for i, name in enumerate(names)}
        ids = np.concatenate([chunk[0] for chunk in self._steps]) if self._steps else np.empty(0, dtype=object)
        unknown = sorted({str(x) for x in ids} - set(index))
        if unknown:
            raise LatticeError(
                f"steps recorded for requests without greedy tokens: {unknown[:5]}",
                where=str(self.path),
                fix="call set_greedy(request_id, tokens) for each request",
            )
        k, m = self.k, self.m

        def cat(i, shape, dtype):
            parts = [chunk[i] for chunk in self._steps]
            return np.concatenate(parts) if parts else np.empty(shape, dtype=dtype)

        lengths = np.array([len(self._greedy[n][0]) for n in names], dtype=np.int64)
        return Lattice(
            meta=self.meta,
            request_ids=np.array(names, dtype=np.str_),
            labels=np.array([self._greedy[n][1] for n in names], dtype=np.str_),
            greedy_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            greedy_tokens=(
                np.concatenate([self._greedy[n][0] for n in names]) if names else np.empty(0, np.int32)
            ).astype(np.int32),
            step_request=np.array([index[str(x)] for x in ids], dtype=np.int32),
            step_position=cat(1, (0,), np.int64).astype(np.int32),
            cand=cat(2, (0, m, k), np.int32),
            unary=cat(3, (0, m, k), SCORE_DTYPE),
            pair=cat(4, (0, m, k, k), SCORE_DTYPE),
            source=str(self.path),
        )


def _np(value) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().float().cpu().numpy() if value.is_floating_point() else value.detach().cpu().numpy()
    return np.asarray(value)


def load_lattices(paths: Iterable[str | os.PathLike]) -> list[Lattice]:
    paths = list(paths)
    if not paths:
        raise LatticeError("no lattice files given", where="LATTICES", fix="pass one or more .npz lattice files")
    return [load_lattice(p) for p in paths]
