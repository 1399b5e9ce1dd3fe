"""The tail rule, the request rule and δ from AR's departures from the scorer, on planted cases whose answer is known;
the fault study's batched judging of all seeds against judging seed by seed."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_forcing_rules import planted
from test_forcing_support import PlantedScorer, make_case, other_token, outputs_from

from specpilot_mem.forcing.calibrate import calibrate_delta
from specpilot_mem.forcing.rules import (
    CONTEXT_TOKENS,
    rank_test,
    request_rule,
    request_tail,
    tail_rule,
    tarone_tests,
)
from specpilot_mem.forcing.scorer import ForcingError, ScoredOutput, TokenScores, score_outputs
from specpilot_mem.forcing.verdict import TokenForcing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fault_study  # noqa: E402


def _scored(scorer, reqs, outputs):
    return score_outputs(scorer, reqs, outputs)


def test_rank_test_matches_scipys_one_sided_mann_whitney():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    a, b = list(rng.exponential(0.3, 40)), list(rng.exponential(0.1, 60)) + [0.1] * 5
    u, _, p = rank_test(a, b)
    ref = stats.mannwhitneyu(a, b, alternative="greater", method="asymptotic", use_continuity=True)
    assert u == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue, rel=1e-6)
    assert rank_test([], b)[2] == 1.0


def test_tail_rule_rejects_flips_at_wider_near_ties_and_not_flips_at_stocks():
    """A lossy verify whose flips sit at near-ties of 0.4 nats (under 2δ = 0.5: no events) at stock's rate is
    rejected by the tail rule's margin ranks; a lossless one flipping at stock's gaps is not."""
    reqs, reference, scorer = make_case(requests=40, length=200, seed=50)
    stock, _ = planted(reqs, reference, scorer, seed=51, tie_rate=0.01, gap=0.05)
    same, _ = planted(reqs, reference, scorer, seed=52, tie_rate=0.01, gap=0.05)
    lossy, _ = planted(reqs, reference, scorer, seed=53, tie_rate=0.01, gap=0.4)
    s_stock = _scored(scorer, reqs, stock)
    wide, _ = tail_rule(_scored(scorer, reqs, lossy), s_stock, delta=0.25)
    assert wide.reject and wide.rank_p < 1e-6 and wide.system_mismatches > 40
    alike, _ = tail_rule(_scored(scorer, reqs, same), s_stock, delta=0.25)
    assert not alike.reject and alike.rank_p > 0.01 and alike.band_p > 0.005
    verdict = TokenForcing(scorer, s_stock, delta=0.25).judge("wide", _scored(scorer, reqs, lossy))
    assert verdict.verdict == "reject" and any(r.startswith("tail rule") for r in verdict.reasons)
    assert verdict.events.system_events == 0 and not verdict.rate.reject


def test_the_tail_starts_where_the_outputs_part():
    """Positions before a request's first departure from stock have the same tokens and scores on both sides and are
    left out; a system that emits stock's tokens has no tail at all."""
    reqs, reference, scorer = make_case(requests=10, length=100, seed=54)
    stock, _ = planted(reqs, reference, scorer, seed=55, tie_rate=0.03, gap=0.05)
    s_stock = _scored(scorer, reqs, stock)
    result, tails = tail_rule(s_stock, s_stock, delta=0.25)
    assert result.requests == 0 and not tails and result.rank_p == 1.0 and not result.reject
    first = reqs[0]
    changed = dict(stock)
    ids = list(stock[first.id].output_ids)
    ids[60] = other_token(ids[60], 7)
    changed[first.id] = type(stock[first.id])(first.id, tuple(ids))
    result, tails = tail_rule(_scored(scorer, reqs, changed), s_stock, delta=0.25)
    assert list(tails) == [first.id] and tails[first.id][0].start == tails[first.id][1].start == 60
    assert tails[first.id][0].tokens == 40


def _looped(cycle: list[int], repeats: int, mismatch_at: int) -> ScoredOutput:
    ids = cycle * repeats
    argmax = np.asarray(ids, dtype=np.int64)
    gaps = np.full(len(ids), 5.0)
    flip = np.arange(mismatch_at, len(ids), len(cycle))
    argmax[flip] = (argmax[flip] + 1) % 97
    gaps[flip] = 0.1
    logprob = np.zeros(len(ids))
    logprob[flip] = -0.1
    scores = TokenScores(logprob, argmax, np.zeros(len(ids)), gaps)
    return ScoredOutput("r", (1, 2, 3), tuple(ids), scores, len(ids))


