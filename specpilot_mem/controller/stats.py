"""Small statistics the controller and token forcing share, on the standard library and numpy only.

They must import on the lent GPU machine, which has torch, triton, numpy and safetensors but no
scipy, so the two distributions needed here (Student's t quantiles and a binomial upper tail) are
computed directly. ``tests/test_controller_stats.py`` checks them against scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


def t_quantile(p: float, df: float) -> float:
    """Quantile ``p`` of Student's t with ``df`` degrees of freedom.

    Exact for df = 1 and 2; for df >= 3 the Cornish-Fisher expansion of Abramowitz & Stegun 26.7.5,
    whose error for p <= 0.975 is below 4e-3 at df = 3, 1e-3 at df = 4 and 1e-5 from df = 10 on.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    if df < 1:
        raise ValueError(f"df must be at least 1, got {df}")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def binomial_upper_tail(successes: int, trials: int, p: float) -> float:
    """P(X >= successes) for X ~ Binomial(trials, p), summed in log space (no overflow at large n)."""
    if successes <= 0:
        return 1.0
    if successes > trials:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    log_terms = [
        math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1) + k * log_p + (trials - k) * log_q
        for k in range(successes, trials + 1)
    ]
    peak = max(log_terms)
    return min(1.0, math.exp(peak) * math.fsum(math.exp(t - peak) for t in log_terms))


@dataclass(frozen=True)
class RatioEstimate:
    """A ratio of totals (e.g. mismatches / tokens) with a variance clustered by request."""

    value: float
    se: float
    clusters: int

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """Two-sided interval with t(clusters - 1) quantiles."""
        half = t_quantile(0.5 + level / 2, max(self.clusters - 1, 1)) * self.se
        return self.value - half, self.value + half

    def lower_bound(self, level: float = 0.95) -> float:
        """One-sided lower confidence bound."""
        return self.value - t_quantile(level, max(self.clusters - 1, 1)) * self.se


def _influence(numerators: np.ndarray, denominators: np.ndarray) -> tuple[float, np.ndarray]:
    """Ratio of totals and each cluster's linearised contribution (delta method)."""
    total = denominators.sum()
    if total <= 0:
        raise ValueError("the denominators sum to zero: there is nothing to take a rate of")
    ratio = numerators.sum() / total
    return float(ratio), (numerators - ratio * denominators) / total


def _clustered_se(influence: np.ndarray) -> float:
    clusters = len(influence)
    if clusters < 2:
        return float("inf")
    # CR1 small-sample factor G/(G-1), as in Stata's cluster-robust variance.
    return math.sqrt(clusters / (clusters - 1) * float(np.sum(influence**2)))


def clustered_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> RatioEstimate:
    """sum(numerators) / sum(denominators), one pair per cluster, with a cluster-robust standard error."""
    num, den = np.asarray(numerators, dtype=np.float64), np.asarray(denominators, dtype=np.float64)
    ratio, infl = _influence(num, den)
    return RatioEstimate(ratio, _clustered_se(infl), len(num))


def clustered_ratio_difference(
    numerators_a: Sequence[float],
    denominators_a: Sequence[float],
    numerators_b: Sequence[float],
    denominators_b: Sequence[float],
) -> RatioEstimate:
    """ratio_a - ratio_b where cluster i of a and b is the same request (paired clusters).

    Pairing lets a request that is hard for both systems cancel out of the variance.
    """
    ratio_a, infl_a = _influence(np.asarray(numerators_a, float), np.asarray(denominators_a, float))
    ratio_b, infl_b = _influence(np.asarray(numerators_b, float), np.asarray(denominators_b, float))
    if len(infl_a) != len(infl_b):
        raise ValueError("paired clusters need the same number of clusters on both sides")
    return RatioEstimate(ratio_a - ratio_b, _clustered_se(infl_a - infl_b), len(infl_a))
