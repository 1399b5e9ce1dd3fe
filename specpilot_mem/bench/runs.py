"""What the run-level benchmarks share: progress lines on stderr (stdout carries the JSON document) and the
request subset a paired run measures."""

from __future__ import annotations

import dataclasses
import sys
from collections import defaultdict

from specpilot_mem.controller.requests import load_requests


def log(*parts) -> None:
    """A progress line on stderr, flushed at once (a device call's log shows how far a run got)."""
    print(*parts, file=sys.stderr, flush=True)


def pick_requests(args) -> list:
    """The first ``args.per_benchmark`` requests of each benchmark in ``args.split`` of ``args.requests``, each
    capped at ``args.max_new_tokens``."""
    taken: dict[str, int] = defaultdict(int)
    picked = []
    for request in load_requests(args.requests, split=args.split):
        if taken[request.benchmark] < args.per_benchmark:
            taken[request.benchmark] += 1
            picked.append(dataclasses.replace(request, max_new_tokens=min(request.max_new_tokens, args.max_new_tokens)))
    return picked
