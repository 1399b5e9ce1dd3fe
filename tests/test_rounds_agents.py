"""Agent backends and isolation: the Anthropic backend through the real SDK against a local Messages API
server, the external-command backend, and the unprivileged sandbox (where the machine allows it)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specpilot_mem.errors import RoundError
from specpilot_mem.rounds.agents.anthropic_api import AnthropicAgent
from specpilot_mem.rounds.agents.base import AgentTask, make_backend
from specpilot_mem.rounds.agents.external import ExternalCommandAgent
from specpilot_mem.rounds.sandbox import AGENT_USER, Sandbox, confine

API_KEY = "sk-test-0123456789abcdef"


class MessagesAPI(BaseHTTPRequestHandler):
    """Speaks just enough of POST /v1/messages: first a tool call, then a final answer."""

    requests: list[dict] = []

    def log_message(self, *args):  # keep test output clean
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        MessagesAPI.requests.append(
            {
                "path": self.path,
                "key": self.headers.get("x-api-key") or self.headers.get("authorization", "").removeprefix("Bearer "),
                "body": body,
            }
        )
        last = body["messages"][-1]
        if last["role"] == "user" and isinstance(last["content"], str):
            content = [
                {"type": "text", "text": "Writing the patch."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "write_file",
                    "input": {"path": "patch.txt", "content": "option --faster\n"},
                },
                {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"command": "env; cat patch.txt"}},
            ]
            stop = "tool_use"
        else:
            content = [{"type": "text", "text": "Done: wrote patch.txt behind --faster."}]
            stop = "end_turn"
        payload = {
            "id": f"msg_{len(MessagesAPI.requests)}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 20},
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def messages_api(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), MessagesAPI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    MessagesAPI.requests = []
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    yield MessagesAPI
    server.shutdown()


def test_anthropic_backend_runs_tools_in_the_worktree_and_keeps_no_secret(messages_api, tmp_path):
    agent = make_backend({"backend": "anthropic", "model": "claude-test"})
    assert isinstance(agent, AnthropicAgent)
    result = agent.run(AgentTask("sub", "faster", "Make it faster.", tmp_path, Sandbox(None), time_limit_s=60))
    assert (tmp_path / "patch.txt").read_text() == "option --faster\n"
    assert result.summary == "Done: wrote patch.txt behind --faster."
    assert result.usage.input_tokens == 200 and result.usage.output_tokens == 40 and result.usage.turns == 2
    assert [r["key"] for r in messages_api.requests] == [API_KEY, API_KEY]  # the SDK sent the key...
    transcript = json.dumps(result.transcript)
    assert API_KEY not in transcript  # ...but it never reaches the transcript, not even through `env`
    tool_results = messages_api.requests[1]["body"]["messages"][-1]["content"]
    assert "exit code 0" in tool_results[1]["content"] and "option --faster" in tool_results[1]["content"]
    assert API_KEY not in json.dumps(messages_api.requests[1]["body"])


def test_tools_refuse_paths_outside_the_worktree(tmp_path):
    (tmp_path / "inside").mkdir()
    os.symlink("/etc", tmp_path / "inside" / "escape")
    with pytest.raises(RoundError):
        confine(tmp_path / "inside", "../outside.txt")
    with pytest.raises(RoundError):
        confine(tmp_path / "inside", "escape/passwd")
    assert confine(tmp_path / "inside", "a/b.txt") == (tmp_path / "inside" / "a" / "b.txt").resolve()


def test_command_backend_gets_the_brief_and_its_output_is_the_transcript(tmp_path, monkeypatch):
    monkeypatch.setenv("SOME_TOKEN", "tok-secret-value-123")
    agent = ExternalCommandAgent(
        ["bash", "-c", 'cat "$1" > got.md; echo $SOME_TOKEN; echo finished', "_", "{brief_file}"]
    )
    result = agent.run(AgentTask("sub", "d", "the brief", tmp_path, Sandbox(None), time_limit_s=30))
    assert (tmp_path / "got.md").read_text() == "the brief"
    assert result.summary == "finished"
    assert "tok-secret-value-123" not in json.dumps(result.transcript)


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(RoundError, match="unknown agent backend"):
        make_backend({"backend": "carrier-pigeon"})


needs_root = pytest.mark.skipif(
    os.geteuid() != 0
    or Sandbox.for_machine([], create_user=False).user is None
    and subprocess.run(["which", "useradd"], capture_output=True).returncode != 0,
    reason="the unprivileged sandbox needs root, useradd, unshare and setpriv",
)


@needs_root
def test_sandboxed_agent_cannot_read_the_unseen_split_nor_write_outside_its_worktree(tmp_path):
    tmp_path.chmod(0o755)
    home = tmp_path / "home"
    rounds = home / "rounds"
    rounds.mkdir(parents=True)
    unseen = rounds / "unseen.jsonl"
    unseen.write_text('{"id": "secret"}\n')
    unseen.chmod(0o644)  # readable by anyone on disk: only the sandbox's mounts hide it
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    sandbox = Sandbox.for_machine([rounds])
    assert sandbox.user == AGENT_USER
    sandbox.give(worktree)

    read = sandbox.run(f"cat {unseen}", worktree, 30)
    assert read.returncode != 0 and "secret" not in read.stdout
    outside = sandbox.run(f"touch {home}/planted", worktree, 30)
    assert outside.returncode != 0 and not (home / "planted").exists()
    inside = sandbox.run("touch made-here && id -un", worktree, 30)
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.strip() == AGENT_USER and (worktree / "made-here").exists()
    assert unseen.read_text() == '{"id": "secret"}\n'  # the runner itself still reads it
