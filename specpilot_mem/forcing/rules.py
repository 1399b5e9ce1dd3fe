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

Band rule (for lossy verifies whose flips all sit under 2δ): mismatches whose margin lies in the
upper near-tie band (δ/2, 2δ] are counted per token, and the system is rejected if a one-sided
binomial test at level 0.01 finds them more than ``BAND_RATIO`` (2) times as frequent as stock's.
Rounding flips at near-ties concentrate below δ/2 and occur at stock's rate whatever the reduction
order; a verify with coarser weights flips near-ties that are further apart, which moves its
mismatches up into the band (see ``docs/token-forcing.md``, fault study).

Length rule: every output runs to its request's ``max_new_tokens`` or ends on a stop token; an
output cut short elsewhere (or one longer than its limit) is a fault whatever its tokens. Where the
system and stock report stop reasons, a system's reason must be one stock gives and must agree with
its output ("length" only at the limit, "stop" only on a stop token when the stop tokens are known).

Power: from stock's numbers and the sample, the smallest rate difference the rate rule detects with
80% power, the events the event rule needs, and (reported) the band rule's power against flips at 0.3% of the
tokens; ``verdict.py`` says ``inconclusive`` rather than ``accept`` when the rate or event rule could not have
seen what it is there to see.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import math

import numpy as np

from specpilot_mem.controller.stats import binomial_upper_tail, clustered_ratio, clustered_ratio_difference, t_quantile
from specpilot_mem.forcing.scorer import ForcingError, ScoredOutput

RATE_LIMIT = 0.005
LEVEL = 0.95
EVENT_ALPHA = 0.05
BAND_ALPHA = 0.01
BAND_RATIO = 2.0
POWER = 0.8
Z_POWER = 0.8416212335729143  # the standard normal's 80% quantile
# The event rate the event rule must be able to see (per token) when stock has almost no events:
# one large-margin event per 1,000 tokens.
EVENT_FLOOR = 1e-3
# Issue 38's target for a fault whose flips sit under 2δ: 0.3% of the tokens changed (the band rule's power is
# reported against it).
CHANGE_FLOOR = 3e-3


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


def rate_rule(
    system: Mapping[str, ScoredOutput],
    stock: Mapping[str, ScoredOutput],
    limit: float = RATE_LIMIT,
    level: float = LEVEL,
) -> RateResult:
    if set(system) != set(stock):
        raise ForcingError(
            f"system and stock were scored on different requests ({len(set(system) ^ set(stock))} differ)",
            where="rate rule",
            fix="score both systems' outputs on the same request set",
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
        sys_rate.value,
        max(sys_low, 0.0),
        sys_high,
        stock_rate.value,
        max(stock_low, 0.0),
        stock_high,
        diff.value,
        diff_low,
        diff_high,
        limit,
        reject=diff_low > limit,
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
    *,
    delta: float,
    system_events: int,
    system_tokens: int,
    audited: int,
    unexplained: int,
    stock_events: int,
    stock_tokens: int,
    alpha: float = EVENT_ALPHA,
) -> EventResult:
    if not 0 <= unexplained <= audited <= system_events:
        raise ForcingError(
            f"inconsistent audit counts: {unexplained} unexplained of {audited} audited of {system_events}",
            where="event rule",
            fix="audit a sample of the system's events",
        )
    if system_tokens <= 0 or stock_tokens <= 0:
        raise ForcingError("no tokens to take an event rate over", where="event rule", fix="score non-empty outputs")
    exposure = system_tokens * (audited / system_events) if system_events else 0.0
    total = unexplained + stock_events
    share = exposure / (exposure + stock_tokens) if exposure else 0.0
    p_value = binomial_upper_tail(unexplained, total, share)
    return EventResult(
        delta,
        2 * delta,
        system_events,
        system_tokens,
        audited,
        unexplained,
        stock_events,
        stock_tokens,
        p_value,
        alpha,
        reject=unexplained > 0 and p_value < alpha,
    )


