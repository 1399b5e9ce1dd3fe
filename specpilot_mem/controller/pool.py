"""Paired runs with every system in its own worker process: the per-process device pool.

A pool is a list of device slots (``cuda:0``, ``cuda:1``; ``cuda:0#1`` for a second slot on one GPU;
``cpu:0``, ``cpu:1`` to rehearse without GPUs). Each system (stock, the current best, a candidate)
is served on a slot by a worker process of its own (``specpilot_mem.controller.worker``, spawned, its
own CUDA context), so no GIL or CUDA context couples two systems and candidate code never runs where
the timer and the verdict live. The host end here reads the clock: a request's start when it is handed
to the worker, each token when its message arrives (a reader thread per worker stamps it).

The schedule is ``paired.schedule``: one slot interleaves A B B A; two or more run A and B at once
on the first two slots, swapped A/B/B/A. With ``RepetitionPolicy.fresh_workers`` (the default) every
timed run gets a worker that serves nothing else, so a system cannot carry outputs from one run to
the next; all workers of a paired run are started and warmed up (on perturbed copies of the
requests) before the first timed run, and every worker that is not being timed is stopped (SIGSTOP):
an idle system cannot load the machine while the other one is timed. A worker that dies during a
run is replaced and its step run once more; a second death is reported.

``ProcessDevices`` spawns workers on this host; ``specpilot_mem.controller.ray_pool.RayDevices`` runs
the same host code in Ray actors, one per GPU of a cluster. Both give ``pool_paired_run`` and
``pool_stock_noise`` the same methods.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from specpilot_mem.controller.gains import Run
from specpilot_mem.controller.paired import Noise, PairedResult, schedule
from specpilot_mem.controller.requests import Request
from specpilot_mem.controller.system import RequestOutput
from specpilot_mem.errors import RoundError
from specpilot_mem.rounds.sandbox import scrubbed_environment

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
MAX_TOKEN_ID = 2**31 - 1


class WorkerDied(RoundError):
    """A worker process (or the Ray actor hosting it) ended while it was serving."""


@dataclass(frozen=True)
class RepetitionPolicy:
    """How a paired run repeats: part of every measurement's identity."""

    repeats: int = 2
    batch_sizes: tuple[int, ...] = (1,)
    fresh_workers: bool = True  # one worker per timed run: nothing carries over between runs
    warmup_requests: int | None = None  # perturbed warm-up requests per worker (None: one per request)
    run_timeout_s: float = 3600.0

    def to_dict(self) -> dict:
        return {**asdict(self), "batch_sizes": list(self.batch_sizes), "order": "ABBA"}


@dataclass
class PoolRun:
    """A paired run through worker processes, with where each run ran and what was re-run."""

    paired: PairedResult
    placement: dict[str, dict]
    reruns: list[dict] = field(default_factory=list)
    workers: int = 0
    info: dict[str, dict] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "paired": self.paired.to_dict(),
            "placement": self.placement,
            "reruns": self.reruns,
            "workers": self.workers,
            "info": self.info,
        }


class Devices(Protocol):
    """What the paired-run driver needs from a pool backend (``ProcessDevices``, ``RayDevices``)."""

    kind: str
    slots: list[str]

    def start(self, spec: dict, slot: str, warmup: list[dict]) -> Any: ...
    def wait_opened(self, worker: Any) -> dict: ...
    def pause(self, worker: Any) -> None: ...
    def resume(self, worker: Any) -> None: ...
    def run(self, worker: Any, prompts: list[dict], batch_size: int, timeout_s: float) -> list[tuple]: ...
    def close(self, worker: Any) -> None: ...
    def placement(self) -> dict[str, dict]: ...


# -- one worker process, host side ------------------------------------------------------------------


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it (from /proc): what a pause or a kill must reach."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _signal_tree(root: int, signum: int) -> None:
    for pid in process_tree(root):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    try:
        os.killpg(root, signum)
    except (ProcessLookupError, PermissionError):
        pass


