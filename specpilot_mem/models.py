"""The record schema: the one definition of every YAML record SpecPilot reads or writes.

``EntryRecord`` is ``entries/<id>/entry.yaml``; ``DeploymentRecord`` is ``rounds/<name>/deployment.yaml``.
Validation, the JSON schema (``specpilot-mem schema``) and the docs all come from these models.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

ENTRY_ID = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
DEPLOYMENT_NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"
ARCH = r"^(sm_[0-9]{2,3}[a-z]?|cpu)$"  # "cpu": measured without a GPU (tests, the pure-torch engine)
SHA1 = r"^[0-9a-f]{40}$"
SHA256 = r"^[0-9a-f]{64}$"
RELEASE = r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$"  # an SGLang version: 0.5.23, 0.5.24rc1

Regime = Literal["single", "batch"]
EvidenceKind = Literal["paired-run", "microbenchmark", "replay", "token-forcing"]
ContractLevel = Literal["bit-exact", "reduction-order", "token-forcing"]
OptionType = Literal["bool", "int", "float", "str", "choice"]
# verified: the entry's code holds on the release and its evidence stands there; candidate: not confirmed
# there (new, drifted, ported or never checked: re-measure first); superseded: upstream already has it.
Status = Literal["verified", "candidate", "superseded"]
# How an entry's delta went onto another release (``specpilot_mem.store.port``): clean (every file it
# touches is as recorded), drift (applies, but files it touches changed upstream), conflict, superseded
# (upstream already has every change), blocked (a requirement does not apply).
PortVerdict = Literal["clean", "drift", "conflict", "superseded", "blocked"]


def _arch_ids(value: list[str]) -> list[str]:
    for arch in value:
        if not re.match(ARCH, arch):
            raise ValueError(f"{arch!r} is not an arch id like sm_90 or sm_120")
    return value


ArchIds = Annotated[list[str], AfterValidator(_arch_ids)]


class Record(BaseModel):
    """Base: unknown keys are errors (a typo must not vanish silently)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Option(Record):
    """A flag the entry's delta adds to SGLang's server arguments; its default reproduces stock."""

    name: str = Field(pattern=r"^--[a-z0-9][a-z0-9-]*$", description="the flag, e.g. --specpilot-w12")
    type: OptionType
    default: Any = Field(description="the value that reproduces stock behaviour")
    help: str
    choices: list[Any] | None = Field(default=None, description="allowed values when type is 'choice'")

    @model_validator(mode="after")
    def _default_fits_type(self) -> "Option":
        expected = {"bool": bool, "int": int, "float": (int, float), "str": str}
        if self.type == "choice":
            if not self.choices:
                raise ValueError("an option of type 'choice' needs 'choices'")
            if self.default not in self.choices:
                raise ValueError(f"default {self.default!r} is not one of the choices {self.choices!r}")
        elif self.default is not None:
            ok = expected[self.type]
            if isinstance(self.default, bool) and self.type != "bool":
                raise ValueError(f"default {self.default!r} is a bool but the option's type is {self.type}")
            if not isinstance(self.default, ok):
                raise ValueError(f"default {self.default!r} does not have the option's type {self.type}")
        return self