def needed_events(stock_events: int, share: float, alpha: float) -> int | None:
    """The fewest unexplained events the binomial test rejects on, given stock's count (None: never)."""
    for x in range(1, 10_000):
        if binomial_upper_tail(x, x + stock_events, share) < alpha:
            return x
    return None


def poisson_at_least(k: int, mean: float) -> float:
    """P(Poisson(mean) >= k)."""
    if k <= 0:
        return 1.0
    term, below = math.exp(-mean), 0.0
    for i in range(k):
        below += term
        term *= mean / (i + 1)
    return max(0.0, 1.0 - below)


@dataclass(frozen=True)
class Power:
    """What the sample can see. Rate rule: ``rate_detectable`` is the smallest mismatch-rate excess over
    stock it rejects with 80% power (the limit plus (t + z_0.8) standard errors of the paired
    difference, the larger of stock's calibrated one and the one observed); the sample suffices when
    that is at most twice the limit (it can tell the 0.5-point margin from no excess at all).
    Event rule: ``events_needed`` is the fewest unexplained events it rejects on given stock's count;
    ``event_power`` the chance of seeing them if the system's unexplained events ran at twice stock's
    rate (at least one per 1,000 tokens). Band rule: ``band_needed`` is the fewest mismatches with margin in
    (δ/2, 2δ] it rejects on given stock's count there; ``band_power`` the chance of seeing them if the system flipped
    0.3% of its tokens more than stock in that band (``CHANGE_FLOOR``): issue 38's size for flips under 2δ,
    reported but not required (``sufficient``), since no sample reaches it once stock flips 0.3% there itself;
    flips at margins up to δ/2, within rounding's own reach, only the rate rule's 0.5-point margin bounds.
    ``requests_needed`` and ``tokens_needed`` say what would suffice (the same tokens per request).
    ``band_sufficient`` is None in verdicts written before the band power existed."""

    rate_se: float
    rate_detectable: float
    rate_sufficient: bool
    events_needed: int | None
    event_alternative: float
    event_power: float
    event_sufficient: bool
    requests: int
    tokens: int
    requests_needed: int
    tokens_needed: int
    band_needed: int | None = None
    band_alternative: float | None = None
    band_power: float | None = None
    band_sufficient: bool | None = None

    @property
    def sufficient(self) -> bool:
        # the band power is reported, not required: where stock's own flips crowd (δ/2, 2δ] it cannot reach 80% at
        # any sample size (docs/token-forcing.md, "Verdicts")
        return self.rate_sufficient and self.event_sufficient

    @property
    def band_reachable(self) -> bool:
        """Whether any sample lets the band rule see 0.3% of the tokens flipped: not once stock's own band rate is
        so high that stock's plus 0.3% stays within ``BAND_RATIO`` times stock's."""
        return self.band_alternative is None or _band_can_see(self.band_alternative - CHANGE_FLOOR)

    def to_dict(self) -> dict:
        return asdict(self)

    def statement(self) -> str:
        """The power in words, with what sample would suffice."""
        text = (
            f"rate rule detects an excess of {100 * self.rate_detectable:.2f} points with 80% power; event rule needs "
            f"{self.events_needed} unexplained events and sees a rate of {1000 * self.event_alternative:.2g} per "
            f"1,000 tokens with {100 * self.event_power:.0f}% power"
        )
        if self.band_power is not None and self.band_reachable:
            text += (
                f"; band rule needs {self.band_needed} mismatches in (δ/2, 2δ] and sees {100 * CHANGE_FLOOR:g}% of "
                f"the tokens flipped there with {100 * self.band_power:.0f}% power"
            )
        elif self.band_power is not None:
            text += (
                f"; band rule cannot see {100 * CHANGE_FLOOR:g}% of the tokens flipped in (δ/2, 2δ] at any sample size: "
                f"stock flips {100 * (self.band_alternative - CHANGE_FLOOR):.2f}% there itself"
            )
        text += f" ({self.requests} requests, {self.tokens} tokens)"
        if not self.sufficient:
            text += (
                f"; the sample cannot tell: about {self.requests_needed} requests ({self.tokens_needed} tokens) "
                "would suffice"
            )
        return text


