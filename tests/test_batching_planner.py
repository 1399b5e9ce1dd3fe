"""The batch-size-aware budget planner (batching.planner): it takes the bucket of most expected tokens per
ms, AR when no bucket beats AR, backs off its probes where speculation cannot pay, and refuses bad buckets."""

import numpy as np
import pytest

from specpilot_mem.batching.costs import BatchingError
from specpilot_mem.batching.planner import BudgetPlanner, acceptance_prior


class Costs:
    """Step costs of a toy engine: AR 10 ms; a speculative step 10 ms x (1 + growth x extra rows per request)
    plus a 2 ms draft."""

    def __init__(self, growth: float):
        self.growth = growth

    def ar_ms(self, requests):
        return 10.0

    def verify_ms(self, rows, requests):
        return 10.0 * (1 + self.growth * (rows / requests - 1))

    def draft_ms(self, rows, requests):
        return 2.0


TAU = np.array([1.8, 2.4, 3.0, 3.4, 3.6])  # expected tokens per request at 2, 3, 5, 9, 17 rows


def test_the_plan_takes_the_best_bucket_where_extra_rows_are_cheap():
    planner = BudgetPlanner(Costs(growth=0.001))
    table = planner.table(8, TAU)
    assert table[0]["rows"] == 1 and table[0]["tokens_per_ms"] == pytest.approx(0.8)
    best = max(table, key=lambda r: r["tokens_per_ms"])
    assert planner.rows_for(8, TAU) == best["rows"] == 17


def test_the_plan_is_ar_where_no_bucket_beats_it():
    planner = BudgetPlanner(Costs(growth=1.5))  # one extra row per request already costs 2.5x AR
    table = planner.table(32, TAU)
    assert all(r["tokens_per_ms"] < table[0]["tokens_per_ms"] for r in table[1:])
    assert planner.rows_for(32, TAU) == 1


def test_the_plan_is_a_smaller_bucket_in_between():
    planner = BudgetPlanner(Costs(growth=0.2))
    rows = planner.rows_for(16, TAU)
    assert 2 < rows < 17


def test_drafter_blocks_follow_the_bucket():
    planner = BudgetPlanner(Costs(growth=0.1), blocks=(8, 12, 16))
    assert [planner.draft_block(r) for r in (2, 9, 10, 13, 17)] == [8, 8, 12, 12, 16]


def test_expected_tokens_from_per_depth_acceptance():
    planner = BudgetPlanner(Costs(growth=0.001))
    assert planner.expected() is None and planner.rows_for(8) == planner.buckets[0]  # first look: the cheapest
    # chains verified 4 deep: per depth half of those reaching it accept it
    for _ in range(400):  # the decaying sums' steady state
        planner.observe(np.array([0, 1, 2, 4, 0, 1, 2, 4]), np.full(8, 4))
    rate = planner.acceptance()
    steady = 1 / (1 - planner.decay)  # the decaying sums' weight of one step
    want, prior = [], 0.5
    for num, den in ((6, 8), (4, 6), (2, 4), (2, 2)):
        prior = (num * steady + planner.PRIOR * prior) / (den * steady + planner.PRIOR)
        want.append(prior)
    np.testing.assert_allclose(rate[:4], want, rtol=1e-4)
    np.testing.assert_allclose(rate[:4], [6 / 8, 4 / 6, 2 / 4, 2 / 2], atol=0.05)
    np.testing.assert_allclose(rate[4:], rate[3])  # unverified depths take the deepest verified one's rate
    reach = np.cumprod(rate)
    chain = np.array([1 + reach[: r - 1].sum() for r in planner.buckets])
    np.testing.assert_allclose(planner.expected(), chain)


