"""Gains, paired runs, stock-vs-stock noise, the promotion rule and the sealed final, on systems with
known speeds (a test double of ``System``: the engine is the real one, timed in benchmarks)."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from specpilot_mem.controller.gains import GainEstimate, Run, divergent_requests, gain
from specpilot_mem.controller.paired import paired_run, schedule, stock_noise
from specpilot_mem.controller.promotion import PromotionRule
from specpilot_mem.controller.requests import Request, RequestSetError
from specpilot_mem.controller.sealed import sealed_final
from specpilot_mem.controller.system import RequestOutput
from specpilot_mem.errors import RoundError


def make_requests(per_benchmark: dict[str, int], split: str = "dev") -> list[Request]:
    return [
        Request(f"{name}-{i}", name, split, 32, prompt_ids=(1, 2, i))
        for name, n in per_benchmark.items()
        for i in range(n)
    ]


class ClockedSystem:
    """Serves requests at a known rate: ``speed[benchmark]`` tokens/s, times a device factor and a
    slow drift per call (``drift``), plus seeded multiplicative jitter. Outputs are fixed token ids."""

    def __init__(self, name, speed, *, devices=None, drift=0.0, jitter=0.0, seed=0, tokens=None):
        self.name, self.speed, self.devices, self.drift, self.jitter = name, speed, devices or {}, drift, jitter
        self.rng = np.random.default_rng(seed)
        self.tokens = tokens or (lambda request: tuple(range(16)))
        self.calls: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def run(self, requests, *, batch_size, device):
        with self.lock:
            self.calls.append((device, batch_size))
            slowdown = 1.0 + self.drift * (len(self.calls) - 1)
            outputs = []
            for request in requests:
                rate = self.speed[request.benchmark] * self.devices.get(device, 1.0) / slowdown
                rate *= math.exp(self.jitter * self.rng.standard_normal())
                ids = self.tokens(request)
                times = tuple(float(t + 1) / rate for t in range(len(ids)))
                outputs.append(RequestOutput(request.id, ids, 0.0, times))
            return outputs


def runs_of(system, requests, batch_size=1, repeats=1):
    return [
        Run(system.name, "cpu", batch_size, r, tuple(system.run(requests, batch_size=batch_size, device="cpu")))
        for r in range(repeats)
    ]


def test_gain_is_the_equal_weight_geometric_mean_over_benchmarks():
    requests = make_requests({"code": 10, "prose": 2})
    base = ClockedSystem("stock", {"code": 100.0, "prose": 100.0})
    fast = ClockedSystem("patch", {"code": 120.0, "prose": 100.0})
    estimate = gain(runs_of(base, requests), runs_of(fast, requests), requests)
    # equal weight per benchmark, not per request: sqrt(1.2 * 1.0), not (10*log 1.2 + 2*0)/12
    assert estimate.gain == pytest.approx(math.sqrt(1.2))
    assert {(g.benchmark, round(g.gain, 6)) for g in estimate.groups} == {("code", 1.2), ("prose", 1.0)}
    assert estimate.low == pytest.approx(estimate.gain) == pytest.approx(estimate.high)  # no noise, no width


def test_gain_groups_by_batch_size_too():
    requests = make_requests({"code": 3})
    base, cand = ClockedSystem("a", {"code": 100.0}), ClockedSystem("b", {"code": 150.0})
    estimate = gain(
        runs_of(base, requests, 1) + runs_of(base, requests, 8),
        runs_of(cand, requests, 1) + runs_of(cand, requests, 8),
        requests,
    )
    assert [(g.benchmark, g.batch_size) for g in estimate.groups] == [("code", 1), ("code", 8)]
    assert estimate.gain == pytest.approx(1.5)


def test_gain_interval_covers_a_planted_gain():
    requests = make_requests({"code": 12, "math": 12})
    base = ClockedSystem("a", {"code": 100.0, "math": 50.0}, jitter=0.05, seed=1)
    cand = ClockedSystem("b", {"code": 105.0, "math": 52.5}, jitter=0.05, seed=2)
    estimate = gain(runs_of(base, requests, repeats=2), runs_of(cand, requests, repeats=2), requests)
    assert estimate.low < 1.05 < estimate.high
    assert estimate.high - estimate.low < 0.1


def test_gain_needs_two_requests_per_group_and_the_same_requests():
    requests = make_requests({"code": 1})
    base = ClockedSystem("a", {"code": 100.0})
    with pytest.raises(RequestSetError, match="fewer than 2 requests"):
        gain(runs_of(base, requests), runs_of(base, requests), requests)
    two = make_requests({"code": 2})
    with pytest.raises(RequestSetError, match="not run on the same requests"):
        gain(runs_of(base, two), runs_of(base, two[:1]), two)


def test_schedule_interleaves_on_one_device_and_swaps_on_a_pool():
    assert schedule(2, ["cuda:0"]) == [[("a", "cuda:0")], [("b", "cuda:0")], [("b", "cuda:0")], [("a", "cuda:0")]]
    assert schedule(2, ["cuda:0", "cuda:1"]) == [[("a", "cuda:0"), ("b", "cuda:1")], [("a", "cuda:1"), ("b", "cuda:0")]]
    # a paired run keeps to the pool's first two devices, A/B/B/A on each
    assert schedule(4, ["g0", "g1", "g2"]) == [
        [("a", "g0"), ("b", "g1")],
        [("a", "g1"), ("b", "g0")],
        [("a", "g1"), ("b", "g0")],
        [("a", "g0"), ("b", "g1")],
    ]
    with pytest.raises(RoundError):
        schedule(0, ["cuda:0"])
    with pytest.raises(RoundError):
        schedule(1, ["cuda:0", "cuda:0"])


def test_device_swapping_cancels_a_faster_device():
    requests = make_requests({"code": 4})
    devices = {"cuda:0": 1.10, "cuda:1": 1.0}  # cuda:0 is 10% faster
    a = ClockedSystem("a", {"code": 100.0}, devices=devices)
    b = ClockedSystem("b", {"code": 100.0}, devices=devices)
    result = paired_run(a, b, requests, repeats=2, devices=["cuda:0", "cuda:1"])
    assert result.gain(requests).gain == pytest.approx(1.0)
    assert {c[0] for c in a.calls} == {"cuda:0", "cuda:1"} == {c[0] for c in b.calls}
    unswapped = paired_run(a, b, requests, repeats=1, devices=["cuda:0", "cuda:1"])
    assert unswapped.gain(requests).gain == pytest.approx(1 / 1.10)


def test_interleaving_cancels_a_linear_drift_on_one_device():
    requests = make_requests({"code": 4})
    shared_drift = ClockedSystem("stock", {"code": 100.0}, drift=0.02)
    noise = stock_noise(shared_drift, requests, repeats=2, devices=["cpu"])
    # A B B A under a 2%-per-run slowdown: sequential A-then-B would show a 2% loss.
    assert noise.noise < 0.002
    assert noise.estimate.requests == 4


def test_promotion_rule_thresholds():
    rule = PromotionRule()
    estimate = GainEstimate(gain=1.04, low=1.025, high=1.055, requests=40)
    assert rule.decide(estimate, noise=0.005).promote  # 1.025 > 1 + 0.01 + 0.01
    assert not rule.decide(estimate, noise=0.008).promote  # 1.025 < 1 + 0.026
    diverging = rule.decide(estimate, noise=0.001, divergent=["code-3"])
    assert not diverging.promote and diverging.threshold == 0.03 and "diverge" in diverging.reason
    assert rule.decide(GainEstimate(1.06, 1.035, 1.08, 40), noise=0.001, divergent=["x"]).promote
    assert PromotionRule(divergent_min_gain=0.05).threshold(0.0, True) == 0.05


def test_paired_run_detects_divergent_outputs():
    requests = make_requests({"code": 3})
    a = ClockedSystem("a", {"code": 100.0})
    b = ClockedSystem("b", {"code": 110.0}, tokens=lambda r: (1, 2, 3) if r.id == "code-1" else tuple(range(16)))
    result = paired_run(a, b, requests, repeats=1, devices=["cpu"])
    assert result.divergent() == ["code-1"]
    assert divergent_requests(result.runs_a, result.runs_a) == []


def test_paired_run_rejects_a_system_that_drops_requests():
    requests = make_requests({"code": 3})

    class Dropping(ClockedSystem):
        def run(self, requests, *, batch_size, device):
            return super().run(requests, batch_size=batch_size, device=device)[:-1]

    with pytest.raises(RoundError, match="one output per request"):
        paired_run(
            ClockedSystem("a", {"code": 1.0}), Dropping("b", {"code": 1.0}), requests, repeats=1, devices=["cpu"]
        )


def _verdict(name: str, verdict: str):
    from specpilot_mem.forcing.rules import EventResult, RateResult
    from specpilot_mem.forcing.verdict import Verdict

    rate = RateResult(0.007, 0.005, 0.009, 0.007, 0.005, 0.009, 0.0, -0.002, 0.002, 0.005, verdict == "reject")
    events = EventResult(0.25, 0.5, 0, 1000, 0, 0, 0, 1000, 1.0, 0.05, False)
    return Verdict(
        name,
        "stock",
        verdict,
        ("rate rule: planted",) if verdict == "reject" else (),
        4,
        0.25,
        rate,
        events,
        {"stock-path": 0, "stock-margin": 0, "prefill-length": 0},
    )


def test_sealed_final_runs_only_unseen_requests_and_needs_both_checks():
    unseen = make_requests({"code": 3, "math": 3}, split="unseen")
    stock = ClockedSystem("stock", {"code": 100.0, "math": 100.0})
    fast = ClockedSystem("final", {"code": 130.0, "math": 120.0})
    seen = []
    accepted = sealed_final(
        fast, stock, unseen, forcing=lambda s, k: seen.append((s, k)) or _verdict("final", "accept"), devices=["cpu"]
    )
    assert accepted.accepted and accepted.gain.gain == pytest.approx(math.sqrt(1.3 * 1.2))
    system_outputs, stock_outputs = seen[0]
    assert set(system_outputs) == set(stock_outputs) == {r.id for r in unseen}
    rejected = sealed_final(fast, stock, unseen, forcing=lambda s, k: _verdict("final", "reject"), devices=["cpu"])
    assert not rejected.accepted and rejected.reasons == ("rate rule: planted",)
    slow = sealed_final(stock, fast, unseen, forcing=lambda s, k: _verdict("final", "accept"), devices=["cpu"])
    assert not slow.accepted and "not above 1" in slow.reasons[0]
    with pytest.raises(RequestSetError, match="only unseen requests"):
        sealed_final(
            fast, stock, make_requests({"code": 2}), forcing=lambda s, k: _verdict("x", "accept"), devices=["cpu"]
        )
