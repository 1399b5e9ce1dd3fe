"""Ray as the pool's cluster backend: the same worker host, in one Ray actor per GPU.

``RayDevices(n, address=...)`` reserves a placement group of ``n`` bundles of one GPU each (spread over
the cluster's hosts by default), and pins one actor to each bundle. An actor is a device host: it runs
``ProcessDevices`` on its node (Ray sets ``CUDA_VISIBLE_DEVICES`` to its GPU, so its slot is
``cuda:0``), spawns the same worker processes, and times them with its own clock, so a paired run
over Ray has exactly the semantics of one over local processes. Sealed system folders travel to the
actor as bytes and are checked there against their tree id before a worker sees them. SpecPilot
(and, for the engine, its models) must be installed on every node, as SGLang is.

An actor that dies (its node lost, the process killed) surfaces as ``WorkerDied``: the driver starts
a new actor on the same bundle and re-runs the step once, then reports. With ``run_on="cpu"`` the
bundles still reserve GPUs (a cluster started with ``--num-gpus`` stands in for one on machines
without), but the workers compute on the CPU: how the tests run it.

Imported only when a pool of kind ``ray`` is asked for; Ray itself is the optional extra
``specpilot[ray]``.
"""

from __future__ import annotations

import io
import itertools
import os
import tarfile
from pathlib import Path

import ray
from ray.exceptions import GetTimeoutError, RayActorError, WorkerCrashedError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from specpilot_mem.controller.pool import PACKAGE_ROOT, ProcessDevices, WorkerDied
from specpilot_mem.errors import RoundError

PLACEMENT_TIMEOUT_S = 300.0