def test_a_verified_bucket_scales_the_chain_estimate_by_what_it_realised():
    planner = BudgetPlanner(Costs(growth=0.001))
    for _ in range(400):  # the decaying sums' steady state
        planner.observe(np.array([0, 1, 2, 4, 0, 1, 2, 4]), np.full(8, 4))
    chain = planner.chain_expected()
    five = planner.buckets.index(5)
    added, prior = chain[five] - 1, planner.RATIO_PRIOR
    tested = planner.expected()[five]
    planner.observe(np.array([0, 1]), np.array([4, 4]), rows=5)  # 0.5 tokens past the root per request
    start = planner.RATIO_DECAY * prior * added  # a ratio of 1 worth RATIO_PRIOR requests, decayed once
    ratio = (start + 1) / (start + 2 * added)
    assert planner.ratio(5) == pytest.approx(ratio) and ratio < 1
    after = planner.chain_expected()
    expected = planner.expected()
    np.testing.assert_allclose(expected[:five], after[:five])  # below the verified bucket: the chain's
    # the bucket just verified: what it realised (1.5 tokens per request, 2 requests) against the estimate it tested,
    # worth RECENT_REQUESTS requests, both faded once
    memory = planner.RECENT_REQUESTS * planner.decay * np.exp(-2 / planner.RECENT_REQUESTS)
    assert expected[five] == pytest.approx((tested * memory + 2 * 1.5) / (memory + 2))
    assert 1.5 < expected[five] < tested
    for _ in range(200):  # a run of such steps: the realised figure takes over
        planner.observe(np.array([0, 1]), np.array([4, 4]), rows=5)
    assert planner.expected()[five] == pytest.approx(1.5, rel=1e-4)
    np.testing.assert_allclose(expected[five + 1 :], 1 + (after[five + 1 :] - 1) * ratio)  # above: its ratio
    assert planner.ratio(5) < ratio  # many requests' worth: the prior's pull fades
    top = planner.buckets.index(17)
    tested = planner.expected()[top]
    planner.observe(np.array([2, 2]), np.array([4, 4]), rows=17)  # a larger bucket keeps its own ratio
    assert planner.ratio(17) != planner.ratio(5) and planner.ratio(3) is None
    assert tested < planner.expected()[top] < 3.0  # its first look: from the estimate it tested towards 3 tokens
    for _ in range(100):  # other buckets verified: the 5-row bucket's realised figure fades into its scaled estimate
        planner.observe(np.array([2, 2]), np.array([4, 4]), rows=17)
    assert planner.expected()[top] == pytest.approx(3.0, rel=0.01)
    scaled = 1 + (planner.chain_expected()[five] - 1) * planner.ratio(5)
    assert planner.expected()[five] == pytest.approx(scaled, rel=0.02)


def test_looks_are_spaced_by_their_estimated_loss():
    far = BudgetPlanner(Costs(growth=3.0), probe=2, max_probe=16)  # every bucket far below AR: rare looks
    far.observe(np.array([1, 0, 1, 0]), np.array([1, 1, 1, 1]))
    picks = [far.rows_for(8) for _ in range(64)]
    looks = [i for i, r in enumerate(picks) if r > 1]
    best = max(far.table(8)[1:], key=lambda r: r["tokens_per_ms"])["rows"]
    assert looks[0] == 1 and all(picks[i] == best for i in looks)  # the first after `probe` AR steps
    assert set(np.diff(looks)) == {16}  # the loss over probe_cost is far past max_probe
    near = BudgetPlanner(Costs(growth=0.48), probe=2, max_probe=64, probe_cost=0.02)
    near.observe(np.array([1, 0, 1, 0]), np.array([1, 1, 1, 1]))
    table = near.table(8)
    best = max(table[1:], key=lambda r: r["tokens_per_ms"])
    # the look's loss in AR steps: its shortfall in tokens per ms over its own time (here over 2 AR steps)
    loss = (1 - best["tokens_per_ms"] / table[0]["tokens_per_ms"]) * best["step_ms"] / table[0]["step_ms"]
    assert 0 < loss < 0.2 and best["step_ms"] > 1.5 * table[0]["step_ms"]
    looks = [i for i, r in enumerate(near.rows_for(8) for _ in range(64)) if r > 1]
    assert set(np.diff(looks)) == {int(np.ceil(loss / 0.02))} and 2 < int(np.ceil(loss / 0.02)) < 16  # within probe x B


def test_a_prior_needs_no_first_look():
    rate = acceptance_prior(np.array([0, 0, 1, 2, 3, 0, 1, 5]), 4)
    np.testing.assert_allclose(rate, [5 / 8, 3 / 5, 2 / 3, 1 / 2])
    cold, warm = BudgetPlanner(Costs(growth=3.0)), BudgetPlanner(Costs(growth=3.0), prior=rate)
    assert cold.rows_for(8) == cold.buckets[0]  # the cheapest look
    assert warm.rows_for(8) == 1  # AR straight away: the prior says no bucket pays
    reach, prev, expected = 16.0 * np.concatenate([[1.0], np.cumprod(rate)[:-1]]), 0.5, []
    for r, n in zip(rate, reach):  # the prior as observations, with acceptance()'s one-request smoothing
        prev = (n * r + warm.PRIOR * prev) / (n + warm.PRIOR)
        expected.append(prev)
    np.testing.assert_allclose(warm.acceptance()[:4], expected)
    with pytest.raises(BatchingError, match="prior"):
        BudgetPlanner(Costs(0.1), prior=np.array([1.5]))


def test_bad_buckets_are_refused():
    with pytest.raises(BatchingError, match="--plan-rows"):
        BudgetPlanner(Costs(0.1), per_request=(1, 5))
    with pytest.raises(BatchingError, match="requests in flight"):
        BudgetPlanner(Costs(0.1)).rows_for(0)