def _rate_resolution(
    stock_m: list[int], stock_n: list[int], observed_se: float, level: float, limit: float
) -> tuple[float, float]:
    """(standard error, detectable excess) of the paired rate difference."""
    requests, tokens = len(stock_n), sum(stock_n)
    stock = clustered_ratio(stock_m, stock_n)
    alternative = min(stock.value + 2 * limit, 1.0)
    # A system like stock, independent of it, at rate stock + 2 * limit: the difference's variance is
    # stock's twice over plus the binomial variance the extra mismatches add.
    calibrated = math.sqrt(2 * stock.se**2 + alternative * (1 - alternative) / tokens) if requests > 1 else math.inf
    se = max(calibrated, observed_se if math.isfinite(observed_se) else math.inf)
    t = t_quantile(0.5 + level / 2, max(requests - 1, 1))
    return se, limit + (t + Z_POWER) * se


def _event_power(
    stock_events: int, stock_tokens: int, system_tokens: int, alpha: float
) -> tuple[int | None, float, float]:
    share = system_tokens / (system_tokens + stock_tokens)
    needed = needed_events(stock_events, share, alpha)
    alternative = max(2 * stock_events / stock_tokens, EVENT_FLOOR)
    power = 0.0 if needed is None else poisson_at_least(needed, alternative * system_tokens)
    return needed, alternative, power


def _band_can_see(stock_rate: float) -> bool:
    """Whether a system flipping ``CHANGE_FLOOR`` of its tokens in the band beyond stock's ``stock_rate`` there
    exceeds the band rule's null of ``BAND_RATIO`` times stock's rate."""
    return stock_rate + CHANGE_FLOOR > BAND_RATIO * stock_rate


def _band_power(
    stock_band: int, stock_tokens: int, system_tokens: int, ratio: float, alpha: float
) -> tuple[int | None, float, float]:
    """(fewest band mismatches the band rule rejects on, the alternative's band rate per token, its power): the
    alternative flips ``CHANGE_FLOOR`` of its tokens in the band beyond stock's rate there (Poisson counts)."""
    share = ratio * system_tokens / (ratio * system_tokens + stock_tokens)
    needed = needed_events(stock_band, share, alpha)
    alternative = stock_band / stock_tokens + CHANGE_FLOOR
    return needed, alternative, 0.0 if needed is None else poisson_at_least(needed, alternative * system_tokens)


def power(
    system: Mapping[str, ScoredOutput],
    stock: Mapping[str, ScoredOutput],
    *,
    delta: float,
    rate: RateResult,
    level: float = LEVEL,
    alpha: float = EVENT_ALPHA,
) -> Power:
    """The power of the rate, event and band rules on this sample (``Power``)."""
    ids = sorted(stock)
    stock_m, stock_n = mismatch_counts(stock, ids)
    requests, tokens = len(ids), sum(stock_n)
    t = t_quantile(0.5 + level / 2, max(requests - 1, 1))
    observed_se = (rate.difference_high - rate.difference) / t if requests > 1 else math.inf
    se, detectable = _rate_resolution(stock_m, stock_n, observed_se, level, rate.limit)
    stock_events = sum(int((o.margin > 2 * delta).sum()) for o in stock.values())
    system_tokens = sum(o.tokens for o in system.values())
    needed, alternative, event_power = _event_power(stock_events, tokens, system_tokens, alpha)
    stock_band = band_counts(stock, delta / 2, 2 * delta)
    band_needed, band_alternative, band_power = _band_power(stock_band, tokens, system_tokens, BAND_RATIO, BAND_ALPHA)
    rate_ok, event_ok, band_ok = detectable <= 2 * rate.limit, event_power >= POWER, band_power >= POWER
    scale = 1.0
    if not rate_ok and math.isfinite(se):
        scale = max(scale, ((t + Z_POWER) * se / rate.limit) ** 2)
    if not event_ok:
        factor = 1.0
        while factor < 1e4:
            factor *= 1.25
            n_sys, n_stock = int(system_tokens * factor), int(tokens * factor)
            k = round(stock_events * factor)
            if _event_power(k, n_stock, n_sys, alpha)[2] >= POWER:
                break
        scale = max(scale, factor)
    if not math.isfinite(scale):
        scale = 1e4
    return Power(
        se,
        detectable,
        rate_ok,
        needed,
        alternative,
        event_power,
        event_ok,
        requests,
        tokens,
        requests_needed=max(requests, math.ceil(requests * scale)),
        tokens_needed=max(tokens, math.ceil(tokens * scale)),
        band_needed=band_needed,
        band_alternative=band_alternative,
        band_power=band_power,
        band_sufficient=band_ok,
    )


