"""Token forcing end to end: a system's scored outputs in, a verdict with all its numbers out."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from specpilot_mem.forcing.audit import AUDIT_SAMPLE, audit, find_events
from specpilot_mem.forcing.rules import EVENT_ALPHA, RATE_LIMIT, EventResult, RateResult, event_rule, rate_rule
from specpilot_mem.controller.requests import Request
from specpilot_mem.controller.system import RequestOutput
from specpilot_mem.forcing.scorer import ForcingError, ScoredOutput, Scorer, score_outputs

UNEXPLAINED_EXAMPLES = 10


@dataclass(frozen=True)
class Verdict:
    """The outcome of token forcing for one system against stock. ``to_dict`` is its JSON form."""

    system: str
    stock: str
    verdict: Literal["accept", "reject"]
    reasons: tuple[str, ...]
    requests: int
    delta: float
    rate: RateResult
    events: EventResult
    explained_by: dict[str, int]
    unexplained_examples: tuple[dict, ...] = field(default_factory=tuple)
    synthetic: bool = False

    def to_dict(self) -> dict:
        return {
            "system": self.system, "stock": self.stock, "verdict": self.verdict, "reasons": list(self.reasons),
            "requests": self.requests, "delta": self.delta, "synthetic": self.synthetic,
            "rate": self.rate.to_dict(), "events": self.events.to_dict(), "explained_by": dict(self.explained_by),
            "unexplained_examples": list(self.unexplained_examples),
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "Verdict":
        return cls(
            system=data["system"], stock=data["stock"], verdict=data["verdict"], reasons=tuple(data["reasons"]),
            requests=data["requests"], delta=data["delta"], rate=RateResult(**data["rate"]),
            events=EventResult(**data["events"]), explained_by=dict(data["explained_by"]),
            unexplained_examples=tuple(data.get("unexplained_examples", ())), synthetic=data.get("synthetic", False),
        )


@dataclass
class TokenForcing:
    """Judges systems against one scored stock run, with δ from Phase 0's calibration.

    ``stock_paths`` holds, per request, every output stock produced (its runs at each batch size);
    by default just the scored stock outputs. ``stock_engine`` is an optional scorer that returns
    the stock engine's own decode-time logits (no FP32 head) for the audit's stock-margin check.
    """

    scorer: Scorer
    stock: Mapping[str, ScoredOutput]
    delta: float
    stock_paths: Mapping[str, Sequence[Sequence[int]]] | None = None
    stock_engine: Scorer | None = None
    stock_name: str = "stock"
    audit_sample: int = AUDIT_SAMPLE
    seed: int = 0
    rate_limit: float = RATE_LIMIT
    alpha: float = EVENT_ALPHA

    def __post_init__(self) -> None:
        if self.delta <= 0:
            raise ForcingError(f"δ must be positive, got {self.delta}", where="delta", fix="calibrate δ on AR and stock outputs")
        if self.stock_paths is None:
            self.stock_paths = {rid: [out.output_ids] for rid, out in self.stock.items()}

    def judge(self, name: str, system: Mapping[str, ScoredOutput], *, synthetic: bool = False,
              on_event: Callable[[], None] | None = None) -> Verdict:
        rate = rate_rule(system, self.stock, limit=self.rate_limit)
        events = find_events(system, self.delta)
        audited = audit(events, system, scorer=self.scorer, stock_paths=self.stock_paths, stock_engine=self.stock_engine,
                        sample=self.audit_sample, seed=self.seed, on_event=on_event)
        event = event_rule(
            delta=self.delta, system_events=len(events), system_tokens=sum(o.tokens for o in system.values()),
            audited=len(audited.sampled), unexplained=audited.unexplained,
            stock_events=len(find_events(self.stock, self.delta)), stock_tokens=sum(o.tokens for o in self.stock.values()),
            alpha=self.alpha,
        )
        reasons = []
        if rate.reject:
            reasons.append(
                f"rate rule: mismatch rate {100 * rate.system_rate:.2f}% exceeds stock's {100 * rate.stock_rate:.2f}% by "
                f"{100 * rate.difference:.2f} points, 95% lower bound {100 * rate.difference_low:.2f} > {100 * rate.limit:.2f}"
            )
        if event.reject:
            reasons.append(
                f"event rule: {event.unexplained} of {event.audited} audited large-margin events (margin > {event.threshold:g}) "
                f"unexplained, against {event.stock_events} stock events; binomial p = {event.p_value:.2g} < {event.alpha:g}"
            )
        examples = tuple(a.to_dict() for a in audited.sampled if a.explained_by is None)[:UNEXPLAINED_EXAMPLES]
        return Verdict(
            system=name, stock=self.stock_name, verdict="reject" if reasons else "accept", reasons=tuple(reasons),
            requests=len(system), delta=self.delta, rate=rate, events=event, explained_by=audited.explained_by(),
            unexplained_examples=examples, synthetic=synthetic,
        )



def judge_outputs(
    system_outputs: Mapping[str, RequestOutput],
    stock_outputs: Mapping[str, RequestOutput],
    *,
    scorer: Scorer,
    requests: Sequence[Request],
    delta: float,
    name: str,
    encode: Callable[[str], Sequence[int]] | None = None,
    stock_engine: Scorer | None = None,
    synthetic: bool = False,
) -> Verdict:
    """Score both systems' outputs and judge the system (what a sealed final's token forcing runs)."""
    stock = score_outputs(scorer, requests, stock_outputs, encode=encode)
    system = score_outputs(scorer, requests, system_outputs, encode=encode)
    return TokenForcing(scorer, stock, delta, stock_engine=stock_engine).judge(name, system, synthetic=synthetic)
