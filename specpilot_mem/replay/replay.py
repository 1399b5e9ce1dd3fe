"""Exact replay: rerun tree selection and greedy verification on recorded lattices.

A request starts at position 0; each step builds the tree from the lattice recorded at the current
position, verifies it against the target's greedy tokens from there, and moves on by the accepted
nodes plus the bonus token (never past the end of the output). Because lattices are recorded at
every position, each builder follows its own trajectory. All requests in flight step together,
so the builders see one large batch per round of steps.

τ = tokens / steps, pooled over the requests of a benchmark label (and over all of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specpilot_mem.replay.lattice import Lattice, LatticeError
from specpilot_mem.replay.trees import get_builder, sequoia, shared
from specpilot_mem.replay.trees.base import StepBatch
from specpilot_mem.replay.verify import verify_against_greedy

MAX_BATCH = 1024  # steps built at once: keeps a build's temporaries in cache (measured best on this CPU)


@dataclass
class ReplayRun:
    builder: str
    nodes: int
    positions: int
    depth_cap: int | None
    batch: int
    synthetic: bool
    sources: list[str]
    steps: dict[str, int] = field(default_factory=dict)  # label -> steps
    tokens: dict[str, int] = field(default_factory=dict)  # label -> tokens

    @property
    def tau(self) -> float:
        steps = sum(self.steps.values())
        return sum(self.tokens.values()) / steps if steps else float("nan")

    def tau_by_label(self) -> dict[str, float]:
        return {label: self.tokens[label] / self.steps[label] for label in sorted(self.steps) if self.steps[label]}

    def to_dict(self) -> dict:
        return {
            "builder": self.builder,
            "nodes": self.nodes,
            "positions": self.positions,
            "depth_cap": self.depth_cap,
            "batch": self.batch,
            "synthetic": self.synthetic,
            "tau": self.tau,
            "tau_by_label": self.tau_by_label(),
            "steps": sum(self.steps.values()),
            "tokens": sum(self.tokens.values()),
            "sources": self.sources,
        }


def builder_options(name: str, lattices: Sequence[Lattice]) -> dict:
    """Options a builder fits once on the whole lattice set (Sequoia's acceptance vector)."""
    if name == "sequoia":
        return {"acceptance": sequoia.fit_acceptance(lattices)}
    return {}


def replay(
    lat: Lattice, builder: str, nodes: int, depth_cap: int | None = None, batch: int = 1, options: dict | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Replay every request of one lattice file; returns (steps [R], tokens [R]).

    batch = 1: every request on its own, all stepping together (one build per round of steps).
    batch > 1: one server, closed loop, ``batch`` requests in flight (the next request in file order
    takes a finished one's slot); each step verifies at most ``nodes`` nodes over all of them
    (best-first shares, ``trees.shared``).
    """
    build = get_builder(builder)
    options = options or {}
    if batch > 1 and builder != "best-first":
        raise LatticeError(
            f"a shared node budget is defined for best-first trees, not {builder!r}",
            where="--batch",
            fix="use --builders best-first with --batch, or --batch 1",
        )
    state = _Progress(lat)
    if batch == 1:
        active = np.flatnonzero(state.lengths > 0)
        while active.size:
            for lo in range(0, active.size, MAX_BATCH):
                reqs = active[lo : lo + MAX_BATCH]
                sb = StepBatch.from_lattice(lat, state.step_ids(reqs))
                state.advance(reqs, sb, build(sb, nodes, depth_cap, **options))
            active = active[state.position[active] < state.lengths[active]]
    else:
        queue = [int(r) for r in np.flatnonzero(state.lengths > 0)]
        slots, queue = queue[:batch], queue[batch:]
        while slots:
            reqs = np.array(slots)
            sb = StepBatch.from_lattice(lat, state.step_ids(reqs))
            state.advance(reqs, sb, shared.build(sb, np.zeros(reqs.size, dtype=np.int64), nodes, depth_cap))
            slots = [r if state.position[r] < state.lengths[r] else (queue.pop(0) if queue else -1) for r in slots]
            slots = [r for r in slots if r >= 0]
    return state.steps, state.tokens


class _Progress:
    """Where each request of a lattice file stands during replay."""

    def __init__(self, lat: Lattice):
        self.lat = lat
        self.lengths = np.diff(lat.greedy_offsets)
        self.lookup = lat.step_lookup()
        self.position = np.zeros(lat.num_requests, dtype=np.int64)
        self.steps = np.zeros(lat.num_requests, dtype=np.int64)
        self.tokens = np.zeros(lat.num_requests, dtype=np.int64)

    def step_ids(self, reqs: np.ndarray) -> np.ndarray:
        ids = self.lookup[self.lat.greedy_offsets[reqs] + self.position[reqs]]
        missing = np.flatnonzero(ids < 0)
        if missing.size:
            r = reqs[missing[0]]
            raise LatticeError(
                f"no lattice recorded for request {self.lat.request_ids[r]!r} at position {int(self.position[r])}",
                where=self.lat.source,
                fix="record a teacher-forced step at every position of the greedy output",
            )
        return ids

    def advance(self, reqs: np.ndarray, sb: StepBatch, trees) -> None:
        """Verify the step's trees; each request gains its accepted nodes + the bonus, within its output."""
        verdict = verify_against_greedy(trees, sb.greedy)
        gained = np.minimum(verdict.accepted + 1, self.lengths[reqs] - self.position[reqs])
        self.position[reqs] += gained
        self.tokens[reqs] += gained
        self.steps[reqs] += 1


def replay_set(
    lattices: Sequence[Lattice],
    builders: Sequence[str],
    nodes: Sequence[int],
    depth_cap: int | None = None,
    batch: int = 1,
    progress=None,
) -> list[ReplayRun]:
    """τ for every (lattice group, builder, node budget); lattices group by their number of positions.
    ``progress`` (``output.progress``) advances once per run."""
    groups: dict[int, list[Lattice]] = {}
    for lat in lattices:
        groups.setdefault(lat.positions, []).append(lat)
    runs = []
    for positions, members in sorted(groups.items()):
        for name in builders:
            get_builder(name)
            options = builder_options(name, members)
            for n in nodes:
                run = ReplayRun(
                    name,
                    int(n),
                    positions,
                    depth_cap,
                    batch,
                    any(m.synthetic for m in members),
                    [m.source for m in members],
                )
                for lat in members:
                    steps, tokens = replay(lat, name, int(n), depth_cap, batch, options)
                    for label in np.unique(lat.labels):
                        mine = lat.labels == label
                        run.steps[str(label)] = run.steps.get(str(label), 0) + int(steps[mine].sum())
                        run.tokens[str(label)] = run.tokens.get(str(label), 0) + int(tokens[mine].sum())
                runs.append(run)
                if progress is not None:
                    progress.advance(1)
    return runs