class Variant(Record):
    """A named set of option values and the hardware it suits (e.g. sm_90 wgmma vs sm_120 mma.sync)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    options: dict[str, Any] = Field(default_factory=dict, description="option flag -> value")
    hardware: ArchIds = Field(default_factory=list, description="arch ids such as sm_90, sm_120")
    notes: str = ""


class Contract(Record):
    """What correctness means for the entry, and the commands that check it."""

    level: ContractLevel
    statement: str
    commands: list[str] = Field(default_factory=list)


class Deployment(Record):
    """Where a piece of evidence was measured."""

    gpu: str = Field(description="GPU name as the registry knows it, e.g. H200, H100, RTX PRO 6000")
    arch: str = Field(pattern=ARCH)
    target: str | None = Field(default=None, description="target model")
    drafter: str | None = None
    regime: Regime | None = None
    batch_sizes: list[int] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_gpu_on_its_arch(self) -> "Deployment":
        """A GPU the table knows must be on its own arch (a newer GPU is indexed under the name given)."""
        from specpilot_mem.gpus import GPUS, name_key

        gpu = next((g for g in GPUS if name_key(self.gpu) in {name_key(n) for n in (g.name, *g.aliases)}), None)
        if gpu is not None and gpu.arch != self.arch:
            raise ValueError(f"{self.gpu} is {gpu.arch}, not {self.arch}: set arch: {gpu.arch}")
        return self


class Figure(Record):
    """One measured number, with its 95% interval when it has one."""

    name: str
    value: float
    unit: str = ""
    ci_low: float | None = None
    ci_high: float | None = None


class Evidence(Record):
    kind: EvidenceKind
    deployment: Deployment
    figures: list[Figure] = Field(default_factory=list)
    verdict: str | None = Field(default=None, description="e.g. the token-forcing verdict: accept / reject")
    command: str = Field(description="the command that reproduces the measurement")
    date: dt.date
    round: str | None = Field(default=None, description="deployment/round-N where it was measured")
    results: str | None = Field(default=None, description="committed output file (e.g. benchmarks/results/...json)")
    synthetic: bool = Field(default=False, description="measured on synthetic data or random weights")
    revalidate: str | None = Field(
        default=None,
        description="set when the figures were measured on code that has "
        "changed since, e.g. 'base changed: re-validate' after a requirement was re-recorded",
    )


class Untested(Record):
    """A regime, GPU or setting the entry has never been measured in."""

    note: str
    regime: Regime | None = None
    arch: str | None = Field(default=None, pattern=ARCH)
    gpu: str | None = None
    drafter: str | None = None
    model: str | None = None


class Source(Record):
    round: str | None = None
    commit: str | None = Field(default=None, pattern=SHA1)
    repo: str | None = Field(default=None, description="where the source commit lives, if not this fork")


class Scope(Record):
    """Where the entry's status holds: the SGLang release it was validated on and the settings of its evidence.

    Empty lists mean the entry is not specific to that axis (e.g. an option group runs on any GPU).
    """

    sglang: str | None = Field(default=None, pattern=RELEASE, description="SGLang release validated on, e.g. 0.5.23")
    arch: ArchIds = Field(default_factory=list, description="arch ids validated on")
    target: list[str] = Field(default_factory=list, description="target models validated with")
    drafter: list[str] = Field(default_factory=list)
    regime: list[Regime] = Field(default_factory=list)


class Port(Record):
    """A ported variant of the entry's delta for another release, written when its 3-way merge was clean.

    It applies onto the release with the entry's requirements (ported or merged) exactly and must give
    ``reproduces`` there; until it is re-measured its release status stays ``candidate``.
    """

    source: str = Field(pattern=RELEASE, description="the release the entry was ported from")
    delta: str = Field(description="the ported delta, relative to the entry's folder (ports/sglang-<release>.patch)")
    sha256: str = Field(pattern=SHA256, description="sha256 of the ported delta")
    reproduces: str = Field(pattern=SHA1, description="tree id the chain gives onto the release with this port")
    ported: dt.date


class ReleaseCheck(Record):
    """The entry on another SGLang release: the port check's verdict and the status it left."""

    release: str = Field(pattern=RELEASE)
    status: Status
    verdict: PortVerdict
    base: str = Field(pattern=SHA1, description="the release's commit in the fork (deterministic import of its wheel)")
    checked: dt.date
    changed: list[str] = Field(default_factory=list, description="files the entry touches that changed upstream")
    conflicts: list[str] = Field(default_factory=list, description="files whose hunks do not apply")
    blocked_by: list[str] = Field(default_factory=list, description="requirements that do not apply")
    port: Port | None = None


