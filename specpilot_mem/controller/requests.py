"""Request sets: the JSONL files the controller times systems on (format in ``docs/controller.md``).

One JSON object per line::

    {"id": "code-003", "benchmark": "code", "split": "dev", "prompt": "Write ...", "max_new_tokens": 128}
    {"id": "synth-01", "benchmark": "synthetic", "split": "unseen", "prompt_ids": [17, 4, 99], "max_new_tokens": 64}

``split`` is ``dev`` (agents see these) or ``unseen`` (only the sealed final runs them). Exactly one
of ``prompt`` (text) and ``prompt_ids`` (token ids) is given. Blank lines are skipped; any other
problem is an error naming the file and line, and nothing is returned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specpilot_mem.errors import RecordError

Split = Literal["dev", "unseen"]
SPLITS: tuple[str, ...] = ("dev", "unseen")
REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
BENCHMARK_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
FIELDS = {"id", "benchmark", "split", "prompt", "prompt_ids", "max_new_tokens"}


class RequestSetError(RecordError):
    """A request-set file that cannot be read, or a request set that does not fit its use."""


@dataclass(frozen=True)
class Request:
    id: str
    benchmark: str
    split: Split
    max_new_tokens: int
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None

    def token_ids(self, encode: Callable[[str], Sequence[int]] | None = None) -> list[int]:
        """The prompt as token ids: ``prompt_ids`` as given, else ``encode(prompt)``."""
        if self.prompt_ids is not None:
            return list(self.prompt_ids)
        if encode is None:
            raise RequestSetError(
                f"request {self.id!r} has a text prompt and no tokenizer was given",
                where=f"request {self.id}",
                fix="pass the target's tokenizer (encode function), or give the request as prompt_ids",
            )
        return [int(t) for t in encode(self.prompt or "")]

    def to_dict(self) -> dict:
        row: dict = {"id": self.id, "benchmark": self.benchmark, "split": self.split}
        if self.prompt_ids is not None:
            row["prompt_ids"] = list(self.prompt_ids)
        else:
            row["prompt"] = self.prompt
        row["max_new_tokens"] = self.max_new_tokens
        return row


def _fail(what: str, where: str, fix: str) -> RequestSetError:
    return RequestSetError(what, where=where, fix=fix)


def parse_request(row: object, where: str) -> Request:
    """One request from a decoded JSON value; ``where`` (file:line) goes into every error."""
    if not isinstance(row, dict):
        raise _fail("a request must be a JSON object", where, 'write {"id": ..., "benchmark": ..., ...} on the line')
    unknown = sorted(set(row) - FIELDS)
    if unknown:
        raise _fail(f"unknown field(s) {unknown}", where, f"use only {sorted(FIELDS)}")
    for name in ("id", "benchmark", "split", "max_new_tokens"):
        if name not in row:
            raise _fail(f"missing field {name!r}", where, f"add {name!r}; see docs/controller.md for the format")
    rid, benchmark, split, max_new = row["id"], row["benchmark"], row["split"], row["max_new_tokens"]
    if not isinstance(rid, str) or not REQUEST_ID.match(rid):
        raise _fail(f"bad id {rid!r}", where, "ids are 1-128 letters, digits, '.', '_', ':' or '-', starting alnum")
    if not isinstance(benchmark, str) or not BENCHMARK_NAME.match(benchmark):
        raise _fail(
            f"bad benchmark name {benchmark!r}", where, "benchmark names are lower-case, e.g. code, prose, math"
        )
    if split not in SPLITS:
        raise _fail(f"bad split {split!r}", where, "split is 'dev' (agents see it) or 'unseen' (sealed final only)")
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise _fail(f"max_new_tokens must be a positive integer, got {max_new!r}", where, 'e.g. "max_new_tokens": 128')
    has_text, has_ids = "prompt" in row, "prompt_ids" in row
    if has_text == has_ids:
        raise _fail(
            "give exactly one of 'prompt' and 'prompt_ids'", where, "text prompts use 'prompt', token ids 'prompt_ids'"
        )
    if has_text:
        if not isinstance(row["prompt"], str) or not row["prompt"]:
            raise _fail("'prompt' must be a non-empty string", where, "write the prompt text, or use prompt_ids")
        return Request(rid, benchmark, split, max_new, prompt=row["prompt"])
    ids = row["prompt_ids"]
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
    ):
        raise _fail(
            "'prompt_ids' must be a non-empty list of non-negative integers", where, 'e.g. "prompt_ids": [17, 4, 99]'
        )
    return Request(rid, benchmark, split, max_new, prompt_ids=tuple(ids))


def jsonl_rows(path: str | Path, what: str) -> Iterator[tuple[str, int, object]]:
    """(``file:line``, line number, decoded value) for every non-blank line of a JSONL file; a missing
    file, bad encoding or bad JSON raises a ``RequestSetError`` naming the file (and line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _fail(f"{what} {path} does not exist", str(path), "check the path") from None
    except UnicodeDecodeError as err:
        raise _fail(f"{what} {path} is not UTF-8: {err}", str(path), "save the file as UTF-8 JSONL") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            yield where, number, json.loads(line)
        except json.JSONDecodeError as err:
            raise _fail(f"not valid JSON: {err.msg} (column {err.colno})", where, "one JSON object per line") from None


def load_requests(
    path: str | Path, *, split: Split | None = None, benchmarks: Iterable[str] | None = None
) -> list[Request]:
    """Every request in ``path`` (in file order), optionally only one split and some benchmarks."""
    requests: list[Request] = []
    seen: dict[str, int] = {}
    for where, number, row in jsonl_rows(path, "request set"):
        request = parse_request(row, where)
        if request.id in seen:
            raise _fail(
                f"duplicate id {request.id!r} (first on line {seen[request.id]})",
                where,
                "give every request its own id",
            )
        seen[request.id] = number
        requests.append(request)
    if not requests:
        raise _fail(f"request set {path} holds no requests", str(path), "add one JSON object per line")
    wanted = set(benchmarks) if benchmarks is not None else None
    if wanted is not None:
        known = {r.benchmark for r in requests}
        missing = sorted(wanted - known)
        if missing:
            raise _fail(f"benchmark(s) {missing} not in {path}", str(path), f"choose from {sorted(known)}")
    return [r for r in requests if (split is None or r.split == split) and (wanted is None or r.benchmark in wanted)]


def require_split(requests: Sequence[Request], split: Split, purpose: str) -> None:
    """Refuse a request list that contains another split (e.g. dev requests in a sealed final)."""
    wrong = [r.id for r in requests if r.split != split]
    if wrong:
        raise RequestSetError(
            f"{purpose} runs only {split} requests, but {len(wrong)} are not: {wrong[:5]}",
            where="request set",
            fix=f"load the set with split={split!r}",
        )
    if not requests:
        raise RequestSetError(
            f"{purpose} got no {split} requests", where="request set", fix=f"add {split} requests to the set"
        )
