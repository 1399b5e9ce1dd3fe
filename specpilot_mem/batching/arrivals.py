"""A batched server under an arrival process, replayed exactly on recorded lattices and timed by the composed
engine's measured steps: stock scheduling (a new prompt prefilled in passes of its own, which every request in
flight waits for) against prompt admission (its rows in the verify steps' forward, while they keep the step on
its plateau).

The server has B request slots and verifies every slot's rows each step (the engine's padded [B, T] layout:
T = 17, the root and stock's 16-position chain). A decoding request gains what stock's chain of its block
accepts at its own position in the lattice file (replay of ``replay.replay``: exact for the chain), plus the
bonus. Requests arrive by ``Arrivals``: a closed loop (every finished request's slot takes the next at once:
a prompt waits at every completion; the figures stop when the stream runs out, so B requests are in flight
throughout) or Poisson arrivals at a rate (prompts wait when they come while the batch decodes; every request
is served). Each has ``prompt_rows`` prompt rows; tokens count the decode steps' (the first output token, the
prefill's, is timed in ``ttft_ms``).

Time per step comes from ``AdmissionCosts`` (``benchmarks/admission_costs.py``, measured on the H200): the
drafter's pass plus the verify step of B slots, with S admitted prompt rows in its forward where admission
puts them (the measured mixed step), and stock's prefill passes of 64 rows. Admission reads the same
measured step, c_B(S): ``PromptAdmission`` admits only the rows on the plateau that c_B starts on (compute
idles), and only the waiting prompts for which that beats prefill passes of their own
(``PromptAdmission.admitted_prompts``); the others are prefilled as stock does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from specpilot_mem.batching.admission import PromptAdmission
from specpilot_mem.batching.costs import BatchingError, CostCurve
from specpilot_mem.replay.lattice import Lattice
from specpilot_mem.replay.trees import chain
from specpilot_mem.replay.trees.base import StepBatch
from specpilot_mem.replay.verify import verify_against_greedy

CHAIN_ROWS = 17  # the root and stock DFlash's 16-position chain: every slot's verify rows
PREFILL_ROWS = 64  # rows of one of the engine's prefill passes (``engine.decode.PREFILL_CHUNK``)


class AdmissionCosts:
    """The engine's measured step times of one shape (``admission_costs.py``'s per-shape record): the decode step
    of B slots, the same step with S prompt rows in its forward, the drafter's pass, and the prefill pass of 16 and
    64 rows. Linear in B between measured batch sizes; the mixed step only at measured S (admission takes no
    more rows than the largest measured segment)."""

    def __init__(self, shape: dict, source: str = "", draft_ms: dict | None = None):
        """``draft_ms``: the drafter's pass per batch size from another measurement, where the record has none."""
        self.source = source
        if draft_ms is not None:
            given = {int(b): float(ms) for b, ms in draft_ms.items()}
            known = np.array(sorted(given), dtype=np.float64)
            shape = {
                **shape,
                "T_draft_ms": {
                    b: float(np.interp(int(b), known, [given[int(k)] for k in known])) for b in shape["T_step_ms"]
                },
            }
        try:
            self.batches = np.array(sorted(int(b) for b in shape["T_step_ms"]), dtype=np.float64)
            self.step = np.array([shape["T_step_ms"][str(int(b))] for b in self.batches])
            self.draft = np.array([shape["T_draft_ms"][str(int(b))] for b in self.batches])
            segments = sorted({int(s) for per in shape["T_mixed_ms"].values() for s in per})
            self.segments = np.array(segments, dtype=np.int64)
            self.mixed = np.array([[shape["T_mixed_ms"][str(int(b))][str(s)] for s in segments] for b in self.batches])
            self.prefill = {int(s): float(ms) for s, ms in shape["T_prefill_ms"].items()}
            self.prefill[PREFILL_ROWS]
        except (KeyError, TypeError, ValueError) as err:
            raise BatchingError(
                f"the admission cost record lacks {err}",
                where=source or "admission costs",
                fix="use benchmarks/admission_costs.py's result (every batch size with its step, draft and mixed steps)",
            ) from None

    def _at(self, table: np.ndarray, batch: int) -> np.ndarray | float:
        if batch > self.batches[-1]:
            return table[-1] * batch / self.batches[-1]
        if table.ndim == 1:
            return float(np.interp(batch, self.batches, table))
        return np.array([np.interp(batch, self.batches, col) for col in table.T])

    def step_ms(self, batch: int, prompt_rows: int = 0) -> float:
        """The drafter's pass and the verify step of ``batch`` slots with ``prompt_rows`` admitted rows (at the
        measured segment that holds them)."""
        verify = self._at(self.step, batch)
        if prompt_rows > 0:
            i = int(np.searchsorted(self.segments, prompt_rows))
            if i >= self.segments.size:
                raise BatchingError(
                    f"{prompt_rows} prompt rows past the largest measured segment ({self.segments[-1]})",
                    where=self.source,
                    fix="measure larger segments, or admit at most that many rows",
                )
            verify = float(self._at(self.mixed, batch)[i])
        return float(self._at(self.draft, batch)) + verify

    def curve(self, batch: int) -> CostCurve:
        """c_B(R): the verify step over the B slots' rows and R - B x 17 prompt rows (the plateau admission reads)."""
        base = batch * CHAIN_ROWS
        mixed = self._at(self.mixed, batch)
        return CostCurve(
            (base, *(base + int(s) for s in self.segments)),
            (float(self._at(self.step, batch)), *(float(m) for m in mixed)),
            f"{self.source}: the verify step of {batch} slots with prompt rows",
        )

    def prefill_ms(self, prompt_rows: int) -> float:
        """Stock: the prompt in 64-row passes of its own (a shorter last pass at the measured 16 rows when it fits)."""
        full, rest = divmod(prompt_rows, PREFILL_ROWS)
        last = 0.0
        if rest:
            small = [s for s in self.prefill if s >= rest]
            last = self.prefill[min(small)]
        return full * self.prefill[PREFILL_ROWS] + last