@dataclass(frozen=True)
class BandResult:
    low: float  # the band is (low, high] nats of margin
    high: float
    system_mismatches: int
    system_tokens: int
    stock_mismatches: int
    stock_tokens: int
    ratio: float
    p_value: float
    alpha: float
    reject: bool

    def to_dict(self) -> dict:
        return asdict(self)


def band_counts(scored: Mapping[str, ScoredOutput], low: float, high: float) -> int:
    return sum(int(((o.margin > low) & (o.margin <= high)).sum()) for o in scored.values())


def band_rule(
    system: Mapping[str, ScoredOutput],
    stock: Mapping[str, ScoredOutput],
    *,
    delta: float,
    ratio: float = BAND_RATIO,
    alpha: float = BAND_ALPHA,
) -> BandResult:
    """Reject if mismatches with margin in (δ/2, 2δ] are more than ``ratio`` times as frequent per token
    as stock's: under that null, given both counts, the system's is Binomial(sum, π) with
    π = ratio·N_sys / (ratio·N_sys + N_stock)."""
    low, high = delta / 2, 2 * delta
    x, s = band_counts(system, low, high), band_counts(stock, low, high)
    n_sys, n_stock = sum(o.tokens for o in system.values()), sum(o.tokens for o in stock.values())
    share = ratio * n_sys / (ratio * n_sys + n_stock)
    p_value = binomial_upper_tail(x, x + s, share)
    observed = (x / n_sys) / (s / n_stock) if s else (math.inf if x else 1.0)
    return BandResult(low, high, x, n_sys, s, n_stock, observed, p_value, alpha, reject=x > 0 and p_value < alpha)


