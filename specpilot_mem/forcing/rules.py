"""The two rejection rules of token forcing (§3.3).

Rate rule: reject if the system's mismatch rate exceeds stock's by more than 0.5 points at 95%
confidence, i.e. if the lower end of the two-sided 95% interval of (system rate - stock rate) is
above 0.005. Rates are ratios of totals (mismatches / tokens) with cluster-robust variance by request,
paired across the two systems because both answered the same requests (``controller.stats``).

Event rule: reject if a one-sided binomial test at level 0.05 finds the system's unexplained
large-margin events more frequent per token than stock's large-margin events. Given the two counts,
equal rates would split their sum in proportion to the tokens each side exposed, so the system's
count is Binomial(total, exposure share) under the null hypothesis. When only a sample of the events
is audited, the system's exposure is scaled by the sampled fraction (thinning keeps the count
Poisson), so the test uses audited counts only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from specpilot_mem.controller.stats import binomial_upper_tail, clustered_ratio, clustered_ratio_difference
from specpilot_mem.forcing.scorer import ForcingError, ScoredOutput

RATE_LIMIT = 0.005
LEVEL = 0.95
EVENT_ALPHA = 0.05


@dataclass(frozen=True)
class RateResult:
    system_rate: float
    system_low: float
    system_high: float
    stock_rate: float
    stock_low: float
    stock_high: float
    difference: float
    difference_low: float
    difference_high: float
    limit: float
    reject: bool

    def to_dict(self) -> dict:
        return asdict(self)


def mismatch_counts(scored: Mapping[str, ScoredOutput], ids: list[str]) -> tuple[list[int], list[int]]:
    """Per request (in ``ids`` order): mismatches and tokens."""
    return [int(scored[i].mismatch.sum()) for i in ids], [scored[i].tokens for i in ids]


def rate_rule(system: Mapping[str, ScoredOutput], stock: Mapping[str, ScoredOutput], limit: float = RATE_LIMIT,
              level: float = LEVEL) -> RateResult:
    if set(system) != set(stock):
        raise ForcingError(
            f"system and stock were scored on different requests ({len(set(system) ^ set(stock))} differ)",
            where="rate rule", fix="score both systems' outputs on the same request set",
        )
    ids = sorted(system)
    sys_m, sys_n = mismatch_counts(system, ids)
    stock_m, stock_n = mismatch_counts(stock, ids)
    sys_rate, stock_rate = clustered_ratio(sys_m, sys_n), clustered_ratio(stock_m, stock_n)
    diff = clustered_ratio_difference(sys_m, sys_n, stock_m, stock_n)
    diff_low, diff_high = diff.interval(level)
    sys_low, sys_high = sys_rate.interval(level)
    stock_low, stock_high = stock_rate.interval(level)
    return RateResult(
        sys_rate.value, max(sys_low, 0.0), sys_high, stock_rate.value, max(stock_low, 0.0), stock_high,
        diff.value, diff_low, diff_high, limit, reject=diff_low > limit,
    )


@dataclass(frozen=True)
class EventResult:
    delta: float
    threshold: float  # 2 * delta
    system_events: int
    system_tokens: int
    audited: int
    unexplained: int
    stock_events: int
    stock_tokens: int
    p_value: float
    alpha: float
    reject: bool

    def to_dict(self) -> dict:
        return asdict(self)


def event_rule(
    *, delta: float, system_events: int, system_tokens: int, audited: int, unexplained: int,
    stock_events: int, stock_tokens: int, alpha: float = EVENT_ALPHA,
) -> EventResult:
    if not 0 <= unexplained <= audited <= system_events:
        raise ForcingError(f"inconsistent audit counts: {unexplained} unexplained of {audited} audited of {system_events}",
                           where="event rule", fix="audit a sample of the system's events")
    if system_tokens <= 0 or stock_tokens <= 0:
        raise ForcingError("no tokens to take an event rate over", where="event rule", fix="score non-empty outputs")
    exposure = system_tokens * (audited / system_events) if system_events else 0.0
    total = unexplained + stock_events
    share = exposure / (exposure + stock_tokens) if exposure else 0.0
    p_value = binomial_upper_tail(unexplained, total, share)
    return EventResult(delta, 2 * delta, system_events, system_tokens, audited, unexplained, stock_events, stock_tokens,
                       p_value, alpha, reject=unexplained > 0 and p_value < alpha)