@dataclass(frozen=True)
class Arrivals:
    """``closed``: every finished request's slot takes the next one at once; ``poisson``: requests arrive at
    ``rate`` per second (``seed`` fixes the draws) and wait in a queue for a free slot."""

    kind: str = "closed"
    rate: float = 0.0
    seed: int = 0

    def times(self, count: int) -> np.ndarray:
        """Arrival times in ms of ``count`` requests (closed loop: all at 0, served as slots free up)."""
        if self.kind == "closed":
            return np.zeros(count)
        if self.kind != "poisson" or self.rate <= 0:
            raise BatchingError(
                f"arrivals {self.kind!r} at rate {self.rate}",
                where="--arrivals",
                fix="use closed, or poisson with a rate > 0 requests per second",
            )
        gaps = np.random.default_rng(self.seed).exponential(1e3 / self.rate, count)
        return np.cumsum(gaps)


@dataclass
class ServeOutcome:
    scheduling: str
    slots: int
    requests: int = 0  # requests served to their last token
    tokens: int = 0
    time_ms: float = 0.0
    steps: int = 0
    prefill_passes: int = 0
    admitted_rows: int = 0
    admitted_steps: int = 0
    ttft_ms: float = 0.0  # mean time from arrival to the first output token
    latency_ms: float = 0.0  # mean time from arrival to the last output token

    @property
    def tokens_per_s(self) -> float:
        return 1e3 * self.tokens / self.time_ms if self.time_ms else math.nan

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s}


def chain_gains(lattice: Lattice) -> list[np.ndarray]:
    """Per request and output position: the tokens stock's chain of the lattice's block commits there (its
    accepted drafted tokens plus the bonus), from the recorded lattices (the replay's verification)."""
    lookup = lattice.step_lookup()
    gains = []
    for r in range(lattice.num_requests):
        start, end = lattice.greedy_offsets[r], lattice.greedy_offsets[r + 1]
        steps = lookup[start:end]
        if np.any(steps < 0):
            raise BatchingError(
                f"request {r} has positions without a recorded lattice",
                where=lattice.source,
                fix="record a lattice at every greedy position (benchmarks/batched_lattices.py)",
            )
        batch = StepBatch.from_lattice(lattice, steps)
        verdict = verify_against_greedy(chain.build(batch, lattice.positions), batch.greedy)
        gains.append(np.minimum(verdict.accepted + 1, np.arange(end - start, 0, -1)))
    return gains


