"""Round records: the files a round writes under ``rounds/<deployment>/round-<n>/``.

``round.yaml`` is a ``RoundState``; ``directions.yaml`` is the master's ``DirectionPlan``;
``directions/<id>/direction.yaml`` a ``DirectionRecord``; ``promotions.yaml`` a ``PromotionLog``.
Measurements are JSON files under ``measurements/`` written once each (see ``files.RoundDir``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import Field

from specpilot_mem.models import SHA1, Record

Phase = Literal["cost-model", "explore", "integrate", "kernel", "sealed", "distill"]
PHASES: tuple[Phase, ...] = ("cost-model", "explore", "integrate", "kernel", "sealed", "distill")
Factor = Literal["tau", "kernel", "overhead", "other"]
EvidenceSource = Literal["replay", "microbenchmark", "timing", "byte-arithmetic"]
DirectionStatus = Literal["planned", "closed", "rejected", "promoted", "not-promoted"]
DirectionKind = Literal["explore", "integration", "kernel"]

# The paper's rules for sub-agents (§3.2).
MIN_NET_HEADROOM = 0.03
MAX_GPU_MINUTES_TO_CLOSE_UNMEASURED = 10.0


class DirectionSpec(Record):
    """One idea the master proposes: what to try, which ceiling factor it attacks, and its expected gain."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")
    title: str
    idea: str
    factor: Factor
    headroom: float = Field(ge=0, description="expected gain as a fraction (0.25 = 25%)")
    cheapest_evidence: EvidenceSource = Field(description="how the sub-agent checks the headroom first")
    entry: str | None = Field(default=None, description="a memory entry this direction starts from, if any")


class DirectionPlan(Record):
    """``directions.yaml``: the master's proposals, one direction per device at a time."""

    summary: str
    directions: list[DirectionSpec] = Field(min_length=1)


class HeadroomCheck(Record):
    """What a sub-agent writes to ``headroom.json`` before building: its cheapest evidence."""

    evidence: EvidenceSource
    headroom: float = Field(description="gain the evidence supports, as a fraction")
    overhead: float = Field(ge=0, default=0.0, description="runtime overhead the mechanism adds, as a fraction")
    gpu_minutes_to_measure: float = Field(ge=0, default=0.0)
    notes: str = ""

    @property
    def net(self) -> float:
        return self.headroom - self.overhead


class AgentUsage(Record):
    input_tokens: int = 0
    output_tokens: int = 0
    turns: int = 0
    seconds: float = 0.0


class DirectionRecord(Record):
    spec: DirectionSpec
    kind: DirectionKind
    branch: str
    base: str = Field(pattern=SHA1)
    status: DirectionStatus = "planned"
    headroom: HeadroomCheck | None = None
    patch: str | None = Field(default=None, pattern=SHA1, description="the commit the sub-agent's patch became")
    changed_paths: list[str] = Field(default_factory=list)
    decision: str = ""
    measurements: list[str] = Field(default_factory=list, description="keys of measurements/<key>.json")
    usage: AgentUsage = Field(default_factory=AgentUsage)


class PromotionRecord(Record):
    order: int
    direction: str
    phase: Phase
    candidate: str = Field(pattern=SHA1)
    merge: str = Field(pattern=SHA1)
    previous_best: str = Field(pattern=SHA1)
    gain: float
    ci_low: float
    ci_high: float
    noise: float
    threshold: float
    token_forcing: str
    requests: int
    devices: list[str]
    rate: float | None = Field(default=None, description="mean output tokens/s of the promoted system")
    measurement: str | None = Field(default=None, description="key of the measurement behind it")
    audit_sha256: str | None = Field(default=None, description="sha256 of that measurement file (the merge's trailer)")


class PromotionLog(Record):
    promotions: list[PromotionRecord] = Field(default_factory=list)


class RoundConfig(Record):
    """What a round runs with; fixed at round start."""

    system_repo: str = Field(description="path of the system's git repository (the SGLang fork by default)")
    requests: str = Field(description="request-set JSONL with dev and unseen splits")
    devices: list[str] = Field(min_length=1)
    batch_sizes: list[int] = Field(default_factory=lambda: [1])
    repeats: int = 2
    noise_repeats: int = 2
    max_new_tokens: int | None = None
    sealed_max_new_tokens: int | None = Field(default=None, description="longer outputs for the sealed final")
    sealed_long_outputs: bool = Field(
        default=True,
        description="without sealed_max_new_tokens, the sealed final's outputs run to 4,096 tokens or the "
        "scorer's context (the paper's long-output pass)",
    )
    sealed_require_conclusive: bool = Field(
        default=True, description="accept the sealed final only on a token-forcing accept, not an inconclusive verdict"
    )
    agent: dict[str, Any] = Field(default_factory=lambda: {"backend": "scripted"})
    protected_paths: list[str] = Field(
        default_factory=lambda: ["controller/", "bench/", "requests/"],
        description="paths in the system repo that directions must not touch",
    )
    agent_time_limit_s: float = 1800.0
    pool: dict[str, Any] = Field(
        default_factory=lambda: {"kind": "process"},
        description='the device pool: {"kind": "process"} or {"kind": "ray", "address": ...}',
    )
    fresh_workers: bool = Field(default=True, description="a new worker process for every timed run")
    warmup_requests: int | None = Field(
        default=None, ge=0, description="perturbed warm-up requests per worker (default: one per request)"
    )


class RoundState(Record):
    """``round.yaml``: where the round is. Rewritten atomically after every step."""

    format: Literal[1] = 1
    deployment: str
    number: int = Field(ge=1)
    config: RoundConfig
    start: str = Field(pattern=SHA1, description="the system commit the round starts from")
    lineage: str = Field(description="branch holding the round's promotions as --no-ff merges")
    best: str = Field(pattern=SHA1)
    stock: str = Field(pattern=SHA1, description="the stock commit token forcing and the sealed final compare with")
    done: list[Phase] = Field(default_factory=list)
    controller_hashes: dict[str, str] = Field(default_factory=dict)
    started: dt.datetime
    finished: dt.datetime | None = None
    sealed: dict[str, Any] | None = None
    distilled: list[str] = Field(default_factory=list, description="entry ids recorded from this round")
