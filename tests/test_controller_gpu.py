"""Paired runs on real GPUs with the pure-torch engine (synthetic weights): CUDA graphs captured and
replayed by engines on two GPUs of one process, the interleaved run on one GPU, device swapping over a
two-GPU pool, stock-vs-stock noise on each, and the promotion rule on a change whose direction is known.
The CPU rehearsal of the pool is tests/test_controller_pool.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from specpilot_mem.controller.engine_system import EngineSystem
from specpilot_mem.controller.paired import paired_run, stock_noise
from specpilot_mem.controller.promotion import PromotionRule
from specpilot_mem.controller.requests import Request
from specpilot_mem.engine.engine import Engine
from specpilot_mem.forcing.engine_adapter import utf8_bytes

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (runs on the 2-GPU machine)")

REQUESTS = [
    Request("code-1", "code", "dev", 32, prompt="def merge(intervals):"),
    Request("code-2", "code", "dev", 32, prompt="class RingBuffer:"),
    Request("prose-1", "prose", "dev", 32, prompt="The harbour at dawn was"),
    Request("prose-2", "prose", "dev", 32, prompt="Dear colleague, thank you"),
]
PROMPTS = [list(utf8_bytes(r.prompt)) for r in REQUESTS]


def _systems(devices):
    stock = {d: Engine.random(0, device=d) for d in devices}
    # GDN verify by the path recurrence, eager: the same tokens, several times slower per step
    slow = {d: e.with_options(gdn_verify="path") for d, e in stock.items()}
    systems = EngineSystem("stock", stock, encode=utf8_bytes), EngineSystem("path-verify", slow, encode=utf8_bytes)
    # Warm up on every request, so CUDA graph capture (one graph per verify shape) counts against neither side.
    for system in systems:
        for device in devices:
            system.run(REQUESTS, batch_size=1, device=device)
    for device, engine in stock.items():
        assert engine.graph_error is None and "draft" in engine.captured_graphs, device
    return systems


def _check(devices):
    stock, slow = _systems(devices)
    noise = stock_noise(stock, REQUESTS, repeats=2, devices=devices)
    assert noise.noise < 0.05
    faster = paired_run(slow, stock, REQUESTS, repeats=2, devices=devices)
    if len(devices) > 1:  # A/B/B/A on each device
        assert [r.device for r in faster.runs_a] == [devices[(r + 1) // 2 % 2] for r in range(len(faster.runs_a))]
        assert [r.device for r in faster.runs_b] == [devices[1 - (r + 1) // 2 % 2] for r in range(len(faster.runs_b))]
    else:
        assert {r.device for r in (*faster.runs_a, *faster.runs_b)} == {devices[0]}
    estimate = faster.gain(REQUESTS)
    assert faster.divergent() == []
    decision = PromotionRule().decide(estimate, noise.noise, faster.divergent())
    assert estimate.low > 1.2 and decision.promote
    slower = PromotionRule().decide(
        paired_run(stock, slow, REQUESTS, repeats=2, devices=devices).gain(REQUESTS), noise.noise
    )
    assert not slower.promote and slower.gain < 0.85
    print(
        f"devices={devices} noise={noise.noise:.4f} gain={estimate.gain:.3f} [{estimate.low:.3f}, {estimate.high:.3f}] "
        f"reverse={slower.gain:.3f}"
    )


def test_paired_run_interleaved_on_one_gpu():
    _check(["cuda:0"])


@two_gpus
def test_paired_run_swaps_devices_over_two_gpus():
    _check(["cuda:0", "cuda:1"])


@two_gpus
def test_engines_on_two_gpus_capture_and_replay_their_own_graphs():
    """Two engines, one per GPU, first used from two threads at once: each captures its graphs on its own
    device (taking turns, while the other thread runs eager passes) and replays them there, and the
    outputs are those of a later serial run of the same graphs."""
    engines = [Engine.random(0, device=f"cuda:{i}") for i in range(2)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        concurrent = list(pool.map(lambda e: [g.output_ids for g in e.generate(PROMPTS, "spec", 32)], engines))
    for engine, outputs in zip(engines, concurrent):
        assert engine.graph_error is None
        assert "draft" in engine.captured_graphs and any(k.startswith("verify/") for k in engine.captured_graphs)
        assert [g.output_ids for g in engine.generate(PROMPTS, "spec", 32)] == outputs
    assert concurrent[0] == concurrent[1]  # the same weights and kernels on both GPUs
