"""Paired runs on real GPUs with the pure-torch engine: device swapping over a two-GPU pool,
stock-vs-stock noise and the promotion rule on a change whose direction is known (synthetic weights)."""

from __future__ import annotations

import pytest
import torch

from specpilot_mem.controller.engine_system import EngineSystem
from specpilot_mem.controller.paired import paired_run, stock_noise
from specpilot_mem.controller.promotion import PromotionRule
from specpilot_mem.controller.requests import Request
from specpilot_mem.engine.engine import Engine
from specpilot_mem.forcing.engine_adapter import utf8_bytes

pytestmark = pytest.mark.gpu

REQUESTS = [
    Request("code-1", "code", "dev", 48, prompt="def merge(intervals):"),
    Request("code-2", "code", "dev", 48, prompt="class RingBuffer:"),
    Request("prose-1", "prose", "dev", 48, prompt="The harbour at dawn was"),
    Request("prose-2", "prose", "dev", 48, prompt="Dear colleague, thank you"),
]


def _systems(devices, cuda_graphs=True):
    stock = {d: Engine.random(0, device=d).with_options(cuda_graphs=cuda_graphs) for d in devices}
    # GDN verify by the path recurrence: the same tokens, several times slower per step
    slow = {d: e.with_options(gdn_verify="path") for d, e in stock.items()}
    systems = EngineSystem("stock", stock, encode=utf8_bytes), EngineSystem("path-verify", slow, encode=utf8_bytes)
    # Warm up on every request: CUDA graph capture (one graph per verify shape) must neither count
    # against a side nor happen while the other device's thread runs (global capture mode forbids it).
    for system in systems:
        for device in devices:
            system.run(REQUESTS, batch_size=1, device=device)
    return systems


def _check(devices, cuda_graphs=True):
    stock, slow = _systems(devices, cuda_graphs)
    noise = stock_noise(stock, REQUESTS, repeats=2, devices=devices)
    assert noise.noise < 0.05
    faster = paired_run(slow, stock, REQUESTS, repeats=2, devices=devices)
    assert {r.device for r in faster.runs_a} == {r.device for r in faster.runs_b} == set(devices)
    estimate = faster.gain(REQUESTS)
    assert faster.divergent() == []
    decision = PromotionRule().decide(estimate, noise.noise, faster.divergent())
    assert estimate.low > 1.2 and decision.promote
    slower = PromotionRule().decide(paired_run(stock, slow, REQUESTS, repeats=2, devices=devices).gain(REQUESTS), noise.noise)
    assert not slower.promote and slower.gain < 0.85
    print(f"devices={devices} noise={noise.noise:.4f} gain={estimate.gain:.3f} [{estimate.low:.3f}, {estimate.high:.3f}] "
          f"reverse={slower.gain:.3f}")


def test_paired_run_interleaved_on_one_gpu():
    _check(["cuda:0"])


def test_paired_run_swaps_devices_over_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (runs on the 2-GPU machine)")
    # Eager: the engine's CUDA graph capture uses torch's shared default capture stream, which lives on
    # the first device that captured, so capturing on a second GPU fails (reported to the engine's owner).
    _check(["cuda:0", "cuda:1"], cuda_graphs=False)