@dataclass(frozen=True)
class LengthResult:
    """Outputs that stopped where stock could not have: short of ``max_new_tokens`` without a stop
    token at their end, or longer than it."""

    truncated: tuple[str, ...]
    overlong: tuple[str, ...]
    length_differs: int  # requests whose output length differs from stock's (any reason)
    reject: bool
    # requests whose reported stop reason stock never gives, or that their own output contradicts
    stop_inconsistent: tuple[str, ...] = ()
    stop_differs: int = 0  # requests whose reported stop reason differs from stock's (both reported)

    def to_dict(self) -> dict:
        return {
            "truncated": list(self.truncated),
            "overlong": list(self.overlong),
            "length_differs": self.length_differs,
            "reject": self.reject,
            "stop_inconsistent": list(self.stop_inconsistent),
            "stop_differs": self.stop_differs,
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "LengthResult":
        return cls(
            tuple(data["truncated"]),
            tuple(data["overlong"]),
            data["length_differs"],
            data["reject"],
            tuple(data.get("stop_inconsistent", ())),
            data.get("stop_differs", 0),
        )


def stop_reason(output: ScoredOutput, stop_ids: frozenset[int], limit: int | None) -> str:
    """``length`` (ran to the limit), ``stop`` (ended on a stop token), ``overlong`` or ``truncated``."""
    if limit is not None and output.tokens > limit:
        return "overlong"
    if output.output_ids and output.output_ids[-1] in stop_ids:
        return "stop"
    if limit is None or output.tokens == limit:
        return "length"
    return "truncated"


def length_rule(
    system: Mapping[str, ScoredOutput], stock: Mapping[str, ScoredOutput], stop_ids: frozenset[int] = frozenset()
) -> LengthResult:
    """Each output's stop reason against its request's limit (``ScoredOutput.max_new_tokens``, else
    stock's length for that request), and the stop reasons the system reports against stock's."""
    truncated, overlong, inconsistent = [], [], []
    stock_reasons = {o.stop_reason for o in stock.values() if o.stop_reason is not None}
    for rid in sorted(system):
        out, ref = system[rid], stock[rid]
        limit = out.max_new_tokens if out.max_new_tokens is not None else ref.tokens
        reason = stop_reason(out, stop_ids, limit)
        if reason == "truncated":
            truncated.append(rid)
        elif reason == "overlong":
            overlong.append(rid)
        said = out.stop_reason
        if said is not None and stock_reasons:
            unknown = said not in stock_reasons
            contradicted = (said == "length" and out.tokens != limit) or (
                said == "stop" and bool(stop_ids) and not (out.output_ids and out.output_ids[-1] in stop_ids)
            )
            if unknown or contradicted:
                inconsistent.append(rid)
    differs = sum(system[rid].tokens != stock[rid].tokens for rid in system)
    stop_differs = sum(
        system[rid].stop_reason != stock[rid].stop_reason
        for rid in system
        if system[rid].stop_reason is not None and stock[rid].stop_reason is not None
    )
    return LengthResult(
        tuple(truncated),
        tuple(overlong),
        differs,
        reject=bool(truncated or overlong or inconsistent),
        stop_inconsistent=tuple(inconsistent),
        stop_differs=stop_differs,
    )


# The tail rule (a sharper third rule for lossy verifies whose flips sit under 2δ) and the request rule. Both look
# only at each request's tail: its positions from the first one where the system's output departs from stock's
# (the shared prefix has the same tokens, scores and mismatches on both sides, which would count twice). In the tail
# a mismatch is counted once per distinct context (the CONTEXT_TOKENS tokens before it, the emitted token and the
# scorer's argmax): 2,000-token greedy outputs settle into loops, where one near-tie repeats every cycle and would
# otherwise weigh as dozens of independent flips.
CONTEXT_TOKENS = 8
TAIL_ALPHA = 0.01
# Gap bands, in units of δ, of the scorer's top-2 gap at a position: (1/4, 1/2], (1/2, 1], (1, 2], (2, 4]
GAP_BANDS = (0.25, 0.5, 1.0, 2.0, 4.0)
TAIL_RATIO = 2.0
REQUEST_ALPHA = 0.01
REQUEST_RATIO = 2.0


def shared_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common prefix of two token sequences."""
    n = min(len(a), len(b))
    for position in range(n):
        if a[position] != b[position]:
            return position
    return n


@dataclass(frozen=True)
class Tail:
    """One side's tail of one request: from ``start`` on, the distinct mismatches' margins and, per gap band, the
    distinct positions in it and the mismatches among them."""

    start: int
    tokens: int
    margins: tuple[float, ...]
    band_positions: tuple[int, ...]
    band_mismatches: tuple[int, ...]


def _context_keys(output: ScoredOutput) -> np.ndarray:
    """(n,) uint64: per output position a hash of the CONTEXT_TOKENS tokens before it, the emitted token and the
    scorer's argmax (positions with equal keys are one context repeated, e.g. by a loop)."""

    seq = np.asarray(tuple(output.prompt_ids[-CONTEXT_TOKENS:]) + tuple(output.output_ids), dtype=np.uint64)
    n, offset = output.tokens, len(seq) - output.tokens
    keys = np.asarray(output.scores.argmax, dtype=np.uint64) + np.uint64(1)
    multiplier = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        for back in range(CONTEXT_TOKENS + 1):
            start = offset - back
            window = (
                seq[start : start + n]
                if start >= 0
                else np.concatenate([np.zeros(-start, np.uint64), seq[: n + start]])
            )
            keys = keys * multiplier + window + np.uint64(1)
    return keys


def request_tail(output: ScoredOutput, start: int, delta: float) -> Tail:
    """``output``'s positions from ``start`` on, each distinct context once (see CONTEXT_TOKENS)."""

    _, first = np.unique(_context_keys(output)[start:], return_index=True)
    kept = np.sort(first) + start
    mismatch = output.mismatch[kept]
    margins = output.margin[kept][mismatch]
    edges = np.asarray([delta * b for b in GAP_BANDS])
    band = np.searchsorted(edges, output.scores.top2_margin[kept], side="left") - 1  # (edges[k], edges[k+1]] -> k
    inside = (band >= 0) & (band < len(edges) - 1)
    positions = np.bincount(band[inside], minlength=len(edges) - 1)
    mismatches = np.bincount(band[inside & mismatch], minlength=len(edges) - 1)
    return Tail(
        start,
        output.tokens - start,
        tuple(float(m) for m in margins),
        tuple(int(c) for c in positions),
        tuple(int(c) for c in mismatches),
    )


def rank_test(larger: list[float], smaller: list[float]) -> tuple[float, float, float]:
    """One-sided Mann-Whitney test that ``larger`` is stochastically larger than ``smaller``: (U, z, p), the
    normal approximation with the tie correction and a continuity correction (p = 1 when a side is empty)."""
    from statistics import NormalDist

    n1, n2 = len(larger), len(smaller)
    if not n1 or not n2:
        return 0.0, 0.0, 1.0
    pooled = sorted([(v, 0) for v in larger] + [(v, 1) for v in smaller])
    ranks, ties, i = [0.0] * len(pooled), 0.0, 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        ties += (j - i + 1) ** 3 - (j - i + 1)
        i = j + 1
    r1 = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0)
    u = r1 - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return u, 0.0, 1.0
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(var)
    return u, z, 1.0 - NormalDist().cdf(z)


