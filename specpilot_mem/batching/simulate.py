"""A batched server in closed loop, replayed exactly on recorded lattices, timed by measured step costs.

B request slots stay busy: a finished request's slot takes the next request of the stream (the lattice
file's requests, cycled). Every step, each decoding request builds its draft from the lattice recorded at
its own position (from the file of the drafter block it drafts), the step verifies them against the
target's greedy tokens, and each request moves on by its accepted nodes plus the bonus — the replay of
``replay.replay``, with the batching policies of this package deciding rows, shares, blocks and prompts
(their torch code, the same the engine runs). Time per step comes from ``StepCosts``:

* a speculative step: the drafter's pass over its rows (block + anchor per request), then the verify
  pass over roots + nodes + admitted prompt rows;
* an AR step: the verify pass over the roots (and admitted prompt rows);
* stock scheduling: a new request's prompt is prefilled in a pass of its own before the next step
  (every request in flight waits for it); with admission its rows ride in verify steps instead, and when a
  step has no spare rows (compute does not idle) waiting prompts are prefilled as stock does.

Slots start staggered along their first request (as in a server long in steady state); the figures
cover the steps until the stream runs out (B requests in flight throughout).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from specpilot_mem.batching.admission import PromptAdmission
from specpilot_mem.batching.blocks import DrafterBlocks, share_depth
from specpilot_mem.batching.budget import SharedBudget, equal_shares, shared_shares
from specpilot_mem.batching.costs import BatchingError, StepCosts
from specpilot_mem.batching.planner import BudgetPlanner, acceptance_prior
from specpilot_mem.replay.lattice import Lattice
from specpilot_mem.replay.trees import best_first, chain
from specpilot_mem.replay.trees.base import DraftTrees, StepBatch, pad_trees
from specpilot_mem.replay.verify import verify_against_greedy

STOCK_BLOCK = 16  # stock DFlash drafts its trained block (16 positions) every step


@dataclass(frozen=True)
class Mechanisms:
    """One server configuration. tree: "chain" (stock's greedy chain of the block) or "best-first";
    shared: best-first trees share the step's rows (else each request gets an equal share of them);
    blocks: a drafter block per request (else every request drafts ``STOCK_BLOCK``); admission: prompt
    rows in the verify step; plan: the verify rows per request (AR among them) chosen each step by the
    batch-size-aware planner (``planner.BudgetPlanner``) from the step costs and the trees' expected tokens;
    gate: the configuration's own step or AR, whichever the planner (with that step as its one bucket) expects
    faster, so a mechanism never runs speculation where it loses to AR.
    The configuration ``path-verify`` is stock's chain on SpecPilot's engine option set: what the option set
    alone gains, against which each batching mechanism's own gain reads."""

    name: str
    # which engine option set times it where the step costs have both (``batching.costs.EngineStepCosts``):
    # "stock" (SGLang's snapshot GDN verify) or "path" (SpecPilot's batched option set: per bucket the faster of
    # GDN path verify and the snapshot kernel)
    engine: str = "path"
    speculate: bool = True
    tree: str = "chain"
    shared: bool = False
    blocks: bool = False
    admission: bool = False
    plan: bool = False
    gate: bool = False


CONFIGS = {
    m.name: m
    for m in (
        Mechanisms("ar", engine="stock", speculate=False),
        Mechanisms("stock", engine="stock"),
        Mechanisms("path-verify"),
        # stock's chain behind the AR gate: what the gated drafter-block and prompt-admission each add to
        Mechanisms("gated-chain", gate=True),
        Mechanisms("equal-trees", tree="best-first"),
        Mechanisms("shared-plateau", tree="best-first", shared=True),
        Mechanisms("shared-budget", tree="best-first", shared=True, gate=True),
        Mechanisms("drafter-block", blocks=True, gate=True),
        Mechanisms("shared-budget+drafter-block", tree="best-first", shared=True, blocks=True, gate=True),
        Mechanisms("prompt-admission", admission=True, gate=True),
        Mechanisms("planned-budget", tree="best-first", shared=True, plan=True),
        Mechanisms("all", tree="best-first", shared=True, blocks=True, admission=True, plan=True),
    )
}


@dataclass
class Outcome:
    config: str
    requests_in_flight: int
    tokens: int = 0
    request_steps: int = 0  # decoding requests summed over steps (tau's denominator)
    steps: int = 0
    spec_steps: int = 0
    request_steps_spec: int = 0
    time_ms: float = 0.0
    prefill_ms: float = 0.0  # of time_ms: stock's separate prefill passes
    # those passes charged to the tokens the run decoded: each request's share of its pass(es) in proportion to the
    # tokens of it decoded here (see ``tokens_per_ms``)
    prefill_share_ms: float = 0.0
    draft_ms: float = 0.0  # of time_ms: the drafter's passes of the speculative steps (one ragged forward each)
    draft_ms_forwards: float = 0.0  # the same passes as one forward per drafted block (``drafter_ms``; not in time_ms)
    prefill_passes: int = 0
    admitted_rows: int = 0
    verify_rows: int = 0
    drafter_rows: int = 0
    blocks: dict = field(default_factory=dict)  # drafted block -> request-steps
    tail_value: float = 0.0  # expected tokens of the last nodes a shared budget took (what a prompt row displaces)

    @property
    def tau(self) -> float:
        return self.tokens / self.request_steps if self.request_steps else float("nan")

    @property
    def tokens_per_ms(self) -> float:
        """Throughput with each request's prefill passes charged in proportion to its tokens the run decoded. A finite
        stream's run starts with requests part-way (no pass paid) and ends with requests part-way (their passes paid
        whole): with the passes charged as they happen, an arm whose last requests happen to be less advanced when
        the stream runs out reads several percent slower at a higher decode rate (at 32 requests, 60-80% of the time
        prefill passes: a gated chain 0.97x AR while decoding 5% faster). AR in lockstep keeps its slots' stagger, so
        its figure hardly moves."""
        return self.tokens / self.charged_ms if self.charged_ms else float("nan")

    @property
    def charged_ms(self) -> float:
        """The run's time with the prefill passes charged as ``tokens_per_ms`` says."""
        return self.time_ms - self.prefill_ms + self.prefill_share_ms

    @property
    def raw_tokens_per_ms(self) -> float:
        """Tokens over the run's time, the prefill passes charged as they happen."""
        return self.tokens / self.time_ms if self.time_ms else float("nan")

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(
            tau=self.tau,
            tau_spec=(self.tokens - (self.request_steps - self.request_steps_spec)) / max(self.request_steps_spec, 1),
            tokens_per_s=self.tokens_per_ms * 1e3,
            raw_tokens_per_s=self.raw_tokens_per_ms * 1e3,
            decode_tokens_per_s=self.tokens / max(self.time_ms - self.prefill_ms, 1e-9) * 1e3,
            mean_verify_rows=self.verify_rows / max(self.spec_steps, 1),
            mean_drafter_rows=self.drafter_rows / max(self.spec_steps, 1),
        )
        return out


def concat_lattices(lattices: list[Lattice]) -> Lattice:
    """One lattice set of several files' requests (same kind and block), in file order."""
    first = lattices[0]
    if any(lat.positions != first.positions or lat.kind != first.kind for lat in lattices):
        raise BatchingError(
            "lattice files of different blocks or kinds",
            where=", ".join(lat.source for lat in lattices),
            fix="concatenate the files of one drafter block",
        )
    requests = np.cumsum([0] + [lat.num_requests for lat in lattices])
    tokens = np.cumsum([0] + [lat.greedy_tokens.shape[0] for lat in lattices])
    return Lattice(
        meta=first.meta,
        request_ids=np.concatenate([lat.request_ids for lat in lattices]),
        labels=np.concatenate([lat.labels for lat in lattices]),
        greedy_offsets=np.concatenate([[0]] + [lat.greedy_offsets[1:] + t for lat, t in zip(lattices, tokens)]),
        greedy_tokens=np.concatenate([lat.greedy_tokens for lat in lattices]),
        step_request=np.concatenate([lat.step_request + r for lat, r in zip(lattices, requests)]).astype(np.int32),
        step_position=np.concatenate([lat.step_position for lat in lattices]),
        cand=np.concatenate([lat.cand for lat in lattices]),
        unary=np.concatenate([lat.unary for lat in lattices]),
        pair=np.concatenate([lat.pair for lat in lattices]),
        source="+".join(lat.source for lat in lattices),
    )


def check_block_lattices(lattices: dict[int, Lattice]) -> None:
    """The per-block files must hold the same requests and greedy outputs, each with its block's positions."""
    first = next(iter(lattices.values()))
    for block, lat in lattices.items():
        if lat.positions != block:
            raise BatchingError(
                f"the block-{block} lattice drafts {lat.positions} positions",
                where=lat.source,
                fix="record one lattice file per drafter block (benchmarks/batched_lattices.py)",
            )
        if not (
            np.array_equal(lat.request_ids, first.request_ids)
            and np.array_equal(lat.greedy_tokens, first.greedy_tokens)
        ):
            raise BatchingError(
                "the per-block lattices hold different requests or greedy outputs",
                where=lat.source,
                fix="record every block on the same greedy outputs (batched_lattices.py does)",
            )


class _Slots:
    """Per-slot state: request index, position, prompt rows still to prefill, recent acceptance, confidence."""

    def __init__(self, batch: int, lengths: np.ndarray, stream: int, largest_block: int, prefill_ms: float = 0.0):
        self.lengths, self.stream, self.next = lengths, stream, batch
        self.request = np.arange(batch) % lengths.size
        self.position = (np.arange(batch) * lengths[self.request]) // batch  # staggered start
        self.start = self.position.copy()  # where each slot's request entered the run
        # prefill passes paid for each slot's request (the first ones, entering part-way: a pass of their own)
        self.paid = np.full(batch, float(prefill_ms))
        self.waiting = np.zeros(batch, dtype=np.int64)
        self.arrival = np.arange(batch)  # the stream index of each slot's request
        self.recent = torch.full((batch,), float(largest_block))
        self.confidence = torch.zeros(batch, dtype=torch.int64)
        self.largest = largest_block

    def prefill_share(self, slots: np.ndarray) -> float:
        """The passes paid for these slots' requests in proportion to their tokens decoded in the run."""
        lengths = self.lengths[self.request[slots]]
        return float((self.paid[slots] * (self.position[slots] - self.start[slots]) / lengths).sum())

    def refill(self, done: np.ndarray, prompt_rows: int) -> bool:
        """Start the stream's next requests in the finished slots; False when the stream has run out."""
        for slot in np.flatnonzero(done):
            if self.next >= self.stream:
                return False
            self.request[slot] = self.next % self.lengths.size
            self.position[slot] = self.start[slot] = 0
            self.paid[slot] = 0.0
            self.waiting[slot] = prompt_rows
            self.arrival[slot] = self.next
            self.recent[slot] = float(self.largest)
            self.confidence[slot] = 0
            self.next += 1
        return True


def simulate(
    lattices: dict[int, Lattice],
    costs: StepCosts,
    config: Mechanisms,
    batch: int,
    prompt_rows: int = 512,
    verify_buffer: int = 2048,
    segment: int | None = 64,
    stream: int | None = None,
    budget_rows: int | None = None,
    plan_rows: tuple[int, ...] = (2, 3, 5, 9, 17),
    plan_prior: np.ndarray | None = None,
) -> Outcome:
    """Run ``config`` with ``batch`` requests in flight; see the module docstring. ``plan_prior``: the
    planner's per-depth acceptance to start from (``chain_prior`` of another split), else it looks first."""
    check_block_lattices(lattices)
    if STOCK_BLOCK not in lattices:
        raise BatchingError(
            f"no lattice of the stock block ({STOCK_BLOCK})", where="lattices", fix="record the 16-position block too"
        )
    base = lattices[STOCK_BLOCK]
    lengths = np.diff(base.greedy_offsets)
    lookups = {b: lat.step_lookup() for b, lat in lattices.items()}
    budget = SharedBudget(costs.target, verify_buffer, budget_rows)
    blocks = DrafterBlocks(STOCK_BLOCK, costs.drafter, sorted(lattices)) if config.blocks else None
    # per number of decoding requests: the step's curve at that many (its measured counts are that many x the rows per
    # request; a step of fewer requests read on the full batch's curve falls between its counts, where rows read free)
    admissions: dict[int, PromptAdmission] = {}
    if config.admission:  # refuses a segment the verify buffers cannot hold before any step
        admissions[batch] = PromptAdmission(costs.rows_curve(batch), verify_buffer, segment)
    if config.plan:
        planner = BudgetPlanner(costs, plan_rows, blocks=tuple(sorted(lattices)), prior=plan_prior)
    elif config.gate:  # one bucket: the configuration's own rows per request (the budget's, or a chain's)
        own = max(2, round(budget.rows_for(batch) / batch)) if config.tree == "best-first" else 1 + STOCK_BLOCK
        planner = BudgetPlanner(costs, (own,), blocks=(STOCK_BLOCK,), prior=plan_prior)
    else:
        planner = None
    slots = _Slots(batch, lengths, stream or max(lengths.size, 2 * batch), STOCK_BLOCK, costs.prefill_ms(prompt_rows))
    out = Outcome(config.name, batch)
    while True:
        decoding = np.flatnonzero(slots.waiting == 0)
        n = decoding.size
        speculate = config.speculate and n > 0
        chosen = np.full(n, STOCK_BLOCK)
        if speculate and blocks is not None:
            chosen = blocks.choose(slots.recent[decoding], slots.confidence[decoding]).numpy()
        rows = budget.rows_for(max(n, 1)) if speculate else n
        per_request = 0
        if speculate and planner is not None:
            per_request = planner.rows_for(n)
            speculate = per_request > 1
            if config.plan or not speculate:
                rows = n * per_request if speculate else n
                chosen = np.minimum(chosen, planner.draft_block(per_request))
        fixed = n + (int(chosen.sum()) if speculate and config.tree == "chain" else 0)
        prompt_take = np.zeros(batch, dtype=np.int64)
        queued = np.flatnonzero(slots.waiting > 0)
        queued = queued[np.argsort(slots.arrival[queued], kind="stable")]  # arrival order
        admit = 0
        if queued.size and config.admission:
            if n not in admissions:
                admissions[n] = PromptAdmission(costs.rows_curve(max(n, 1)), verify_buffer, segment)
            admission = admissions[n]
            waiting = torch.from_numpy(slots.waiting[queued])
            entering = int((slots.waiting[queued] < prompt_rows).sum())  # already partly in: they stay admitted
            # the verify rows of the step without prompts (a shared budget's nodes give way to prompt rows) and with all
            base = rows if speculate and config.tree == "best-first" else fixed
            full = max(base, fixed + int(admission.plan(fixed, waiting)[1]))
            admit = admission.admitted_prompts(
                fixed,
                waiting,
                n,
                _step_estimate(costs, base, n, chosen, speculate),
                torch.tensor([costs.prefill_ms(int(w)) for w in slots.waiting[queued]]),
                out.tau if out.request_steps else 1.0,
                out.tail_value if config.tree == "best-first" else 0.0,
                committed=entering,
                # what the rows cost in the step that times them (the engine's step grows between its measured counts,
                # where the plateau's stepwise curve reads them free)
                dearer_ms=costs.verify_ms(full, n) - costs.verify_ms(base, n),
            )
            # a look (the planner expects AR to win) is followed by AR steps, which at large batches have no spare
            # rows: a prompt first admitted in it would idle through them and then be prefilled anyway
            if speculate and planner is not None and planner.looking:
                admit = min(admit, entering)
            if admit:
                prompt_take[queued[:admit]] = admission.plan(fixed, waiting[:admit])[0].numpy()
        rest = queued[admit:]
        if rest.size:  # stock scheduling: the other waiting prompts' prefill pass, before the step
            prefill = costs.prefill_ms(int(slots.waiting[rest].sum()))
            slots.paid[rest] += prefill * slots.waiting[rest] / slots.waiting[rest].sum()
            out.time_ms += prefill
            out.prefill_ms += prefill
            out.prefill_passes += 1
            slots.waiting[rest] = 0  # they decode from the next step on
        extra = int(prompt_take.sum())
        gained = np.zeros(n, dtype=np.int64)
        if speculate:
            gained, step_ms, depth = _speculative_step(
                lattices, lookups, slots, decoding, chosen, config, blocks, rows, extra, costs, out
            )
            out.spec_steps += 1
            out.request_steps_spec += n
            if planner is not None:
                planner.observe(gained - 1, depth, per_request)
        else:
            gained[:] = 1
            step_ms = costs.verify_ms(n + extra, n) if n + extra else 0.0
        gained = np.minimum(gained, lengths[slots.request[decoding]] - slots.position[decoding])
        slots.position[decoding] += gained
        out.tokens += int(gained.sum())
        out.request_steps += n
        out.steps += 1
        out.time_ms += step_ms
        out.admitted_rows += extra
        slots.waiting -= prompt_take
        done = np.zeros(batch, dtype=bool)
        done[decoding] = slots.position[decoding] >= lengths[slots.request[decoding]]
        out.prefill_share_ms += slots.prefill_share(np.flatnonzero(done))
        if done.any() and not slots.refill(done, prompt_rows):
            # the requests still in flight (the finished ones are counted): their share so far
            out.prefill_share_ms += slots.prefill_share(np.flatnonzero(~done))
            return out


def chain_prior(lattice: Lattice, depth: int = STOCK_BLOCK) -> np.ndarray:
    """[depth] per-depth acceptance of the greedy chain of ``lattice``'s block at the positions a decoder visits
    (each request from its first token, each step where the last one's accepted tokens and bonus end): a pair's
    acceptance measured on one split, the planner's prior on another (``BudgetPlanner(prior=...)``).

    Not over every recorded position: a decoder steps over a long accepted stretch in one step but stops at
    every position of a hard one, so the positions' mean overstates what it sees (the trained pair's dev split:
    a 16-chain tau of 5.24 over all positions, 2.99 as decoded), and a prior that high kept the AR gates
    speculating where the steps lost to AR."""
    lookup, lengths = lattice.step_lookup(), np.diff(lattice.greedy_offsets)
    position = np.zeros(lattice.num_requests, dtype=np.int64)
    live, accepted = np.flatnonzero(lengths > 0), []
    while live.size:
        batch = StepBatch.from_lattice(lattice, lookup[lattice.greedy_offsets[live] + position[live]])
        took = verify_against_greedy(chain.build(batch, lattice.positions), batch.greedy).accepted
        accepted.append(took)
        position[live] += took + 1
        live = live[position[live] < lengths[live]]
    return acceptance_prior(np.concatenate(accepted), depth)


def drafter_ms(costs: StepCosts, chosen: np.ndarray) -> float:
    """The drafter's passes of a step whose requests draft the ``chosen`` blocks as one forward per block over its
    requests (what the composed engine's decoder runs, each paying its own weight stream), where the replay's time
    charges one ragged forward over all of them (the paper's form, which neither that decoder nor SGLang's uniform
    DFlash draft has)."""
    return sum(
        costs.draft_ms(int((chosen == b).sum()) * (int(b) + 1), int((chosen == b).sum())) for b in np.unique(chosen)
    )


def _step_estimate(costs: StepCosts, rows: int, requests: int, chosen: np.ndarray, speculate: bool) -> float:
    """A step's time before drafting (verify rows at the budget, the drafter's rows of the chosen blocks)."""
    if not speculate:
        return costs.verify_ms(max(rows, 1), requests)
    return costs.draft_ms(int((chosen + 1).sum()), requests) + costs.verify_ms(rows, requests)


def _speculative_step(
    lattices,
    lookups,
    slots: _Slots,
    decoding: np.ndarray,
    chosen: np.ndarray,
    config: Mechanisms,
    blocks: DrafterBlocks | None,
    rows: int,
    extra: int,
    costs: StepCosts,
    out: Outcome,
) -> tuple[np.ndarray, float, np.ndarray]:
    """Draft, share, verify one step of the decoding slots drafting ``chosen`` blocks; returns (tokens
    gained per slot, step ms, the deepest node each slot's share verified)."""
    n = decoding.size
    groups = []
    for block in np.unique(chosen):
        mine = np.flatnonzero(chosen == block)
        slot = decoding[mine]
        lat = lattices[int(block)]
        steps = lookups[int(block)][lat.greedy_offsets[slots.request[slot]] + slots.position[slot]]
        groups.append((mine, StepBatch.from_lattice(lat, steps)))
    trees, tail = step_trees(groups, n, config, max(0, rows - n - extra))
    if config.tree == "best-first":
        out.tail_value = tail
    greedy = np.full((n, STOCK_BLOCK), -1, dtype=np.int64)
    for mine, batch in groups:
        greedy[mine, : batch.positions] = batch.greedy
    verdict = verify_against_greedy(trees, greedy)
    if blocks is not None:
        slots.recent[decoding], slots.confidence[decoding] = block_signals(
            blocks, slots.recent[decoding], trees, verdict.accepted, config
        )
    for block in np.unique(chosen):
        out.blocks[int(block)] = out.blocks.get(int(block), 0) + int((chosen == block).sum())
    drafter_rows = int((chosen + 1).sum())
    verify_rows = n + int(trees.num_nodes.sum()) + extra
    out.drafter_rows += drafter_rows
    out.verify_rows += verify_rows
    draft_ms = costs.draft_ms(drafter_rows, n)  # one ragged forward over every request's block + anchor
    out.draft_ms += draft_ms
    out.draft_ms_forwards += drafter_ms(costs, chosen)
    depth = share_depth(torch.from_numpy(trees.depths), torch.from_numpy(trees.num_nodes)).numpy()
    return verdict.accepted + 1, draft_ms + costs.verify_ms(verify_rows, n), depth


def step_trees(
    groups: list[tuple[np.ndarray, StepBatch]], n: int, config: Mechanisms, nodes: int, cap: int | None = None
) -> tuple[DraftTrees, float]:
    """One step's drafts for ``n`` requests: ``groups`` pairs each block's requests (indices into the n)
    with their lattices. Stock's chain of each block, or best-first trees cut by the shared budget (or
    the equal split) to ``nodes`` nodes in all, at most ``cap`` per request (a padded verify layout's
    width). Returns the trees in request order and the expected tokens of the budget's last nodes (what
    an admitted prompt row displaces)."""
    width = max(nodes, 1) if config.tree == "best-first" else STOCK_BLOCK
    if cap is not None:
        width = max(1, min(width, cap))
    order, parts = [], []
    for mine, batch in groups:
        built = best_first.build(batch, width) if config.tree == "best-first" else chain.build(batch, width)
        order.append(mine)
        parts.append(pad_trees(built, width))
    back = np.argsort(np.concatenate(order))
    stacked = _stack(parts)
    trees = DraftTrees(*(getattr(stacked, f)[back] for f in TREE_FIELDS))
    if config.tree != "best-first":
        return trees, 0.0
    scores = torch.from_numpy(trees.scores)
    counts = shared_shares(scores, nodes) if config.shared else equal_shares(torch.from_numpy(trees.num_nodes), nodes)
    trees = trees.truncate(counts.numpy())
    kept = np.sort(trees.scores[np.isfinite(trees.scores)])
    return trees, float(np.exp(kept[: max(1, kept.size // 4)]).mean()) if kept.size else 0.0


def block_signals(
    blocks: DrafterBlocks, recent: torch.Tensor, trees: DraftTrees, accepted: np.ndarray, config: Mechanisms
) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter-block state after a verified step: recent acceptance and the draft confidence depth
    (the deepest node of each tree's share, or the accepted length of a chain)."""
    accepted_t = torch.from_numpy(np.asarray(accepted, dtype=np.int64))
    depth = share_depth(torch.from_numpy(trees.depths), torch.from_numpy(trees.num_nodes))
    return blocks.update(recent, accepted_t), depth if config.tree == "best-first" else accepted_t


TREE_FIELDS = ("parents", "depths", "ranks", "tokens", "scores", "num_nodes")


def _stack(parts: list[DraftTrees]) -> DraftTrees:
    width = max(p.parents.shape[1] for p in parts)
    parts = [pad_trees(p, width) for p in parts]
    return DraftTrees(*(np.concatenate([getattr(p, f) for p in parts]) for f in TREE_FIELDS))


def speedups(outcomes: dict[str, Outcome]) -> dict[str, dict]:
    """Per configuration: throughput, speedup over AR and gain over stock (Figure A2's two panels)."""
    ar, stock = outcomes["ar"].tokens_per_ms, outcomes.get("stock")
    rows = {}
    for name, o in outcomes.items():
        rows[name] = {
            "tau": o.tau,
            "tokens_per_s": o.tokens_per_ms * 1e3,
            "over_ar": o.tokens_per_ms / ar,
            "over_stock": o.tokens_per_ms / stock.tokens_per_ms if stock else math.nan,
            "raw_over_ar": o.raw_tokens_per_ms / outcomes["ar"].raw_tokens_per_ms,
        }
    return rows
