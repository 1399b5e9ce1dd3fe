"""Agent backends behind one interface: the Anthropic API, an external command, and a scripted backend."""

from specpilot_mem.rounds.agents.base import AgentBackend, AgentResult, AgentTask, make_backend

__all__ = ["AgentBackend", "AgentResult", "AgentTask", "make_backend"]
