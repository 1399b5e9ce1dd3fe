"""``round start`` that cannot start its system records nothing, so the next start is not blocked."""

from __future__ import annotations

from test_rounds_e2e import DEPLOYMENT, make_home

from specpilot_mem.errors import RoundError
from specpilot_mem.git import Repo
from specpilot_mem.main import main
from specpilot_mem.rounds.runner import RoundRunner


def test_a_round_whose_system_does_not_start_leaves_nothing(tmp_path, monkeypatch, capsys):
    home, config = make_home(tmp_path)

    def system_does_not_start(self):
        raise RoundError("the stock system did not start", where="worker cpu", fix="look at the worker log")

    monkeypatch.setattr(RoundRunner, "_cost_model", system_does_not_start)
    argv = [
        "round",
        "start",
        DEPLOYMENT,
        "--requests",
        config.requests,
        "--devices",
        "cpu",
        "--agent",
        "command",
        "--agent-command",
        "true",
        "--home",
        str(home.root),
    ]
    for _attempt in range(2):  # the second start is not refused as "round 1 has not finished"
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "round 1 of engine-cpu could not start: the stock system did not start; nothing of it was kept" in err
        assert sorted(p.name for p in (home.rounds / DEPLOYMENT).iterdir()) == ["deployment.yaml"]
        assert Repo(home.fork).refs("refs/heads/round") == {}