def test_a_near_tie_a_loop_repeats_counts_once():
    """A 2,000-token greedy output that loops repeats one near-tie every cycle: the tail counts it once per context
    (the first cycle's follows the prompt, every later one the cycle itself: 2 of 100)."""
    cycle = list(range(10, 30))
    output = _looped(cycle, 100, mismatch_at=5)
    assert int(output.mismatch.sum()) == 100
    tail = request_tail(output, 0, delta=0.25)
    assert len(tail.margins) == 2 and tail.margins[0] == pytest.approx(0.1)
    assert sum(tail.band_positions) == 2  # the gap-0.1 position; the 5-nat ones lie above every band
    assert len(cycle) > CONTEXT_TOKENS


def test_request_rule_rejects_a_fault_on_one_request_and_not_rounding_spread_over_all():
    reqs, reference, scorer = make_case(requests=40, length=300, seed=56)
    stock, _ = planted(reqs, reference, scorer, seed=57, tie_rate=0.005, gap=0.05)
    same, _ = planted(reqs, reference, scorer, seed=58, tie_rate=0.005, gap=0.05)
    s_stock = _scored(scorer, reqs, stock)
    _, tails = tail_rule(_scored(scorer, reqs, same), s_stock, delta=0.25)
    assert not request_rule(tails)[0].reject
    hit = dict(stock)
    target = reqs[3]
    ids = list(stock[target.id].output_ids)
    for position in range(100, 300, 8):  # 25 flips at 0.2-nat near-ties on this request only
        scorer.tie(target.prompt_ids, position, other_token(reference[target.prompt_ids][position], 9), 0.2)
        ids[position] = other_token(reference[target.prompt_ids][position], 9)
    hit[target.id] = type(stock[target.id])(target.id, tuple(ids))
    verdict = TokenForcing(scorer, s_stock, delta=0.25).judge("one-request", _scored(scorer, reqs, hit))
    assert verdict.request.reject and verdict.request.worst == target.id and verdict.verdict == "reject"
    assert any(r.startswith("request rule") for r in verdict.reasons)
    row = next(r for r in verdict.per_request if r["id"] == target.id)
    assert row["tail_p_value"] == verdict.request.worst_p and row["shared_prefix"] <= 100


def test_ar_departures_from_the_scorer_calibrate_delta_and_are_bounded():
    """Where AR's token is not the scorer's argmax the gap is rounding between the decode and the scorer: δ covers
    it (stock never departing from AR no longer leaves δ on its floor); one above 1 nat is refused."""
    reqs, reference, scorer = make_case(requests=6, length=40, seed=59)
    ar_sequences = []
    for index, request in enumerate(reqs):
        sequence = list(reference[request.prompt_ids])
        if index < 3:
            scorer.tie(request.prompt_ids, 11, other_token(sequence[11]), 0.07)
            sequence[11] = other_token(sequence[11])
        ar_sequences.append(sequence)
    ar = _scored(scorer, reqs, outputs_from(reqs, ar_sequences))
    calibration = calibrate_delta(ar, ar)
    assert not calibration.departures and len(calibration.scorer_departures) == 3
    assert calibration.largest_gap == pytest.approx(0.07, abs=1e-5) and calibration.delta == 0.125
    assert "3 of AR from the scorer" in calibration.basis
    wide = list(ar_sequences[4])
    wide[2] = other_token(wide[2])  # 8 nats below the argmax
    ar_sequences[4] = wide
    far = _scored(scorer, reqs, outputs_from(reqs, ar_sequences))
    with pytest.raises(ForcingError, match="not near-ties"):
        calibrate_delta(far, far)


class _BatchlessScorer(PlantedScorer):
    """The planted scorer with the audit's shared prefill pass (one ``score`` per query, as the audit's fallback)."""

    def prefill_argmax(self, prompt_ids, output_ids, queries):
        return [int(self.score(prompt_ids, output_ids[: p + 1], prefill_len=s).argmax[p]) for p, s in queries]


