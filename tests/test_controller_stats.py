"""The shared statistics against scipy, and the clustered rate interval's coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from specpilot_mem.controller.stats import (
    binomial_upper_tail,
    clustered_ratio,
    clustered_ratio_difference,
    t_quantile,
)


@pytest.mark.parametrize("df, tolerance", [(1, 1e-9), (2, 1e-9), (3, 4e-3), (4, 1e-3), (10, 1e-5), (60, 1e-7)])
@pytest.mark.parametrize("p", [0.9, 0.95, 0.975])
def test_t_quantile_matches_scipy(df, tolerance, p):
    assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), abs=tolerance)


@pytest.mark.parametrize(
    "k, n, p", [(0, 10, 0.3), (5, 10, 0.3), (11, 10, 0.3), (50, 100_000, 3e-4), (3, 7, 0.999), (2, 2, 0.5)]
)
def test_binomial_upper_tail_matches_scipy(k, n, p):
    assert binomial_upper_tail(k, n, p) == pytest.approx(stats.binom.sf(k - 1, n, p), rel=1e-9, abs=1e-300)


def test_clustered_ratio_is_the_ratio_of_totals():
    estimate = clustered_ratio([1, 2, 0, 5], [100, 100, 50, 250])
    assert estimate.value == pytest.approx(8 / 500)
    assert estimate.clusters == 4
    low, high = estimate.interval()
    assert low < estimate.value < high


def test_clustered_interval_covers_the_true_rate_when_requests_differ():
    """Requests with their own mismatch propensity (overdispersed): the clustered 95% interval should
    cover the true rate about 95% of the time, where a token-level binomial interval would not."""
    rng = np.random.default_rng(0)
    true_rate, covered, naive_covered, trials = 0.01, 0, 0, 400
    for _ in range(trials):
        lengths = rng.integers(100, 400, size=50)
        propensity = rng.gamma(shape=1.0, scale=true_rate, size=50)
        mismatches = rng.binomial(lengths, np.minimum(propensity, 1.0))
        estimate = clustered_ratio(mismatches, lengths)
        low, high = estimate.interval()
        covered += low <= true_rate <= high
        p = mismatches.sum() / lengths.sum()
        half = 1.96 * math.sqrt(p * (1 - p) / lengths.sum())
        naive_covered += p - half <= true_rate <= p + half
    assert 0.90 <= covered / trials <= 0.99
    assert naive_covered / trials < 0.85


def test_paired_difference_cancels_shared_request_difficulty():
    rng = np.random.default_rng(1)
    lengths = rng.integers(100, 300, size=40)
    difficulty = rng.gamma(0.5, 0.04, size=40)
    a = rng.binomial(lengths, np.minimum(difficulty, 1))
    b = a + rng.binomial(lengths, 0.002)  # the same hard requests, plus a small extra rate
    paired = clustered_ratio_difference(b, lengths, a, lengths)
    unpaired_se = math.hypot(clustered_ratio(b, lengths).se, clustered_ratio(a, lengths).se)
    assert paired.se < 0.5 * unpaired_se
    assert paired.value == pytest.approx(b.sum() / lengths.sum() - a.sum() / lengths.sum())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(20, 400)), min_size=2, max_size=30))
def test_paired_difference_is_antisymmetric_and_order_free(rows):
    a, b, n = (list(column) for column in zip(*rows))
    forward = clustered_ratio_difference(a, n, b, n)
    backward = clustered_ratio_difference(b, n, a, n)
    shuffled = clustered_ratio_difference(a[::-1], n[::-1], b[::-1], n[::-1])
    assert forward.value == pytest.approx(-backward.value, abs=1e-12)
    assert forward.se == pytest.approx(backward.se) and forward.se == pytest.approx(shuffled.se)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 40), st.integers(0, 40), st.integers(1000, 100_000))
def test_event_p_value_falls_as_unexplained_events_rise(stock_events, unexplained, tokens):
    from specpilot_mem.forcing.rules import event_rule

    def p(count):
        return event_rule(
            delta=0.25,
            system_events=40,
            system_tokens=tokens,
            audited=40,
            unexplained=count,
            stock_events=stock_events,
            stock_tokens=tokens,
        ).p_value

    assert p(min(unexplained + 1, 40)) <= p(unexplained) + 1e-12
