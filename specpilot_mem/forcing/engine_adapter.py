"""The pure-torch engine (``specpilot_mem.engine``) as a token-forcing ``Scorer``.

``score`` runs prompt + output through the target in the engine's chunked prefill passes and an LM
head in FP32; its ``prefill_len`` moves the boundary of the first pass, which is what the audit
varies. ``score_batch`` is the cheap path for whole request sets: one teacher-forced pass over each
whole sequence (the target's sequence form: chunked GDN, causal attention, the same weights and
formulas), many requests per pass, right-padded (every layer is causal, so padding after a
sequence cannot reach it), on the engine's device. Imports only numpy and the engine (torch), so it
runs on the lent GPU machine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from specpilot_mem.forcing.scorer import ForcingError, TokenScores

# Tokens per batched pass (prompt + output, padding included): bounds the activations and the FP32 logits.
BATCH_TOKENS = 16_384


def utf8_bytes(text: str) -> list[int]:
    """Text as its UTF-8 bytes (ids 0-255): the prompt encoding for engines without a tokenizer
    (random weights), valid for any vocabulary of at least 256 ids."""
    return list(text.encode("utf-8"))


def prompt_encoder(engine, model_dir: Path | None = None) -> Callable[[str], list[int]]:
    """How text prompts become token ids for ``engine``: the trained pair's tokenizer (``tokenizer.json``
    beside its weights), UTF-8 bytes only for random weights, which were never trained on any text.
    Without the ``tokenizers`` package a trained engine gets an encoder that refuses text: scoring a
    trained model on byte ids it never saw would make stock look lossy and faults look like stock."""
    if engine.synthetic:
        return utf8_bytes
    from specpilot_mem.engine.weights import DEFAULT_MODEL_DIR

    folder = Path(model_dir) if model_dir is not None else DEFAULT_MODEL_DIR
    if not (folder / "tokenizer.json").is_file():
        return _refuse_text(f"there is no tokenizer.json in {folder}")
    try:
        from specpilot_mem.engine.train.corpus import load_tokenizer

        tokenizer = load_tokenizer(folder)
    except ImportError:
        return _refuse_text("the tokenizers package is not installed")
    return lambda text: list(tokenizer.encode(text).ids)


def _refuse_text(why: str) -> Callable[[str], list[int]]:
    def refuse(text: str) -> list[int]:
        raise ForcingError(
            f"cannot encode a text prompt for the trained model: {why}",
            where="prompt encoding",
            fix="install tokenizers (pip install tokenizers), or give the requests as prompt_ids",
        )

    return refuse


class EngineScorer:
    """Teacher-forced scores from an ``Engine``; ``fp32_head=False`` gives the stock engine's own head
    (the audit's optional stock-margin check) instead of the scorer's FP32 one."""

    def __init__(self, engine, *, fp32_head: bool = True, encode: Callable[[str], Sequence[int]] | None = None):
        self.engine = engine
        self.fp32_head = fp32_head
        self.encode = encode if encode is not None else prompt_encoder(engine)

    @property
    def max_len(self) -> int:
        """Longest prompt + output the scorer takes: the engine's context."""
        return self.engine.max_len

    def score(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], prefill_len: int | None = None
    ) -> TokenScores:
        scored = self.engine.score(
            list(prompt_ids), list(output_ids), fp32_head=self.fp32_head, prefill_len=prefill_len
        )
        logprob = np.asarray(scored.logprob, dtype=np.float64)
        return TokenScores(
            token_logprob=logprob,
            argmax=np.asarray(scored.argmax, dtype=np.int64),
            argmax_logprob=logprob + np.asarray(scored.margin, dtype=np.float64),
            top2_margin=np.asarray(scored.top2_margin, dtype=np.float64),
        )

    def prefill_argmax(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], queries: Sequence[tuple[int, int]]
    ) -> list[int]:
        """For each (position, prefill_len), the argmax ``score(prompt_ids, output_ids[:position + 1], prefill_len)``
        gives at ``position``, from one shared pass (the audit's prefill-length check)."""
        return self.engine.prefill_argmax(list(prompt_ids), list(output_ids), list(queries), fp32_head=self.fp32_head)

    def score_batch(self, items: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[TokenScores]:
        """Scores of many (prompt_ids, output_ids) pairs, one whole-sequence pass each, batched up to
        ``BATCH_TOKENS`` tokens per pass (longest first, so padding stays small)."""
        import torch

        from specpilot_mem.engine.model import lm_head

        engine = self.engine
        for prompt, output in items:
            if not prompt or not output:
                raise ForcingError(
                    "score needs a non-empty prompt and output",
                    where="EngineScorer.score_batch",
                    fix="every request needs a prompt and at least one output token",
                )
            if len(prompt) + len(output) > engine.max_len:
                raise ForcingError(
                    f"prompt + output ({len(prompt) + len(output)} tokens) exceed the scorer's context "
                    f"of {engine.max_len}",
                    where="EngineScorer.score_batch",
                    fix=f"cap max_new_tokens at {engine.max_len} - the prompt's length",
                )
        order = sorted(range(len(items)), key=lambda i: -(len(items[i][0]) + len(items[i][1])))
        results: list[TokenScores | None] = [None] * len(items)
        start = 0
        with torch.no_grad():
            while start < len(order):
                longest = len(items[order[start]][0]) + len(items[order[start]][1])
                count = max(1, min(len(order) - start, BATCH_TOKENS // longest))
                chunk = order[start : start + count]
                tokens = torch.zeros(len(chunk), longest, dtype=torch.long)
                for row, index in enumerate(chunk):
                    seq = list(items[index][0]) + list(items[index][1])
                    tokens[row, : len(seq)] = torch.as_tensor(seq)
                hidden, _ = engine.target.forward_train(tokens.to(engine.device), engine.options.chunk_size)
                for row, index in enumerate(chunk):
                    prompt, output = items[index]
                    predicting = hidden[row, len(prompt) - 1 : len(prompt) + len(output) - 1]
                    logits = lm_head(predicting, engine.target.lm_head_weight, "dense", fp32=self.fp32_head)
                    results[index] = TokenScores.from_logits(logits, output)
                start += count
        return results  # type: ignore[return-value]


def load_scorer(
    model: str = "default", seed: str = "0", device: str = "cpu", fp32_head: str = "true", dtype: str = "float32"
) -> EngineScorer:
    """CLI factory (``--scorer specpilot_mem.forcing.engine_adapter:load_scorer``): ``model`` is
    ``default`` (the committed trained pair, else seeded random weights), ``random`` (seeded random
    weights) or a folder holding target.safetensors and drafter.safetensors (and tokenizer.json, for
    text prompts). Text prompts are encoded with the trained model's tokenizer, UTF-8 bytes only for
    random weights."""
    import torch

    from specpilot_mem.engine.engine import Engine

    torch_dtype = getattr(torch, dtype)
    folder = None
    if model == "default":
        engine = Engine.load_default(device=device, dtype=torch_dtype)
    elif model == "random":
        engine = Engine.random(int(seed), device=device, dtype=torch_dtype)
    else:
        folder = Path(model)
        engine = Engine.load(folder, device=device, dtype=torch_dtype)
    return EngineScorer(
        engine, fp32_head=fp32_head.lower() in ("1", "true", "yes"), encode=prompt_encoder(engine, folder)
    )
