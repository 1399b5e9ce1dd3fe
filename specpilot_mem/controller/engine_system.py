"""The pure-torch engine (``specpilot_mem.engine``) as a controller ``System``.

The engine serves one request at a time, so only batch size 1 is accepted. Pass one engine per
device (e.g. ``{"cuda:0": e0, "cuda:1": e1}``) for a paired run over a device pool: each engine
owns its cache and CUDA graphs and makes its own GPU current while it works, so engines on two
devices can serve from two threads at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from specpilot_mem.controller.requests import Request
from specpilot_mem.controller.system import RequestOutput
from specpilot_mem.errors import RoundError


def _on(device: str, engine_device: torch.device) -> bool:
    """Whether an engine on ``engine_device`` serves pool slot ``device`` ("cuda" means cuda:0; "cpu:1"
    names a second CPU slot, for rehearsing a pool without GPUs)."""
    wanted = torch.device(device)
    if wanted.type != engine_device.type:
        return False
    return wanted.type == "cpu" or (wanted.index or 0) == engine_device.index


class EngineSystem:
    def __init__(self, name: str, engines, *, mode: str = "spec", encode: Callable[[str], Sequence[int]] | None = None):
        self.name = name
        self.engines: Mapping[str, object] = engines if isinstance(engines, Mapping) else {str(engines.device): engines}
        misplaced = [
            f"{slot} (engine on {engine.device})"
            for slot, engine in self.engines.items()
            if not _on(slot, engine.device)
        ]
        if misplaced:
            raise RoundError(
                f"system {name!r} lists engines under the wrong device: {', '.join(misplaced)}",
                where=f"system {name}",
                fix="key each engine by the device its weights are on",
            )
        if len({id(engine) for engine in self.engines.values()}) < len(self.engines):
            # two pool slots would drive one cache from two threads at once
            raise RoundError(
                f"system {name!r} lists one engine under several devices",
                where=f"system {name}",
                fix="give each device its own engine (Engine.with_options() makes one over the same weights)",
            )
        self.mode = mode
        self.encode = encode

    def run(self, requests: Sequence[Request], *, batch_size: int, device: str) -> list[RequestOutput]:
        if batch_size != 1:
            raise RoundError(
                f"the pure-torch engine serves one request at a time, not {batch_size}",
                where=f"system {self.name}",
                fix="time it at batch size 1",
            )
        if device not in self.engines:
            raise RoundError(
                f"system {self.name!r} has no engine on {device}",
                where=f"system {self.name}",
                fix=f"use one of {sorted(self.engines)} or pass an engine per device",
            )
        batch = [
            {"prompt_ids": r.token_ids(self.encode), "max_new_tokens": r.max_new_tokens, "id": r.id} for r in requests
        ]
        generations = self.engines[device].generate(batch, mode=self.mode)
        # token_times are seconds from each request's own start; the engine has no stop tokens, so an output ends
        # at its limit ("length") unless an injected fault stops it earlier
        limits = {r.id: r.max_new_tokens for r in requests}
        return [
            RequestOutput(
                g.id,
                tuple(g.output_ids),
                0.0,
                tuple(g.token_times),
                "length" if len(g.output_ids) >= limits[g.id] else "stop_after",
            )
            for g in generations
        ]
