"""Large-margin events and their audit (§3.3).

An event is a mismatch whose margin exceeds 2δ: the system emitted a token the scorer ranks well
below its argmax, further than rounding explains. The audit explains an event, in this order, if

- ``stock-path``: stock emitted the same token at that position after the same prefix on one of its
  own runs (stock makes the same departure, so the system is no worse than stock there);
- ``stock-margin``: the stock engine's own logits, teacher-forced on the system's prefix, have that
  token as their argmax (stock would have made the same choice had it reached this prefix);
- ``prefill-length``: re-scoring with the prefill ending at the event (and one token earlier) makes
  the emitted token the scorer's argmax, so the scorer itself is at a near-tie between the emitted
  token and its argmax that depends on kernel shape. An argmax that moves to some third token
  explains nothing about the emitted one, and an event whose margin exceeds ``DELTA_MAX`` (1 nat, the
  calibration's bound on what rounding does) is no near-tie of the scorer: it is not re-scored.

Like the paper, a seeded sample of events is audited (200 by default); the event rule then uses
the sampled counts. The prefill-length re-scores of one output's events share one pass where the scorer
offers ``prefill_argmax`` (the pure-torch engine's: bit for bit what ``score`` gives).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from specpilot_mem.forcing.calibrate import DELTA_MAX
from specpilot_mem.forcing.scorer import ScoredOutput, Scorer

AUDIT_SAMPLE = 200
EXPLANATIONS = ("stock-path", "stock-margin", "prefill-length")


@dataclass(frozen=True)
class Event:
    id: str
    position: int
    token: int
    argmax: int
    margin: float


@dataclass(frozen=True)
class AuditedEvent:
    event: Event
    explained_by: str | None

    def to_dict(self) -> dict:
        return {**asdict(self.event), "explained_by": self.explained_by}


@dataclass(frozen=True)
class Audit:
    events: int
    sampled: tuple[AuditedEvent, ...]

    @property
    def unexplained(self) -> int:
        return sum(1 for a in self.sampled if a.explained_by is None)

    def explained_by(self) -> dict[str, int]:
        counts = Counter(a.explained_by for a in self.sampled if a.explained_by is not None)
        return {name: counts.get(name, 0) for name in EXPLANATIONS}


def find_events(scored: Mapping[str, ScoredOutput], delta: float) -> list[Event]:
    """Every mismatch with margin > 2δ, ordered by request id and position."""
    events = []
    for rid in sorted(scored):
        output = scored[rid]
        margins = output.margin
        for position in (margins > 2 * delta).nonzero()[0]:
            p = int(position)
            events.append(Event(rid, p, output.output_ids[p], int(output.scores.argmax[p]), float(margins[p])))
    return events


def _stock_path(event: Event, output: ScoredOutput, stock_paths: Sequence[Sequence[int]]) -> bool:
    prefix = output.output_ids[: event.position + 1]
    return any(tuple(path[: event.position + 1]) == prefix for path in stock_paths)


def _argmax_at(scorer: Scorer, output: ScoredOutput, position: int, prefill_len: int | None) -> int:
    scores = scorer.score(list(output.prompt_ids), list(output.output_ids[: position + 1]), prefill_len=prefill_len)
    return int(scores.argmax[position])


def _prefill_lengths(prompt_len: int, position: int) -> list[int]:
    """Prefill ending at the event's row (its logits are the prefill's last row), and one token earlier
    (its logits come from a one-token decode step)."""
    end = prompt_len + position
    return [p for p in (end, end - 1) if p >= 1]


def _explained_by_stock(
    event: Event, output: ScoredOutput, stock_paths: Sequence[Sequence[int]], stock_engine: Scorer | None
) -> str | None:
    if _stock_path(event, output, stock_paths):
        return "stock-path"
    if stock_engine is not None and _argmax_at(stock_engine, output, event.position, None) == event.token:
        return "stock-margin"
    return None


def _prefill_explained(scorer: Scorer, output: ScoredOutput, events: Sequence[Event]) -> list[bool]:
    """Whether re-scoring at either prefill length makes each event's emitted token the argmax. A scorer with
    ``prefill_argmax(prompt_ids, output_ids, [(position, prefill_len), ...])`` answers all of one output's
    events from one shared pass (the same argmaxes ``score`` gives); else one ``score`` per event and length. Events
    whose margin exceeds ``DELTA_MAX`` are not near-ties: no re-chunking moves a log-prob by that much."""
    near = [e for e in events if e.margin <= DELTA_MAX]
    queries = [(e.position, p) for e in near for p in _prefill_lengths(len(output.prompt_ids), e.position)]
    batched = getattr(scorer, "prefill_argmax", None)
    if batched is not None and queries:
        found = dict(zip(queries, batched(list(output.prompt_ids), list(output.output_ids), queries)))
    else:
        found = {}
    explained = []
    for e in events:
        if e.margin > DELTA_MAX:
            explained.append(False)
            continue
        hit = False
        for p in _prefill_lengths(len(output.prompt_ids), e.position):
            argmax = found[(e.position, p)] if batched is not None else _argmax_at(scorer, output, e.position, p)
            if argmax == e.token:
                hit = True
                break
        explained.append(hit)
    return explained


def explain(
    event: Event,
    output: ScoredOutput,
    *,
    scorer: Scorer,
    stock_paths: Sequence[Sequence[int]],
    stock_engine: Scorer | None,
) -> str | None:
    reason = _explained_by_stock(event, output, stock_paths, stock_engine)
    if reason is None and _prefill_explained(scorer, output, [event])[0]:
        reason = "prefill-length"
    return reason


def audit(
    events: Sequence[Event],
    scored: Mapping[str, ScoredOutput],
    *,
    scorer: Scorer,
    stock_paths: Mapping[str, Sequence[Sequence[int]]],
    stock_engine: Scorer | None = None,
    sample: int = AUDIT_SAMPLE,
    seed: int = 0,
    on_event: Callable[[], None] | None = None,
) -> Audit:
    """Audit a seeded sample of at most ``sample`` events (all of them when there are fewer)."""
    chosen = list(events) if len(events) <= sample else random.Random(seed).sample(list(events), sample)
    chosen.sort(key=lambda e: (e.id, e.position))
    reasons = {}
    for event in chosen:
        reasons[event] = _explained_by_stock(event, scored[event.id], stock_paths.get(event.id, ()), stock_engine)
    # the prefill-length check for what stock does not explain, one output's events at a time
    for rid in sorted({e.id for e in chosen}):
        left = [e for e in chosen if e.id == rid and reasons[e] is None]
        if left:
            for event, hit in zip(left, _prefill_explained(scorer, scored[rid], left)):
                reasons[event] = "prefill-length" if hit else None
    audited = []
    for event in chosen:
        audited.append(AuditedEvent(event, reasons[event]))
        if on_event is not None:
            on_event()
    return Audit(len(events), tuple(audited))
