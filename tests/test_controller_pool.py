"""Paired runs of the real engine over a device pool, rehearsed on the CPU: two pool slots ("cpu:0",
"cpu:1") each with its own engine, both systems serving at once from two threads and swapping slots
between repeats, as they do on two GPUs. Timings here are not asserted (a shared 2-core machine); the
GPU run of this path is tests/test_controller_gpu.py."""

from __future__ import annotations

import pytest

from conftest import tiny_pair
from specpilot_mem.controller.engine_system import EngineSystem
from specpilot_mem.controller.paired import paired_run, stock_noise
from specpilot_mem.controller.promotion import PromotionRule
from specpilot_mem.controller.requests import Request
from specpilot_mem.engine.engine import Engine
from specpilot_mem.errors import RoundError
from specpilot_mem.forcing.engine_adapter import utf8_bytes

TINY, TINY_DRAFTER = tiny_pair(vocab_size=512, d_model=64, block_size=8, max_seq_len=256)
REQUESTS = [
    Request("code-1", "code", "dev", 12, prompt="def merge(intervals):"),
    Request("code-2", "code", "dev", 12, prompt="class RingBuffer:"),
    Request("prose-1", "prose", "dev", 12, prompt="The harbour at dawn was"),
    Request("prose-2", "prose", "dev", 12, prompt="Dear colleague, thank you"),
]
POOL = ["cpu:0", "cpu:1"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def engines():
    """One engine per pool slot: the same seeded weights, each its own cache."""
    return {slot: Engine.random(0, TINY, TINY_DRAFTER, max_len=256) for slot in POOL}


@pytest.fixture(scope="module")
def greedy(engines):
    """Each request's greedy AR output, served alone on one slot."""
    outputs = EngineSystem("ar", engines["cpu:0"], mode="ar", encode=utf8_bytes).run(
        REQUESTS, batch_size=1, device="cpu"
    )
    return {o.id: o.output_ids for o in outputs}


def systems(engines):
    stock = EngineSystem("stock", engines, encode=utf8_bytes)
    path = EngineSystem(
        "path-verify", {slot: e.with_options(gdn_verify="path") for slot, e in engines.items()}, encode=utf8_bytes
    )
    return stock, path


def test_pool_run_swaps_slots_and_serves_both_systems_at_once(engines, greedy):
    stock, path = systems(engines)
    seen = []
    result = paired_run(path, stock, REQUESTS, repeats=3, devices=POOL, on_run=seen.append)
    # repeat r: a on pool[(r + 1) // 2 mod 2] (A/B/B/A on each slot), b on the other slot
    assert [(r.repeat, r.device) for r in result.runs_a] == [(0, "cpu:0"), (1, "cpu:1"), (2, "cpu:1")]
    assert [(r.repeat, r.device) for r in result.runs_b] == [(0, "cpu:1"), (1, "cpu:0"), (2, "cpu:0")]
    assert sorted((r.system, r.repeat) for r in seen) == sorted(
        (s, k) for s in ("stock", "path-verify") for k in range(3)
    )
    # two engines served from two threads at once, each on its own cache: every run is the greedy decode
    for run in (*result.runs_a, *result.runs_b):
        assert {o.id: o.output_ids for o in run.outputs} == greedy
    assert result.divergent() == []


def test_pool_noise_and_promotion_decision(engines):
    stock, path = systems(engines)
    noise = stock_noise(
        stock,
        REQUESTS,
        stock_b=EngineSystem("stock-b", {s: e.with_options() for s, e in engines.items()}, encode=utf8_bytes),
        repeats=2,
        devices=POOL,
    )
    assert noise.noise == abs(noise.estimate.gain - 1.0)
    assert noise.estimate.low <= noise.estimate.gain <= noise.estimate.high
    result = paired_run(path, stock, REQUESTS, repeats=2, devices=POOL)
    decision = PromotionRule().decide(result.gain(REQUESTS), noise.noise, result.divergent())
    assert decision.threshold == pytest.approx(0.01 + 2 * noise.noise)
    assert decision.promote == (decision.low > 1 + decision.threshold)


def test_engine_system_refuses_a_shared_or_misplaced_engine(engines):
    engine = engines["cpu:0"]
    with pytest.raises(RoundError, match="one engine under several devices"):
        EngineSystem("stock", {"cpu:0": engine, "cpu:1": engine})
    with pytest.raises(RoundError, match="wrong device"):
        EngineSystem("stock", {"cuda:0": engine})
    system = EngineSystem("stock", engines)
    with pytest.raises(RoundError, match="no engine on cuda:1"):
        system.run(REQUESTS, batch_size=1, device="cuda:1")
