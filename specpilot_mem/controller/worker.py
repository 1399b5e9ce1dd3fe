"""A worker process: one system on one device, driven over its stdin/stdout by a device host.

Every system the controller times (stock, the current best, a candidate) runs in a worker of its own,
so no candidate code ever runs where the timer, the scorer or the verdict live, and two systems never
share a process, a GIL or a CUDA context. The host (``specpilot_mem.controller.pool``) reads the
clock: it stamps each request's start when it hands the request over and each token when its message
arrives, so nothing the system does to its own process can change a measured rate.

Protocol: one JSON object per line each way (data only: never pickles, which would run code in the
host). Host to worker::

    {"op": "open", "spec": {...}, "device": "cuda:0", "warmup": [request, ...]}
    {"op": "begin"}                                   # a timed run starts (SGLang: its server is up)
    {"op": "request", "i": 3, "prompt_ids": [...], "prompt": null, "max_new_tokens": 64}
    {"op": "end"}
    {"op": "exit"}

Worker to host: ``{"ev": "opened", "info": {...}}``, ``{"ev": "ready"}``, ``{"ev": "tokens", "i": 3,
"ids": [...]}`` (as soon as the system hands tokens over), ``{"ev": "done", "i": 3}``, ``{"ev":
"ended"}``, or ``{"ev": "error", "what": ...}``.

System specs (``spec["adapter"]``):

- ``python``: ``{"checkout": DIR, "module": "system.py"}``, the checkout's ``System(device)`` class
  (``specpilot_mem.rounds.systems``), serving one request at a time;
- ``engine``: ``{"model": "default" | "random" | DIR, "dtype": "float32", "mode": "spec", "options":
  {...}}``, the pure-torch engine with ``Engine.with_options(**options)``;
- ``sglang``: ``{"export_dir": DIR, "server_args": [...]}``, one SGLang server per timed run
  (``specpilot_mem.sglang.adapter``), requests served concurrently up to the batch size.

Run as ``python -m specpilot_mem.controller.worker``; imports only the standard library until a spec
names its adapter, so it starts on the bare GPU machine.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

MAX_LINE = 64 << 20  # a message larger than this is a protocol error, not something to buffer


class Channel:
    """The worker's end of the protocol. The system's own prints go to stderr, never into it."""

    def __init__(self) -> None:
        self.inbox = os.fdopen(os.dup(0), "rb")
        self.outbox = os.fdopen(os.dup(1), "wb")
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(2, 1)
        self.lock = threading.Lock()

    def send(self, **message) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self.lock:
            self.outbox.write(data)
            self.outbox.flush()

    def receive(self) -> dict | None:
        line = self.inbox.readline(MAX_LINE)
        return json.loads(line) if line else None


class PythonAdapter:
    """A checkout's ``System`` class (see ``specpilot_mem.rounds.systems``), one request at a time."""

    concurrent = False

    def __init__(self, spec: dict, device: str):
        from specpilot_mem.rounds.systems import load_system_module

        module = load_system_module(Path(spec["checkout"]), spec.get("module", "system.py"), spec.get("name", "system"))
        self.system = module.System(torch_device(device))

    @contextmanager
    def session(self):
        yield

    def serve(self, request: dict, emit) -> None:
        ids = request.get("prompt_ids")
        if ids is None:  # a text prompt and no tokenizer in the host: the system's own
            ids = self.system.encode(request["prompt"])
        self.system.generate(list(ids), int(request["max_new_tokens"]), lambda token: emit([int(token)]))

    def info(self) -> dict:
        return {}


class EngineAdapter:
    """The pure-torch engine; each request's tokens are handed over when its generation returns."""

    concurrent = False

    def __init__(self, spec: dict, device: str):
        import torch

        from specpilot_mem.engine.engine import Engine

        torch.set_num_threads(int(spec.get("threads", 1)))
        dtype = getattr(torch, spec.get("dtype", "float32"))
        model = spec.get("model", "default")
        target = torch_device(device)
        if model == "default":
            engine = Engine.load_default(device=target, dtype=dtype)
        elif model == "random":
            engine = Engine.random(int(spec.get("seed", 0)), device=target, dtype=dtype)
        else:
            engine = Engine.load(Path(model), device=target, dtype=dtype)
        self.engine = engine.with_options(**spec.get("options", {}))
        self.mode = spec.get("mode", "spec")

    @contextmanager
    def session(self):
        yield

    def serve(self, request: dict, emit) -> None:
        (generation,) = self.engine.generate(
            [{"prompt_ids": list(request["prompt_ids"]), "max_new_tokens": int(request["max_new_tokens"])}],
            mode=self.mode,
        )
        emit([int(t) for t in generation.output_ids])

    def info(self) -> dict:
        return {
            "synthetic": self.engine.synthetic,
            "dtype": str(self.engine.dtype),
            "cuda_graphs": self.engine.captured_graphs,
            "graph_error": self.engine.graph_error,
        }


