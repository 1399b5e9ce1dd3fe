"""The lattice format: recorder, reader, validation, and the synthetic generator's statistics."""

import json

import numpy as np
import pytest
import torch

from specpilot_mem.replay.lattice import LatticeError, LatticeRecorder, load_lattice, save_lattice
from specpilot_mem.replay.synthetic import SyntheticSpec, generate
from specpilot_mem.replay.trees.base import StepBatch

M, K = 4, 3


def step(rng, root_rows_equal=True):
    cand = rng.integers(0, 100, size=(M, K))
    unary = rng.standard_normal((M, K)).astype(np.float32)
    pair = rng.standard_normal((M, K, K)).astype(np.float32)
    if root_rows_equal:
        pair[0] = pair[0, :1]
    return cand, unary, pair


def test_recorder_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "run.npz"
    rec = LatticeRecorder(path, kind="markov", positions=M, candidates=K, meta={"target": "t", "drafter": "d"})
    steps = {}
    for rid, length in (("a", 3), ("b", 2)):
        for p in range(length):
            steps[(rid, p)] = step(rng)
            rec.add(rid, p, *steps[(rid, p)])
        rec.set_greedy(rid, rng.integers(0, 100, size=length), label=f"bench-{rid}/dev")
    assert not path.exists()  # nothing is written before close
    rec.close()
    lat = load_lattice(path)
    assert lat.kind == "markov" and lat.meta["target"] == "t" and not lat.synthetic
    assert lat.positions == M and lat.candidates == K and lat.num_steps == 5
    assert list(lat.labels) == ["bench-a/dev", "bench-b/dev"]
    lookup = lat.step_lookup()
    for (rid, p), (cand, unary, pair) in steps.items():
        r = list(lat.request_ids).index(rid)
        s = lookup[lat.greedy_offsets[r] + p]
        assert (lat.cand[s] == cand).all()
        assert np.array_equal(lat.unary[s], unary.astype(np.float16))
        # markov: score = unary + pair term (Eq. 1)
        got = lat.conditional_scores(np.array([s]))[0]
        want = pair.astype(np.float16).astype(np.float32) + unary.astype(np.float16).astype(np.float32)[:, None, :]
        assert np.array_equal(got, want)
    assert [p.name for p in tmp_path.iterdir()] == ["run.npz"]  # no temp file left behind


def test_recorder_takes_torch_bf16_exactly(tmp_path):
    rng = np.random.default_rng(1)
    cand, unary, pair = step(rng)
    rec = LatticeRecorder(tmp_path / "t.npz", kind="selector", positions=M, candidates=K)
    bf = torch.from_numpy(pair).to(torch.bfloat16)
    rec.add_batch(
        ["r"],
        torch.tensor([0]),
        torch.from_numpy(cand)[None],
        torch.from_numpy(unary)[None].to(torch.bfloat16),
        bf[None],
    )
    rec.set_greedy("r", torch.tensor([5]))
    lat = rec.close()
    assert np.array_equal(lat.pair[0].astype(np.float32), bf.float().numpy())  # bf16 -> fp16 is exact in range


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda rec, rng: rec.add("a", 0, *step(rng, root_rows_equal=False)), "pair\\[:, 0\\] differs"),
        (lambda rec, rng: (rec.add("a", 0, *step(rng)), rec.add("a", 0, *step(rng))), "same \\(request, position\\)"),
        (lambda rec, rng: rec.add("a", 7, *step(rng)), "outside its greedy output"),
        (lambda rec, rng: rec.add("ghost", 0, *step(rng)), "without greedy tokens"),
    ],
)
def test_bad_recordings_write_nothing(tmp_path, mutate, message):
    rng = np.random.default_rng(2)
    path = tmp_path / "bad.npz"
    rec = LatticeRecorder(path, kind="selector", positions=M, candidates=K)
    rec.set_greedy("a", [1, 2])
    mutate(rec, rng)
    with pytest.raises(LatticeError, match=message):
        rec.close()
    assert list(tmp_path.iterdir()) == []