def test_the_study_judges_all_seeds_at_once_as_it_would_seed_by_seed():
    """``judge_all`` (one scoring of every distinct output, one shared set of audit re-scores) gives every seed the
    verdicts ``judge_seed`` gives it alone."""
    reqs, reference, _ = make_case(requests=12, length=60, seed=60)
    scorer = _BatchlessScorer(reference)
    samples = {0: reqs[:6], 1: reqs[4:10], 2: reqs[6:]}  # requests shared between seeds
    outputs = {
        "ar": outputs_from(reqs, [reference[r.prompt_ids] for r in reqs]),
        "stock": planted(reqs, reference, scorer, seed=61, tie_rate=0.01, gap=0.05)[0],
        "path-verify": planted(reqs, reference, scorer, seed=62, tie_rate=0.01, gap=0.05)[0],
        "flip-1%": planted(reqs, reference, scorer, seed=63, tie_rate=0.01, events=9)[0],
        "fp8-all": planted(reqs, reference, scorer, seed=64, tie_rate=0.02, gap=0.3)[0],
    }
    outputs["int8-all"], sites = planted(reqs, reference, scorer, seed=65, events=4)
    for rid, position in sites:  # near-ties (0.7 nats, over 2δ) that the re-scores at other prefill lengths explain
        prompt = next(r.prompt_ids for r in reqs if r.id == rid)
        scorer.tie(prompt, position, other_token(reference[prompt][position]), 0.7)
        scorer.prefill_sensitive[(prompt, position)] = other_token(reference[prompt][position])
    args = SimpleNamespace(audit_sample=5, skip_settled_audit=False, first_seed=0, scores_out=None)
    engine = SimpleNamespace(synthetic=True)
    together = fault_study.judge_all([0, 1, 2], samples, outputs, engine, args, scorer=scorer)
    for run in together:
        sample = samples[run["seed"]]
        mine = {name: {r.id: outs[r.id] for r in sample} for name, outs in outputs.items()}
        alone = fault_study.judge_seed(run["seed"], sample, mine, {}, engine, args, scorer=scorer)
        assert run["verdicts"] == alone["verdicts"] and run["delta"] == alone["delta"]
    verdicts = [v for run in together for v in run["verdicts"].values()]
    assert any(v["verdict"] == "reject" for v in verdicts)
    assert any(v["explained_by"].get("prefill-length") for v in verdicts)  # the shared re-scores were used


def test_tarone_counts_only_requests_that_could_reach_the_corrected_level():
    # 12 departing requests: two with many mismatches could reach 0.01 / 2, ten with one or two never can
    floors = [(2 / 3) ** 30, (2 / 3) ** 20] + [(2 / 3) ** t for t in (1, 1, 2, 2, 1, 1, 2, 1, 2, 1)]
    assert tarone_tests(floors, 0.01) == 2
    assert tarone_tests([1e-9] * 5, 0.01) == 5 and tarone_tests([], 0.01) == 1


def test_skipping_the_audit_of_settled_systems_keeps_every_verdict():
    """``skip_settled_audit`` audits no system that a rule needing no audit rejects already: the verdicts are the
    same, the settled ones say their events were not audited, and the others are audited as before."""
    reqs, reference, scorer = make_case(requests=40, length=150, seed=66)
    stock, _ = planted(reqs, reference, scorer, seed=67, tie_rate=0.007, gap=0.05)
    systems = {
        "lossless": planted(reqs, reference, scorer, seed=68, tie_rate=0.007, gap=0.05)[0],
        "lossy": planted(reqs, reference, scorer, seed=69, tie_rate=0.02, gap=0.4, events=30)[0],
        "few-events": planted(reqs, reference, scorer, seed=70, tie_rate=0.007, gap=0.05, events=6)[0],
    }
    s_stock = _scored(scorer, reqs, stock)
    full = TokenForcing(scorer, s_stock, delta=0.25)
    quick = TokenForcing(scorer, s_stock, delta=0.25, skip_settled_audit=True)
    audited = []
    for name, outputs in systems.items():
        scored = _scored(scorer, reqs, outputs)
        a, b = full.judge(name, scored), quick.judge(name, scored)
        assert a.verdict == b.verdict
        audited.append(quick.needs_audit(scored))
        if audited[-1]:
            assert b.events == a.events and b.explained_by == a.explained_by
        else:
            assert b.verdict == "reject" and b.events.audited == 0 and a.events.audited > 0
            assert any("not audited" in r for r in b.reasons)
    assert audited == [True, False, True]


