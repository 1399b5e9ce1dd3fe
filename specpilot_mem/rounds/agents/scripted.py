"""A scripted agent for tests and demos: a Python function per agent name acts on the worktree."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from specpilot_mem.errors import RoundError
from specpilot_mem.rounds.agents.base import AgentResult, AgentTask
from specpilot_mem.rounds.models import AgentUsage

Script = Callable[[AgentTask], str]


class ScriptedAgent:
    name = "scripted"

    def __init__(self, scripts: Mapping[str, Script]):
        self.scripts = dict(scripts)

    def run(self, task: AgentTask) -> AgentResult:
        script = self.scripts.get(task.name) or self.scripts.get(task.role)
        if script is None:
            raise RoundError(
                f"no script for agent {task.name!r} (role {task.role})",
                where="scripted backend",
                fix="give a script for each direction id, or one per role",
            )
        summary = script(task)
        return AgentResult(
            summary=summary,
            transcript=[{"role": "user", "content": task.brief}, {"role": "assistant", "content": summary}],
            usage=AgentUsage(turns=1),
        )
