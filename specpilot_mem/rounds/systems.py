"""Systems under test, opened from a commit of the system's repository.

A repository says how it is run in ``specpilot-system.json`` at its root:

- ``{"adapter": "python", "module": "system.py"}``: a Python module in the checkout defines
  ``class System`` with ``__init__(self, device)``, ``generate(self, prompt_ids, max_new_tokens,
  on_token)`` calling ``on_token(token_id)`` as each output token is ready, and, on the stock system,
  ``generate_ar(self, prompt_ids, max_new_tokens) -> list[int]`` and ``scorer(self)`` returning a
  token-forcing ``Scorer``. Any git repo with such a module can be optimized, which is how the tests
  run rounds on the pure-torch engine.
- ``{"adapter": "sglang", "server_args": [...]}`` (the default when the file is absent): the commit
  is exported as an importable SGLang and served (``specpilot_mem.sglang.adapter.SGLangSystem``).

The controller, not the system, reads the clock: a request's timestamps are taken when the system
hands over its tokens, so a system cannot report a rate it did not achieve. Rounds run every system
in a worker process of its own (``specpilot_mem.controller.pool``); ``PythonSystem`` here is how the
judge opens stock for its scorer, AR outputs and tokenizer, and how a system is served in-process.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specpilot_mem.controller.requests import Request
from specpilot_mem.controller.system import RequestOutput
from specpilot_mem.errors import RoundError

SYSTEM_FILE = "specpilot-system.json"


def system_spec(checkout: Path) -> dict[str, Any]:
    path = checkout / SYSTEM_FILE
    if not path.is_file():
        return {"adapter": "sglang", "server_args": []}
    try:
        spec = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RoundError(
            f"{SYSTEM_FILE} is not valid JSON: {err.msg}",
            where=f"{path}:{err.lineno}",
            fix='e.g. {"adapter": "python", "module": "system.py"}',
        ) from None
    if spec.get("adapter") not in ("python", "sglang"):
        raise RoundError(f"unknown adapter {spec.get('adapter')!r}", where=str(path), fix="use 'python' or 'sglang'")
    return spec


def load_system_module(checkout: Path, relative: str, name: str):
    """Import a checkout's system module (in the process that will run it: a pool worker, or the judge
    for stock's scorer)."""
    path = checkout / relative
    if not path.is_file():
        raise RoundError(
            f"system module {relative} is missing", where=str(checkout), fix=f"add it or fix {SYSTEM_FILE}"
        )
    module_name = f"specpilot_system_{name}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


class PythonSystem:
    """A ``System`` (controller protocol) backed by the ``System`` class of a checkout's module."""

    def __init__(self, name: str, checkout: Path, module: str):
        self.name = name
        self.module = load_system_module(checkout, module, name)
        self._instances: dict[str, Any] = {}

    def instance(self, device: str):
        if device not in self._instances:
            self._instances[device] = self.module.System(device)
        return self._instances[device]

    def run(self, requests: Sequence[Request], *, batch_size: int, device: str) -> list[RequestOutput]:
        if batch_size != 1:
            raise RoundError(
                f"system {self.name!r} serves one request at a time, not {batch_size}",
                where=SYSTEM_FILE,
                fix="use batch size 1 or an adapter that batches (sglang)",
            )
        system = self.instance(device)
        encode = getattr(system, "encode", None)
        outputs = []
        for request in requests:
            ids: list[int] = []
            times: list[float] = []

            def on_token(token: int, ids: list[int] = ids, times: list[float] = times) -> None:
                ids.append(int(token))
                times.append(time.perf_counter())

            start = time.perf_counter()
            system.generate(request.token_ids(encode), request.max_new_tokens, on_token)
            outputs.append(RequestOutput(request.id, tuple(ids), start, tuple(times)))
        return outputs

    def ar_outputs(self, requests: Sequence[Request], device: str) -> dict[str, RequestOutput]:
        system = self.instance(device)
        encode = getattr(system, "encode", None)
        return {
            r.id: RequestOutput(r.id, tuple(system.generate_ar(r.token_ids(encode), r.max_new_tokens)))
            for r in requests
        }

    def scorer(self, device: str):
        return self.instance(device).scorer()


def open_system(home, name: str, checkout: Path, commit: str) -> Any:
    """The system at ``commit`` (checked out at ``checkout``), as the controller's ``System``."""
    spec = system_spec(checkout)
    if spec["adapter"] == "python":
        return PythonSystem(name, checkout, spec.get("module", "system.py"))
    from specpilot_mem.sglang.adapter import SGLangSystem

    return SGLangSystem.from_commit(home, name, commit, spec.get("server_args", []))