class WorkerProcess:
    """A spawned worker (``python -m specpilot_mem.controller.worker``) and the clock that times it."""

    def __init__(
        self,
        spec: dict,
        slot: str,
        warmup: list[dict],
        *,
        sandbox=None,
        scratch: Path,
        cpus: set[int] | None = None,
        env: Mapping[str, str] | None = None,
    ):
        self.spec, self.slot, self.cpus = spec, slot, cpus
        self.home = Path(tempfile.mkdtemp(prefix="worker-", dir=scratch))
        self.log_path = self.home / "stderr.log"
        environment = scrubbed_environment(env)
        paths = [str(PACKAGE_ROOT), str(PACKAGE_ROOT / "kernels")]
        environment.update(
            PYTHONPATH=os.pathsep.join(
                paths + [p for p in environment.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
            ),
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONUNBUFFERED="1",
            SPECPILOT_WORKER_SLOT=slot,
        )
        command = [sys.executable, "-m", "specpilot_mem.controller.worker"]
        cwd = Path(spec.get("checkout") or self.home)
        if sandbox is not None and getattr(sandbox, "user", None):
            environment.update(HOME="/tmp", TMPDIR="/tmp")
            # the interpreter, its packages and SpecPilot may sit under a folder closed to the agent user
            expose = [Path(sys.base_prefix), Path(sys.prefix), *map(Path, site.getsitepackages()), PACKAGE_ROOT, cwd]
            argv = sandbox.command(shlex.join(command), cwd, expose=expose)
        else:
            environment.update(HOME=str(self.home), TMPDIR=str(self.home))
            argv = command
        if shutil.which("setpriv"):  # the worker tree dies with this process
            argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
        self.log = open(self.log_path, "wb")  # noqa: SIM115 -- the worker's stderr for its whole life; closed in close()
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            start_new_session=True,
        )
        self.messages: queue.Queue = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True, name=f"worker-{slot}")
        self.reader.start()
        self._send(op="open", spec=spec, device=slot, warmup=warmup)
        self.paused = False
        self.info: dict = {}

    def _read(self) -> None:
        from specpilot_mem.controller.worker import MAX_LINE

        stream = self.proc.stdout
        while True:
            line = stream.readline(MAX_LINE)
            arrived = time.perf_counter()
            if not line:
                self.messages.put((arrived, None))
                return
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                message = {"ev": "garbled", "text": line[:200].decode(errors="replace")}
            self.messages.put((arrived, message if isinstance(message, dict) else {"ev": "garbled"}))

    def _send(self, **message) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise self._died("while being sent a request") from None

    def _died(self, when: str) -> WorkerDied:
        try:  # its output ended: give it a moment to exit, so the exit code can be reported
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.log.flush()
        tail = self.log_path.read_text(errors="replace")[-1500:] if self.log_path.exists() else ""
        return WorkerDied(
            f"the worker of {self.spec.get('name', 'a system')} on {self.slot} ended {when} "
            f"(exit code {self.proc.returncode}): {tail.strip()}",
            where=f"worker {self.slot}",
            fix="see the worker's stderr above; a worker that dies twice in one step is not re-run",
        )

    def _next(self, deadline: float) -> tuple[float, dict]:
        try:
            arrived, message = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RoundError(
                f"the worker of {self.spec.get('name')} on {self.slot} did not answer in time",
                where=f"worker {self.slot}",
                fix="raise run_timeout_s or fix the system",
            ) from None
        if message is None:
            raise self._died("before answering")
        if message.get("ev") == "error":
            raise RoundError(
                f"system {self.spec.get('name')!r} failed on {self.slot}: {message.get('what')}",
                where=f"worker {self.slot}",
                fix="fix the system; its stderr is in the worker log",
            )
        return arrived, message

    def _expect(self, event: str, deadline: float) -> dict:
        _, message = self._next(deadline)
        if message.get("ev") != event:
            raise RoundError(
                f"worker on {self.slot} sent {message.get('ev')!r} where {event!r} was due",
                where=f"worker {self.slot}",
                fix="the worker protocol was broken; see its log",
            )
        return message

    def wait_opened(self, timeout_s: float = 1800.0) -> dict:
        self.info = self._expect("opened", time.monotonic() + timeout_s).get("info", {})
        if self.cpus:
            self._pin()
        return self.info

    def _pin(self) -> None:
        """Keep every thread of the worker tree on the slot's cores (fewer migrations, less noise)."""
        for pid in process_tree(self.proc.pid):
            for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else ():
                try:
                    os.sched_setaffinity(int(task), self.cpus)
                except OSError:
                    pass

    def pause(self) -> None:
        if not self.paused:
            _signal_tree(self.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            _signal_tree(self.proc.pid, signal.SIGCONT)
            self.paused = False

    def run(self, prompts: list[dict], batch_size: int, timeout_s: float) -> list[tuple]:
        """Serve ``prompts`` closed-loop with ``batch_size`` in flight; per request (ids, start, token times)."""
        deadline = time.monotonic() + timeout_s
        self._send(op="begin")
        self._expect("ready", deadline)
        ids: list[list[int]] = [[] for _ in prompts]
        times: list[list[float]] = [[] for _ in prompts]
        starts: list[float] = [0.0] * len(prompts)
        waiting, in_flight = deque(range(len(prompts))), set()

        def dispatch() -> None:
            index = waiting.popleft()
            in_flight.add(index)
            starts[index] = time.perf_counter()
            self._send(op="request", i=index, **prompts[index])

        for _ in range(min(batch_size, len(prompts))):
            dispatch()
        while in_flight:
            arrived, message = self._next(deadline)
            index = message.get("i")
            if index not in in_flight:
                raise RoundError(
                    f"worker on {self.slot} answered for request {index!r}, which is not in flight",
                    where=f"worker {self.slot}",
                    fix="the worker protocol was broken",
                )
            if message.get("ev") == "tokens":
                new = message.get("ids")
                if not isinstance(new, list) or not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in new):
                    raise RoundError(
                        f"worker on {self.slot} sent token ids that are not ids: {str(new)[:80]}",
                        where=f"worker {self.slot}",
                        fix="a system hands over integer token ids",
                    )
                ids[index].extend(new)
                times[index].extend([arrived] * len(new))
                if len(ids[index]) > prompts[index]["max_new_tokens"]:
                    raise RoundError(
                        f"system {self.spec.get('name')!r} returned more than "
                        f"{prompts[index]['max_new_tokens']} tokens",
                        where=f"worker {self.slot}",
                        fix="a system stops at max_new_tokens",
                    )
            elif message.get("ev") == "done":
                in_flight.discard(index)
                if not ids[index]:
                    raise RoundError(
                        f"system {self.spec.get('name')!r} returned no token for request {index}",
                        where=f"worker {self.slot}",
                        fix="every request needs at least one token",
                    )
                if waiting:
                    dispatch()
            else:
                raise RoundError(
                    f"worker on {self.slot} sent {message.get('ev')!r} during a run",
                    where=f"worker {self.slot}",
                    fix="the worker protocol was broken",
                )
        self._send(op="end")
        self.info = self._expect("ended", deadline).get("info", self.info)
        return [(tuple(ids[i]), starts[i], tuple(times[i])) for i in range(len(prompts))]

    def close(self) -> None:
        """End the worker and everything it started, and drop its scratch folder."""
        if self.proc.poll() is None:
            self.resume()
            try:
                self._send(op="exit")
                self.proc.wait(timeout=5)
            except (WorkerDied, subprocess.TimeoutExpired):
                pass
        _signal_tree(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)