def serve(
    gains: list[np.ndarray],
    costs: AdmissionCosts,
    slots: int,
    arrivals: Arrivals,
    requests: int,
    prompt_rows: int = 512,
    admission: PromptAdmission | None = None,
) -> ServeOutcome:
    """Serve ``requests`` requests (the lattice's, cycled) on ``slots`` slots under ``arrivals``; with ``admission``
    their prompts enter in the verify steps where it admits them, else in prefill passes of their own."""
    out = ServeOutcome("admission" if admission else "stock", slots, requests)
    arrive = arrivals.times(requests)
    queue = 0  # next request not yet given a slot
    request = np.full(slots, -1)  # per slot: the request it serves (-1: free)
    position = np.zeros(slots, dtype=np.int64)
    entering = np.zeros(slots, dtype=np.int64)  # prompt rows still to enter (admission)
    first, last = np.full(requests, np.nan), np.full(requests, np.nan)
    now = 0.0
    step_ms = costs.step_ms(slots)
    spare = admission.spare_rows(slots * CHAIN_ROWS) if admission is not None else 0
    tau = 1.0
    while True:
        free = np.flatnonzero(request < 0)
        if arrivals.kind == "closed" and queue >= requests and free.size:
            break  # the stream ran out: the figures cover a full batch throughout
        taken = 0
        while free.size > taken and queue < requests and arrive[queue] <= now:
            slot = free[taken]
            request[slot], position[slot], entering[slot] = queue, 0, prompt_rows
            taken += 1
            queue += 1
        busy = np.flatnonzero(request >= 0)
        if busy.size == 0:
            if queue >= requests:
                break
            now = max(now, arrive[queue])  # idle until the next arrival
            continue
        waiting = np.flatnonzero(entering > 0)
        waiting = waiting[np.argsort(request[waiting], kind="stable")]  # arrival order
        decoding = np.flatnonzero((request >= 0) & (entering == 0))
        rows = np.zeros(slots, dtype=np.int64)
        if waiting.size:
            take = 0
            if admission is not None and decoding.size:
                take = admission.admitted_prompts(
                    slots * CHAIN_ROWS,
                    torch.from_numpy(entering[waiting]),
                    int(decoding.size),
                    step_ms,
                    torch.tensor([costs.prefill_ms(int(entering[s])) for s in waiting]),
                    tau,
                    committed=int((entering[waiting] < prompt_rows).sum()),
                    dearer_ms=costs.step_ms(slots, min(int(entering[waiting].sum()), spare)) - step_ms,
                )
                rows[waiting[:take]] = admission.plan(slots * CHAIN_ROWS, torch.from_numpy(entering[waiting[:take]]))[0]
            for slot in waiting[take:]:  # stock: the prompt's prefill passes, every request in flight waiting
                now += costs.prefill_ms(int(entering[slot]))
                out.prefill_passes += -(-int(entering[slot]) // PREFILL_ROWS)
                entering[slot] = 0
                first[request[slot]] = now  # the prefill's last row gives the first output token
            decoding = np.flatnonzero((request >= 0) & (entering == 0))
        admitted = int(rows.sum())
        if decoding.size == 0 and admitted == 0:
            continue
        now += costs.step_ms(slots, admitted)
        out.steps += 1
        out.admitted_rows += admitted
        out.admitted_steps += int(admitted > 0)
        gained = np.array([gains[request[s] % len(gains)][position[s]] for s in decoding], dtype=np.int64)
        position[decoding] += gained
        out.tokens += int(gained.sum())
        if gained.size:
            tau = 0.9 * tau + 0.1 * float(gained.mean())
        entering -= rows
        for slot in np.flatnonzero((rows > 0) & (entering == 0)):
            first[request[slot]] = now  # the segment that ends the prompt gives the first output token
        for slot in decoding:
            r = request[slot]
            if position[slot] >= gains[r % len(gains)].size:
                last[r] = now
                request[slot] = -1
    out.time_ms = now
    done = ~np.isnan(last)
    out.requests = int(done.sum())
    out.ttft_ms = float(np.mean(first[done] - arrive[done])) if done.any() else math.nan
    out.latency_ms = float(np.mean(last[done] - arrive[done])) if done.any() else math.nan
    return out
