"""Exact replay: trajectories, τ per builder and benchmark, shared budgets, the replay command."""

import json

import numpy as np
import pytest

from specpilot_mem.main import main
from specpilot_mem.replay.lattice import LatticeError, LatticeRecorder, save_lattice
from specpilot_mem.replay.replay import replay, replay_set
from specpilot_mem.replay.synthetic import SyntheticSpec, generate
from specpilot_mem.replay.trees import BUILDERS

M, K = 4, 3


def scripted_lattice(path, length=13, correct=2, drop_position=None):
    """Greedy output 100, 101, ...; at every position the drafter's top candidate is right for the
    first ``correct`` drafted positions and wrong after, the right token sitting at rank 1."""
    greedy = np.arange(100, 100 + length)
    rec = LatticeRecorder(path, kind="selector", positions=M, candidates=K, meta={"script": True})
    for p in range(length):
        if p == drop_position:
            continue
        cand = np.zeros((M, K), dtype=np.int64)
        for d in range(M):
            truth = greedy[p + d] if p + d < length else 0
            wrong = (900 + d, 950 + d)
            cand[d] = (truth, *wrong) if d < correct else (wrong[0], truth, wrong[1])
        unary = np.tile(np.array([2.0, 1.0, 0.0], dtype=np.float32), (M, 1))
        pair = np.tile(unary[:, None, :], (1, K, 1))
        rec.add("only", p, cand, unary, pair)
    rec.set_greedy("only", greedy, label="scripted")
    return rec.close()


def test_chain_replay_follows_its_own_trajectory(tmp_path):
    lat = scripted_lattice(tmp_path / "s.npz", length=13, correct=2)
    steps, tokens = replay(lat, "chain", 4)
    # each step accepts 2 drafted tokens + the bonus: positions 0, 3, 6, 9, 12 -> 5 steps, 13 tokens
    assert steps.tolist() == [5] and tokens.tolist() == [13]
    # a tree with the rank-1 candidate at depth 3 accepts 3 + bonus per step
    steps, tokens = replay(lat, "best-first", 16)
    assert tokens.tolist() == [13] and steps[0] < 5
    steps, _ = replay(lat, "oracle", 4)
    assert steps.tolist() == [3]  # 4 + 1 per step: positions 0, 5, 10 (10 ends at 13)


def test_missing_position_is_a_clear_error(tmp_path):
    lat = scripted_lattice(tmp_path / "s.npz", length=13, correct=2, drop_position=3)
    with pytest.raises(LatticeError, match="at position 3"):
        replay(lat, "chain", 4)


@pytest.fixture(scope="module")
def lattice():
    return generate(SyntheticSpec(requests=6, length=60, positions=8, labels=("gsm8k", "mbpp"), seed=11))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_token_is_counted_once(lattice, name):
    (run,) = replay_set([lattice], [name], [16])
    assert sum(run.tokens.values()) == lattice.greedy_tokens.shape[0]
    assert set(run.tau_by_label()) == {"gsm8k", "mbpp"}
    assert 1.0 <= run.tau <= lattice.positions + 1
    assert run.synthetic


def test_oracle_and_best_first_order_on_a_selector_lattice(lattice):
    runs = {(r.builder, r.nodes): r.tau for r in replay_set([lattice], ["chain", "best-first", "oracle"], [8, 32])}
    assert runs[("oracle", 32)] >= runs[("best-first", 32)] >= runs[("chain", 32)]
    assert runs[("best-first", 32)] >= runs[("best-first", 8)]


def test_shared_budget_replay(lattice):
    steps, tokens = replay(lattice, "best-first", 32, batch=3)
    assert tokens.sum() == lattice.greedy_tokens.shape[0]
    solo_steps, _ = replay(lattice, "best-first", 32)
    assert steps.sum() >= solo_steps.sum()  # three requests share what one had alone
    with pytest.raises(LatticeError, match="shared node budget"):
        replay(lattice, "chain", 32, batch=3)


def test_a_request_alone_in_the_server_gets_the_whole_budget(tmp_path):
    lat = scripted_lattice(tmp_path / "s.npz", length=13, correct=2)
    assert replay(lat, "best-first", 6, batch=4)[0].tolist() == replay(lat, "best-first", 6)[0].tolist()


def test_replay_command_json_and_plot(tmp_path, capsys, lattice):
    path = tmp_path / "lat.npz"
    save_lattice(lattice, path)
    png = tmp_path / "fig" / "tau.png"
    code = main(
        ["replay", str(path), "--builders", "chain,best-first,oracle", "--nodes", "8,16", "--json", "--plot", str(png)]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["synthetic"] is True and out["plot"] == str(png)
    assert {(r["builder"], r["nodes"]) for r in out["runs"]} == {
        (b, n) for b in ("chain", "best-first", "oracle") for n in (8, 16)
    }
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["replay", str(path), "--builders", "best-first", "--nodes", "8"]) == 0
    assert "SYNTHETIC" in capsys.readouterr().out
    assert main(["replay", str(path), "--builders", "nope", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "SpecPilotError"
    assert main(["replay", str(path), "--nodes", "x"]) == 2
