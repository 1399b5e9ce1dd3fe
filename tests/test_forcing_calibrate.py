"""δ calibration from stock's first departures from AR, on planted gaps."""

from __future__ import annotations

import pytest
from test_forcing_support import make_case, other_token, outputs_from

from specpilot_mem.forcing.calibrate import calibrate_delta, first_departure, round_up_to_step
from specpilot_mem.forcing.scorer import ForcingError, score_outputs


@pytest.mark.parametrize(
    "gap, delta",
    [
        (0.232, 0.25),
        (0.25, 0.25),
        (0.26, 0.375),
        (0.07, 0.125),
        (0.05, 0.0625),
        (3e-6, 2.0**-10),
        (0.003, 2.0**-8),
        (0.0, 2.0**-10),
        (1.01, 1.125),
    ],
)
def test_round_up_to_a_multiple_of_an_eighth(gap, delta):
    assert round_up_to_step(gap) == delta


def test_first_departure():
    assert first_departure((1, 2, 3), (1, 2, 4)) == 2
    assert first_departure((1, 2), (1, 2, 3)) is None


def test_delta_is_the_largest_gap_at_stocks_first_departures_rounded_up():
    reqs, reference, scorer = make_case(requests=6, length=40, seed=3)
    gaps = [0.05, 0.232, None, 0.1, None, 0.01]  # None: stock follows AR on that request
    stock_sequences = []
    for request, gap in zip(reqs, gaps):
        sequence = list(reference[request.prompt_ids])
        if gap is not None:
            position = 7
            scorer.tie(request.prompt_ids, position, other_token(sequence[position]), gap)
            sequence[position] = other_token(sequence[position])
            # a later, larger departure on the same request is not a first departure and must not count
            scorer.tie(request.prompt_ids, 20, other_token(sequence[20]), 0.9)
            sequence[20] = other_token(sequence[20])
        stock_sequences.append(sequence)
    ar = score_outputs(scorer, reqs, outputs_from(reqs, [reference[r.prompt_ids] for r in reqs]))
    stock = score_outputs(scorer, reqs, outputs_from(reqs, stock_sequences))
    calibration = calibrate_delta(ar, stock)
    assert len(calibration.departures) == 4
    assert all(d.position == 7 for d in calibration.departures)
    assert calibration.largest_gap == pytest.approx(0.232, abs=1e-5)
    assert calibration.delta == 0.25


def test_calibration_needs_the_same_requests():
    reqs, reference, scorer = make_case(requests=3, length=10, seed=4)
    ar = score_outputs(scorer, reqs, outputs_from(reqs, [reference[r.prompt_ids] for r in reqs]))
    with pytest.raises(ForcingError, match="different requests"):
        calibrate_delta(ar, dict(list(ar.items())[:2]))


def test_calibration_on_a_faulty_stock_is_refused():
    """A stock whose first departures from AR are large-margin (a faulty stock run) would calibrate δ to
    several nats and hide every event: the calibration is refused, naming the departures."""
    reqs, reference, scorer = make_case(requests=4, length=30, seed=5)
    stock_sequences = []
    for request in reqs:
        sequence = list(reference[request.prompt_ids])
        sequence[5] = other_token(sequence[5])  # the planted background: 8 nats below the argmax
        stock_sequences.append(sequence)
    ar = score_outputs(scorer, reqs, outputs_from(reqs, [reference[r.prompt_ids] for r in reqs]))
    stock = score_outputs(scorer, reqs, outputs_from(reqs, stock_sequences))
    with pytest.raises(ForcingError, match="not near-ties") as err:
        calibrate_delta(ar, stock)
    assert "r000@5" in err.value.what


def test_an_fp32_stock_that_never_departs_gets_the_low_floor():
    reqs, reference, scorer = make_case(requests=3, length=10, seed=6)
    ar = score_outputs(scorer, reqs, outputs_from(reqs, [reference[r.prompt_ids] for r in reqs]))
    calibration = calibrate_delta(ar, ar)
    assert calibration.delta == 2.0**-10 and "never departed" in calibration.basis