@dataclass(frozen=True)
class TailResult:
    """The tail rule: after each request's shared prefix with stock, (a) the margins of the system's distinct
    mismatches against stock's (one-sided Mann-Whitney: larger?) and (b) per band of the scorer's top-2 gap, the
    system's distinct mismatches per distinct position against ``ratio`` times stock's (binomial given both
    counts), Bonferroni over the bands; it rejects when either part's p-value is below half its level."""

    requests: int  # requests whose output departs from stock's
    system_tokens: int
    stock_tokens: int
    system_mismatches: int
    stock_mismatches: int
    rank_u: float
    rank_z: float
    rank_p: float
    bands: tuple[dict, ...]
    band_p: float
    alpha: float
    reject: bool

    def to_dict(self) -> dict:
        return {**asdict(self), "bands": list(self.bands)}


def tail_rule(
    system: Mapping[str, ScoredOutput],
    stock: Mapping[str, ScoredOutput],
    *,
    delta: float,
    alpha: float = TAIL_ALPHA,
    ratio: float = TAIL_RATIO,
) -> tuple[TailResult, dict[str, tuple[Tail, Tail]]]:
    """The tail rule (``TailResult``) and each departing request's (system, stock) tails, for the request rule."""
    tails = {}
    for rid in sorted(system):
        start = shared_prefix(system[rid].output_ids, stock[rid].output_ids)
        if start < max(system[rid].tokens, stock[rid].tokens):
            tails[rid] = (request_tail(system[rid], start, delta), request_tail(stock[rid], start, delta))
    sys_margins = [m for s, _ in tails.values() for m in s.margins]
    stock_margins = [m for _, s in tails.values() for m in s.margins]
    u, z, rank_p = rank_test(sys_margins, stock_margins)
    bands, band_ps = [], []
    for k in range(len(GAP_BANDS) - 1):
        x = sum(s.band_mismatches[k] for s, _ in tails.values())
        n_sys = sum(s.band_positions[k] for s, _ in tails.values())
        y = sum(s.band_mismatches[k] for _, s in tails.values())
        n_stock = sum(s.band_positions[k] for _, s in tails.values())
        share = ratio * n_sys / (ratio * n_sys + n_stock) if n_sys else 0.0
        p = binomial_upper_tail(x, x + y, share) if x else 1.0
        band_ps.append(p)
        bands.append(
            {
                "low": delta * GAP_BANDS[k],
                "high": delta * GAP_BANDS[k + 1],
                "system_mismatches": x,
                "system_positions": n_sys,
                "stock_mismatches": y,
                "stock_positions": n_stock,
                "p_value": p,
            }
        )
    band_p = min(1.0, len(band_ps) * min(band_ps)) if band_ps else 1.0
    result = TailResult(
        len(tails),
        sum(s.tokens for s, _ in tails.values()),
        sum(s.tokens for _, s in tails.values()),
        len(sys_margins),
        len(stock_margins),
        u,
        z,
        rank_p,
        tuple(bands),
        band_p,
        alpha,
        reject=rank_p < alpha / 2 or band_p < alpha / 2,
    )
    return result, tails


