"""The rate rule, the event rule, the audit and the verdict on planted cases whose answer is known."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats
from test_forcing_support import make_case, other_token, outputs_from

from specpilot_mem.forcing.audit import audit, find_events
from specpilot_mem.forcing.rules import event_rule, rate_rule
from specpilot_mem.forcing.scorer import ForcingError, score_outputs
from specpilot_mem.forcing.verdict import TokenForcing, Verdict, judge_outputs


def planted(reqs, reference, scorer, *, seed, tie_rate=0.0, events=0, gap=0.1):
    """Outputs that follow the reference except for near-tie mismatches (about ``tie_rate`` of tokens,
    each planted in the scorer with ``gap``) and ``events`` large-margin mismatches."""
    rng = np.random.default_rng(seed)
    sequences, event_sites = [], []
    event_requests = (
        set(rng.choice(len(reqs), size=min(events, len(reqs)), replace=False).tolist()) if events else set()
    )
    per_request_events = (
        {
            i: events // len(event_requests) + (1 if k < events % len(event_requests) else 0)
            for k, i in enumerate(sorted(event_requests))
        }
        if events
        else {}
    )
    for index, request in enumerate(reqs):
        sequence = list(reference[request.prompt_ids])
        ties = rng.binomial(len(sequence), tie_rate) if tie_rate else 0
        positions = rng.choice(len(sequence), size=ties + per_request_events.get(index, 0), replace=False)
        for k, position in enumerate(positions):
            position = int(position)
            if k < ties:
                token = other_token(sequence[position], 5)
                scorer.tie(request.prompt_ids, position, token, gap)
            else:
                token = other_token(sequence[position], 3)
                event_sites.append((request.id, position))
            sequence[position] = token
        sequences.append(sequence)
    return outputs_from(reqs, sequences), event_sites


@pytest.fixture()
def case():
    return make_case(requests=40, length=150, seed=1)


def _scored(scorer, reqs, outputs):
    return score_outputs(scorer, reqs, outputs)


def test_mismatch_and_margin_follow_the_scorer(case):
    reqs, reference, scorer = case
    outputs, sites = planted(reqs, reference, scorer, seed=2, tie_rate=0.01, events=3, gap=0.2)
    scored = _scored(scorer, reqs, outputs)
    margins = np.concatenate([s.margin for s in scored.values()])
    mismatches = np.concatenate([s.mismatch for s in scored.values()])
    assert mismatches.sum() == np.sum(margins > 0)
    assert np.allclose(np.sort(margins[margins > 0])[-3:], 8.0, atol=1e-4)  # the three events, margin 8
    assert np.all(np.isclose(margins[(margins > 0) & (margins < 1)], 0.2, atol=1e-5))
    assert len(find_events(scored, delta=0.25)) == len(sites) == 3


def test_rate_rule_accepts_a_rate_like_stocks_and_rejects_one_two_points_higher(case):
    reqs, reference, scorer = case
    stock, _ = planted(reqs, reference, scorer, seed=3, tie_rate=0.007)
    lossless, _ = planted(reqs, reference, scorer, seed=4, tie_rate=0.008)
    faulty, _ = planted(reqs, reference, scorer, seed=5, tie_rate=0.027)
    stock_s = _scored(scorer, reqs, stock)
    accept = rate_rule(_scored(scorer, reqs, lossless), stock_s)
    reject = rate_rule(_scored(scorer, reqs, faulty), stock_s)
    assert not accept.reject and accept.difference_low < 0.005
    assert reject.reject and reject.difference_low > 0.005
    assert reject.system_low <= reject.system_rate <= reject.system_high
    assert 0.015 < reject.difference < 0.03


def test_rate_rule_interval_is_clustered_by_request(case):
    """The same 60 mismatches spread over all requests or piled into two give the same rate but a far
    wider interval when piled up: tokens of one request are not independent."""
    reqs, reference, scorer = case
    stock, _ = planted(reqs, reference, scorer, seed=6, tie_rate=0.0)
    spread = {r.id: list(reference[r.prompt_ids]) for r in reqs}
    piled = {r.id: list(reference[r.prompt_ids]) for r in reqs}
    for k in range(60):
        request = reqs[k % 40]
        spread[request.id][k // 40] = other_token(spread[request.id][k // 40], 5)
        scorer.tie(request.prompt_ids, k // 40, other_token(reference[request.prompt_ids][k // 40], 5), 0.1)
    for k in range(60):
        request = reqs[k % 2]
        position = 10 + k // 2
        piled[request.id][position] = other_token(piled[request.id][position], 5)
        scorer.tie(request.prompt_ids, position, other_token(reference[request.prompt_ids][position], 5), 0.1)
    stock_s = _scored(scorer, reqs, stock)
    a = rate_rule(_scored(scorer, reqs, outputs_from(reqs, spread.values())), stock_s)
    b = rate_rule(_scored(scorer, reqs, outputs_from(reqs, piled.values())), stock_s)
    assert math.isclose(a.system_rate, b.system_rate)
    assert (b.system_high - b.system_low) > 3 * (a.system_high - a.system_low)


def test_rate_rule_needs_the_same_requests(case):
    reqs, reference, scorer = case
    stock, _ = planted(reqs, reference, scorer, seed=7)
    scored = _scored(scorer, reqs, stock)
    fewer = dict(list(scored.items())[:-1])
    with pytest.raises(ForcingError, match="different requests"):
        rate_rule(fewer, scored)


def test_event_rule_p_value_is_the_binomial_tail():
    result = event_rule(
        delta=0.25,
        system_events=400,
        system_tokens=100_000,
        audited=200,
        unexplained=12,
        stock_events=3,
        stock_tokens=100_000,
    )
    exposure = 100_000 * 200 / 400
    expected = stats.binom.sf(12 - 1, 12 + 3, exposure / (exposure + 100_000))
    assert math.isclose(result.p_value, expected, rel_tol=1e-9)
    assert result.reject and result.threshold == 0.5


def test_event_rule_accepts_when_nothing_is_unexplained():
    result = event_rule(
        delta=0.25, system_events=5, system_tokens=1000, audited=5, unexplained=0, stock_events=0, stock_tokens=1000
    )
    assert not result.reject and result.p_value == 1.0


def test_event_rule_rejects_planted_events_that_only_the_system_has(case):
    reqs, reference, scorer = case
    stock, _ = planted(reqs, reference, scorer, seed=8, tie_rate=0.007)
    system, sites = planted(reqs, reference, scorer, seed=9, tie_rate=0.007, events=12)
    forcing = TokenForcing(scorer, _scored(scorer, reqs, stock), delta=0.25)
    verdict = forcing.judge("events", _scored(scorer, reqs, system))
    assert not verdict.rate.reject  # 12 events in 6000 tokens add 0.2 points: under the rate rule's limit
    assert verdict.events.reject and verdict.verdict == "reject"
    assert verdict.events.system_events == verdict.events.unexplained == len(sites) == 12
    assert {(e["id"], e["position"]) for e in verdict.unexplained_examples} <= set(sites)


def test_audit_explains_events_stock_reproduces_on_its_path(case):
    reqs, reference, scorer = case
    system, sites = planted(reqs, reference, scorer, seed=10, events=12)
    stock = {rid: out for rid, out in system.items()}  # stock made the very same departures
    forcing = TokenForcing(scorer, _scored(scorer, reqs, stock), delta=0.25)
    verdict = forcing.judge("same-as-stock", _scored(scorer, reqs, system))
    assert verdict.verdict != "reject"
    assert verdict.explained_by["stock-path"] == 12 and verdict.events.unexplained == 0


def test_audit_explains_prefill_sensitive_events(case):
    reqs, reference, scorer = case
    stock, _ = planted(reqs, reference, scorer, seed=11, tie_rate=0.007)
    system, sites = planted(reqs, reference, scorer, seed=12, tie_rate=0.007, events=12)
    by_id = {r.id: r for r in reqs}
    for rid, position in sites:  # split at a prefill length, the scorer's argmax becomes the emitted token
        scorer.tie(by_id[rid].prompt_ids, position, system[rid].output_ids[position], 0.8)  # above 2δ, a near-tie
        scorer.prefill_sensitive[(by_id[rid].prompt_ids, position)] = system[rid].output_ids[position]
    scorer.calls.clear()
    verdict = TokenForcing(scorer, _scored(scorer, reqs, stock), delta=0.25).judge(
        "near-ties", _scored(scorer, reqs, system)
    )
    assert verdict.events.unexplained == 0 and not verdict.events.reject
    assert verdict.explained_by["prefill-length"] == 12
    assert any(call is not None for call in scorer.calls)  # the audit did re-score at a prefill length


def test_audit_does_not_re_score_events_further_than_rounding_goes(case):
    """An event more than DELTA_MAX (1 nat) below the argmax is no near-tie of the scorer: no prefill length
    explains it, and it is not re-scored."""
    reqs, reference, scorer = case
    stock, _ = planted(reqs, reference, scorer, seed=11, tie_rate=0.007)
    system, sites = planted(reqs, reference, scorer, seed=12, tie_rate=0.007, events=12)
    by_id = {r.id: r for r in reqs}
    for rid, position in sites:  # the planted events sit 8 nats below the argmax
        scorer.prefill_sensitive[(by_id[rid].prompt_ids, position)] = system[rid].output_ids[position]
    scored = _scored(scorer, reqs, system)
    scorer.calls.clear()
    verdict = TokenForcing(scorer, _scored(scorer, reqs, stock), delta=0.25).judge("far", scored)
    assert verdict.explained_by["prefill-length"] == 0 and verdict.events.unexplained == 12
    assert all(call is None for call in scorer.calls)


def test_audit_does_not_explain_an_event_whose_argmax_moves_to_a_third_token(case):
    """A scorer argmax that moves with the prefill length to some other token says nothing about the
    emitted token, which stays far below the argmax: such events stay unexplained."""
    reqs, reference, scorer = case
    stock, _ = planted(reqs, reference, scorer, seed=11, tie_rate=0.007)
    system, sites = planted(reqs, reference, scorer, seed=12, tie_rate=0.007, events=12)
    by_id = {r.id: r for r in reqs}
    for rid, position in sites:  # the argmax moves to reference + 1; the system emitted reference + 3
        scorer.prefill_sensitive[(by_id[rid].prompt_ids, position)] = None
    verdict = TokenForcing(scorer, _scored(scorer, reqs, stock), delta=0.25).judge(
        "elsewhere", _scored(scorer, reqs, system)
    )
    assert verdict.explained_by["prefill-length"] == 0
    assert verdict.events.unexplained == 12 and verdict.events.reject


def test_audit_explains_events_the_stock_engine_would_emit(case):
    reqs, reference, scorer = case
    stock, _ = planted(reqs, reference, scorer, seed=13)
    system, sites = planted(reqs, reference, scorer, seed=14, events=6)
    stock_engine = type(scorer)({p: list(ref) for p, ref in reference.items()})
    by_id = {r.id: r for r in reqs}
    for rid, position in sites:  # the stock engine's own logits prefer the system's token there
        prompt = by_id[rid].prompt_ids
        stock_engine.tie(prompt, position, system[rid].output_ids[position], -1.0)
    verdict = TokenForcing(scorer, _scored(scorer, reqs, stock), delta=0.25, stock_engine=stock_engine).judge(
        "stock-engine", _scored(scorer, reqs, system)
    )
    assert verdict.explained_by["stock-margin"] == 6 and verdict.verdict != "reject"


def test_audit_sample_is_seeded_and_capped(case):
    reqs, reference, scorer = case
    system, _ = planted(reqs, reference, scorer, seed=15, events=300)
    scored = _scored(scorer, reqs, system)
    events = find_events(scored, 0.25)
    first = audit(events, scored, scorer=scorer, stock_paths={}, sample=50, seed=1)
    again = audit(events, scored, scorer=scorer, stock_paths={}, sample=50, seed=1)
    other = audit(events, scored, scorer=scorer, stock_paths={}, sample=50, seed=2)
    assert first.events == 300 and len(first.sampled) == 50
    assert [a.event for a in first.sampled] == [a.event for a in again.sampled]
    assert [a.event for a in first.sampled] != [a.event for a in other.sampled]


def test_verdict_round_trips_through_json(case):
    reqs, reference, scorer = case
    stock, _ = planted(reqs, reference, scorer, seed=16, tie_rate=0.007)
    system, _ = planted(reqs, reference, scorer, seed=17, tie_rate=0.03, events=20)
    verdict = judge_outputs(system, stock, scorer=scorer, requests=reqs, delta=0.25, name="faulty", synthetic=True)
    assert verdict.verdict == "reject" and [r.split(":")[0] for r in verdict.reasons] == [
        "rate rule",
        "event rule",
        "tail rule",
    ]
    text = json.dumps(verdict.to_dict())
    assert Verdict.from_dict(json.loads(text)) == verdict


def test_delta_must_be_positive(case):
    reqs, reference, scorer = case
    stock, _ = planted(reqs, reference, scorer, seed=18)
    with pytest.raises(ForcingError, match="δ must be positive"):
        TokenForcing(scorer, _scored(scorer, reqs, stock), delta=0.0)