def engine_doc(path: bool) -> dict:
    entry = lambda b: {  # noqa: E731
        "T_AR_ms": 5.0 + b / 16,
        "T_draft_ms": {"16": 1.0, "8": 0.8},
        "T_step_ms": {"2": 8.0 + b / 4, "17": 12.0 + b},
        **({"T_step_path_ms": {"2": 6.0 + b / 8, "17": 9.0 + b / 2}} if path else {}),
    }
    return {"source": "toy", "by_batch": {str(b): entry(b) for b in (1, 8, 32)}}


def test_engine_costs_per_option_set():
    from specpilot_mem.batching.costs import EngineStepCosts, StepCosts

    base = StepCosts.roofline("4b")
    stock = EngineStepCosts(base, engine_doc(True), "stock")
    path = EngineStepCosts(base, engine_doc(True), "path")
    assert stock.ar_ms(8) == path.ar_ms(8) == pytest.approx(5.5)
    assert stock.verify_ms(8 * 17, 8) == pytest.approx(20.0) and path.verify_ms(8 * 17, 8) == pytest.approx(13.0)
    best = EngineStepCosts(base, engine_doc(True), "best")
    assert best.verify_ms(8 * 17, 8) == pytest.approx(13.0) and best.verify_ms(8 * 2, 8) == pytest.approx(7.0)
    with pytest.raises(BatchingError, match="T_step_path_ms"):
        EngineStepCosts(base, engine_doc(False), "path")
    with pytest.raises(BatchingError, match="unknown engine variant"):
        EngineStepCosts(base, engine_doc(True), "w12")


def test_a_stock_bucket_out_of_memory_takes_the_path_verify_time():
    from specpilot_mem.batching.costs import EngineStepCosts, StepCosts

    doc = engine_doc(True)
    del doc["by_batch"]["32"]["T_step_ms"]["17"]  # stock's snapshot buffers did not fit there
    stock = EngineStepCosts(StepCosts.roofline("4b"), doc, "stock")
    assert stock.substituted == ["32/17"] and stock.to_dict()["substituted_from_path_verify"] == ["32/17"]
    assert stock.verify_ms(32 * 17, 32) == pytest.approx(9.0 + 32 / 2)  # the path verify's (faster) time
    assert stock.verify_ms(8 * 17, 8) == pytest.approx(20.0)  # measured buckets keep stock's own
    assert EngineStepCosts(StepCosts.roofline("4b"), doc, "best").verify_ms(32 * 17, 32) == pytest.approx(25.0)


def test_the_engine_step_curve_has_spare_rows_only_where_measured_counts_are_flat():
    from specpilot_mem.batching.admission import PromptAdmission
    from specpilot_mem.batching.costs import EngineStepCosts, StepCosts

    doc = engine_doc(True)
    doc["by_batch"]["8"]["T_step_path_ms"] = {"2": 6.0, "17": 6.2}  # 17 rows per request cost 3% more than 2
    costs = EngineStepCosts(StepCosts.roofline("4b"), doc, "path")
    curve = costs.rows_curve(8)
    assert curve.rows == (8, 16, 136) and curve.ms == pytest.approx((costs.ar_ms(8), 6.0, 6.2))
    admission = PromptAdmission(curve, 2048, segment=None)
    assert admission.spare_rows(16) == 120  # 2 -> 17 rows per request is one plateau
    assert admission.spare_rows(8) == 0  # the roots' AR step: 2 rows per request cost 6.0 / 5.5 of it
    # below a measured count a pass costs that count's time (its CUDA-graph bucket), never an interpolated sample's
    doc["by_batch"]["32"]["T_step_path_ms"] = {"2": 10.0, "17": 40.0}
    wide = PromptAdmission(EngineStepCosts(StepCosts.roofline("4b"), doc, "path").rows_curve(32), 2048)
    assert wide.spare_rows(32 * 9) == 32 * 17 - 32 * 9  # the measured count it is below costs that count's time
    assert costs.rows_curve(32).plateau_end(32 * 17 + 1) == 32 * 17 + 1  # past the last count: none spare


def test_a_look_says_so():
    planner = BudgetPlanner(Costs(growth=3.0), probe=2, max_probe=16)
    assert planner.rows_for(8) > 1 and planner.looking  # the first look (no estimate yet)
    planner.observe(np.array([1, 0, 1, 0]), np.array([1, 1, 1, 1]))
    flags = [(planner.rows_for(8), planner.looking) for _ in range(20)]
    assert all(looking == (rows > 1) for rows, looking in flags) and any(looking for _, looking in flags)
    cheap = BudgetPlanner(Costs(growth=0.001))
    cheap.observe(np.array([3, 3]), np.array([4, 4]))
    assert cheap.rows_for(8) > 1 and not cheap.looking  # speculating because it is estimated faster
