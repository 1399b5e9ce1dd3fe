"""A whole round end to end with scripted agents, on a small git repo whose system is the pure-torch engine.

Four directions: faster by construction (promoted, merged, distilled into an entry that reproduces),
lossy (rejected by token forcing), slower (measured, not promoted), and one that edits the
controller's files (rejected before measuring). Then the same round again with a crash injected in
every phase, resumed each time: the same final state, and no measurement taken twice.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
import shutil
from collections import Counter
from pathlib import Path

import pytest

from specpilot_mem.errors import RoundError
from specpilot_mem.git import Repo, init_repo
from specpilot_mem.home import Home
from specpilot_mem.models import DeploymentRecord
from specpilot_mem.rounds.agents.scripted import ScriptedAgent
from specpilot_mem.rounds.files import RoundDir
from specpilot_mem.rounds.models import RoundConfig
from specpilot_mem.rounds.runner import RoundRunner
from specpilot_mem.rounds.sandbox import Sandbox
from specpilot_mem.store import init_memory, load_entries
from specpilot_mem.store.records import dump_record, write_atomic
from specpilot_mem.store.resolver import apply_entries

FIXTURE = Path(__file__).parent / "fixtures" / "round_system"
DEPLOYMENT = "engine-cpu"


def _settings(task, **changes) -> None:
    """Set module constants of the system (``TOKEN_SLEEP_S=0.0``), each on its own line."""
    path = task.workdir / "sglang" / "system.py"
    lines = path.read_text().splitlines(keepends=True)
    for name, value in changes.items():
        index = next(i for i, line in enumerate(lines) if line.startswith(f"{name} = "))
        lines[index] = f"{name} = {value!r}\n"
    path.write_text("".join(lines))


def _headroom(task, headroom: float, evidence: str = "timing") -> None:
    (task.workdir / ".specpilot-agent" / "headroom.json").write_text(
        json.dumps({"evidence": evidence, "headroom": headroom, "overhead": 0.0, "gpu_minutes_to_measure": 0.1})
    )


def master(task) -> str:
    plan = {
        "summary": "per-token overhead dominates; try removing it",
        "directions": [
            {"id": d, "title": t, "idea": t, "factor": "overhead", "headroom": 0.3, "cheapest_evidence": "timing"}
            for d, t in (
                ("faster", "drop the per-token sleep"),
                ("lossy", "drop the sleep and bias the logits"),
                ("slower", "sleep longer"),
                ("hacker", "edit the controller's files"),
            )
        ],
    }
    (task.workdir / "directions.yaml").write_text(json.dumps(plan))
    return "planned four directions"


def faster(task) -> str:
    _headroom(task, 0.5)
    _settings(task, TOKEN_SLEEP_S=0.0)
    (task.workdir / ".specpilot-agent" / "entry.yaml").write_text(
        "title: No per-token sleep\nsummary: Removes the per-token sleep of the test system.\n"
        "limits: [test system only]\n"
    )
    return "removed the sleep"


def lossy(task) -> str:
    _headroom(task, 0.5)
    _settings(task, EXTRA_SLEEP_S=0.0, FAULT_AFTER=1)
    return "faster, with a logit bias"


def slower(task) -> str:
    _headroom(task, 0.05)
    _settings(task, EXTRA_SLEEP_S=0.04)
    return "slower"


def hacker(task) -> str:
    _headroom(task, 0.5)
    (task.workdir / "controller" / "README.md").write_text("measure nothing\n")
    _settings(task, TOKEN_SLEEP_S=0.0)
    return "edited the controller"


def nothing(task) -> str:
    return "nothing to do"


SCRIPTS = {
    "master": master,
    "faster": faster,
    "lossy": lossy,
    "slower": slower,
    "hacker": hacker,
    "integration": nothing,
    "kernel": nothing,
}


def make_home(root: Path) -> tuple[Home, RoundConfig]:
    system = root / "system"
    shutil.copytree(FIXTURE, system)
    repo = init_repo(system)
    repo.git("add", "--all")
    repo.git("commit", "-q", "-m", "stock system")
    home = Home(root / "home")
    home.entries.mkdir(parents=True)
    init_memory(home, fork_url=str(system), stock_rev="HEAD")
    fork = Repo(home.fork)
    stock = fork.rev_parse("refs/heads/stock")
    fork.update_refs({f"refs/heads/deploy/{DEPLOYMENT}": (None, stock)}, "deploy")
    record = DeploymentRecord(
        name=DEPLOYMENT,
        gpu="cpu",
        arch="cpu",
        model="random-hybrid",
        drafter="block",
        regime="single",
        batch_sizes=[1],
        entries=[],
        base=stock,
        branch=f"deploy/{DEPLOYMENT}",
        tree=fork.rev_parse(f"{stock}^{{tree}}"),
        created=dt.date(2026, 11, 30),
    )
    write_atomic(home.rounds / DEPLOYMENT / "deployment.yaml", dump_record(record))
    rng = random.Random(0)
    requests = root / "requests" / "set.jsonl"
    requests.parent.mkdir()
    rows = [
        {
            "id": f"{split}-{i}",
            "benchmark": "synthetic",
            "split": split,
            "max_new_tokens": 12,
            "prompt_ids": [rng.randrange(512) for _ in range(8)],
        }
        for split, n in (("dev", 4), ("unseen", 4))
        for i in range(n)
    ]
    requests.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # 12-token outputs keep this round fast; no token-forcing sample that small can have power, so the sealed
    # final reports its inconclusive verdict instead of refusing on it, and skips the long-output pass.
    config = RoundConfig(
        system_repo=str(home.fork),
        requests=str(requests),
        devices=["cpu"],
        repeats=2,
        noise_repeats=2,
        agent={"backend": "scripted"},
        warmup_requests=1,
        sealed_long_outputs=False,
        sealed_require_conclusive=False,
    )
    return home, config


def final_state(home: Home) -> dict:
    round_dir = RoundDir.of(home, DEPLOYMENT, 1)
    state = round_dir.load_state()
    fork = Repo(home.fork)
    return {
        "done": state.done,
        "directions": {d.spec.id: d.status for d in round_dir.directions()},
        "promotions": [p.direction for p in round_dir.load_promotions().promotions],
        "final_tree": fork.rev_parse(f"{state.best}^{{tree}}"),
        "lineage_tree": fork.rev_parse(f"refs/heads/{state.lineage}^{{tree}}"),
        "sealed": (state.sealed or {}).get("accepted"),
        "distilled": state.distilled,
    }


@pytest.fixture(scope="module")
def clean_round(tmp_path_factory):
    home, config = make_home(tmp_path_factory.mktemp("clean"))
    runner = RoundRunner.start(home, DEPLOYMENT, config, ScriptedAgent(SCRIPTS), sandbox=Sandbox(None))
    runner.run()
    return home


def test_round_decides_each_direction_by_the_rules(clean_round):
    home = clean_round
    round_dir = RoundDir.of(home, DEPLOYMENT, 1)
    directions = {d.spec.id: d for d in round_dir.directions()}
    assert directions["faster"].status == "promoted"
    assert directions["lossy"].status == "rejected" and "token forcing rejected" in directions["lossy"].decision
    assert directions["slower"].status == "not-promoted"
    assert directions["hacker"].status == "rejected" and "controller/README.md" in directions["hacker"].decision
    assert directions["hacker"].measurements == []  # rejected before the controller ran it
    promotion = round_dir.load_promotions().promotions[0]
    assert promotion.gain >= 1.3 and promotion.ci_low > 1.0
    message = Repo(home.fork).out("log", "-1", "--format=%B", promotion.merge)
    # 4 dev requests x 12 tokens cannot show power: the verdict says so instead of "accept"
    assert "SpecPilot-Gain:" in message and "SpecPilot-Token-Forcing: inconclusive" in message
    # the audit trailer is the digest of the measurement file, and the merge carries the measured tree
    audit = round_dir.measurement_file(promotion.measurement)
    assert f"SpecPilot-Audit: sha256:{hashlib.sha256(audit.read_bytes()).hexdigest()}" in message
    assert promotion.audit_sha256 == hashlib.sha256(audit.read_bytes()).hexdigest()
    measured = json.loads(audit.read_text())
    assert measured["complete"] is True
    assert Repo(home.fork).rev_parse(f"{promotion.merge}^{{tree}}") == measured["identity"]["systems"]["candidate"]
    assert {r["device"] for r in measured["evidence"]["runs"]} == {"cpu"}
    parents = Repo(home.fork).out("log", "-1", "--format=%P", promotion.merge).split()
    assert parents == [promotion.previous_best, promotion.candidate]  # a --no-ff merge into the lineage


def test_sealed_final_and_distilled_entry_reproduces(clean_round):
    home = clean_round
    state = RoundDir.of(home, DEPLOYMENT, 1).load_state()
    assert state.sealed["accepted"], state.sealed
    assert state.distilled == ["faster"]
    entry = load_entries(home)["faster"]
    assert entry.title == "No per-token sleep" and entry.evidence[0].kind == "paired-run"
    result = apply_entries(home, ["faster"], onto="stock")
    assert result.tree == entry.reproduces


def test_report_draws_the_round(clean_round, tmp_path):
    from specpilot_mem.main import main

    png = tmp_path / "progress.png"
    assert main(["round", "report", DEPLOYMENT, "--home", str(clean_round.root), "--plot", str(png), "--json"]) == 0
    assert png.stat().st_size > 1000


def test_crash_in_every_phase_then_resume_gives_the_same_state(clean_round, tmp_path):
    home, config = make_home(tmp_path)
    points = [
        "cost-model:start",
        "cost-model:report",
        "explore:planned",
        "direction:faster:built",
        "direction:faster:measured",
        "direction:faster:promoted",
        "explore:done",
        "integrate:start",
        "kernel:start",
        "sealed:start",
        "distill:start",
        "distill:faster",
    ]
    crashes = []

    def crash_once(name: str) -> None:
        if name in points and name not in crashes:
            crashes.append(name)
            raise KeyboardInterrupt(name)

    runner = None
    while True:
        try:
            if runner is None:
                runner = RoundRunner.start(
                    home, DEPLOYMENT, config, ScriptedAgent(SCRIPTS), checkpoint=crash_once, sandbox=Sandbox(None)
                )
                runner.run()
            else:
                RoundRunner(
                    home, runner.dir, ScriptedAgent(SCRIPTS), checkpoint=crash_once, sandbox=Sandbox(None)
                ).run()
            break
        except KeyboardInterrupt:
            continue
    assert crashes == points
    assert final_state(home) | {"final_tree": None, "lineage_tree": None} == final_state(clean_round) | {
        "final_tree": None,
        "lineage_tree": None,
    }
    assert final_state(home)["final_tree"] == final_state(clean_round)["final_tree"]
    events = [
        json.loads(line) for line in (RoundDir.of(home, DEPLOYMENT, 1).path / "events.jsonl").read_text().splitlines()
    ]
    measured = Counter(e["key"] for e in events if e["event"] == "measured")
    assert measured and max(measured.values()) == 1  # nothing measured twice


def test_a_stored_measurement_of_another_identity_or_incomplete_is_never_used(tmp_path):
    round_dir = RoundDir(tmp_path / "round")
    identity = {"systems": {"candidate": "a" * 40}, "controller": "c", "requests": "r"}
    calls = []

    def measure():
        calls.append(1)
        return {"gain": 1.5, "identity": identity, "complete": True}

    assert round_dir.measured("measure-x", measure, identity)["gain"] == 1.5
    assert round_dir.measured("measure-x", measure, identity)["gain"] == 1.5 and len(calls) == 1  # stored one
    path = round_dir.measurement_file("measure-x")
    path.write_text(json.dumps({"gain": 9.0, "identity": identity}))  # a cancelled run's leftovers
    assert round_dir.measured("measure-x", measure, identity)["gain"] == 1.5 and len(calls) == 2
    path.write_text(json.dumps({"gain": 9.0, "identity": {**identity, "controller": "d"}, "complete": True}))
    assert round_dir.measured("measure-x", measure, identity)["gain"] == 1.5 and len(calls) == 3
    assert len(list(path.parent.glob("measure-x.json.discarded-*"))) == 2
    with pytest.raises(RoundError, match="incomplete"):
        round_dir.measured("measure-y", lambda: {"gain": 2.0, "identity": identity}, identity)
    assert not round_dir.measurement_file("measure-y").exists()
