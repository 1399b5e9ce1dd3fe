"""An agent that is an external command, e.g. a headless coding CLI given the direction's brief.

``{brief}`` in the command is replaced by the brief's text and ``{brief_file}`` by a file holding
it; the command runs in the worktree through the sandbox, within the task's time limit.
"""

from __future__ import annotations

import shlex
import tempfile
import time
from pathlib import Path

from specpilot_mem.rounds.agents.base import AgentResult, AgentTask
from specpilot_mem.rounds.models import AgentUsage
from specpilot_mem.rounds.sandbox import redact, secret_values

KEPT_OUTPUT = 50_000


class ExternalCommandAgent:
    name = "command"

    def __init__(self, command: list[str]):
        self.command = command

    def run(self, task: AgentTask) -> AgentResult:
        with tempfile.TemporaryDirectory(prefix="specpilot-brief-") as folder:
            brief_file = Path(folder) / "brief.md"
            brief_file.write_text(task.brief)
            brief_file.chmod(0o644)
            Path(folder).chmod(0o755)
            argv = [
                part.replace("{brief_file}", str(brief_file)).replace("{brief}", task.brief) for part in self.command
            ]
            started = time.monotonic()
            proc = task.sandbox.run(shlex.join(argv), task.workdir, task.time_limit_s)
        secrets = secret_values()
        out = redact(proc.stdout, secrets)[-KEPT_OUTPUT:]
        err = redact(proc.stderr, secrets)[-KEPT_OUTPUT:]
        transcript = [
            {"role": "user", "content": redact(task.brief, secrets)},
            {
                "role": "command",
                "argv": [redact(a, secrets) for a in self.command],
                "exit_code": proc.returncode,
                "stdout": out,
                "stderr": err,
            },
        ]
        usage = AgentUsage(turns=1, seconds=round(time.monotonic() - started, 3))
        summary = out.strip().splitlines()[-1] if out.strip() else f"exit code {proc.returncode}"
        return AgentResult(summary=summary, transcript=transcript, usage=usage)
