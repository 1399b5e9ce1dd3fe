"""Ray as the pool's cluster backend, on the CPU: actors pinned one per (stand-in) GPU, the same workers.

A local ``ray.init`` with two GPUs declared (CPU workers standing in for them), then a two-node
cluster on localhost (``ray start --head`` and a second ``ray start``), where the two bundles are
placed on different nodes. A killed actor is replaced and its step re-run once. Skipped, naming the
package, where Ray is not installed (``pip install 'specpilot[ray]'``, which CI's install does).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="needs Ray: pip install 'specpilot[ray]' (ray==2.60.0)")

from specpilot_mem.controller.pool import RepetitionPolicy, pool_paired_run  # noqa: E402
from specpilot_mem.controller.requests import Request  # noqa: E402
from specpilot_mem.rounds.seal import directory_tree_id  # noqa: E402
from test_rounds_e2e import FIXTURE  # noqa: E402

REQUESTS = [Request(f"dev-{i}", "synthetic", "dev", 4, prompt_ids=(2 + i, 40, 7)) for i in range(2)]
POLICY = RepetitionPolicy(repeats=2, warmup_requests=1, run_timeout_s=300)
START_TIMEOUT_S = 180

pytestmark = pytest.mark.slow


def _sealed(tmp_path, name: str, extra: str = "") -> dict:
    folder = tmp_path / name
    shutil.copytree(FIXTURE, folder)
    if extra:
        system = folder / "sglang" / "system.py"
        system.write_text(system.read_text() + textwrap.dedent(extra))
    return {
        "name": name,
        "adapter": "python",
        "checkout": str(folder),
        "module": "sglang/system.py",
        "tree": directory_tree_id(folder),
    }


def _environment() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, os.path.join(root, "kernels"), env.get("PYTHONPATH", "")])
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # The nodes must run in the driver's auth mode: a driver in token mode refuses the GCS's calls to it (the
    # owner of the actors), and the GCS then destroys every actor it creates as orphaned ("died unexpectedly").
    env["RAY_AUTH_MODE"] = os.environ.get("RAY_AUTH_MODE", "disabled")
    env["RAY_worker_register_timeout_seconds"] = "300"  # a loaded CI machine starts Python workers slowly
    return env


@pytest.fixture
def local_ray(monkeypatch):
    # A local ray.init with the mode unset switches this whole process to token auth (and writes
    # ~/.ray/auth_token); the two-node cluster started later would then refuse its driver. An explicit mode
    # keeps every cluster of this process in one mode.
    monkeypatch.setenv("RAY_AUTH_MODE", os.environ.get("RAY_AUTH_MODE", "disabled"))
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": _environment()["PYTHONPATH"]}},
    )
    yield
    ray.shutdown()


def test_ray_actors_one_per_gpu_serve_a_paired_run_and_a_killed_actor_is_replaced(local_ray, tmp_path):
    from specpilot_mem.controller.ray_pool import RayDevices

    marker = tmp_path / "killed-once"
    stock = _sealed(tmp_path, "stock")
    # the first time it serves request dev-0, it kills the actor hosting it (what a lost node looks like)
    dies = _sealed(
        tmp_path,
        "kills-its-actor",
        f"""
        import os as _os, signal as _signal
        _generate = System.generate
        def _killing(self, prompt_ids, max_new_tokens, on_token):
            if list(prompt_ids)[:1] == [2] and not _os.path.exists({str(marker)!r}):
                open({str(marker)!r}, "w").close()
                _os.kill(_os.getppid(), _signal.SIGKILL)
            _generate(self, prompt_ids, max_new_tokens, on_token)
        System.generate = _killing
    """,
    )
    devices = RayDevices(2, run_on="cpu", strategy="PACK")
    try:
        placement = devices.placement()
        assert sorted(p["gpu_ids"][0] for p in placement.values()) == ["0", "1"]  # one (stand-in) GPU each
        run = pool_paired_run(devices, stock, {**stock, "name": "stock-b"}, REQUESTS, POLICY)
        assert [r.device for r in run.paired.runs_a] == ["gpu:0", "gpu:1"]
        assert [r.device for r in run.paired.runs_b] == ["gpu:1", "gpu:0"]
        first = {o.id: o.output_ids for o in run.paired.runs_a[0].outputs}
        assert all({o.id: o.output_ids for o in r.outputs} == first for r in (*run.paired.runs_a, *run.paired.runs_b))
        again = pool_paired_run(devices, stock, dies, REQUESTS, POLICY)
        assert marker.exists() and len(again.reruns) == 1 and "died" in again.reruns[0]["why"]
        assert all(
            {o.id: o.output_ids for o in r.outputs} == first for r in (*again.paired.runs_a, *again.paired.runs_b)
        )
    finally:
        devices.shutdown()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_node(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                "ray",
                "start",
                "--block",
                "--num-cpus=1",
                "--num-gpus=1",
                "--disable-usage-stats",
                "--node-ip-address=127.0.0.1",
                *args,
            ],
            env=_environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_started(node: subprocess.Popen, log: Path, deadline: float) -> None:
    while b"Ray runtime started" not in log.read_bytes():
        if time.monotonic() > deadline or node.poll() is not None:
            pytest.fail(f"a Ray node did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(1)


def _stop_node(node: subprocess.Popen) -> None:
    """Stop one node: its own process group (ray start --block and what it started), nothing else."""
    for signum, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(node.pid, signum)
        except ProcessLookupError:
            return
        try:
            node.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture
def two_node_cluster(tmp_path):
    if shutil.which("ray") is None:
        pytest.skip("needs the `ray` command: pip install 'specpilot[ray]'")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    logs = [tmp_path / "ray-head.log", tmp_path / "ray-second.log"]
    deadline = time.monotonic() + START_TIMEOUT_S
    nodes = [_start_node(["--head", f"--port={port}", "--include-dashboard=false"], logs[0])]
    try:
        _wait_started(nodes[0], logs[0], deadline)
        nodes.append(_start_node([f"--address={address}"], logs[1]))
        _wait_started(nodes[1], logs[1], deadline)
        ray.init(
            address=address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": _environment()["PYTHONPATH"]}}
        )
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            if time.monotonic() > deadline:
                pytest.fail(f"the second node did not join: {logs[1].read_text(errors='replace')[-2000:]}")
            time.sleep(1)
        yield address
    finally:
        ray.shutdown()
        threads = [threading.Thread(target=_stop_node, args=(node,)) for node in reversed(nodes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def test_two_nodes_on_localhost_place_one_bundle_on_each(two_node_cluster, tmp_path):
    from specpilot_mem.controller.ray_pool import RayDevices

    stock = _sealed(tmp_path, "stock")
    devices = RayDevices(2, address=two_node_cluster, run_on="cpu", strategy="STRICT_SPREAD")
    try:
        placement = devices.placement()
        assert len({p["node_id"] for p in placement.values()}) == 2  # across the two nodes
        run = pool_paired_run(devices, stock, {**stock, "name": "stock-b"}, REQUESTS, POLICY)
    finally:
        devices.shutdown()
    assert [r.device for r in run.paired.runs_a] == ["gpu:0", "gpu:1"]
    assert run.placement == placement