def test_the_study_judged_again_from_its_stored_scores_gives_its_verdicts(tmp_path):
    """``--scores-out`` then ``read_scores``: every rule and the power judge the stored numbers as they judged the
    scorer's; the audit's prefill-length re-scores are the scorer's alone (``StoredScores`` explains nothing), which
    is why ``rejudge`` checks the event rule's counts against the study that audited on the scorer."""
    reqs, reference, _ = make_case(requests=10, length=60, seed=71)
    scorer = _BatchlessScorer(reference)
    samples = {0: reqs[:6], 1: reqs[4:]}
    outputs = {
        "ar": outputs_from(reqs, [reference[r.prompt_ids] for r in reqs]),
        "stock": planted(reqs, reference, scorer, seed=72, tie_rate=0.02, gap=0.05)[0],
        "path-verify": planted(reqs, reference, scorer, seed=73, tie_rate=0.02, gap=0.05)[0],
        "fp8-all": planted(reqs, reference, scorer, seed=74, tie_rate=0.03, gap=0.3)[0],
        "flip-1%": planted(reqs, reference, scorer, seed=75, tie_rate=0.02, events=6)[0],
    }
    outputs["int8-all"], sites = planted(reqs, reference, scorer, seed=76, events=3)
    for rid, position in sites:  # events the prefill-length re-scores explain
        prompt = next(r.prompt_ids for r in reqs if r.id == rid)
        scorer.tie(prompt, position, other_token(reference[prompt][position]), 0.7)
        scorer.prefill_sensitive[(prompt, position)] = other_token(reference[prompt][position])
    path = tmp_path / "scores.npz"
    args = SimpleNamespace(audit_sample=5, skip_settled_audit=False, first_seed=0, scores_out=str(path))
    engine = SimpleNamespace(synthetic=True)
    judged = fault_study.judge_all([0, 1], samples, outputs, engine, args, scorer=scorer)
    pool = {r.id: r for r in reqs}
    stored = fault_study.read_scores(str(path), outputs, pool, 60)
    again = [
        fault_study.judge_seed(
            seed,
            samples[seed],
            {name: {r.id: outs[r.id] for r in samples[seed]} for name, outs in outputs.items()},
            {},
            engine,
            args,
            stored,
            fault_study.StoredScores(),
        )
        for seed in (0, 1)
    ]
    for first, second in zip(judged, again):
        assert first["delta"] == second["delta"] and first["effects"] == second["effects"]
        for name, verdict in first["verdicts"].items():
            if name == "int8-all" and verdict["explained_by"].get("prefill-length"):
                assert second["verdicts"][name]["unexplained"] > verdict["unexplained"]  # what rejudge refuses
            else:
                assert second["verdicts"][name] == verdict
    assert any(v["explained_by"].get("prefill-length") for run in judged for v in run["verdicts"].values())


def test_the_issues_fault_on_3_of_16_requests_is_not_accepted():
    """Issue 38's case: 16 requests of 64 tokens, a near-tie fault on 3 of them (about 2.7% of all tokens, where the
    rate rule's lower bound stayed below zero): rejected (the band rule sees its near-ties), the 3 requests flagged."""
    reqs, reference, scorer = make_case(requests=16, length=64, seed=77)
    stock, _ = planted(reqs, reference, scorer, seed=78, tie_rate=0.005, gap=0.05)
    faulty = dict(stock)
    for request in reqs[:3]:
        ids = list(stock[request.id].output_ids)
        for position in range(6, 64, 6):  # 10 flips per request at 0.2-nat near-ties: 30 of 1,024 tokens
            token = other_token(reference[request.prompt_ids][position], 5)
            scorer.tie(request.prompt_ids, position, token, 0.2)
            ids[position] = token
        faulty[request.id] = type(stock[request.id])(request.id, tuple(ids))
    verdict = TokenForcing(scorer, _scored(scorer, reqs, stock), delta=0.25).judge(
        "three", _scored(scorer, reqs, faulty)
    )
    assert not verdict.rate.reject and verdict.rate.difference_low < 0.005
    assert verdict.verdict == "reject" and verdict.request.worst in {r.id for r in reqs[:3]}
    assert {row["id"] for row in verdict.per_request if row["flagged"]} == {r.id for r in reqs[:3]}
