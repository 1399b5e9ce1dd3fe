"""The pure-torch engine (``specpilot_mem.engine``) as a controller ``System``.

The engine serves one request at a time, so only batch size 1 is accepted. Pass one engine per
device (e.g. ``{"cuda:0": e0, "cuda:1": e1}``) for a paired run over a device pool: each engine
owns its cache, so two devices can run at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext

import torch

from specpilot_mem.controller.requests import Request
from specpilot_mem.controller.system import RequestOutput
from specpilot_mem.errors import RoundError


class EngineSystem:
    def __init__(self, name: str, engines, *, mode: str = "spec", encode: Callable[[str], Sequence[int]] | None = None):
        self.name = name
        self.engines: Mapping[str, object] = engines if isinstance(engines, Mapping) else {str(engines.device): engines}
        self.mode = mode
        self.encode = encode

    def run(self, requests: Sequence[Request], *, batch_size: int, device: str) -> list[RequestOutput]:
        if batch_size != 1:
            raise RoundError(f"the pure-torch engine serves one request at a time, not {batch_size}",
                             where=f"system {self.name}", fix="time it at batch size 1")
        if device not in self.engines:
            raise RoundError(f"system {self.name!r} has no engine on {device}", where=f"system {self.name}",
                             fix=f"use one of {sorted(self.engines)} or pass an engine per device")
        engine = self.engines[device]
        batch = [{"prompt_ids": r.token_ids(self.encode), "max_new_tokens": r.max_new_tokens, "id": r.id} for r in requests]
        # a worker thread starts on cuda:0; CUDA graph capture and streams must use the engine's device
        on_device = torch.cuda.device(torch.device(device)) if device.startswith("cuda") else nullcontext()
        with on_device:
            generations = engine.generate(batch, mode=self.mode)
        # token_times are seconds from each request's own start
        return [RequestOutput(g.id, tuple(g.output_ids), 0.0, tuple(g.token_times)) for g in generations]