def test_wrong_shapes_and_files_are_clear_errors(tmp_path):
    rec = LatticeRecorder(tmp_path / "x.npz", kind="selector", positions=M, candidates=K)
    with pytest.raises(LatticeError, match="expected"):
        rec.add("a", 0, np.zeros((M, K + 1)), np.zeros((M, K)), np.zeros((M, K, K)))
    with pytest.raises(LatticeError, match="unknown lattice kind"):
        LatticeRecorder(tmp_path / "y.npz", kind="eagle", positions=M)
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    with pytest.raises(LatticeError, match="lacks arrays"):
        load_lattice(other)
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(LatticeError, match="cannot read"):
        load_lattice(tmp_path / "text.npz")
    lat = generate(SyntheticSpec(requests=1, length=4, positions=2, candidates=2))
    lat.unary[0, 0, 0] = np.inf
    with pytest.raises(LatticeError, match="NaN or \\+inf"):
        save_lattice(lat, tmp_path / "inf.npz")
    lat.unary[0, 0, 0] = 0.0
    lat.meta = {**lat.meta, "version": 99}
    with pytest.raises(LatticeError, match="version 99"):
        save_lattice(lat, tmp_path / "v.npz")
    assert not (tmp_path / "v.npz").exists()


def test_synthetic_lattice_is_labelled_and_reproducible(tmp_path):
    spec = SyntheticSpec(requests=2, length=20, positions=4, seed=7)
    lat = generate(spec)
    assert lat.synthetic and lat.meta["generator"]["seed"] == 7 and lat.meta["generator"]["positions"] == 4
    save_lattice(lat, tmp_path / "s.npz")
    again = load_lattice(tmp_path / "s.npz")
    assert again.synthetic
    assert np.array_equal(again.pair, generate(spec).pair)
    assert json.loads(json.dumps(again.meta)) == again.meta


def greedy_ranks(lat):
    """[S, m]: index of the greedy token among each position's candidates (K: absent)."""
    batch = StepBatch.from_lattice(lat, np.arange(lat.num_steps))
    hit = batch.cand == batch.greedy[:, :, None]
    return np.where(hit.any(axis=2), np.argmax(hit, axis=2), lat.candidates), batch.greedy


def test_synthetic_statistics_follow_the_spec():
    probs = (0.5, 0.2, 0.1)
    lat = generate(
        SyntheticSpec(
            requests=4,
            length=1500,
            positions=3,
            candidates=4,
            rank_probs=probs,
            depth_decay=0.5,
            path_correlation=0.0,
            seed=3,
        )
    )
    ranks, greedy = greedy_ranks(lat)
    inside = greedy[:, 2] >= 0
    first = ranks[inside, 0]
    for r, p in enumerate(probs):
        assert abs(np.mean(first == r) - p) < 0.03
    assert abs(np.mean(first == 4) - 0.2) < 0.03  # not among the candidates
    assert abs(np.mean(ranks[inside, 2] < 4) - 0.8 * 0.25) < 0.03  # depth decay 0.5 per position
    glued = generate(SyntheticSpec(requests=2, length=300, positions=3, candidates=4, path_correlation=1.0, seed=4))
    ranks, greedy = greedy_ranks(glued)
    inside = greedy[:, 2] >= 0
    assert (ranks[inside, 0] == ranks[inside, 2]).all()  # full correlation along the path


def test_selector_boost_favours_the_greedy_child_given_the_greedy_parent():
    lat = generate(
        SyntheticSpec(
            requests=2,
            length=400,
            positions=3,
            selector_boost=4.0,
            pair_noise=0.0,
            score_noise=0.0,
            rank_probs=(0.2,) * 5,
            path_correlation=0.0,
            seed=5,
        )
    )
    ranks, greedy = greedy_ranks(lat)
    batch = StepBatch.from_lattice(lat, np.arange(lat.num_steps))
    alive = (ranks[:, 0] < lat.candidates) & (ranks[:, 1] < lat.candidates)
    rows = np.flatnonzero(alive)
    given = batch.conditional_logp[rows, 1, ranks[rows, 0]]
    assert (np.argmax(given, axis=1) == ranks[rows, 1]).mean() > 0.95


def test_a_truncated_or_damaged_lattice_file_is_a_clear_error(tmp_path):
    path = tmp_path / "whole.npz"
    save_lattice(generate(SyntheticSpec(requests=2, length=16, positions=4, candidates=4, vocab=64)), path)
    data = path.read_bytes()
    for name, damaged in (
        ("half", data[: len(data) // 2]),
        ("tail", data[:-10]),
        ("head", data[:30]),
        ("flipped", data[:200] + bytes(b ^ 0xFF for b in data[200:260]) + data[260:]),
    ):
        bad = tmp_path / f"{name}.npz"
        bad.write_bytes(damaged)
        with pytest.raises(LatticeError, match="damaged or truncated|lacks arrays|not a"):
            load_lattice(bad)
