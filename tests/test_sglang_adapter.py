"""The SGLang engine adapter and scorer client against a local server that speaks SGLang's HTTP API.

The stand-in is a tiny ``sglang`` package (``sglang/launch_server.py``) written into a folder that
plays the export: ``SGLangSystem`` launches it exactly as it launches the real server
(``python -m sglang.launch_server ... --host --port`` with the export first on PYTHONPATH), waits
for ``/health``, streams ``/generate`` and stops it. Its "model" is a fixed toy function, so the
expected tokens and log-probs are computed here independently.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import textwrap

import numpy as np
import pytest

from specpilot_mem.controller.requests import Request
from specpilot_mem.sglang.adapter import (
    SGLangClient,
    SGLangRequestError,
    SGLangScorer,
    SGLangSystem,
    gpu_index,
    serve_closed_loop,
)
from specpilot_mem.sglang.server import SGLangRuntimeError, SGLangServer

VOCAB = 50

FAKE_LAUNCH_SERVER = textwrap.dedent('''
    """Stand-in for sglang.launch_server: /health and /generate of SGLang 0.5.23, on a toy model."""
    import argparse, json, math, os, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    VOCAB = 50

    def logits(prefix):
        """Toy next-token logits: a fixed function of the last two tokens."""
        a, b = (prefix[-2] if len(prefix) > 1 else 0), prefix[-1]
        return [math.sin(0.37 * (v + 1) * (a + 2) + 0.11 * b * v) + (1.5 if v == (3 * b + a + 1) % VOCAB else 0.0)
                for v in range(VOCAB)]

    def logprobs(prefix):
        row = logits(prefix)
        top = max(row)
        norm = top + math.log(sum(math.exp(x - top) for x in row))
        return [x - norm for x in row]

    def greedy(prefix, n):
        out = []
        for _ in range(n):
            row = logprobs(prefix + out)
            out.append(max(range(VOCAB), key=lambda v: row[v]))
        return out

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            status = 200 if self.path == "/health" else 404
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _json(self, status, payload):
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/generate" or "input_ids" not in req:
                return self._json(400, {"error": {"message": "need input_ids"}})
            ids = req["input_ids"]
            n = req["sampling_params"]["max_new_tokens"]
            out = greedy(ids, n)
            if not req.get("stream"):
                meta = {"completion_tokens": len(out), "finish_reason": {"type": "length"}}
                if req.get("return_logprob"):
                    start, k = req["logprob_start_len"], req.get("top_logprobs_num", 0)
                    # As SGLang 0.5.23: entries from input_ids[start] on, the first None (no logits before it).
                    own, top = [[None, ids[start], None]], [None]
                    for pos in range(start + 1, len(ids)):
                        row = logprobs(ids[:pos])
                        own.append([row[ids[pos]], ids[pos], None])
                        best = sorted(range(VOCAB), key=lambda v: -row[v])[:k]
                        top.append([[row[v], v, None] for v in best])
                    meta["input_token_logprobs"], meta["input_top_logprobs"] = own, top
                return self._json(200, {"text": "", "output_ids": out, "meta_info": meta})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            incremental = os.environ.get("FAKE_INCREMENTAL") == "1"
            # SGLang serializes its live output list: it may already hold the next decoded token.
            ahead = 1 if os.environ.get("FAKE_AHEAD") == "1" else 0
            def send(data):
                self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(data), data))
                self.wfile.flush()
            sent = 0
            step = 1
            while sent < len(out):
                time.sleep(0.002)
                new = out[sent:sent + step]
                ids_field = new if incremental else out[:sent + len(new) + ahead]
                sent += len(new)
                step = step % 3 + 1  # chunks of 1, 2, 3 tokens, like accepted speculative blocks
                meta = {"completion_tokens": sent, "finish_reason": None if sent < len(out) else {"type": "length"}}
                send(b"data: " + json.dumps({"output_ids": ids_field, "meta_info": meta}).encode() + b"\\n\\n")
            send(b"data: [DONE]\\n\\n")
            send(b"")

    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--host")
        parser.add_argument("--port", type=int)
        args, _ = parser.parse_known_args()
        with open(os.environ["FAKE_ARGV_LOG"], "w") as log:
            json.dump({"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "argv": sys.argv[1:]}, log)
        ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
''')


@pytest.fixture(scope="module")
def fake_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake-export")
    (root / "sglang").mkdir()
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "launch_server.py").write_text(FAKE_LAUNCH_SERVER)
    return root


@pytest.fixture(scope="module")
def toy(fake_export):
    spec = importlib.util.spec_from_file_location("fake_launch_server", fake_export / "sglang" / "launch_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def server(fake_export, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("FAKE_ARGV_LOG", str(tmp_path_factory.mktemp("argv") / "argv.json"))
    with SGLangServer(fake_export, ["--model-path", "toy"], startup_timeout=60) as running:
        yield running


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def requests(n: int, max_new: int = 9) -> list[Request]:
    return [Request(f"r{i}", "synthetic", "dev", max_new, prompt_ids=(i % 7 + 1, i % 5 + 2, 3)) for i in range(n)]


def test_closed_loop_collects_greedy_tokens_and_timestamps(server, toy):
    reqs = requests(7)
    outputs = serve_closed_loop(SGLangClient(server.url), reqs, batch_size=3)
    assert [o.id for o in outputs] == [r.id for r in reqs]
    for request, output in zip(reqs, outputs):
        assert list(output.output_ids) == toy.greedy(list(request.prompt_ids), request.max_new_tokens)
        assert len(output.token_times) == request.max_new_tokens
        assert output.start < output.token_times[0]
        assert list(output.token_times) == sorted(output.token_times)
        assert output.rate > 0
    # Tokens of one chunk share its arrival time: 9 tokens in chunks of 1, 2, 3, 1, 2.
    assert len(set(outputs[0].token_times)) == 5


def test_incremental_streaming_output_gives_the_same_tokens(fake_export, toy, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ARGV_LOG", str(tmp_path / "argv.json"))
    monkeypatch.setenv("FAKE_INCREMENTAL", "1")
    with SGLangServer(fake_export, [], startup_timeout=60) as running:
        (output,) = serve_closed_loop(SGLangClient(running.url), requests(1, 11), batch_size=1)
    assert list(output.output_ids) == toy.greedy([1, 2, 3], 11)


def test_cumulative_chunks_ahead_of_their_count_give_the_same_tokens(fake_export, toy, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ARGV_LOG", str(tmp_path / "argv.json"))
    monkeypatch.setenv("FAKE_AHEAD", "1")
    with SGLangServer(fake_export, [], startup_timeout=60) as running:
        (output,) = serve_closed_loop(SGLangClient(running.url), requests(1, 11), batch_size=1)
    assert list(output.output_ids) == toy.greedy([1, 2, 3], 11)
    assert len(output.token_times) == 11


def test_system_runs_a_server_per_run_on_the_requested_gpu(fake_export, toy, tmp_path, monkeypatch):
    argv_log = tmp_path / "argv.json"
    monkeypatch.setenv("FAKE_ARGV_LOG", str(argv_log))
    system = SGLangSystem(
        "toy-system", fake_export, ["--model-path", "toy"], log_dir=tmp_path / "logs", startup_timeout=60
    )
    outputs = system.run(requests(4, 5), batch_size=2, device="cuda:3")
    assert [list(o.output_ids) for o in outputs] == [toy.greedy(list(r.prompt_ids), 5) for r in requests(4, 5)]
    assert '"cuda": "3"' in argv_log.read_text()
    assert (tmp_path / "logs" / "toy-system-gpu3.log").exists()


def test_scorer_returns_teacher_forced_logprobs_argmax_and_margin(server, toy):
    prompt = [4, 9, 1]
    forced = [7, 7, 30, 2, 11, 0]
    scores = SGLangScorer(SGLangClient(server.url)).score(prompt, forced)
    tokens = prompt + forced
    for i, token in enumerate(forced):
        row = np.array(toy.logprobs(tokens[: len(prompt) + i]))
        order = np.argsort(-row)
        assert scores.token_logprob[i] == pytest.approx(row[token])
        assert scores.argmax[i] == order[0]
        assert scores.argmax_logprob[i] == pytest.approx(row[order[0]])
        assert scores.top2_margin[i] == pytest.approx(row[order[0]] - row[order[1]])
    assert math.isclose(scores.token_logprob.sum(), sum(toy.logprobs(tokens[:k])[tokens[k]] for k in range(3, 9)))


def test_scorer_split_by_prefill_length_scores_the_same_positions(server):
    scorer = SGLangScorer(SGLangClient(server.url))
    whole = scorer.score([4, 9, 1], [7, 7, 30, 2, 11, 0])
    split = scorer.score([4, 9, 1], [7, 7, 30, 2, 11, 0], prefill_len=5)
    np.testing.assert_allclose(split.token_logprob, whole.token_logprob)
    np.testing.assert_array_equal(split.argmax, whole.argmax)


def test_refused_request_is_a_clear_error(server):
    with pytest.raises(SGLangRequestError, match="answered 400"):
        SGLangClient(server.url).generate({"text": "no ids"})


def test_server_that_exits_early_is_reported(tmp_path):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (tmp_path / "sglang" / "launch_server.py").write_text("raise SystemExit(3)\n")
    with pytest.raises(SGLangRuntimeError, match="exited with status 3"):
        with SGLangServer(tmp_path, [], startup_timeout=30):
            pass


def test_stop_leaves_no_process(fake_export, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ARGV_LOG", str(tmp_path / "argv.json"))
    running = SGLangServer(fake_export, [], startup_timeout=60)
    with running:
        pid = running.process.pid
        assert SGLangClient(running.url).health()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_device_names():
    assert gpu_index("cuda:2") == 2
    assert gpu_index("cuda") is None
    with pytest.raises(Exception, match="CUDA GPU"):
        gpu_index("cpu")


def test_scorer_on_stock_starts_a_server_with_the_fp32_head(fake_export, toy, tmp_path, monkeypatch):
    argv_log = tmp_path / "argv.json"
    monkeypatch.setenv("FAKE_ARGV_LOG", str(argv_log))
    with SGLangScorer.on_stock(fake_export, ["--model-path", "toy"], gpu=1, startup_timeout=60) as scorer:
        scores = scorer.score([4, 9, 1], [7, 30])
    logged = json.loads(argv_log.read_text())
    assert logged["cuda"] == "1" and "--enable-fp32-lm-head" in logged["argv"]
    assert scores.token_logprob[1] == pytest.approx(toy.logprobs([4, 9, 1, 7])[30])


def test_scorer_needs_a_prompt(server):
    with pytest.raises(SGLangRequestError, match="at least one token before it"):
        SGLangScorer(SGLangClient(server.url)).score([], [3, 4])
