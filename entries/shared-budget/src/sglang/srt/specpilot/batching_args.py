"""Server-argument checks of the batching entries (``shared-budget``, ``drafter-block``, ``prompt-admission``):
bad batching flags are refused while SGLang parses its arguments, naming the flag and the limit.

``check_server_args`` runs every module of ``sglang.srt.specpilot.batching_checks`` (each batching entry adds
one, so no two entries edit the same lines); ``handle_speculative_decoding`` calls it once. With every batching
flag unset each check returns at once: stock.

Also here, because the checks and the runtime both read it: ``CostCurve``, a measured c(R) (a pass's time at
increasing row counts) and the end of the plateau a row count is on — the semantics of the project's
``specpilot_mem.batching.costs.CostCurve`` (its tests compare the two). Pure Python: server_args imports it.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from dataclasses import dataclass

# How much dearer each next measured row count on a plateau may be (and 4x that over the plateau's start).
PLATEAU_TOLERANCE = 0.05


class BatchingArgumentError(ValueError):
    """A batching flag SGLang cannot serve; the message names the flag, the limit and the fix."""

    def __init__(self, flag: str, problem: str, fix: str):
        super().__init__(f"{flag}: {problem}. Fix: {fix}.")
        self.flag, self.problem, self.fix = flag, problem, fix


@dataclass(frozen=True)
class CostCurve:
    """c(R) in ms at increasing measured row counts (a pass costs what the next measured count costs). Decisions
    read the running maximum (noise never makes more rows look cheaper)."""

    rows: tuple[int, ...]
    ms: tuple[float, ...]

    @property
    def envelope(self) -> list[float]:
        out, top = [], float("-inf")
        for t in self.ms:
            top = max(top, float(t))
            out.append(top)
        return out

    def plateau_end(self, rows: int, tolerance: float = PLATEAU_TOLERANCE) -> int:
        """The most rows that cost what ``rows`` costs: from the measured count covering ``rows``, onward while
        each next count costs at most (1 + tolerance) x the one before and (1 + 4 x tolerance) x the start;
        ``rows`` itself past the last measured count."""
        if rows >= self.rows[-1]:
            return int(rows)
        env = self.envelope
        i = next(k for k, count in enumerate(self.rows) if count >= rows)
        end = i
        while (
            end + 1 < len(self.rows)
            and env[end + 1] <= env[end] * (1 + tolerance)
            and env[end + 1] <= env[i] * (1 + 4 * tolerance)
        ):
            end += 1
        return max(int(rows), int(self.rows[end]))


def load_cost_curve(path: str, flag: str) -> CostCurve:
    """A c(R) file: JSON ``{"rows": [1, 2, ...], "ms": [...]}`` (e.g. the project's
    ``StepCosts.from_measurement(doc, shape).target.to_dict()`` of ``benchmarks/batched_costs.py``'s result);
    anything else is refused naming ``flag``."""
    try:
        with open(path) as handle:
            doc = json.load(handle)
        rows, ms = [int(r) for r in doc["rows"]], [float(t) for t in doc["ms"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BatchingArgumentError(flag, f"{path} is not a readable c(R) file ({err})",
                                    'give a JSON file {"rows": [...], "ms": [...]} measured on this GPU') from err
    if not rows or len(rows) != len(ms) or rows[0] < 1 or any(b <= a for a, b in zip(rows, rows[1:])) \
            or any(not t > 0 for t in ms):
        raise BatchingArgumentError(flag, f"{path}: rows must increase from 1 with one positive time each",
                                    "measure c(R) at increasing row counts R >= 1")
    return CostCurve(tuple(rows), tuple(ms))


def check_server_args(server_args) -> None:
    """Run every batching entry's check (``batching_checks.<module>.check(server_args)``)."""
    from sglang.srt.specpilot import batching_checks

    for info in sorted(pkgutil.iter_modules(batching_checks.__path__), key=lambda m: m.name):
        importlib.import_module(f"{batching_checks.__name__}.{info.name}").check(server_args)
