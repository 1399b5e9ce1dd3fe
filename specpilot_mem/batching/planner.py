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

tau(k) comes from what the verify steps accepted: per depth d, the share of requests whose accepted path
reached depth d - 1 with a node at depth d verified that accepted it (a decaying average over steps, with a
one-request prior at depth d - 1's rate), and tau(k) = 1 + sum over d <= k of the product of those rates, a
chain's expected tokens (a lower bound for a tree of k nodes). Depths no step verified lately take about the
shallower depths' rate, so the estimate is optimistic where it has not looked and corrects itself once it has. (The drafter's own path probabilities
were tried first: the trained pair's drafter is underconfident below the first position, so they planned
far too few rows.) The chain of k nodes is not the tree a bucket verifies: a shared budget spends nodes on
siblings, so its trees are shallower than k and the chain estimate flatters the large buckets (at 64 requests
a 9- or 17-row bucket realises about 0.75 of the chain's added tokens). So each verified bucket keeps the
ratio of the tokens it added past the root to what the chain estimate said then (a decaying average), and its
estimate is the chain's scaled by that ratio (decaying sums over the requests the bucket verified, starting
from a ratio of 1 worth a few requests, so one request's unlucky step does not write a bucket off); a bucket not
verified takes the ratio of the nearest verified bucket below it (the bias grows with the bucket), or none. The ratio carries the trees' shape, the per-depth
rates carry how well the drafter does lately, so a verified bucket needs no second look to stay right (an
earlier form faded each bucket's realised tokens back into the chain estimate, and its re-looks at the large
buckets cost 8% at 64 requests).

Looking costs: a speculative step the planner takes to look where AR wins is a loss. So the estimate can start
from a prior (``prior``: per-depth acceptance the pair showed elsewhere, e.g. on its dev split, as a few
requests' worth of observations), and then no first look is needed; without one, the first step verifies the
smallest bucket (the cheapest look). While AR wins, the next look comes after as many AR steps as keep its
estimated loss (the best bucket's shortfall from AR, in AR steps) at most ``probe_cost`` of those steps'
throughput, within ``probe`` .. min(``max_probe``, ``probe`` x B) steps: near the break-even the planner looks
often, where speculation is far from paying it looks rarely. Per batch size the step costs of every bucket are computed
once. The planner reads only what the engine brings to the host every step anyway (the accepted lengths and
each share's depth, which the scheduler needs to commit and schedule), so it adds no device synchronisation.
"""

from __future__ import annotations

import numpy as np
from specpilot_mem.batching.costs import BatchingError


class BudgetPlanner:
    """Verify rows per step for B requests from measured step costs and the trees' expected tokens.

    costs: a ``StepCosts`` (``verify_ms(rows, B)``, ``draft_ms(rows, B)``, ``ar_ms(B)``; the engine's own
    step times, ``EngineStepCosts``, are what makes the plan right for that engine); per_request: the row
    buckets per request to choose from (root included, each >= 2: the engine's CUDA-graph buckets);
    blocks: the drafter blocks there are (each bucket drafts the smallest block that reaches its nodes per
    request, else the largest); margin: how much faster than AR a speculative plan must be estimated before
    it is taken; probe, max_probe: the shortest and the longest interval (AR steps) between looks while AR
    wins; probe_cost: the share of the AR steps' throughput a look may cost by estimate; decay: of the running
    estimates; prior, prior_weight: per-depth acceptance to start from (``acceptance_prior``) and how many
    requests' worth of observations it counts as.
    """

    FLAG = "--plan-rows"
    PRIOR = 1.0  # requests' worth of prior weight per depth in the acceptance estimate
    RATIO_PRIOR = 16.0  # requests' worth of a ratio of 1 in a bucket's realised ratio
    # per step, of the realised ratio's sums: slower than the per-depth rates, which carry how the drafter does
    # lately (the ratio carries the trees' shape; both moving at one pace counted a bad stretch twice)
    RATIO_DECAY = 0.99
    # requests' worth of memory of a bucket's realised tokens (and of the estimate it starts from): a batch's acceptance
    # moves in stretches, so at 32 requests a few steps are what the next one resembles, at one request a few dozen
    RECENT_REQUESTS = 128.0

    def __init__(
        self,
        costs,
        per_request: tuple[int, ...] = (2, 3, 5, 9, 17),
        blocks: tuple[int, ...] = (16,),
        margin: float = 0.02,
        probe: int = 8,
        max_probe: int = 256,
        decay: float = 0.95,
        prior: np.ndarray | None = None,
        prior_weight: float = 16.0,
        probe_cost: float = 0.002,
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
        self.probe_cost = probe_cost
        self._interval = probe
        depth = self.buckets[-1] - 1
        # per depth d: requests whose accepted path reached depth d - 1 with a node at depth d verified (den) and
        # those that accepted it (num), decaying averages over steps
        self._num = np.zeros(depth + 1)
        self._den = np.zeros(depth + 1)
        if prior is not None:
            prior = np.asarray(prior, dtype=np.float64)[:depth]
            if prior.size == 0 or not np.all((prior >= 0) & (prior <= 1)):
                raise BatchingError(
                    "the planner's prior must give an acceptance rate in [0, 1] per depth from depth 1",
                    where="prior",
                    fix="pass acceptance_prior(...) of a lattice, or no prior",
                )
            # the prior as prior_weight requests' worth of observations: requests reaching each depth, in proportion
            reach = prior_weight * np.concatenate([[1.0], np.cumprod(prior)[:-1]])
            self._den[1 : prior.size + 1] = reach
            self._num[1 : prior.size + 1] = reach * prior
        # per bucket: realised and estimated tokens past the root, decaying sums over requests (their ratio scales the
        # chain estimate; a verified bucket starts from a ratio of 1 worth RATIO_PRIOR requests, so one request's
        # unlucky step does not write a bucket off)
        self._realised = np.zeros(len(self.buckets))
        self._estimated = np.zeros(len(self.buckets))
        # per bucket: the tokens per request its steps realised lately, as decaying sums over requests (tokens,
        # requests; 0 requests: never verified), and the steps observed since it was last verified (its weight against
        # the scaled estimate fades with them)
        self._recent_tokens = np.zeros(len(self.buckets))
        self._recent_requests = np.zeros(len(self.buckets))
        self._age = np.zeros(len(self.buckets))
        self._since = 0
        self._idle = 0  # AR steps since the last observed speculative step
        # whether the last speculative plan was a look (AR estimated faster): AR steps are expected to follow it
        self.looking = False
        self._steps: dict[int, tuple[float, np.ndarray]] = {}  # requests -> (AR step ms, each bucket's step ms)

    def draft_block(self, rows: int) -> int:
        """The drafter block a bucket of ``rows`` rows per request drafts."""
        return next((b for b in self.blocks if b >= rows - 1), self.blocks[-1])

    def observe(self, accepted: np.ndarray, depth: np.ndarray, rows: int | None = None) -> None:
        """After a speculative step: each request's accepted nodes (the bonus excluded) and the deepest node its
        share verified; ``rows``: the bucket it verified. Updates the per-depth acceptance the expected tokens
        come from, and the bucket's realised tokens per request."""
        accepted, depth = np.asarray(accepted, dtype=np.int64), np.asarray(depth, dtype=np.int64)
        chain, before = self.chain_expected(), self.expected()
        # the estimates age with steps, AR steps included: after a long AR stretch a look counts for more
        steps, self._idle = 1 + self._idle, 0
        decay = self.decay**steps
        self._age += steps
        if rows in self.buckets:
            # a first look starts from the estimate it tests, worth RECENT_REQUESTS requests: one step of a batch is
            # one stretch of its text, and taking it outright (an earlier form) kept the AR gates speculating for a
            # dozen losing steps after one lucky look; then about RECENT_REQUESTS requests of memory, so a batch's
            # estimate follows its stretches within a few steps
            i, n = self.buckets.index(rows), accepted.size
            if self._recent_requests[i] == 0 and before is not None:
                self._recent_tokens[i], self._recent_requests[i] = (
                    before[i] * self.RECENT_REQUESTS,
                    self.RECENT_REQUESTS,
                )
            fade = decay * np.exp(-n / self.RECENT_REQUESTS)
            self._recent_tokens[i] = fade * self._recent_tokens[i] + float(n + accepted.sum())
            self._recent_requests[i] = fade * self._recent_requests[i] + n
            self._age[i] = 0
            if chain is not None:
                added = max(chain[i] - 1.0, 1e-9)
                if self._estimated[i] == 0:
                    self._realised[i] = self._estimated[i] = self.RATIO_PRIOR * added
                self._realised[i] = self.RATIO_DECAY * self._realised[i] + float(accepted.sum())
                self._estimated[i] = self.RATIO_DECAY * self._estimated[i] + n * added
        d = np.arange(1, self._num.size)[:, None]
        reached = (accepted[None, :] >= d - 1) & (depth[None, :] >= d)
        self._den[1:] = decay * self._den[1:] + reached.sum(1)
        self._num[1:] = decay * self._num[1:] + (reached & (accepted[None, :] >= d)).sum(1)

    def acceptance(self) -> np.ndarray | None:
        """[depth] conditional acceptance of a node at each depth given its parent's (index 0: depth 1): the
        observed rate with a prior of weight ``PRIOR`` at the previous depth's rate (0.5 at depth 1), so a depth
        seen once or never takes mostly the shallower one's rate. None before any observation."""
        if self._den[1] <= 0:
            return None
        rate, prior = np.empty(self._num.size - 1), 0.5
        for d in range(1, self._num.size):
            prior = rate[d - 1] = (self._num[d] + self.PRIOR * prior) / (self._den[d] + self.PRIOR)
        return rate

    def chain_expected(self) -> np.ndarray | None:
        """Per bucket: 1 + the sum over depths of the product of the acceptances (a chain of the bucket's nodes);
        None before any observation."""
        rate = self.acceptance()
        if rate is None:
            return None
        reach = np.cumprod(rate)
        return np.array([1.0 + reach[: rows - 1].sum() for rows in self.buckets])

    def expected(self) -> np.ndarray | None:
        """Expected tokens per request at each bucket: what its steps realised lately, fading (as other buckets are
        verified) into the chain estimate's tokens past the root scaled by the bucket's realised ratio (that of the
        nearest verified bucket below where it was not verified; none below either: unscaled); None before any
        observation."""
        chain = self.chain_expected()
        if chain is None:
            return None
        ratio, last = np.ones(len(self.buckets)), 1.0
        for i in range(len(self.buckets)):
            if self._estimated[i] > 0:
                last = self._realised[i] / self._estimated[i]
            ratio[i] = last
        scaled = 1.0 + (chain - 1.0) * ratio
        seen = self._recent_requests > 0
        recent = np.where(seen, self._recent_tokens / np.where(seen, self._recent_requests, 1.0), 0.0)
        weight = np.where(seen, self.decay**self._age, 0.0)
        return weight * recent + (1 - weight) * scaled

    def ratio(self, rows: int) -> float | None:
        """The realised ratio of the bucket of ``rows`` rows per request (None: never verified)."""
        i = self.buckets.index(rows)
        return None if self._estimated[i] == 0 else float(self._realised[i] / self._estimated[i])

    def step_ms(self, requests: int) -> tuple[float, np.ndarray]:
        """AR's step and each bucket's (draft + verify) step at ``requests`` requests, computed once per batch size."""
        if requests not in self._steps:
            steps = [
                self.costs.draft_ms(requests * (self.draft_block(rows) + 1), requests)
                + self.costs.verify_ms(requests * rows, requests)
                for rows in self.buckets
            ]
            self._steps[requests] = (self.costs.ar_ms(requests), np.array(steps))
        return self._steps[requests]

    def table(self, requests: int, tau: np.ndarray | None = None) -> list[dict]:
        """Per bucket: rows per request, estimated tokens per ms, and AR's (rows 1) first."""
        tau = self.expected() if tau is None else np.asarray(tau, dtype=np.float64)
        ar, steps = self.step_ms(requests)
        out = [{"rows": 1, "tokens_per_ms": requests / ar, "step_ms": ar}]
        if tau is None:
            return out
        for rows, t, step in zip(self.buckets, tau, steps):
            out.append({"rows": rows, "tokens_per_ms": requests * float(t) / step, "step_ms": float(step)})
        return out

    def rows_for(self, requests: int, tau: np.ndarray | None = None) -> int:
        """Verify rows per request for the next step (1: an AR step). ``tau``: expected tokens per request at
        each bucket (default: the running calibrated estimate). Before any estimate: the smallest bucket."""
        if requests < 1:
            raise BatchingError(f"{requests} requests in flight", where="BudgetPlanner", fix="plan for >= 1")
        self.looking = False
        if tau is None and self.acceptance() is None:
            self.looking = True  # the first look
            return self.buckets[0]
        table = self.table(requests, tau)
        best = max(table[1:], key=lambda r: r["tokens_per_ms"])
        if best["tokens_per_ms"] >= table[0]["tokens_per_ms"] * (1 + self.margin):
            self._since = 0
            return int(best["rows"])
        if tau is not None:
            return 1
        self._idle += 1
        self._since += 1
        if self._since >= self._interval:
            # the look's estimated loss (in AR steps: its shortfall in tokens per ms over the look's own time, which
            # at large batches is several AR steps) spread over the AR steps until the next one stays <= probe_cost
            shortfall = max(0.0, 1.0 - best["tokens_per_ms"] / table[0]["tokens_per_ms"])
            loss = shortfall * best["step_ms"] / table[0]["step_ms"]
            self._since = 0
            # a batch's estimate averages its requests' text, so it goes stale more slowly the more requests it has:
            # at most probe x B steps between looks (one request's text changes within a few dozen tokens)
            longest = min(self.max_probe, self.probe * requests)
            self._interval = int(np.clip(np.ceil(loss / self.probe_cost), self.probe, longest))
            self._idle -= 1  # the look is a speculative step
            self.looking = True
            return int(best["rows"])
        return 1


def acceptance_prior(accepted: np.ndarray, depth: int) -> np.ndarray:
    """[depth] per-depth acceptance of a chain, for ``BudgetPlanner(prior=...)``: at depth d, the share of the
    steps that accepted d - 1 drafted tokens that accepted the d-th too.

    Args:
        accepted: [S] accepted chain lengths of S steps (e.g. a dev split's lattice, greedy chain of the block).
    """
    accepted = np.asarray(accepted, dtype=np.int64)
    d = np.arange(1, depth + 1)
    reached = (accepted[None, :] >= d[:, None] - 1).sum(1)
    took = (accepted[None, :] >= d[:, None]).sum(1)
    return np.where(reached > 0, took / np.maximum(reached, 1), 0.0)
