"""A scorer with planted logits, shared by the token-forcing tests (this file holds no tests).

The real scorer is the pure-torch engine's (or SGLang's) teacher-forced pass; these tests need
cases where the answer is known, so the logits are planted: at every position of a request the
reference token has logit 0 and every other token -8 (so emitting another token is a large-margin
mismatch), except where a near-tie gives one token logit -gap, or where a position is planted as
prefill-sensitive (its argmax moves to a planted token, by default the reference + 1, whenever the pass
is split at a prefill length).
"""

from __future__ import annotations

import numpy as np
import torch

from specpilot_mem.controller.requests import Request
from specpilot_mem.controller.system import RequestOutput
from specpilot_mem.forcing.scorer import TokenScores

VOCAB = 32
BACKGROUND = -8.0


class PlantedScorer:
    def __init__(self, reference: dict[tuple[int, ...], list[int]]):
        self.reference = reference
        self.ties: dict[tuple[int, ...], dict[int, tuple[int, float]]] = {}
        # (prompt, position) -> the token that becomes the argmax when the pass is split (None: reference + 1)
        self.prefill_sensitive: dict[tuple[tuple[int, ...], int], int | None] = {}
        self.calls: list[int | None] = []

    def tie(self, prompt: tuple[int, ...], position: int, token: int, gap: float) -> None:
        self.ties.setdefault(prompt, {})[position] = (token, gap)

    def score(self, prompt_ids, output_ids, prefill_len=None) -> TokenScores:
        self.calls.append(prefill_len)
        prompt = tuple(prompt_ids)
        n = len(output_ids)
        reference = torch.tensor(self.reference[prompt][:n])
        logits = torch.full((n, VOCAB), BACKGROUND)
        logits[torch.arange(n), reference] = 0.0
        for position, (token, gap) in self.ties.get(prompt, {}).items():
            if position < n:
                logits[position, token] = -gap
        if prefill_len is not None:
            for position in range(n):
                if (prompt, position) in self.prefill_sensitive:
                    moved = self.prefill_sensitive[(prompt, position)]
                    logits[position, (int(reference[position]) + 1) % VOCAB if moved is None else moved] = 0.5
        return TokenScores.from_logits(logits, output_ids)


def make_case(requests: int = 40, length: int = 150, seed: int = 0):
    """Requests with token-id prompts, a reference (AR) output per request and a scorer over them."""
    rng = np.random.default_rng(seed)
    reqs, reference = [], {}
    for index in range(requests):
        prompt = tuple(int(t) for t in rng.integers(0, VOCAB, size=5)) + (index,)
        reqs.append(Request(f"r{index:03d}", "synthetic", "unseen", length, prompt_ids=prompt))
        reference[prompt] = [int(t) for t in rng.integers(0, VOCAB, size=length)]
    return reqs, reference, PlantedScorer(reference)


def outputs_from(reqs, sequences) -> dict[str, RequestOutput]:
    return {r.id: RequestOutput(r.id, tuple(seq)) for r, seq in zip(reqs, sequences)}


def other_token(token: int, shift: int = 3) -> int:
    return (token + shift) % VOCAB