class EntryRecord(Record):
    """``entries/<id>/entry.yaml``: one validated mechanism."""

    format: Literal[1] = 1
    id: str = Field(pattern=ENTRY_ID)
    title: str
    summary: str
    requires: list[str] = Field(default_factory=list)
    options: list[Option] = Field(default_factory=list)
    variants: list[Variant] = Field(default_factory=list)
    contract: Contract
    evidence: list[Evidence] = Field(default_factory=list)
    limits: list[str] = Field(default_factory=list)
    untested: list[Untested] = Field(default_factory=list)
    source: Source = Field(default_factory=Source)
    reproduces: str = Field(
        pattern=SHA1, description="tree id that applying the entry (with its requirements) to stock must give"
    )
    kernels: dict[str, str] = Field(
        default_factory=dict, description="vendored file path in the fork -> sha256 of its content"
    )
    recorded: dt.date | None = Field(
        default=None, description="when the delta was recorded; the entry's commits take their dates from it"
    )
    status: Status = Field(default="candidate", description="status on scope.sglang; a new entry is a candidate")
    scope: Scope = Field(default_factory=Scope)
    releases: list[ReleaseCheck] = Field(default_factory=list, description="the entry on other SGLang releases")

    @field_validator("requires")
    @classmethod
    def _requires_ids(cls, value: list[str]) -> list[str]:
        for rid in value:
            if not re.match(ENTRY_ID, rid):
                raise ValueError(f"{rid!r} is not an entry id")
        if len(set(value)) != len(value):
            raise ValueError("requires lists an entry twice")
        return value

    @field_validator("kernels")
    @classmethod
    def _kernel_hashes(cls, value: dict[str, str]) -> dict[str, str]:
        for path, digest in value.items():
            if not re.match(SHA256, digest):
                raise ValueError(f"kernels[{path!r}] must be a sha256 hex digest")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "EntryRecord":
        if self.id in self.requires:
            raise ValueError("an entry cannot require itself")
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise ValueError("two options share a name")
        for variant in self.variants:
            unknown = set(variant.options) - set(names)
            if unknown:
                raise ValueError(f"variant {variant.name!r} sets options the entry does not define: {sorted(unknown)}")
        if self.status == "verified" and self.scope.sglang is None:
            raise ValueError("a verified entry names the release it was verified on (scope.sglang)")
        releases = [r.release for r in self.releases]
        if len(set(releases)) != len(releases):
            raise ValueError("releases lists a release twice")
        if self.scope.sglang in releases:
            raise ValueError(f"releases lists {self.scope.sglang}, the release of the entry's scope (status covers it)")
        return self

    def release_check(self, release: str) -> ReleaseCheck | None:
        return next((r for r in self.releases if r.release == release), None)

    def status_on(self, release: str | None) -> Status | None:
        """The status on ``release`` (the scope's status on its own release); None where never checked."""
        if release is None or release == self.scope.sglang:
            return self.status
        check = self.release_check(release)
        return check.status if check else None

    def arches(self) -> set[str]:
        """Every arch the entry has evidence on or a variant for."""
        return {e.deployment.arch for e in self.evidence} | {a for v in self.variants for a in v.hardware}


class DeploymentRecord(Record):
    """``rounds/<name>/deployment.yaml``: a serving setting and the entries it started from."""

    format: Literal[1] = 1
    name: str = Field(pattern=DEPLOYMENT_NAME)
    gpu: str
    arch: str = Field(pattern=ARCH)
    model: str
    drafter: str
    regime: Regime
    batch_sizes: list[int] = Field(default_factory=list)
    entries: list[str] = Field(default_factory=list, description="entries applied onto stock, in the order given")
    suggested: dict[str, str] = Field(default_factory=dict, description="entry id -> why --suggest chose it")
    base: str = Field(pattern=SHA1, description="the stock commit the deployment branch starts from")
    branch: str
    tree: str = Field(pattern=SHA1, description="tree id of the deployment branch when created")
    created: dt.date