class SGLangAdapter:
    """SGLang from an export: a server per timed run, started before the host's clock runs."""

    concurrent = True

    def __init__(self, spec: dict, device: str):
        from specpilot_mem.sglang.adapter import SGLangSystem, gpu_index

        self.system = SGLangSystem(
            spec.get("name", "system"),
            spec["export_dir"],
            spec.get("server_args", []),
            log_dir=spec.get("log_dir"),
            startup_timeout=float(spec.get("startup_timeout", 900)),
        )
        self.gpu = gpu_index(torch_device(device))
        self.client = None

    @contextmanager
    def session(self):
        from specpilot_mem.sglang.adapter import SGLangClient

        with self.system.server(self.gpu) as server:
            self.client = SGLangClient(server.url)
            try:
                yield
            finally:
                self.client = None

    def serve(self, request: dict, emit) -> None:
        from specpilot_mem.controller.requests import Request
        from specpilot_mem.sglang.adapter import stream_request

        ids = request.get("prompt_ids")
        stream_request(
            self.client,
            Request(
                f"r{request['i']}",
                "worker",
                "dev",
                int(request["max_new_tokens"]),
                prompt=request.get("prompt"),
                prompt_ids=tuple(ids) if ids else None,
            ),
            None,
            lambda chunk: emit(list(chunk.new_ids)),
        )

    def info(self) -> dict:
        return {"export_dir": str(self.system.export_dir)}


ADAPTERS = {"python": PythonAdapter, "engine": EngineAdapter, "sglang": SGLangAdapter}


def torch_device(slot: str) -> str:
    """The device a pool slot runs on: ``cpu:1`` -> ``cpu`` (a CPU slot), ``cuda:0#1`` -> ``cuda:0``
    (a second slot sharing one GPU)."""
    device = slot.split("#", 1)[0]
    return "cpu" if device.startswith("cpu") else device


def _serve_one(adapter, channel: Channel, request: dict) -> None:
    index = request["i"]
    try:
        adapter.serve(request, lambda ids: channel.send(ev="tokens", i=index, ids=ids))
        channel.send(ev="done", i=index)
    except Exception as err:  # noqa: BLE001 -- any failure of the system goes to the host, which names it
        channel.send(ev="error", i=index, what=f"{type(err).__name__}: {err}")


def _warm_up(adapter, warmup: list[dict]) -> None:
    """Serve the warm-up requests untimed, so lazy initialization (CUDA graphs) counts against no run."""
    with adapter.session():
        for request in warmup:
            adapter.serve(request, lambda ids: None)


def main() -> int:
    channel = Channel()
    adapter = None
    threads: list[threading.Thread] = []
    while (message := channel.receive()) is not None:
        op = message.get("op")
        try:
            if op == "open":
                adapter = ADAPTERS[message["spec"]["adapter"]](message["spec"], message["device"])
                if not adapter.concurrent:
                    _warm_up(adapter, message.get("warmup", []))
                channel.send(ev="opened", info=adapter.info())
            elif op == "begin":
                session = adapter.session()
                session.__enter__()
                channel.send(ev="ready")
            elif op == "request":
                if adapter.concurrent:
                    thread = threading.Thread(target=_serve_one, args=(adapter, channel, message), daemon=True)
                    thread.start()
                    threads.append(thread)
                else:
                    _serve_one(adapter, channel, message)
            elif op == "end":
                for thread in threads:
                    thread.join()
                threads.clear()
                session.__exit__(None, None, None)
                channel.send(ev="ended", info=adapter.info())
            elif op == "exit":
                return 0
            else:
                channel.send(ev="error", what=f"unknown op {op!r}")
        except Exception as err:  # noqa: BLE001 -- reported to the host; the worker serves on
            channel.send(ev="error", what=f"{type(err).__name__}: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
