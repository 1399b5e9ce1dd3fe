"""An agent on the Anthropic Messages API (the ``anthropic`` SDK), with tools confined to its worktree.

The API key comes from the environment (``ANTHROPIC_API_KEY``, read by the SDK; ``ANTHROPIC_BASE_URL``
points it elsewhere). The transcript keeps every message and tool call with secrets redacted; the key
itself is never written anywhere.
"""

from __future__ import annotations

import time
from typing import Any

from specpilot_mem.errors import RoundError
from specpilot_mem.optional import optional_import
from specpilot_mem.rounds.agents.base import AgentResult, AgentTask
from specpilot_mem.rounds.agents.tools import TOOL_SCHEMAS, WorktreeTools
from specpilot_mem.rounds.models import AgentUsage
from specpilot_mem.rounds.sandbox import redact, secret_values

AGENT_BACKEND = "agent backend 'anthropic'"
SYSTEM_PROMPT = (
    "You are a SpecPilot agent optimizing a speculative-decoding system. You work only inside your "
    "worktree through the tools given. Every change goes behind an option whose default reproduces "
    "stock. You never edit controller, benchmark or request files: the controller measures your work "
    "and rejects such changes. Finish with a short summary of what you did and what you measured."
)


class AnthropicAgent:
    name = "anthropic"

    def __init__(self, model: str, max_turns: int = 60, max_tokens: int = 8192, client: Any = None):
        self.model = model
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self._client = client

    def client(self):
        if self._client is None:
            anthropic = optional_import("anthropic", AGENT_BACKEND)
            try:
                self._client = anthropic.Anthropic()
            except anthropic.AnthropicError as err:
                raise RoundError(
                    f"cannot create the Anthropic client: {err}",
                    where=AGENT_BACKEND,
                    fix="set ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL for a proxy)",
                ) from None
        return self._client

    def run(self, task: AgentTask) -> AgentResult:
        anthropic = optional_import("anthropic", AGENT_BACKEND)
        tools = WorktreeTools(task.workdir, task.sandbox, time_limit_s=min(600.0, task.time_limit_s))
        secrets = secret_values()
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.brief}]
        transcript: list[dict[str, Any]] = [{"role": "user", "content": redact(task.brief, secrets)}]
        usage = AgentUsage()
        started = time.monotonic()
        summary = ""
        for _ in range(self.max_turns):
            if time.monotonic() - started > task.time_limit_s:
                summary = f"stopped: time limit of {task.time_limit_s:.0f} s reached"
                break
            try:
                response = self.client().messages.create(
                    model=self.model,
                    max_tokens=self.max_tokens,
                    system=SYSTEM_PROMPT,
                    tools=TOOL_SCHEMAS,
                    messages=messages,
                )
            except anthropic.APIError as err:
                raise RoundError(
                    f"the Anthropic API failed: {redact(str(err), secrets)}",
                    where=f"agent {task.name}",
                    fix="check the model name, key and network; then resume",
                ) from None
            usage = usage.model_copy(
                update={
                    "input_tokens": usage.input_tokens + response.usage.input_tokens,
                    "output_tokens": usage.output_tokens + response.usage.output_tokens,
                    "turns": usage.turns + 1,
                }
            )
            content = [block.model_dump(mode="json", exclude_none=True) for block in response.content]
            messages.append({"role": "assistant", "content": content})
            transcript.append({"role": "assistant", "content": _redacted(content, secrets)})
            calls = [block for block in response.content if block.type == "tool_use"]
            if response.stop_reason != "tool_use" or not calls:
                summary = "\n".join(block.text for block in response.content if block.type == "text").strip()
                break
            results = []
            for call in calls:
                text, is_error = tools.call(call.name, dict(call.input))
                results.append({"type": "tool_result", "tool_use_id": call.id, "content": text, "is_error": is_error})
            messages.append({"role": "user", "content": results})
            transcript.append({"role": "user", "content": results})
        else:
            summary = f"stopped: {self.max_turns} turns reached"
        usage = usage.model_copy(update={"seconds": round(time.monotonic() - started, 3)})
        return AgentResult(summary=redact(summary, secrets), transcript=transcript, usage=usage)


def _redacted(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, list):
        return [_redacted(v, secrets) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v, secrets) for k, v in value.items()}
    return value