def _pack(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(folder, arcname=".")
    return buffer.getvalue()


class DeviceHost:
    """The actor body: one device of the pool, hosting worker processes for the systems it serves."""

    def __init__(self, run_on: str, sandbox: dict | None):
        from specpilot_mem.rounds.sandbox import Sandbox

        self.slot = "cuda:0" if run_on == "cuda" else "cpu:0"
        self.devices = ProcessDevices([self.slot], sandbox=Sandbox.from_dict(sandbox), pin_cpus=False)
        self.trees = self.devices.scratch / "sealed"
        self.workers: dict[int, object] = {}

    def _unpack(self, spec: dict, packed: bytes | None) -> dict:
        """A sealed folder sent as bytes, written once per tree and checked against its tree id here."""
        if packed is None:
            return spec
        from specpilot_mem.rounds.seal import directory_tree_id, verify_sealed

        dest = self.trees / spec["tree"]
        if not dest.is_dir():
            scratch = self.trees / f".{spec['tree']}-{os.getpid()}"
            scratch.mkdir(parents=True)
            with tarfile.open(fileobj=io.BytesIO(packed)) as tar:
                tar.extractall(scratch, filter="data")
            if directory_tree_id(scratch) != spec["tree"]:
                raise RoundError(
                    f"the sealed tree {spec['tree']} arrived with other bytes",
                    where=self.slot,
                    fix="resend it; nothing is measured on other bytes",
                )
            os.replace(scratch, dest)
        verify_sealed(dest, spec["tree"])
        return {**spec, "checkout": str(dest)}

    def start(self, worker_id: int, spec: dict, warmup: list[dict], packed: bytes | None) -> None:
        self.workers[worker_id] = self.devices.start(self._unpack(spec, packed), self.slot, warmup)

    def wait_opened(self, worker_id: int) -> dict:
        return self.devices.wait_opened(self.workers[worker_id])

    def pause(self, worker_id: int) -> None:
        self.devices.pause(self.workers[worker_id])

    def resume(self, worker_id: int) -> None:
        self.devices.resume(self.workers[worker_id])

    def run(self, worker_id: int, prompts: list[dict], batch_size: int, timeout_s: float) -> list[tuple]:
        return self.devices.run(self.workers[worker_id], prompts, batch_size, timeout_s)

    def close(self, worker_id: int) -> None:
        worker = self.workers.pop(worker_id, None)
        if worker is not None:
            self.devices.close(worker)

    def placement(self) -> dict:
        context = ray.get_runtime_context()
        return {
            "backend": "ray",
            "node_id": context.get_node_id(),
            "host": os.uname().nodename,
            "ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "device": self.slot,
            "pid": os.getpid(),
        }


class RayDevices:
    """``n`` device slots (``gpu:0`` ... ``gpu:n-1``), each a ``DeviceHost`` actor pinned to one GPU bundle."""

    kind = "ray"

    def __init__(
        self,
        n: int,
        *,
        address: str | None = None,
        run_on: str = "cuda",
        strategy: str = "SPREAD",
        sandbox=None,
        call_timeout_s: float = 3600.0,
    ):
        if run_on not in ("cuda", "cpu"):
            raise RoundError(f"run_on must be 'cuda' or 'cpu', not {run_on!r}", where="pool", fix="use cuda")
        if not ray.is_initialized():
            paths = [str(PACKAGE_ROOT), str(PACKAGE_ROOT / "kernels"), os.environ.get("PYTHONPATH", "")]
            ray.init(
                address=address or "auto",
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}},
            )
        self.slots = [f"gpu:{i}" for i in range(n)]
        self.run_on = run_on
        self.sandbox = sandbox.to_dict() if sandbox is not None and hasattr(sandbox, "to_dict") else None
        self.call_timeout_s = call_timeout_s
        self.group = placement_group([{"GPU": 1, "CPU": 1} for _ in self.slots], strategy=strategy)
        try:
            ray.get(self.group.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except GetTimeoutError:
            remove_placement_group(self.group)
            raise RoundError(
                f"Ray could not place {n} one-GPU bundles ({strategy}) in {PLACEMENT_TIMEOUT_S:.0f} s",
                where=f"ray cluster {address or 'auto'}",
                fix=f"check `ray status`: the cluster needs {n} free GPUs (and a CPU each)",
            ) from None
        self.actors = {slot: self._actor(i) for i, slot in enumerate(self.slots)}
        self.generation = dict.fromkeys(self.slots, 0)  # bumped when a slot's actor is replaced
        self.started: dict[int, tuple] = {}
        self.renewed: dict[int, int] = {}
        self.ids = itertools.count()
        self.packed: dict[str, bytes] = {}
        self._placement = {slot: self._placed(slot) for slot in self.slots}

    def _placed(self, slot: str) -> dict:
        """Where ``slot``'s actor runs; an actor that dies while starting is replaced once."""
        try:
            return self._call(slot, self.actors[slot].placement)
        except WorkerDied:
            self._replace_actor(slot)
            return self._call(slot, self.actors[slot].placement)

    def _actor(self, index: int):
        strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index)
        return (
            ray.remote(num_gpus=1, num_cpus=1, max_restarts=0)(DeviceHost)
            .options(scheduling_strategy=strategy)
            .remote(self.run_on, self.sandbox)
        )

    def _call(self, slot: str, method, *args, timeout_s: float | None = None):
        try:
            return ray.get(method.remote(*args), timeout=timeout_s or self.call_timeout_s)
        except (RayActorError, WorkerCrashedError) as err:
            raise WorkerDied(
                f"the Ray actor of {slot} died: {str(err).splitlines()[0][:300]}",
                where=f"ray {slot}",
                fix="check the node's logs (`ray logs`); a step whose actor dies twice is not re-run",
            ) from None
        except ray.exceptions.RayTaskError as err:
            cause = err.cause if isinstance(getattr(err, "cause", None), Exception) else None
            if isinstance(cause, RoundError):
                raise cause from None
            raise RoundError(
                f"the Ray actor of {slot} failed: {str(err).splitlines()[0][:500]}",
                where=f"ray {slot}",
                fix="see the actor's log",
            ) from None

    def _replace_actor(self, slot: str) -> None:
        ray.kill(self.actors[slot])
        self.actors[slot] = self._actor(self.slots.index(slot))
        self.generation[slot] += 1

    def start(self, spec: dict, slot: str, warmup: list[dict]):
        worker_id = next(self.ids)
        packed = None
        if spec.get("checkout") and spec.get("tree"):
            packed = self.packed.setdefault(spec["tree"], _pack(Path(spec["checkout"])))
        self.started[worker_id] = (spec, warmup, packed)
        try:
            self._call(slot, self.actors[slot].start, worker_id, spec, warmup, packed)
        except WorkerDied:  # the actor is gone: a new one on the same bundle
            self._replace_actor(slot)
            self._call(slot, self.actors[slot].start, worker_id, spec, warmup, packed)
        return slot, worker_id, self.generation[slot]

    def wait_opened(self, worker) -> dict:
        slot, worker_id, _ = worker
        return self._call(slot, self.actors[slot].wait_opened, worker_id)

    def pause(self, worker) -> None:
        slot, worker_id, generation = worker
        if generation == self.generation[slot]:
            self._call(slot, self.actors[slot].pause, worker_id)

    def resume(self, worker) -> None:
        slot, worker_id, generation = worker
        if generation != self.generation[slot]:  # started on an actor since replaced: start it again, untimed
            spec, warmup, packed = self.started[worker_id]
            self._call(slot, self.actors[slot].start, worker_id, spec, warmup, packed)
            self._call(slot, self.actors[slot].wait_opened, worker_id)
            self.renewed[worker_id] = self.generation[slot]
        self._call(slot, self.actors[slot].resume, worker_id)

    def run(self, worker, prompts: list[dict], batch_size: int, timeout_s: float) -> list[tuple]:
        slot, worker_id, _ = worker
        return self._call(
            slot, self.actors[slot].run, worker_id, prompts, batch_size, timeout_s, timeout_s=timeout_s + 60
        )

    def close(self, worker) -> None:
        slot, worker_id, generation = worker
        self.started.pop(worker_id, None)
        if self.renewed.pop(worker_id, generation) != self.generation[slot]:
            return  # it lived on an actor that is gone
        try:
            self._call(slot, self.actors[slot].close, worker_id, timeout_s=120)
        except WorkerDied:
            self._replace_actor(slot)

    def kill_actor(self, slot: str) -> None:
        """End the actor of ``slot`` (what a lost node does); the driver's re-run replaces it."""
        ray.kill(self.actors[slot], no_restart=True)

    def placement(self) -> dict[str, dict]:
        return dict(self._placement)

    def shutdown(self) -> None:
        for actor in self.actors.values():
            ray.kill(actor)
        remove_placement_group(self.group)
