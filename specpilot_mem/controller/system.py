"""The system under test, as the controller sees it, and the outputs file it leaves behind.

A ``System`` serves a list of requests with a fixed number in flight (the batch size) on one device
and returns, per request, the output token ids and the time each output token came back. The
pure-torch engine and the SGLang adapter implement it; the controller only times and compares.

Outputs file (JSONL, one request per line)::

    {"id": "code-003", "output_ids": [11, 52, 7], "start": 0.0, "token_times": [0.021, 0.022, 0.030],
     "stop_reason": "length"}

``start`` and ``token_times`` are seconds on one monotonic clock; token forcing needs only
``output_ids``, so they may be left out of files written for it. ``stop_reason`` is why the system says
the output ended ("length": at max_new_tokens, "stop": on a stop token, or the server's own word);
optional, and token forcing's length rule compares it with stock's where both report one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from specpilot_mem.controller.requests import Request, RequestSetError, jsonl_rows


@dataclass(frozen=True)
class RequestOutput:
    id: str
    output_ids: tuple[int, ...]
    start: float | None = None
    token_times: tuple[float, ...] | None = None
    stop_reason: str | None = None

    @property
    def rate(self) -> float:
        """Output tokens per second from the request's start to its last token.

        Measured from the start (not the first token) so that prefill, which a batching change can
        speed up or slow down, is part of what a gain rewards.
        """
        if self.start is None or not self.token_times:
            raise RequestSetError(
                f"output of request {self.id!r} has no timestamps",
                where=f"request {self.id}",
                fix="time the run (the system must report start and token_times)",
            )
        elapsed = self.token_times[-1] - self.start
        if elapsed <= 0:
            raise RequestSetError(
                f"output of request {self.id!r} ends {elapsed:.3g} s after it starts",
                where=f"request {self.id}",
                fix="timestamps must come from one monotonic clock (time.perf_counter)",
            )
        return len(self.output_ids) / elapsed

    def to_dict(self) -> dict:
        row: dict = {"id": self.id, "output_ids": list(self.output_ids)}
        if self.start is not None:
            row["start"] = self.start
        if self.token_times is not None:
            row["token_times"] = list(self.token_times)
        if self.stop_reason is not None:
            row["stop_reason"] = self.stop_reason
        return row


@runtime_checkable
class System(Protocol):
    """Anything the controller can time: the pure-torch engine, an SGLang server from a fork worktree."""

    name: str

    def run(self, requests: Sequence[Request], *, batch_size: int, device: str) -> list[RequestOutput]:
        """Serve ``requests`` closed-loop with ``batch_size`` in flight on ``device``; one output per request, in order."""
        ...


def write_outputs(path: str | Path, outputs: Iterable[RequestOutput]) -> Path:
    """Write an outputs file atomically (temp file + os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            for output in outputs:
                handle.write(json.dumps(output.to_dict()) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_outputs(path: str | Path) -> dict[str, RequestOutput]:
    """An outputs file as {request id: output}; errors name the file and line."""
    outputs: dict[str, RequestOutput] = {}
    for where, _, row in jsonl_rows(path, "outputs file"):
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("id"), str)
            or not isinstance(row.get("output_ids"), list)
        ):
            raise RequestSetError(
                "each line needs 'id' (string) and 'output_ids' (list)",
                where=where,
                fix='e.g. {"id": "code-003", "output_ids": [11, 52, 7]}',
            )
        ids = row["output_ids"]
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise RequestSetError("'output_ids' must hold non-negative integers", where=where, fix="write token ids")
        times = row.get("token_times")
        if times is not None and (not isinstance(times, list) or len(times) != len(ids)):
            raise RequestSetError(
                "'token_times' must have one time per output token",
                where=where,
                fix="drop token_times or give one per token",
            )
        reason = row.get("stop_reason")
        if reason is not None and not isinstance(reason, str):
            raise RequestSetError(
                "'stop_reason' must be a string", where=where, fix='e.g. "length" or "stop", or leave it out'
            )
        if row["id"] in outputs:
            raise RequestSetError(f"duplicate id {row['id']!r}", where=where, fix="one line per request")
        outputs[row["id"]] = RequestOutput(
            row["id"],
            tuple(ids),
            row.get("start"),
            tuple(float(t) for t in times) if times is not None else None,
            reason,
        )
    if not outputs:
        raise RequestSetError(f"outputs file {path} is empty", where=str(path), fix="run the system first")
    return outputs
