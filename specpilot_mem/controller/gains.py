"""Gains (§5.1): geometric mean of per-request output-rate ratios per benchmark and batch size,
combined across those groups by an equal-weight geometric mean.

Everything is done on log rates. A request is the unit of replication (a cluster): its log ratio is
averaged over the repeats of a paired run before any variance is taken, because the tokens and
repeats of one request are not independent. The log gain is L = (1/G) sum_g mean_r(log ratio), its
variance (1/G^2) sum_g s_g^2 / n_g, and its 95% interval uses t quantiles with sum_g (n_g - 1)
degrees of freedom (``docs/controller.md``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from specpilot_mem.controller.requests import Request, RequestSetError
from specpilot_mem.controller.stats import t_quantile
from specpilot_mem.controller.system import RequestOutput


@dataclass(frozen=True)
class Run:
    """One system's pass over a request list at one batch size, on one device."""

    system: str
    device: str
    batch_size: int
    repeat: int
    outputs: tuple[RequestOutput, ...]

    def to_dict(self) -> dict:
        return {
            "system": self.system,
            "device": self.device,
            "batch_size": self.batch_size,
            "repeat": self.repeat,
            "outputs": [o.to_dict() for o in self.outputs],
        }


@dataclass(frozen=True)
class GroupGain:
    benchmark: str
    batch_size: int
    requests: int
    gain: float
    low: float
    high: float


@dataclass(frozen=True)
class GainEstimate:
    """Gain of a candidate over a baseline with its two-sided 95% interval [low, high]."""

    gain: float
    low: float
    high: float
    requests: int
    groups: tuple[GroupGain, ...] = field(default_factory=tuple)
    level: float = 0.95

    def to_dict(self) -> dict:
        return asdict(self)


def _mean_log_rates(runs: Sequence[Run]) -> dict[tuple[int, str], float]:
    """(batch size, request id) -> mean over repeats of log output rate."""
    sums: dict[tuple[int, str], list[float]] = defaultdict(list)
    for run in runs:
        for output in run.outputs:
            sums[(run.batch_size, output.id)].append(math.log(output.rate))
    return {key: float(np.mean(values)) for key, values in sums.items()}


def _interval(mean: float, variance: float, df: int, level: float) -> tuple[float, float]:
    if df < 1:
        return -math.inf, math.inf
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(variance)
    return mean - half, mean + half


def gain(
    baseline: Sequence[Run], candidate: Sequence[Run], requests: Sequence[Request], level: float = 0.95
) -> GainEstimate:
    """Gain of ``candidate`` over ``baseline`` (>1 means faster), both run on ``requests``."""
    base, cand = _mean_log_rates(baseline), _mean_log_rates(candidate)
    if set(base) != set(cand):
        missing = sorted(set(base) ^ set(cand))[:5]
        raise RequestSetError(
            "the two systems were not run on the same requests and batch sizes",
            where=f"e.g. (batch size, request) {missing}",
            fix="time both systems in one paired run",
        )
    by_id = {r.id: r for r in requests}
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for (batch_size, rid), log_rate in base.items():
        if rid not in by_id:
            raise RequestSetError(
                f"request {rid!r} was run but is not in the request set",
                where="gain",
                fix="pass the request list the systems served",
            )
        groups[(by_id[rid].benchmark, batch_size)].append(cand[(batch_size, rid)] - log_rate)
    if not groups:
        raise RequestSetError("no timed requests to take a gain over", where="gain", fix="run both systems first")
    small = [key for key, ratios in groups.items() if len(ratios) < 2]
    if small:
        raise RequestSetError(
            f"benchmark/batch-size group(s) {small} have fewer than 2 requests, so their noise cannot be estimated",
            where="request set",
            fix="give every benchmark at least two requests",
        )
    group_gains, means, variances, df = [], [], [], 0
    for (benchmark, batch_size), ratios in sorted(groups.items()):
        values = np.asarray(ratios)
        mean, variance = float(values.mean()), float(values.var(ddof=1)) / len(values)
        low, high = _interval(mean, variance, len(values) - 1, level)
        group_gains.append(GroupGain(benchmark, batch_size, len(values), math.exp(mean), math.exp(low), math.exp(high)))
        means.append(mean)
        variances.append(variance)
        df += len(values) - 1
    count = len(means)
    log_gain = sum(means) / count
    low, high = _interval(log_gain, sum(variances) / count**2, df, level)
    return GainEstimate(
        math.exp(log_gain),
        math.exp(low),
        math.exp(high),
        requests=len({rid for _, rid in base}),
        groups=tuple(group_gains),
        level=level,
    )


def divergent_requests(a: Sequence[Run], b: Sequence[Run]) -> list[str]:
    """Ids of requests for which ``a`` and ``b`` produced different sets of output token sequences."""
    outputs_a: dict[str, set[tuple[int, ...]]] = defaultdict(set)
    outputs_b: dict[str, set[tuple[int, ...]]] = defaultdict(set)
    for runs, into in ((a, outputs_a), (b, outputs_b)):
        for run in runs:
            for output in run.outputs:
                into[output.id].add(output.output_ids)
    return sorted(rid for rid in set(outputs_a) | set(outputs_b) if outputs_a.get(rid) != outputs_b.get(rid))
