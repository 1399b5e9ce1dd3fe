"""The pure-torch speculative engine (CPU and CUDA): a Qwen3.5-style hybrid target (Gated DeltaNet +
attention), a DFlash2-style block drafter, greedy AR and speculative decoding with chain or tree
verification, a teacher-forced scorer, lattice recording and per-request timing.

Imports only torch, numpy and safetensors (triton where kernels are used), so it runs on the bare H200
with ``PYTHONPATH=kernels:.``.

    from specpilot_mem.engine import Engine
    engine = Engine.load_default()                      # the trained pair in models/, else synthetic
    runs = engine.generate([prompt_ids], mode="spec", max_new_tokens=128)
    runs[0].output_ids, runs[0].token_times, runs[0].output_rate, runs[0].tau
    score = engine.score(prompt_ids, runs[0].output_ids)  # FP32 head: logprob, argmax, margin, top2_margin
    faulty = engine.with_options(fault_after=32)          # the injected fault of §6.2
"""

from specpilot_mem.engine.config import DrafterConfig, EngineOptions, TargetConfig
from specpilot_mem.engine.engine import Engine, Generation, Request, Score

__all__ = ["DrafterConfig", "Engine", "EngineOptions", "Generation", "Request", "Score", "TargetConfig"]