@dataclass(frozen=True)
class RequestResult:
    """The request rule, for faults confined to a few requests: per departing request, its tail's distinct
    mismatches against ``ratio`` times stock's on the same request's tail (binomial given both counts; both tails
    start at the departure and run the same number of tokens); it rejects when the smallest p-value times
    ``tests`` is below ``alpha``. ``tests`` is Tarone's count: a request whose tails hold t mismatches in all can
    reach p = share^t at best, and one that could not reach the corrected level is no test (a request with a
    mismatch or two cannot reject), so the smallest k whose requests able to reach alpha / k number at most k."""

    requests: int  # departing requests
    tests: int
    worst: str | None
    worst_mismatches: int
    worst_stock_mismatches: int
    worst_p: float
    p_value: float  # worst_p times tests
    alpha: float
    reject: bool

    def to_dict(self) -> dict:
        return asdict(self)


def tarone_tests(floors: list[float], alpha: float) -> int:
    """Tarone's multiplicity for discrete tests whose smallest attainable p-values are ``floors``: the smallest k
    such that at most k of them can reach alpha / k (at least 1)."""
    for k in range(1, len(floors) + 1):
        if sum(1 for f in floors if f <= alpha / k) <= k:
            return k
    return max(len(floors), 1)


def request_rule(
    tails: Mapping[str, tuple[Tail, Tail]],
    *,
    alpha: float = REQUEST_ALPHA,
    ratio: float = REQUEST_RATIO,
) -> tuple[RequestResult, dict[str, float]]:
    """The request rule (``RequestResult``) and each departing request's p-value."""
    p_values, floors = {}, []
    worst, worst_x, worst_y, worst_p = None, 0, 0, 1.0
    for rid, (mine, theirs) in sorted(tails.items()):
        x, y = len(mine.margins), len(theirs.margins)
        share = ratio * mine.tokens / (ratio * mine.tokens + theirs.tokens) if mine.tokens else 0.0
        p = binomial_upper_tail(x, x + y, share) if x else 1.0
        p_values[rid] = p
        floors.append(share ** (x + y) if x + y else 1.0)
        if p < worst_p:
            worst, worst_x, worst_y, worst_p = rid, x, y, p
    tests = tarone_tests(floors, alpha)
    p_value = min(1.0, worst_p * tests)
    result = RequestResult(len(tails), tests, worst, worst_x, worst_y, worst_p, p_value, alpha, p_value < alpha)
    return result, p_values
