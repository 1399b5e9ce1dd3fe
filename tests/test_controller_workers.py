"""The per-process device pool on the CPU: every system in its own worker process, timed by the host.

Paired runs of the round fixture's system (seeded random engine, synthetic) through spawned workers:
A/B/B/A on one slot and over two slots, fresh workers per timed run, a worker that dies once re-run
and one that dies twice reported, protocol violations refused, the SGLang adapter served through a
worker against the SGLang stand-in server, and no Ray import unless a Ray pool is asked for. Timings
are not asserted (a shared 2-core machine); benchmarks/controller_pool_bench.py measures them.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

from specpilot_mem.controller.pool import (
    ProcessDevices,
    RepetitionPolicy,
    WorkerDied,
    open_devices,
    perturbed,
    pool_paired_run,
    pool_stock_noise,
)
from specpilot_mem.controller.requests import Request
from specpilot_mem.errors import RoundError
from test_rounds_e2e import FIXTURE

REQUESTS = [Request(f"dev-{i}", "synthetic", "dev", 5, prompt_ids=(2 + i, 40, 7)) for i in range(2)]
POLICY = RepetitionPolicy(repeats=2, warmup_requests=1)


def _spec(name: str, folder=FIXTURE, module: str = "sglang/system.py") -> dict:
    return {"name": name, "adapter": "python", "checkout": str(folder), "module": module}


def _system(tmp_path, name: str, extra: str) -> dict:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "system.py").write_text((FIXTURE / "sglang" / "system.py").read_text() + textwrap.dedent(extra))
    return _spec(name, folder, "system.py")


@pytest.fixture(scope="module")
def two_slots():
    devices = ProcessDevices(["cpu:0", "cpu:1"])
    yield devices
    devices.shutdown()


def test_pool_swaps_slots_abba_with_a_fresh_worker_per_run(two_slots):
    seen = []
    run = pool_paired_run(
        two_slots,
        _spec("stock"),
        _spec("stock-b"),
        REQUESTS,
        RepetitionPolicy(repeats=4, warmup_requests=1),
        on_run=seen.append,
    )
    # each slot serves A, B, B, A over four repeats; A and B run at once on different slots
    assert [r.device for r in run.paired.runs_a] == ["cpu:0", "cpu:1", "cpu:1", "cpu:0"]
    assert [r.device for r in run.paired.runs_b] == ["cpu:1", "cpu:0", "cpu:0", "cpu:1"]
    assert run.workers == 8 and len(seen) == 8 and run.reruns == []
    outputs = {o.id: o.output_ids for o in run.paired.runs_a[0].outputs}
    for each in (*run.paired.runs_a, *run.paired.runs_b):
        assert {o.id: o.output_ids for o in each.outputs} == outputs
        assert all(len(o.token_times) == 5 and o.token_times[0] > o.start and o.rate > 0 for o in each.outputs)
    assert run.paired.divergent() == []
    assert run.placement["cpu:0"]["cpus"] != run.placement["cpu:1"]["cpus"]


def test_one_slot_interleaves_and_noise_comes_from_two_copies_of_stock():
    devices = ProcessDevices(["cpu"])
    try:
        noise, run = pool_stock_noise(
            devices, _spec("stock"), REQUESTS, RepetitionPolicy(repeats=2, fresh_workers=False, warmup_requests=0)
        )
    finally:
        devices.shutdown()
    assert run.workers == 2  # one worker per system, kept for both repeats
    assert run.paired.a == "stock" and run.paired.b == "stock-b"
    assert [(r.system, r.repeat) for r in run.paired.runs_a] == [("stock", 0), ("stock", 1)]
    assert noise.noise == abs(noise.estimate.gain - 1.0)


def test_a_worker_that_dies_is_replaced_once_then_reported(tmp_path):
    marker = tmp_path / "died-once"
    once = _system(
        tmp_path,
        "dies-once",
        f"""
        import os as _os
        _generate = System.generate
        def _dying(self, prompt_ids, max_new_tokens, on_token):
            if list(prompt_ids)[:1] == [2] and not _os.path.exists({str(marker)!r}):
                open({str(marker)!r}, "w").close()
                _os._exit(3)
            _generate(self, prompt_ids, max_new_tokens, on_token)
        System.generate = _dying
    """,
    )
    devices = ProcessDevices(["cpu"], pin_cpus=False)
    try:
        run = pool_paired_run(devices, _spec("stock"), once, REQUESTS, POLICY)
        assert len(run.reruns) == 1 and "exit code 3" in run.reruns[0]["why"] and run.reruns[0]["repeat"] == 0
        assert len(run.paired.runs_b) == 2
        always = _system(
            tmp_path,
            "dies-always",
            """
            import os as _os
            _generate = System.generate
            def _dying(self, prompt_ids, max_new_tokens, on_token):
                if list(prompt_ids)[:1] == [2]:  # a timed request, not its warm-up copy
                    _os._exit(4)
                _generate(self, prompt_ids, max_new_tokens, on_token)
            System.generate = _dying
        """,
        )
        always = {**always, "name": "dies-always"}
        with pytest.raises(WorkerDied, match=r"exit code 4.*again, after a re-run"):
            pool_paired_run(devices, _spec("stock"), always, REQUESTS, POLICY)
    finally:
        devices.shutdown()


def test_a_system_that_breaks_the_protocol_is_refused(tmp_path):
    greedy = _system(
        tmp_path,
        "greedy",
        """
        _generate = System.generate
        def _more(self, prompt_ids, max_new_tokens, on_token):
            _generate(self, prompt_ids, max_new_tokens, on_token)
            on_token(1)  # one token more than asked for
        System.generate = _more
    """,
    )
    liar = _system(
        tmp_path,
        "liar",
        """
        def _not_ids(self, prompt_ids, max_new_tokens, on_token):
            on_token(-5)
        System.generate = _not_ids
    """,
    )
    devices = ProcessDevices(["cpu"], pin_cpus=False)
    try:
        with pytest.raises(RoundError, match="more than 5 tokens"):
            pool_paired_run(devices, _spec("stock"), greedy, REQUESTS, POLICY)
        with pytest.raises(RoundError, match="not ids"):
            pool_paired_run(devices, _spec("stock"), liar, REQUESTS, POLICY)
        with pytest.raises(RoundError, match="needs a name and an adapter"):
            pool_paired_run(devices, {"adapter": "python"}, liar, REQUESTS, POLICY)
    finally:
        devices.shutdown()
    with pytest.raises(RoundError, match="distinct device slots"):
        ProcessDevices(["cuda:0", "cuda:0"])
    with pytest.raises(RoundError, match="unknown pool"):
        open_devices({"kind": "carrier-pigeon"}, ["cpu"])


def test_warm_up_requests_are_perturbed_copies():
    warm = perturbed(REQUESTS[0])
    assert warm.prompt_ids == (7, 40, 2) and warm.max_new_tokens == 5 and warm.id != REQUESTS[0].id
    text = perturbed(Request("t", "prose", "dev", 3, prompt="abc"))
    assert text.prompt == "cba"


def test_the_sglang_adapter_is_served_through_a_worker(tmp_path, monkeypatch):
    from test_sglang_adapter import FAKE_LAUNCH_SERVER

    export = tmp_path / "export"
    (export / "sglang").mkdir(parents=True)
    (export / "sglang" / "__init__.py").write_text("")
    (export / "sglang" / "launch_server.py").write_text(FAKE_LAUNCH_SERVER)
    monkeypatch.setenv("FAKE_ARGV_LOG", str(tmp_path / "argv.json"))
    spec = {
        "adapter": "sglang",
        "export_dir": str(export),
        "server_args": ["--model-path", "toy"],
        "startup_timeout": 120,
    }
    requests = [Request(f"r{i}", "synthetic", "dev", 7, prompt_ids=(i + 1, 2, 3)) for i in range(3)]
    devices = ProcessDevices(["cuda:3"], pin_cpus=False)
    try:
        run = pool_paired_run(
            devices,
            {**spec, "name": "stock"},
            {**spec, "name": "candidate"},
            requests,
            RepetitionPolicy(repeats=2, batch_sizes=(2,)),
        )
    finally:
        devices.shutdown()
    loader = importlib.util.spec_from_file_location("toy_server", export / "sglang" / "launch_server.py")
    toy = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(toy)
    for each in (*run.paired.runs_a, *run.paired.runs_b):
        assert each.batch_size == 2
        assert [list(o.output_ids) for o in each.outputs] == [toy.greedy(list(r.prompt_ids), 7) for r in requests]
        # chunks of 1, 2, 3 tokens, each stamped on arrival by the host: 7 tokens in 4 chunks
        assert all(len(set(o.token_times)) == 4 and o.rate > 0 for o in each.outputs)
    assert '"cuda": "3"' in (tmp_path / "argv.json").read_text()


def test_no_ray_import_unless_a_ray_pool_is_asked_for():
    code = (
        "import sys; from specpilot_mem.controller.pool import open_devices; import specpilot_mem.rounds.controller; "
        "d = open_devices({'kind': 'process'}, ['cpu']); print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_missing_ray_is_a_clear_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "specpilot_mem.controller.ray_pool", raising=False)
    with pytest.raises(RoundError, match=r"specpilot\[ray\]"):
        open_devices({"kind": "ray"}, ["gpu:0"])


def test_round_start_names_its_pool():
    from argparse import Namespace

    from specpilot_mem.commands.round import _devices, _pool

    assert _devices(Namespace(pool="process", devices="cuda:0#0,cuda:0#1")) == ["cuda:0#0", "cuda:0#1"]
    assert _devices(Namespace(pool="ray", devices="3")) == ["gpu:0", "gpu:1", "gpu:2"]
    assert _pool(Namespace(pool="ray", address="10.0.0.1:6379")) == {"kind": "ray", "address": "10.0.0.1:6379"}
    assert _pool(Namespace(pool="process", address=None)) == {"kind": "process"}
    with pytest.raises(RoundError, match="number of GPUs"):
        _devices(Namespace(pool="ray", devices="cuda:0"))
    with pytest.raises(RoundError, match="names a Ray cluster"):
        _pool(Namespace(pool="process", address="10.0.0.1:6379"))
