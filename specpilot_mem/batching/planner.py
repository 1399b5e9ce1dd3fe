"""The batch-size-aware node budget: how many verify rows a step of B requests takes, AR included.

A shared node budget pays while the rows it adds cost less than the tokens they bring. With few requests
the target's GEMMs are weight-bound and extra rows are nearly free; with many, every row costs compute,
and in an engine each request's extra rows also cost KV writes, recurrent-state traffic and attention.
So the budget is chosen from the measured step times of the engine that runs it, per batch size, against
the tokens the batch's trees are expected to bring:

    rows*(B) = argmax over the measured row buckets of  B * tau(k) / (T_draft(B) + T_verify(B, B (1 + k)))
               compared with AR:                       B / T_AR(B)

where k is the nodes per request the bucket holds and tau(k) the expected tokens per request of a shared
budget of B k nodes. AR is one of the choices, so the plan is never estimated to be slower than AR; the
benchmarks measure whether it is.

tau(k) comes from the trees themselves: each speculative step's best-first trees give, for every bucket,
1 + the mean path probability mass of the global top-(B k) nodes (``budget.expected_tokens`` over
``shared_shares``: a calibrated drafter's expected accepted length). One calibration factor (an average
of accepted over predicted tokens at the buckets actually verified) corrects a drafter whose scores are
over- or under-confident. While AR wins, a speculative step at the smallest bucket now and then keeps
the estimate current: after ``probe`` AR steps at first, the interval doubling after every probe that AR
still wins by far (estimated below 0.8x AR; up to ``max_probe``), so where speculation cannot pay its
probes cost next to nothing; near the break-even the probe takes the best bucket at the first interval.
"""

from __future__ import annotations

import numpy as np
import torch

from specpilot_mem.batching.budget import expected_tokens, shared_shares
from specpilot_mem.batching.costs import BatchingError


class BudgetPlanner:
    """Verify rows per step for B requests from measured step costs and the trees' expected tokens.

    costs: a ``StepCosts`` (``verify_ms(rows, B)``, ``draft_ms(rows, B)``, ``ar_ms(B)``; the engine's own
    step times, ``EngineStepCosts``, are what makes the plan right for that engine); per_request: the row
    buckets per request to choose from (root included, each >= 2: the engine's CUDA-graph buckets);
    blocks: the drafter blocks there are (each bucket drafts the smallest block that reaches its nodes per
    request, else the largest); margin: how much faster than AR a speculative plan must be estimated before
    it is taken; probe, max_probe: the first and the longest interval (AR steps) between probes while AR wins;
    decay: of the running estimates.
    """

    FLAG = "--plan-rows"

    def __init__(
        self,
        costs,
        per_request: tuple[int, ...] = (2, 3, 5, 9, 17),
        blocks: tuple[int, ...] = (16,),
        margin: float = 0.02,
        probe: int = 8,
        max_probe: int = 256,
        decay: float = 0.8,
    ):
        if not per_request or min(per_request) < 2:
            raise BatchingError(
                f"{self.FLAG}={','.join(map(str, per_request))}: each bucket needs the root and at least one node",
                where=self.FLAG,
                fix="use row counts per request >= 2, e.g. 2,3,5,9,17",
            )
        self.costs, self.buckets = costs, tuple(sorted(set(int(r) for r in per_request)))
        self.blocks = tuple(sorted(set(int(b) for b in blocks)))
        self.margin, self.probe, self.max_probe, self.decay = margin, probe, max_probe, decay
        self._interval = probe
        self.tau: np.ndarray | None = None  # expected tokens per request at each bucket (uncalibrated)
        self.calibration = (
            1.0  # running accepted / predicted nodes (ratio of the two averages: one bad step moves it little)
        )
        self._accepted = self._predicted = 0.0
        self._since = 0

    def draft_block(self, rows: int) -> int:
        """The drafter block a bucket of ``rows`` rows per request drafts."""
        return next((b for b in self.blocks if b >= rows - 1), self.blocks[-1])

    def estimate(self, scores: torch.Tensor) -> np.ndarray:
        """Expected tokens per request at each bucket from one step's best-first trees (scores [B, N] path
        log-probabilities in best-first order, -inf past a tree); one host read per step."""
        B = scores.shape[0]
        per_bucket = []
        for rows in self.buckets:
            counts = shared_shares(scores, B * (rows - 1))
            per_bucket.append(expected_tokens(scores, counts).mean())
        return torch.stack(per_bucket).cpu().numpy().astype(np.float64)

    def observe(self, scores: torch.Tensor, rows: int, accepted_mean: float) -> None:
        """After a speculative step at ``rows`` per request whose requests accepted ``accepted_mean`` nodes
        on average (the bonus excluded): update the expected-token curve and the calibration."""
        curve = self.estimate(scores)
        self.tau = curve if self.tau is None else self.decay * self.tau + (1 - self.decay) * curve
        if rows in self.buckets:
            predicted = float(curve[self.buckets.index(rows)]) - 1.0
            self._accepted = self.decay * self._accepted + (1 - self.decay) * accepted_mean
            self._predicted = self.decay * self._predicted + (1 - self.decay) * predicted
            if self._predicted > 1e-6:
                self.calibration = min(max(self._accepted / self._predicted, 0.1), 2.0)

    def expected(self) -> np.ndarray | None:
        """Calibrated expected tokens per request at each bucket (None before any observation)."""
        if self.tau is None:
            return None
        return 1.0 + self.calibration * (self.tau - 1.0)

    def table(self, requests: int, tau: np.ndarray | None = None) -> list[dict]:
        """Per bucket: rows per request, estimated tokens per ms, and AR's (rows 1) first."""
        tau = self.expected() if tau is None else np.asarray(tau, dtype=np.float64)
        ar = self.costs.ar_ms(requests)
        out = [{"rows": 1, "tokens_per_ms": requests / ar, "step_ms": ar}]
        if tau is None:
            return out
        for rows, t in zip(self.buckets, tau):
            drafted = requests * (self.draft_block(rows) + 1)
            step = self.costs.draft_ms(drafted, requests) + self.costs.verify_ms(requests * rows, requests)
            out.append({"rows": rows, "tokens_per_ms": requests * float(t) / step, "step_ms": step})
        return out

    def rows_for(self, requests: int, tau: np.ndarray | None = None) -> int:
        """Verify rows per request for the next step (1: an AR step). ``tau``: expected tokens per request at
        each bucket (default: the running calibrated estimate). Before any estimate: the smallest bucket."""
        if requests < 1:
            raise BatchingError(f"{requests} requests in flight", where="BudgetPlanner", fix="plan for >= 1")
        if tau is None and self.tau is None:
            return self.buckets[0]
        table = self.table(requests, tau)
        best = max(table[1:], key=lambda r: r["tokens_per_ms"])
        if best["tokens_per_ms"] >= table[0]["tokens_per_ms"] * (1 + self.margin):
            self._since, self._interval = 0, self.probe
            return int(best["rows"])
        if tau is not None:
            return 1
        self._since += 1
        if self._since >= self._interval:
            # back off only where speculation is far from paying; near the break-even, keep probing often
            far = best["tokens_per_ms"] < 0.8 * table[0]["tokens_per_ms"]
            self._since, self._interval = 0, min(2 * self._interval, self.max_probe) if far else self.probe
            return int(best["rows"]) if not far else self.buckets[0]
        return 1
