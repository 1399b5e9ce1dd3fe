"""The tools an API-driven agent gets: file read/write/edit and a time-limited bash, all inside its worktree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specpilot_mem.errors import RoundError
from specpilot_mem.rounds.sandbox import Sandbox, confine, redact, secret_values

MAX_OUTPUT = 20_000
BASH_TIMEOUT_S = 600.0

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "name": "read_file",
        "description": "Read a text file of the worktree.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {
        "name": "write_file",
        "description": "Create or overwrite a file of the worktree.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "edit_file",
        "description": "Replace one exact, unique occurrence of old_text with new_text in a file.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "old_text": {"type": "string"}, "new_text": {"type": "string"}},
            "required": ["path", "old_text", "new_text"],
        },
    },
    {
        "name": "bash",
        "description": "Run a shell command in the worktree (time-limited; its output is returned).",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout_s": {"type": "number"}},
            "required": ["command"],
        },
    },
]


class WorktreeTools:
    def __init__(self, root: Path, sandbox: Sandbox, time_limit_s: float = BASH_TIMEOUT_S):
        self.root = root
        self.sandbox = sandbox
        self.time_limit_s = time_limit_s
        self.secrets = secret_values()

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run tool ``name``; returns (text for the model, is_error). Tool failures go back to the model."""
        try:
            handler = getattr(self, f"_{name}", None)
            if handler is None:
                return f"unknown tool {name!r}", True
            return redact(handler(**arguments), self.secrets)[:MAX_OUTPUT], False
        except (RoundError, OSError, TypeError, UnicodeDecodeError) as err:
            return redact(str(err), self.secrets), True

    def _read_file(self, path: str) -> str:
        return confine(self.root, path).read_text()

    def _write_file(self, path: str, content: str) -> str:
        target = confine(self.root, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        self.sandbox.give(target)
        return f"wrote {len(content)} characters to {path}"

    def _edit_file(self, path: str, old_text: str, new_text: str) -> str:
        target = confine(self.root, path)
        text = target.read_text()
        count = text.count(old_text)
        if count != 1:
            raise RoundError(f"old_text occurs {count} times in {path}; it must occur exactly once", where=path)
        target.write_text(text.replace(old_text, new_text, 1))
        return f"edited {path}"

    def _bash(self, command: str, timeout_s: float | None = None) -> str:
        limit = min(float(timeout_s or self.time_limit_s), self.time_limit_s)
        proc = self.sandbox.run(command, self.root, limit)
        return f"exit code {proc.returncode}\n--- stdout\n{proc.stdout[-MAX_OUTPUT // 2 :]}\n--- stderr\n{proc.stderr[-MAX_OUTPUT // 4 :]}"
