"""The agent interface: a task (role, brief, the one folder it may work in) in, a result out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from specpilot_mem.errors import RoundError
from specpilot_mem.rounds.models import AgentUsage
from specpilot_mem.rounds.sandbox import Sandbox

Role = Literal["master", "sub", "integration", "kernel"]


@dataclass
class AgentTask:
    role: Role
    name: str  # "master" or the direction id
    brief: str
    workdir: Path  # the only folder the agent may change
    sandbox: Sandbox
    time_limit_s: float = 1800.0


@dataclass
class AgentResult:
    summary: str
    transcript: list[dict[str, Any]] = field(default_factory=list)
    usage: AgentUsage = field(default_factory=AgentUsage)


class AgentBackend(Protocol):
    name: str

    def run(self, task: AgentTask) -> AgentResult: ...


def make_backend(spec: Mapping[str, Any], scripts: Mapping[str, Any] | None = None) -> AgentBackend:
    """The backend a round's config names: ``{"backend": "anthropic", "model": ...}``,
    ``{"backend": "command", "command": [...]}`` or ``{"backend": "scripted"}`` (with ``scripts``)."""
    kind = spec.get("backend")
    if kind == "anthropic":
        from specpilot_mem.rounds.agents.anthropic_api import AnthropicAgent

        return AnthropicAgent(
            model=spec.get("model", "claude-opus-4-5"),
            max_turns=int(spec.get("max_turns", 60)),
            max_tokens=int(spec.get("max_tokens", 8192)),
        )
    if kind == "command":
        from specpilot_mem.rounds.agents.external import ExternalCommandAgent

        command = spec.get("command")
        if not command or not isinstance(command, list):
            raise RoundError(
                "the command backend needs 'command': a list of arguments",
                where="round config: agent",
                fix='e.g. {"backend": "command", "command": ["claude", "-p", "{brief}"]}',
            )
        return ExternalCommandAgent(command=[str(c) for c in command])
    if kind == "scripted":
        from specpilot_mem.rounds.agents.scripted import ScriptedAgent

        if scripts is None:
            raise RoundError(
                "the scripted backend needs scripts (it is for tests and demos)",
                where="round config: agent",
                fix="pass scripts= when starting the round from Python",
            )
        return ScriptedAgent(scripts)
    raise RoundError(
        f"unknown agent backend {kind!r}", where="round config: agent", fix="use 'anthropic', 'command' or 'scripted'"
    )
