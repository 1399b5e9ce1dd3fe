"""Token forcing end to end: a system's scored outputs in, a verdict with all its numbers out.

A verdict is ``reject`` when any rule rejects (rate, event, band, tail, request, length), ``inconclusive`` when none
does but the sample could not have seen a 0.5-point rate excess or a doubling of large-margin events
(``rules.Power``), and ``accept`` only when none rejects and the sample was large enough to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from specpilot_mem.forcing.audit import AUDIT_SAMPLE, audit, find_events
from specpilot_mem.controller.stats import binomial_upper_tail
from specpilot_mem.forcing.rules import (
    EVENT_ALPHA,
    RATE_LIMIT,
    BandResult,
    EventResult,
    LengthResult,
    Power,
    RateResult,
    RequestResult,
    TailResult,
    band_rule,
    event_rule,
    length_rule,
    power,
    rate_rule,
    request_rule,
    shared_prefix,
    stop_reason,
    tail_rule,
)
from specpilot_mem.controller.requests import Request
from specpilot_mem.controller.system import RequestOutput
from specpilot_mem.forcing.scorer import ForcingError, ScoredOutput, Scorer, score_outputs

UNEXPLAINED_EXAMPLES = 10
# per-request tails repeat (most requests of most systems have a handful of mismatches at stock's rate)
_upper_tail = lru_cache(maxsize=4096)(binomial_upper_tail)


@dataclass(frozen=True)
class Verdict:
    """The outcome of token forcing for one system against stock. ``to_dict`` is its JSON form."""

    system: str
    stock: str
    verdict: Literal["accept", "reject", "inconclusive"]
    reasons: tuple[str, ...]
    requests: int
    delta: float
    rate: RateResult
    events: EventResult
    explained_by: dict[str, int]
    unexplained_examples: tuple[dict, ...] = field(default_factory=tuple)
    synthetic: bool = False
    band: BandResult | None = None
    length: LengthResult | None = None
    power: Power | None = None
    per_request: tuple[dict, ...] = field(default_factory=tuple)
    tail: TailResult | None = None
    request: RequestResult | None = None

    def to_dict(self) -> dict:
        return {
            "system": self.system,
            "stock": self.stock,
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "requests": self.requests,
            "delta": self.delta,
            "synthetic": self.synthetic,
            "rate": self.rate.to_dict(),
            "events": self.events.to_dict(),
            "explained_by": dict(self.explained_by),
            "unexplained_examples": list(self.unexplained_examples),
            "band": self.band.to_dict() if self.band else None,
            "length": self.length.to_dict() if self.length else None,
            "power": self.power.to_dict() if self.power else None,
            "power_statement": self.power.statement() if self.power else None,
            "per_request": list(self.per_request),
            "tail": self.tail.to_dict() if self.tail else None,
            "request": self.request.to_dict() if self.request else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "Verdict":
        length = data.get("length")
        return cls(
            system=data["system"],
            stock=data["stock"],
            verdict=data["verdict"],
            reasons=tuple(data["reasons"]),
            requests=data["requests"],
            delta=data["delta"],
            rate=RateResult(**data["rate"]),
            events=EventResult(**data["events"]),
            explained_by=dict(data["explained_by"]),
            unexplained_examples=tuple(data.get("unexplained_examples", ())),
            synthetic=data.get("synthetic", False),
            band=BandResult(**data["band"]) if data.get("band") else None,
            length=LengthResult.from_dict(length) if length else None,
            power=Power(**data["power"]) if data.get("power") else None,
            per_request=tuple(data.get("per_request", ())),
            tail=TailResult(**{**data["tail"], "bands": tuple(data["tail"]["bands"])}) if data.get("tail") else None,
            request=RequestResult(**data["request"]) if data.get("request") else None,
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
    stop_ids: frozenset[int] = frozenset()
    # a study's shortcut: no audit (its prefill re-scores are the costly part) once another rule rejects; the
    # verdict is the same, the event rule's numbers say "not audited"
    skip_settled_audit: bool = False

    def __post_init__(self) -> None:
        if self.delta <= 0:
            raise ForcingError(
                f"δ must be positive, got {self.delta}", where="delta", fix="calibrate δ on AR and stock outputs"
            )
        if self.stock_paths is None:
            self.stock_paths = {rid: [out.output_ids] for rid, out in self.stock.items()}
        self.stop_ids = frozenset(self.stop_ids or getattr(self.scorer, "stop_ids", ()))
        cut = [
            rid
            for rid, out in sorted(self.stock.items())
            if stop_reason(out, self.stop_ids, out.max_new_tokens) in ("truncated", "overlong")
        ]
        if cut:
            raise ForcingError(
                f"stock's outputs stop short of (or run past) their max_new_tokens on {len(cut)} "
                f"request(s), e.g. {cut[:5]}",
                where="stock outputs",
                fix="judge against a complete stock run: every output must run to max_new_tokens or "
                "end on a stop token",
            )

    def _unaudited_rules(self, system: Mapping[str, ScoredOutput]) -> tuple:
        """The rules that need no audit: rate, band, tail (with the tails), request (with its p-values), length."""
        rate = rate_rule(system, self.stock, limit=self.rate_limit)
        band = band_rule(system, self.stock, delta=self.delta)
        tail, tails = tail_rule(system, self.stock, delta=self.delta)
        request, request_ps = request_rule(tails)
        length = length_rule(system, self.stock, self.stop_ids)
        return rate, band, tail, tails, request, request_ps, length

    def needs_audit(self, system: Mapping[str, ScoredOutput]) -> bool:
        """Whether ``judge`` audits this system's events (always, unless ``skip_settled_audit`` and a rule that needs
        no audit rejects it already)."""
        if not self.skip_settled_audit:
            return True
        rate, band, tail, _, request, _, length = self._unaudited_rules(system)
        return not _any_reject(rate, band, tail, request, length)

    def audit(self, system: Mapping[str, ScoredOutput], *, on_event: Callable[[], None] | None = None):
        """The system's large-margin events and the audit of their seeded sample: what ``judge``'s event rule
        counts (``audit.Audit``)."""
        events = find_events(system, self.delta)
        return events, audit(
            events,
            system,
            scorer=self.scorer,
            stock_paths=self.stock_paths,
            stock_engine=self.stock_engine,
            sample=self.audit_sample,
            seed=self.seed,
            on_event=on_event,
        )

    def judge(
        self,
        name: str,
        system: Mapping[str, ScoredOutput],
        *,
        synthetic: bool = False,
        on_event: Callable[[], None] | None = None,
    ) -> Verdict:
        rate, band, tail, tails, request, request_ps, length = self._unaudited_rules(system)
        if self.skip_settled_audit and _any_reject(rate, band, tail, request, length):
            events, audited = find_events(system, self.delta), None
        else:
            events, audited = self.audit(system, on_event=on_event)
        event = event_rule(
            delta=self.delta,
            system_events=len(events),
            system_tokens=sum(o.tokens for o in system.values()),
            audited=len(audited.sampled) if audited else 0,
            unexplained=audited.unexplained if audited else 0,
            stock_events=len(find_events(self.stock, self.delta)),
            stock_tokens=sum(o.tokens for o in self.stock.values()),
            alpha=self.alpha,
        )
        seen = power(system, self.stock, delta=self.delta, rate=rate, alpha=self.alpha)
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
        if audited is None and events:
            reasons.append(f"event rule: {len(events)} large-margin events not audited (another rule rejects)")
        if band.reject:
            reasons.append(
                f"band rule: {band.system_mismatches} mismatches with margin in ({band.low:g}, {band.high:g}] against "
                f"stock's {band.stock_mismatches} (ratio {band.ratio:.3g} per token); p = {band.p_value:.2g} < "
                f"{band.alpha:g} for a ratio above 2"
            )
        if tail.reject:
            reasons.append(
                f"tail rule: after the shared prefixes, {tail.system_mismatches} distinct mismatches against stock's "
                f"{tail.stock_mismatches}; margins larger (Mann-Whitney z = {tail.rank_z:.2f}, p = {tail.rank_p:.2g}), "
                f"gap bands p = {tail.band_p:.2g} (Bonferroni); level {tail.alpha:g} split between the two"
            )
        if request.reject:
            reasons.append(
                f"request rule: request {request.worst} has {request.worst_mismatches} distinct mismatches after its "
                f"shared prefix against stock's {request.worst_stock_mismatches}; p = {request.worst_p:.2g} for a "
                f"ratio above 2, {request.p_value:.2g} over {request.tests} requests that could reject (Tarone) < {request.alpha:g}"
            )
        if length.truncated or length.overlong:
            cut = [*length.truncated, *length.overlong]
            reasons.append(
                f"length rule: {len(cut)} output(s) stop where no lossless system stops (not at "
                f"max_new_tokens, not on a stop token), e.g. {cut[:5]}"
            )
        if length.stop_inconsistent:
            reasons.append(
                f"length rule: {len(length.stop_inconsistent)} output(s) report a stop reason stock never gives or "
                f"that their own output contradicts, e.g. {list(length.stop_inconsistent[:5])}"
            )
        if reasons:
            outcome = "reject"
        elif not seen.sufficient:
            outcome = "inconclusive"
            reasons.append("inconclusive: no rule rejects, but " + seen.statement())
        else:
            outcome = "accept"
        sampled = audited.sampled if audited else ()
        examples = tuple(a.to_dict() for a in sampled if a.explained_by is None)[:UNEXPLAINED_EXAMPLES]
        return Verdict(
            system=name,
            stock=self.stock_name,
            verdict=outcome,
            reasons=tuple(reasons),
            requests=len(system),
            delta=self.delta,
            rate=rate,
            events=event,
            explained_by=audited.explained_by() if audited else {},
            unexplained_examples=examples,
            synthetic=synthetic,
            band=band,
            length=length,
            power=seen,
            per_request=self._per_request(system, events, request_ps),
            tail=tail,
            request=request,
        )

    def _per_request(
        self, system: Mapping[str, ScoredOutput], events, tail_ps: Mapping[str, float]
    ) -> tuple[dict, ...]:
        """Each request's counts beside stock's, and how improbable its mismatches are at stock's pooled
        rate (binomial tail; ``flagged`` below 0.05 / requests): a fault confined to a few requests
        shows here even when the pooled rates hide it."""
        tokens = sum(o.tokens for o in self.stock.values())
        pooled = max(sum(int(o.mismatch.sum()) for o in self.stock.values()), 1) / max(tokens, 1)
        per_event: dict[str, int] = {}
        for event in events:
            per_event[event.id] = per_event.get(event.id, 0) + 1
        rows = []
        for rid in sorted(system):
            out, ref = system[rid], self.stock[rid]
            mismatches = int(out.mismatch.sum())
            p_value = _upper_tail(mismatches, out.tokens, pooled)
            rows.append(
                {
                    "id": rid,
                    "tokens": out.tokens,
                    "stock_tokens": ref.tokens,
                    "mismatches": mismatches,
                    "stock_mismatches": int(ref.mismatch.sum()),
                    "events": per_event.get(rid, 0),
                    "stop": stop_reason(
                        out, self.stop_ids, out.max_new_tokens if out.max_new_tokens is not None else ref.tokens
                    ),
                    "reported_stop": out.stop_reason,
                    "stock_reported_stop": ref.stop_reason,
                    "p_value": p_value,
                    "flagged": p_value < 0.05 / len(system),
                    "shared_prefix": shared_prefix(out.output_ids, ref.output_ids),
                    "tail_p_value": tail_ps.get(rid),
                }
            )
        return tuple(rows)


def _any_reject(*results) -> bool:
    return any(r.reject for r in results)


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
