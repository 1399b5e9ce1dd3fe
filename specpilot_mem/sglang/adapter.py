"""SGLang as a system under test, and SGLang as the token-forcing scorer.

``SGLangSystem`` implements the controller's ``System``: it starts SGLang from an export of a system
commit on one GPU, waits for ``/health``, serves a request set closed-loop with a fixed number of
requests in flight (one thread per slot), records when every output token arrived from the streamed
``/generate`` chunks, and shuts the server down.

``SGLangScorer`` implements token forcing's ``Scorer`` against a stock SGLang server (launched with
``--enable-fp32-lm-head``, SGLang's FP32 LM head): one teacher-forced ``/generate`` call over
prompt + output with ``return_logprob``, ``logprob_start_len`` at the prompt's last token and
``top_logprobs_num=2``, which gives each forced token's log-probability, the argmax and the top-2 margin.

Both speak SGLang's HTTP API through ``SGLangClient`` (standard library only).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specpilot_mem.controller.requests import Request
from specpilot_mem.controller.system import RequestOutput
from specpilot_mem.errors import SpecPilotError
from specpilot_mem.forcing.scorer import TokenScores
from specpilot_mem.sglang.server import SGLangServer


class SGLangRequestError(SpecPilotError):
    """A request the SGLang server refused, or an answer that does not fit the request."""


@dataclass(frozen=True)
class StreamChunk:
    """One streamed ``/generate`` chunk: when it arrived and the output token ids it added."""

    arrived: float
    new_ids: tuple[int, ...]
    finish_reason: Any


class SGLangClient:
    """SGLang's ``/generate`` and ``/health`` over HTTP; one connection per call, so threads may share it."""

    def __init__(self, url: str, timeout: float = 600.0):
        parsed = urllib.parse.urlsplit(url)
        self.url = url.rstrip("/")
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 80
        self.timeout = timeout

    def _post(self, path: str, body: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            text = response.read().decode(errors="replace")[:500]
            connection.close()
            raise SGLangRequestError(
                f"{self.url}{path} answered {response.status}: {text}",
                where=self.url,
                fix="check the request against the server's log",
            )
        return connection, response

    def health(self) -> bool:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=5)
        try:
            connection.request("GET", "/health")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def generate(self, body: dict) -> dict:
        """A non-streaming ``/generate`` call; returns SGLang's JSON answer."""
        connection, response = self._post("/generate", {**body, "stream": False})
        try:
            answer = json.loads(response.read())
        finally:
            connection.close()
        if isinstance(answer, dict) and "error" in answer:
            raise SGLangRequestError(f"SGLang refused the request: {answer['error']}", where=self.url)
        return answer

    def stream(self, body: dict) -> Iterator[StreamChunk]:
        """A streaming ``/generate`` call: one ``StreamChunk`` per server-sent event, timed on arrival.

        SGLang sends cumulative ``output_ids`` by default (a chunk may already hold tokens decoded after
        its ``completion_tokens`` was counted) and disjoint segments with
        ``--incremental-streaming-output``; both are read here.
        """
        connection, response = self._post("/generate", {**body, "stream": True})
        received: list[int] = []
        try:
            for raw in response:
                arrived = time.perf_counter()
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                chunk = json.loads(payload)
                if "error" in chunk:
                    raise SGLangRequestError(f"SGLang stopped the stream: {chunk['error']}", where=self.url)
                ids = [int(t) for t in chunk.get("output_ids") or []]
                meta = chunk.get("meta_info", {})
                total = meta.get("completion_tokens", len(received) + len(ids))
                if received and len(ids) >= total and ids[: len(received)] == received:
                    new = ids[len(received) :]  # cumulative
                elif not received or len(ids) == total - len(received):
                    new = ids  # the first chunk, or a disjoint segment
                else:
                    raise SGLangRequestError(
                        f"a streamed chunk of {len(ids)} tokens fits neither cumulative nor incremental output "
                        f"after {len(received)} tokens (completion_tokens {total})",
                        where=self.url,
                        fix="report this with the server's version and flags",
                    )
                received += new
                yield StreamChunk(arrived, tuple(new), meta.get("finish_reason"))
        finally:
            connection.close()


