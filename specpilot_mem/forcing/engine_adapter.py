"""The pure-torch engine (``specpilot_mem.engine``) as a token-forcing ``Scorer``.

``Engine.score`` runs prompt + output through the target in chunked prefill passes and an LM head in
FP32; its ``prefill_len`` moves the boundary of the first pass, which is what the audit varies.
Imports only numpy and the engine (torch), so it runs on the lent GPU machine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from specpilot_mem.forcing.scorer import TokenScores


def utf8_bytes(text: str) -> list[int]:
    """Text as its UTF-8 bytes (ids 0-255): the prompt encoding for engines without a tokenizer
    (random weights), valid for any vocabulary of at least 256 ids."""
    return list(text.encode("utf-8"))


class EngineScorer:
    """Teacher-forced scores from an ``Engine``; ``fp32_head=False`` gives the stock engine's own head
    (the audit's optional stock-margin check) instead of the scorer's FP32 one."""

    def __init__(self, engine, *, fp32_head: bool = True, encode: Callable[[str], Sequence[int]] = utf8_bytes):
        self.engine = engine
        self.fp32_head = fp32_head
        self.encode = encode

    def score(self, prompt_ids: Sequence[int], output_ids: Sequence[int], prefill_len: int | None = None) -> TokenScores:
        scored = self.engine.score(list(prompt_ids), list(output_ids), fp32_head=self.fp32_head, prefill_len=prefill_len)
        logprob = np.asarray(scored.logprob, dtype=np.float64)
        return TokenScores(
            token_logprob=logprob,
            argmax=np.asarray(scored.argmax, dtype=np.int64),
            argmax_logprob=logprob + np.asarray(scored.margin, dtype=np.float64),
            top2_margin=np.asarray(scored.top2_margin, dtype=np.float64),
        )


def load_scorer(model: str = "default", seed: str = "0", device: str = "cpu", fp32_head: str = "true") -> EngineScorer:
    """CLI factory (``--scorer specpilot_mem.forcing.engine_adapter:load_scorer``): ``model`` is
    ``default`` (the committed trained pair, else seeded random weights), ``random`` (seeded random
    weights) or a folder holding target.safetensors and drafter.safetensors."""
    from pathlib import Path

    from specpilot_mem.engine.engine import Engine

    if model == "default":
        engine = Engine.load_default(device=device)
    elif model == "random":
        engine = Engine.random(int(seed), device=device)
    else:
        engine = Engine.load(Path(model), device=device)
    return EngineScorer(engine, fp32_head=fp32_head.lower() in ("1", "true", "yes"))
