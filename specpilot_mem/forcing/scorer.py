"""The teacher-forced scorer interface and the per-token numbers token forcing works from.

A scorer runs the target on the stock engine with an FP32 LM head over prompt + output, teacher-forced,
and reports, for every output position, the log-probability of the token the
system emitted, the scorer's argmax there, that argmax's log-probability and the gap between the top
two log-probabilities. ``prefill_len`` moves where the first forward pass of prompt + output ends
(default: after the prompt); the rest follows in later passes, so the logits at a position come from
a different kernel shape and chunking. The audit uses this to find near-ties that move with
the prefill length. The pure-torch engine's scorer and the SGLang scorer client implement it; a
scorer that also has ``encode(text) -> token ids`` lets request sets use text prompts, and one with
``score_batch`` scores whole request sets in batched passes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import numpy as np

from specpilot_mem.controller.requests import Request
from specpilot_mem.controller.system import RequestOutput
from specpilot_mem.errors import SpecPilotError


class ForcingError(SpecPilotError):
    """Token forcing cannot run on the inputs it was given."""


# The sealed final's long-output pass: outputs of up to 4,096 tokens, as in the paper's finals.
LONG_OUTPUT_TOKENS = 4096


def long_output_requests(
    requests: Sequence[Request], context: int | None, encode: Callable[[str], Sequence[int]] | None
) -> list[Request]:
    """The requests with ``max_new_tokens`` of the long-output pass: ``LONG_OUTPUT_TOKENS``, or what the
    scorer's ``context`` leaves after each prompt when that is less."""
    from dataclasses import replace

    longer = []
    for request in requests:
        room = (
            LONG_OUTPUT_TOKENS if context is None else min(LONG_OUTPUT_TOKENS, context - len(request.token_ids(encode)))
        )
        if room < 1:
            raise ForcingError(
                f"request {request.id!r} leaves no room for an output in the scorer's context of {context}",
                where=f"request {request.id}",
                fix="shorten its prompt, or leave the long-output pass off",
            )
        longer.append(replace(request, max_new_tokens=room))
    return longer


@dataclass(frozen=True)
class TokenScores:
    """Per output position (all arrays have shape (n,), n = number of output tokens)."""

    token_logprob: np.ndarray  # float64: log p(emitted token)
    argmax: np.ndarray  # int64: the scorer's argmax token
    argmax_logprob: np.ndarray  # float64: log p(argmax token)
    top2_margin: np.ndarray  # float64: log p(argmax) - log p(runner-up)

    def __post_init__(self) -> None:
        lengths = {len(self.token_logprob), len(self.argmax), len(self.argmax_logprob), len(self.top2_margin)}
        if len(lengths) != 1:
            raise ForcingError(
                f"scorer returned arrays of different lengths {sorted(lengths)}",
                where="Scorer.score",
                fix="return one value per output token in every array",
            )

    @classmethod
    def from_logits(cls, logits: Any, output_ids: Sequence[int]) -> "TokenScores":
        """From a torch tensor of logits, shape (n, vocab), row i predicting output token i (FP32 math)."""
        import torch

        logprobs = torch.log_softmax(logits.detach().to(torch.float32), dim=-1)
        targets = torch.as_tensor(list(output_ids), dtype=torch.long, device=logprobs.device)
        top = torch.topk(logprobs, k=2, dim=-1)
        return cls(
            token_logprob=logprobs.gather(1, targets[:, None])[:, 0].double().cpu().numpy(),
            argmax=top.indices[:, 0].cpu().numpy().astype(np.int64),
            argmax_logprob=top.values[:, 0].double().cpu().numpy(),
            top2_margin=(top.values[:, 0] - top.values[:, 1]).double().cpu().numpy(),
        )


@runtime_checkable
class Scorer(Protocol):
    def score(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], prefill_len: int | None = None
    ) -> TokenScores:
        """Teacher-forced scores of ``output_ids`` after ``prompt_ids`` (see the module docstring)."""
        ...