def generate_body(request: Request, encode: Callable[[str], Sequence[int]] | None) -> dict:
    """Greedy decoding of one request (``temperature`` 0), by token ids where the request has them."""
    body: dict = {"sampling_params": {"max_new_tokens": request.max_new_tokens, "temperature": 0.0}}
    if request.prompt_ids is not None or encode is not None:
        body["input_ids"] = request.token_ids(encode)
    else:
        body["text"] = request.prompt
    return body


def stream_request(
    client: SGLangClient,
    request: Request,
    encode: Callable[[str], Sequence[int]] | None,
    on_chunk: Callable[[StreamChunk], None] | None = None,
) -> RequestOutput:
    """Serve one request, streamed; ``on_chunk`` sees each chunk as it arrives (a pool worker forwards
    it to the host, whose clock times it)."""
    body = generate_body(request, encode)
    start = time.perf_counter()
    ids: list[int] = []
    times: list[float] = []
    finish = None
    for chunk in client.stream(body):
        ids.extend(chunk.new_ids)
        times.extend([chunk.arrived] * len(chunk.new_ids))
        finish = chunk.finish_reason if chunk.finish_reason is not None else finish
        if on_chunk is not None:
            on_chunk(chunk)
    return RequestOutput(request.id, tuple(ids), start, tuple(times), finish_reason_name(finish))


def finish_reason_name(finish: Any) -> str | None:
    """SGLang's ``meta_info.finish_reason`` ({"type": "length", ...}, or a bare string) as a stop reason."""
    if isinstance(finish, dict):
        finish = finish.get("type")
    return str(finish) if finish is not None else None


def serve_closed_loop(
    client: SGLangClient,
    requests: Sequence[Request],
    batch_size: int,
    encode: Callable[[str], Sequence[int]] | None = None,
) -> list[RequestOutput]:
    """Serve ``requests`` with ``batch_size`` in flight: a slot takes the next request as soon as its last one ends."""
    if batch_size < 1:
        raise SpecPilotError(f"batch size {batch_size} is not positive", where="batch_size", fix="use 1 or more")
    with ThreadPoolExecutor(max_workers=batch_size, thread_name_prefix="sglang-slot") as pool:
        return list(pool.map(lambda request: stream_request(client, request, encode), requests))


class SGLangSystem:
    """A system under test: SGLang from an export of a system commit, one server per ``run``."""

    def __init__(
        self,
        name: str,
        export_dir: str | Path,
        server_args: Sequence[str],
        *,
        encode: Callable[[str], Sequence[int]] | None = None,
        python: str | None = None,
        log_dir: str | Path | None = None,
        startup_timeout: float = 900.0,
    ):
        self.name = name
        self.export_dir = Path(export_dir)
        self.server_args = list(server_args)
        self.encode = encode
        self.python = python
        self.log_dir = Path(log_dir) if log_dir else None
        self.startup_timeout = startup_timeout

    @classmethod
    def from_commit(
        cls, home, name: str, commit: str, server_args: Sequence[str], *, entries: Sequence[str] = (), **kwargs
    ) -> "SGLangSystem":
        """Export ``commit`` of the fork (cached by tree id under the home's state folder) and wrap it."""
        from specpilot_mem.sglang.export import cached_export

        return cls(name, cached_export(home, commit, entries), server_args, **kwargs)

    def server(self, gpu: int | None) -> SGLangServer:
        extra = {"python": self.python} if self.python else {}
        log = self.log_dir / f"{self.name}-gpu{gpu}.log" if self.log_dir else None
        if log:
            log.parent.mkdir(parents=True, exist_ok=True)
        return SGLangServer(
            self.export_dir, self.server_args, gpu=gpu, log_path=log, startup_timeout=self.startup_timeout, **extra
        )

    def run(self, requests: Sequence[Request], *, batch_size: int, device: str) -> list[RequestOutput]:
        with self.server(gpu_index(device)) as server:
            return serve_closed_loop(SGLangClient(server.url), requests, batch_size, self.encode)