# -- the process pool ----------------------------------------------------------------------------------


def slot_cpus(slots: Sequence[str]) -> dict[str, set[int]]:
    """Disjoint core sets, one per slot, from the cores this process may use."""
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // len(slots))
    return {
        slot: set(cores[(i * share) % len(cores) : (i * share) % len(cores) + share]) for i, slot in enumerate(slots)
    }


class ProcessDevices:
    """Workers spawned on this host, one slot per device; ``sandbox`` (``rounds.sandbox.Sandbox``)
    runs them as the unprivileged agent user with the round's secrets masked, where the machine allows."""

    kind = "process"

    def __init__(
        self,
        slots: Sequence[str],
        *,
        sandbox=None,
        scratch: Path | None = None,
        pin_cpus: bool = True,
        env: Mapping[str, str] | None = None,
    ):
        if not slots or len(set(slots)) != len(slots):
            raise RoundError(
                f"a pool needs distinct device slots, got {list(slots)}",
                where="devices",
                fix="e.g. cuda:0,cuda:1 or cuda:0#0,cuda:0#1 for two slots on one GPU",
            )
        self.slots = list(slots)
        self.sandbox = sandbox
        self._scratch = tempfile.TemporaryDirectory(prefix="specpilot-pool-") if scratch is None else None
        self.scratch = Path(self._scratch.name) if self._scratch else scratch
        if sandbox is not None and getattr(sandbox, "user", None):
            self.scratch.chmod(0o755)
        self.cpus = slot_cpus(self.slots) if pin_cpus else {}
        self.env = env

    def start(self, spec: dict, slot: str, warmup: list[dict]) -> WorkerProcess:
        return WorkerProcess(
            spec, slot, warmup, sandbox=self.sandbox, scratch=self.scratch, cpus=self.cpus.get(slot), env=self.env
        )

    def wait_opened(self, worker: WorkerProcess) -> dict:
        return worker.wait_opened()

    def pause(self, worker: WorkerProcess) -> None:
        worker.pause()

    def resume(self, worker: WorkerProcess) -> None:
        worker.resume()

    def run(self, worker: WorkerProcess, prompts: list[dict], batch_size: int, timeout_s: float) -> list[tuple]:
        return worker.run(prompts, batch_size, timeout_s)

    def close(self, worker: WorkerProcess) -> None:
        worker.close()

    def placement(self) -> dict[str, dict]:
        host = os.uname().nodename
        return {
            slot: {
                "backend": "process",
                "host": host,
                "device": slot.split("#", 1)[0],
                "cpus": sorted(self.cpus.get(slot, ())),
            }
            for slot in self.slots
        }

    def shutdown(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()


# -- the paired-run driver -----------------------------------------------------------------------------


def perturbed(request: Request) -> Request:
    """A warm-up copy of ``request``: the same length and limits, its prompt reversed, so warming up
    exercises the same shapes without serving the request itself."""
    if request.prompt_ids is not None:
        return replace(request, id=f"warmup-{request.id}", prompt_ids=tuple(reversed(request.prompt_ids)))
    return replace(request, id=f"warmup-{request.id}", prompt=(request.prompt or "")[::-1])


def wire_requests(requests: Sequence[Request], encode: Callable[[str], Sequence[int]] | None) -> list[dict]:
    """Requests as workers get them: token ids (encoded here, so no system chooses its own prompt
    tokens) or, without a tokenizer, the text; copies, so nothing a worker does reaches them."""
    rows = []
    for request in requests:
        if request.prompt_ids is not None or encode is not None:
            rows.append({"prompt_ids": request.token_ids(encode), "max_new_tokens": request.max_new_tokens})
        else:
            rows.append({"prompt": request.prompt, "max_new_tokens": request.max_new_tokens})
    return rows


def _check_spec(spec: dict) -> None:
    if not isinstance(spec.get("name"), str) or spec.get("adapter") not in ("python", "engine", "sglang"):
        raise RoundError(
            f"a pool system needs a name and an adapter (python, engine, sglang): {spec}",
            where="system spec",
            fix='e.g. {"name": "stock", "adapter": "engine", "model": "default"}',
        )


def pool_paired_run(
    devices: Devices,
    a: dict,
    b: dict,
    requests: Sequence[Request],
    policy: RepetitionPolicy,
    *,
    encode: Callable[[str], Sequence[int]] | None = None,
    on_run: Callable[[Run], None] | None = None,
) -> PoolRun:
    """Time system specs ``a`` and ``b`` on ``requests`` per ``paired.schedule``, each in its own workers."""
    for spec in (a, b):
        _check_spec(spec)
    if not requests:
        raise RoundError("a paired run needs requests", where="requests", fix="load a request set")
    if not policy.batch_sizes or any(size < 1 for size in policy.batch_sizes):
        raise RoundError(
            f"bad batch sizes {list(policy.batch_sizes)}", where="batch_sizes", fix="use positive integers"
        )
    steps = schedule(policy.repeats, devices.slots)
    per_repeat = len(steps) // policy.repeats
    specs = {"a": a, "b": b}
    prompts = wire_requests(requests, encode)
    count = len(requests) if policy.warmup_requests is None else policy.warmup_requests
    warmup = wire_requests([perturbed(r) for r in requests[:count]], encode)
    # (which, slot, repeat, batch size) of every timed run, and the worker that serves it
    runs = [
        (which, slot, index // per_repeat, size)
        for index, step in enumerate(steps)
        for size in policy.batch_sizes
        for which, slot in step
    ]
    key = (lambda r: r) if policy.fresh_workers else (lambda r: (r[0], r[1]))
    workers: dict = {}
    opened = 0
    info: dict[str, dict] = {}

    def start(run_key) -> Any:
        which, slot = run_key[0], run_key[1]
        return devices.start(specs[which], slot, warmup)

    def open_all(pending: dict) -> None:
        nonlocal opened
        try:
            with ThreadPoolExecutor(max_workers=max(1, min(len(pending), os.cpu_count() or 1))) as pool:
                for (run_key, worker), got in zip(pending.items(), pool.map(devices.wait_opened, pending.values())):
                    info[f"{specs[run_key[0]]['name']}@{run_key[1]}"] = got
                    devices.pause(worker)
                    opened += 1
        except BaseException:
            for worker in pending.values():
                devices.close(worker)
            raise

    try:
        for run in runs:
            if key(run) not in workers:
                workers[key(run)] = start(run)
        open_all(workers)
        collected: dict[str, list[Run]] = {"a": [], "b": []}
        reruns: list[dict] = []
        for index, step in enumerate(steps):
            repeat = index // per_repeat
            for size in policy.batch_sizes:
                jobs = [(which, slot, repeat, size) for which, slot in step]
                for attempt in (1, 2):
                    try:
                        finished = _timed_step(devices, workers, key, jobs, specs, prompts, requests, policy)
                        break
                    except WorkerDied as died:
                        if attempt == 2:
                            raise WorkerDied(
                                f"{died.what} (again, after a re-run of repeat {repeat})",
                                where=died.where,
                                fix=died.fix,
                            ) from None
                        reruns.append(
                            {
                                "repeat": repeat,
                                "batch_size": size,
                                "slots": [j[1] for j in jobs],
                                "why": died.what[:500],
                            }
                        )
                        fresh = {}
                        for job in jobs:
                            devices.close(workers.pop(key(job)))
                            workers[key(job)] = fresh[key(job)] = start(job)
                        open_all(fresh)
                for which, run in finished:
                    collected[which].append(run)
                    if on_run is not None:
                        on_run(run)
                if policy.fresh_workers:
                    for job in jobs:
                        devices.close(workers.pop(key(job)))
    finally:
        for worker in workers.values():
            devices.close(worker)
    paired = PairedResult(a["name"], b["name"], tuple(collected["a"]), tuple(collected["b"]))
    return PoolRun(paired, devices.placement(), reruns, opened, info)


def _timed_step(
    devices: Devices,
    workers: dict,
    key,
    jobs: list[tuple],
    specs: dict,
    prompts: list[dict],
    requests: Sequence[Request],
    policy: RepetitionPolicy,
) -> list[tuple[str, Run]]:
    """One step of the schedule: its runs at once (one per slot), every other worker stopped."""
    chosen = [workers[key(job)] for job in jobs]
    for worker in chosen:
        devices.resume(worker)

    def serve(job_and_worker) -> tuple[str, Run]:
        (which, slot, repeat, size), worker = job_and_worker
        served = devices.run(worker, prompts, size, policy.run_timeout_s)
        outputs = tuple(RequestOutput(r.id, ids, start, times) for r, (ids, start, times) in zip(requests, served))
        return which, Run(specs[which]["name"], slot, size, repeat, outputs)

    try:
        if len(jobs) == 1:
            return [serve((jobs[0], chosen[0]))]
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            return list(pool.map(serve, zip(jobs, chosen)))
    finally:
        for worker in chosen:
            devices.pause(worker)


def pool_stock_noise(
    devices: Devices,
    stock: dict,
    requests: Sequence[Request],
    policy: RepetitionPolicy,
    *,
    encode: Callable[[str], Sequence[int]] | None = None,
) -> tuple[Noise, PoolRun]:
    """|gain - 1| of stock over a second copy of itself, each copy in its own workers."""
    run = pool_paired_run(devices, stock, {**stock, "name": f"{stock['name']}-b"}, requests, policy, encode=encode)
    estimate = run.paired.gain(requests)
    return Noise(abs(estimate.gain - 1.0), estimate, run.paired), run


def open_devices(pool: Mapping[str, Any], slots: Sequence[str], *, sandbox=None) -> Devices:
    """The pool backend a job names: ``{"kind": "process"}`` or ``{"kind": "ray", "address": ...}``.
    Ray is imported only here, only when asked for."""
    kind = pool.get("kind", "process")
    if kind == "process":
        return ProcessDevices(slots, sandbox=sandbox, pin_cpus=pool.get("pin_cpus", True))
    if kind == "ray":
        try:
            from specpilot_mem.controller.ray_pool import RayDevices
        except ImportError as err:
            if "ray" not in str(err):
                raise
            raise RoundError(
                f"a Ray pool needs Ray, which does not import here ({err})",
                where="pool",
                fix="pip install 'specpilot[ray]' (pins ray==2.60.0), or use the process pool",
            ) from None

        return RayDevices(
            len(slots),
            address=pool.get("address"),
            run_on=pool.get("run_on", "cuda"),
            strategy=pool.get("strategy", "SPREAD"),
            sandbox=sandbox,
        )
    raise RoundError(f"unknown pool {kind!r}", where="pool", fix="use 'process' or 'ray'")