@dataclass(frozen=True)
class ScoredOutput:
    """One request's output with the scorer's numbers."""

    id: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    scores: TokenScores
    max_new_tokens: int | None = None  # the request's limit (the length rule's reference)
    stop_reason: str | None = None  # why the system says the output ended (``RequestOutput.stop_reason``)

    @cached_property
    def mismatch(self) -> np.ndarray:
        """(n,) bool: the emitted token is not the scorer's argmax."""
        return np.asarray(self.output_ids, dtype=np.int64) != self.scores.argmax

    @cached_property
    def margin(self) -> np.ndarray:
        """(n,) float64: log-prob gap from the emitted token to the argmax (0 where they agree)."""
        return np.where(self.mismatch, np.maximum(self.scores.argmax_logprob - self.scores.token_logprob, 0.0), 0.0)

    @property
    def tokens(self) -> int:
        return len(self.output_ids)


def score_outputs(
    scorer: Scorer,
    requests: Sequence[Request],
    outputs: Mapping[str, RequestOutput],
    *,
    encode: Callable[[str], Sequence[int]] | None = None,
    on_request: Callable[[], None] | None = None,
) -> dict[str, ScoredOutput]:
    """Score every request's output; every request must have one, with at least one token.

    Text prompts are encoded with ``encode``, else with the scorer's own ``encode`` method if it has one.
    A scorer with ``score_batch(items) -> list[TokenScores]`` scores all outputs in batched passes.
    """
    encode = encode or getattr(scorer, "encode", None)
    missing = [r.id for r in requests if r.id not in outputs]
    if missing:
        raise ForcingError(
            f"{len(missing)} request(s) have no output, e.g. {missing[:5]}",
            where="outputs",
            fix="score the outputs of a run over this request set",
        )
    items = []
    for request in requests:
        output = outputs[request.id]
        if not output.output_ids:
            raise ForcingError(
                f"request {request.id!r} has an empty output",
                where=f"request {request.id}",
                fix="every request must produce at least one token",
            )
        items.append((request, request.token_ids(encode), list(output.output_ids)))
    batch = getattr(scorer, "score_batch", None)
    if batch is not None:  # one whole-sequence pass per output, many outputs per pass
        all_scores = batch([(prompt, output) for _, prompt, output in items])
    else:
        all_scores = [scorer.score(prompt, output) for _, prompt, output in items]
    scored: dict[str, ScoredOutput] = {}
    for (request, prompt, output), scores in zip(items, all_scores):
        if len(scores.argmax) != len(output):
            raise ForcingError(
                f"scorer returned {len(scores.argmax)} positions for {len(output)} tokens",
                where=f"request {request.id}",
                fix="the scorer must return one score per output token",
            )
        scored[request.id] = ScoredOutput(
            request.id,
            tuple(prompt),
            tuple(output),
            scores,
            request.max_new_tokens,
            getattr(outputs[request.id], "stop_reason", None),
        )
        if on_request is not None:
            on_request()
    return scored


def load_scorer(spec: str, options: Mapping[str, str] | None = None) -> Scorer:
    """A scorer from ``module:factory``, called as ``factory(**options)`` (how the CLI picks a backend)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ForcingError(
            f"scorer {spec!r} is not of the form module:factory",
            where="--scorer",
            fix="e.g. --scorer specpilot_mem.forcing.engine_adapter:load_scorer --scorer-arg model=default",
        )
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise ForcingError(
            f"cannot load scorer {spec!r}: {err}",
            where="--scorer",
            fix="check the module path and that its dependencies are installed",
        ) from None
    scorer = factory(**dict(options or {}))
    if not isinstance(scorer, Scorer):
        raise ForcingError(
            f"{spec} returned {type(scorer).__name__}, which has no score() method",
            where="--scorer",
            fix="the factory must return an object with score(prompt_ids, output_ids, prefill_len=None)",
        )
    return scorer