def gpu_index(device: str) -> int | None:
    """``cuda:3`` -> 3, ``cuda`` -> None (whatever CUDA_VISIBLE_DEVICES already says)."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        raise SpecPilotError(f"SGLang serves on a CUDA GPU, not {device!r}", where="device", fix="pass cuda:N")
    return int(index) if index else None


class SGLangScorer:
    """Teacher-forced scores from a stock SGLang server started with ``--enable-fp32-lm-head``."""

    # Flags the scorer's server needs: FP32 logits, and no speculative decoding (stock, AR).
    SERVER_ARGS = ("--enable-fp32-lm-head",)

    def __init__(self, client: SGLangClient):
        self.client = client

    @classmethod
    @contextmanager
    def on_stock(
        cls, export_dir: str | Path, server_args: Sequence[str], *, gpu: int | None = None, **server_kwargs
    ) -> Iterator["SGLangScorer"]:
        """Start SGLang from a stock export with the FP32 LM head on ``gpu`` and yield its scorer."""
        with SGLangServer(export_dir, [*server_args, *cls.SERVER_ARGS], gpu=gpu, **server_kwargs) as server:
            yield cls(SGLangClient(server.url))

    def _forced(
        self, tokens: Sequence[int], start: int, expected: Sequence[int]
    ) -> list[tuple[float, int, float, float]]:
        """(token logprob, argmax, argmax logprob, top-2 margin) of ``tokens[start:]``, one pass.

        SGLang returns input log-probs from ``input_ids[logprob_start_len]`` on, the first being None
        (no logits precede it), so the request starts one token earlier and that entry is dropped.
        """
        if start < 1:
            raise SGLangRequestError(
                "a forced token needs at least one token before it", where="prompt_ids", fix="give a non-empty prompt"
            )
        answer = self.client.generate(
            {
                "input_ids": list(tokens),
                "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                "return_logprob": True,
                "logprob_start_len": start - 1,
                "top_logprobs_num": 2,
            }
        )
        meta = answer.get("meta_info", {})
        token_lp = (meta.get("input_token_logprobs") or [])[1:]
        top_lp = (meta.get("input_top_logprobs") or [])[1:]
        if len(token_lp) != len(expected) or len(top_lp) != len(expected):
            raise SGLangRequestError(
                f"the server returned {len(token_lp)} input log-probs for {len(expected)} forced tokens",
                where=self.client.url,
                fix="the server must be SGLang 0.5.23 (logprob_start_len semantics)",
            )
        rows = []
        for position, (own, top, token) in enumerate(zip(token_lp, top_lp, expected)):
            if own[1] != token or own[0] is None or top is None or len(top) < 2:
                raise SGLangRequestError(
                    f"forced position {position}: the server scored token {own[1]} (expected {token}) "
                    f"with {0 if top is None else len(top)} top log-probs",
                    where=self.client.url,
                    fix="the server must be SGLang 0.5.23 started without speculative decoding",
                )
            rows.append((float(own[0]), int(top[0][1]), float(top[0][0]), float(top[0][0]) - float(top[1][0])))
        return rows

    def score(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], prefill_len: int | None = None
    ) -> TokenScores:
        """Scores of ``output_ids`` after ``prompt_ids``.

        With ``prefill_len``, the tokens before it are scored in one pass over ``tokens[:prefill_len]``
        and the rest in a second pass whose prefix SGLang's radix cache already holds, so those
        positions come from an extend of a different length (the audit's prefill-length check).
        """
        tokens = [*prompt_ids, *output_ids]
        first = len(prompt_ids)
        if prefill_len is None or prefill_len <= first:
            rows = self._forced(tokens, first, output_ids)
        else:
            split = min(prefill_len, len(tokens))
            rows = self._forced(tokens[:split], first, tokens[first:split])
            if split < len(tokens):
                rows += self._forced(tokens, split, tokens[split:])
        columns = list(zip(*rows)) if rows else [(), (), (), ()]
        return TokenScores(
            token_logprob=np.asarray(columns[0], dtype=np.float64),
            argmax=np.asarray(columns[1], dtype=np.int64),
            argmax_logprob=np.asarray(columns[2], dtype=np.float64),
            top2_margin=np.asarray(columns[3], dtype=np.float64),
        )
