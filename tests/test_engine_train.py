"""Training the pair: greedy rollouts are the target's own greedy decode, the drafter's labels are the
next tokens of those rollouts, and one tiny seeded run writes a pair the engine loads."""

import json

import numpy as np
import pytest
import torch

from conftest import tiny_pair
from specpilot_mem.engine.config import EngineOptions
from specpilot_mem.engine.engine import Engine
from specpilot_mem.engine.model import HybridTarget
from specpilot_mem.engine.train import train

TINY_TARGET, TINY_DRAFTER = tiny_pair()
# Top-2 log-prob gap below which two float32 evaluation orders may pick different tokens.
NEAR_TIE_NATS = 1e-4


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return HybridTarget(TINY_TARGET).eval()


def test_rollouts_continue_each_prompt_as_the_engine_decodes_greedily(target):
    stream = torch.randint(1, TINY_TARGET.vocab_size, (4000,), generator=torch.Generator().manual_seed(1))
    pool = train.greedy_rollouts(target, stream, 3, 12, 10, torch.Generator().manual_seed(2))
    assert pool.tokens.shape == (3, 22) and pool.features.shape == (3, 22, TINY_TARGET.feature_dim)
    engine = Engine(target, None)
    runs = engine.generate([row[:12].tolist() for row in pool.tokens], "ar", max_new_tokens=10)
    for row, run in zip(pool.tokens, runs):
        rolled = row[12:].tolist()
        if rolled != run.output_ids:
            first = next(i for i, (a, b) in enumerate(zip(rolled, run.output_ids)) if a != b)
            gap = engine.score(row[:12].tolist(), run.output_ids).top2_margin[first]
            assert gap < NEAR_TIE_NATS, f"rollout departs from greedy decoding at token {first} (top-2 gap {gap:.2e})"
    _, features = target.forward_train(pool.tokens)
    torch.testing.assert_close(pool.features, features)


def test_drafter_blocks_are_labelled_with_the_rollout_tokens_after_the_anchor():
    prompt_len, length = 6, 20
    tokens = torch.arange(2 * length).view(2, length) + 1000  # every token names its row and position
    positions = torch.arange(length, dtype=torch.float32)[None, :, None].expand(2, length, 3)
    rows = torch.tensor([0.0, 100.0])[:, None, None]
    pool = train.Rollouts(tokens, positions + rows, prompt_len)
    features, valid, anchors, anchor_pos, labels, labelled = train.drafter_batch(
        pool, TINY_DRAFTER, 5, 7, torch.Generator().manual_seed(0)
    )
    assert bool(labelled.all())
    assert labels.shape == (35, TINY_DRAFTER.block_size) and features.shape == (35, TINY_DRAFTER.context_window, 3)
    assert bool((anchor_pos >= prompt_len - 1).all()) and bool((anchor_pos + TINY_DRAFTER.block_size < length).all())
    row = (anchors - 1000) // length
    assert torch.equal((anchors - 1000) % length, anchor_pos)
    step = torch.arange(1, TINY_DRAFTER.block_size + 1)
    assert torch.equal(labels, anchors[:, None] + step)  # the next block_size tokens of the same rollout
    context = anchor_pos[:, None] - TINY_DRAFTER.context_window + torch.arange(TINY_DRAFTER.context_window)
    assert torch.equal(valid, context >= 0)
    # The features of the positions before the anchor, of the anchor's own rollout.
    assert torch.equal(features[..., 0][valid], (context + 100 * row[:, None]).float()[valid])


def test_corpus_blocks_label_a_slot_only_while_the_corpus_follows_the_target_argmax(target):
    gen = torch.Generator().manual_seed(3)
    stream = torch.randint(1, TINY_TARGET.vocab_size, (4000,), generator=gen)
    # Continue half of each sequence greedily so that long on-path stretches exist.
    corpus = train.greedy_rollouts(target, stream, 4, 24, 24, gen).tokens
    corpus[:, 30] = (corpus[:, 30] + 1) % TINY_TARGET.vocab_size  # one departure inside the greedy part
    features, valid, anchors, anchor_pos, labels, labelled = train.corpus_batch(target, TINY_DRAFTER, corpus, 16, gen)
    hidden, feats = target.forward_train(corpus)
    greedy = (hidden @ target.lm_head_weight.t()).argmax(-1)
    row = torch.arange(4).repeat_interleave(16)
    for n in range(row.numel()):
        r, a = int(row[n]), int(anchor_pos[n])
        assert int(anchors[n]) == int(corpus[r, a])
        assert labels[n].tolist() == greedy[r, a : a + TINY_DRAFTER.block_size].tolist()
        followed = [bool(corpus[r, a + i + 1] == greedy[r, a + i]) for i in range(TINY_DRAFTER.block_size - 1)]
        expected = [True] + [all(followed[:j]) for j in range(1, TINY_DRAFTER.block_size)]
        assert labelled[n].tolist() == expected
    assert bool(labelled[:, 1:].any()) and not bool(labelled.all())
    torch.testing.assert_close(
        features[valid],
        feats[
            row[:, None].expand_as(valid),
            (anchor_pos[:, None] - TINY_DRAFTER.context_window + torch.arange(TINY_DRAFTER.context_window)).clamp(
                min=0
            ),
        ][valid],
    )


def test_seeded_tiny_run_writes_a_pair_the_engine_loads(tmp_path):
    gen = np.random.default_rng(0)
    tokens = tmp_path / "corpus.npz"
    np.savez(
        tokens,
        **{s: gen.integers(1, TINY_TARGET.vocab_size, 3000).astype(np.uint16) for s in ("train", "dev", "unseen")},
    )
    out = tmp_path / "pair"
    train.main(
        [
            "--tokens",
            str(tokens),
            "--out",
            str(out),
            "--seq-len",
            "32",
            "--batch",
            "4",
            "--target-steps",
            "4",
            "--prompt-len",
            "8",
            "--rollout-tokens",
            "8",
            "--rollout-batch",
            "4",
            "--rollout-rounds",
            "2",
            "--drafter-steps",
            "4",
            "--anchors",
            "2",
            "--eval-tokens",
            "256",
            "--target-config",
            TINY_TARGET.to_json(),
            "--drafter-config",
            TINY_DRAFTER.to_json(),
        ]
    )
    log = json.loads((out / "training-log.json").read_text())
    rollouts = next(e for e in log if e.get("phase") == "rollouts")
    assert rollouts["rounds"] == 2 and rollouts["greedy_tokens"] == 2 * 4 * 8
    done = log[-1]
    assert done["event"] == "done" and (done["target_steps"], done["drafter_steps"]) == (4, 4)
    assert (
        np.isfinite(done["unseen_loss_nats"])
        and len(done["unseen_drafter"]["slot_accuracy"]) == TINY_DRAFTER.block_size
    )
    engine = Engine.load(out, options=EngineOptions(positions=TINY_DRAFTER.block_size))
    assert engine.target.cfg == TINY_TARGET and engine.drafter.cfg == TINY_DRAFTER
    run = engine.generate([[5, 6, 7, 8, 9]], "spec", max_new_tokens=6)[0]
    assert (
        len(run.output_ids) == 6
        and run.output_ids == engine.generate([[5, 6, 7, 8, 9]], "ar", max_new_tokens=6)[0].output_ids
    )

    # A second run retrains only the drafter on the committed target; the log keeps both runs.
    before = {name: t.clone() for name, t in engine.target.state_dict().items()}
    train.main(
        [
            "--tokens",
            str(tokens),
            "--out",
            str(out),
            "--init-from",
            str(out),
            "--new-drafter",
            "--target-steps",
            "0",
            "--seq-len",
            "32",
            "--batch",
            "4",
            "--prompt-len",
            "8",
            "--rollout-tokens",
            "8",
            "--rollout-batch",
            "4",
            "--rollout-rounds",
            "1",
            "--drafter-steps",
            "3",
            "--anchors",
            "2",
            "--eval-tokens",
            "256",
            "--drafter-config",
            TINY_DRAFTER.to_json(),
        ]
    )
    log = json.loads((out / "training-log.json").read_text())
    assert [e["event"] for e in log if e.get("event") in ("start", "done")] == ["start", "done", "start", "done"]
    assert (log[-1]["target_steps"], log[-1]["drafter_steps"]) == (4, 3)
    retrained = Engine.load(out, options=EngineOptions(positions=TINY_DRAFTER.block_size))
    assert all(torch.equal(before[name], t) for name, t in retrained.target.state_dict().items())

    # A third run trains the drafter on with every per-request block (one drawn per step), evaluated per block.
    drafter_before = {name: t.clone() for name, t in retrained.drafter.state_dict().items()}
    blocks = [TINY_DRAFTER.block_size, TINY_DRAFTER.block_size - 2]
    common = ["--seq-len", "32", "--batch", "4", "--prompt-len", "8", "--rollout-tokens", "8", "--rollout-batch", "4"]
    train.main(
        ["--tokens", str(tokens), "--out", str(out), "--init-from", str(out), "--target-steps", "0", *common]
        + ["--rollout-rounds", "1", "--drafter-steps", "6", "--anchors", "2", "--eval-tokens", "256"]
        + ["--drafter-blocks", ",".join(map(str, blocks)), "--drafter-config", TINY_DRAFTER.to_json()]
    )
    done = json.loads((out / "training-log.json").read_text())[-1]
    assert done["drafter_steps"] == 3 + 6
    small = done[f"unseen_drafter_block{blocks[1]}"]
    assert len(small["slot_accuracy"]) == blocks[1] and np.isfinite(small["chain8_tau_proxy"])
    blocked = Engine.load(out, options=EngineOptions(positions=TINY_DRAFTER.block_size))
    assert all(torch.equal(before[name], t) for name, t in blocked.target.state_dict().items())
    assert not all(torch.equal(drafter_before[name], t) for name, t in blocked.drafter.state_dict().items())


def test_a_training_block_the_drafter_cannot_draft_is_refused(tmp_path, capsys):
    tokens = tmp_path / "corpus.npz"
    np.savez(tokens, **{s: np.arange(1, 200, dtype=np.uint16) for s in ("train", "dev", "unseen")})
    out = tmp_path / "pair"
    with pytest.raises(SystemExit):
        train.main(
            ["--tokens", str(tokens), "--out", str(out), "--rollout-tokens", "8", "--drafter-blocks", "4,9"]
            + ["--drafter-config", TINY_DRAFTER.to_json(), "--target-config", TINY_TARGET.to_json()]
        )
    assert "--drafter-blocks: block 9 cannot be drafted: the drafter drafts 1..4" in capsys.readouterr().err
    assert not out.exists()


def test_rollouts_must_be_longer_than_a_drafter_block(tmp_path):
    with pytest.raises(SystemExit):
        train.main(
            [
                "--tokens",
                str(tmp_path / "none.npz"),
                "--out",
                str(tmp_path),
                "--rollout-tokens",
                "4",
                "--drafter-config",
                TINY_DRAFTER.to_json(),
            ]
        )
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--target-config", '{"d_modle": 64}', "--target-config has no field d_modle"),
        ("--drafter-config", "{block_size: 4}", "--drafter-config is not JSON"),
        ("--drafter-config", "[4]", "--drafter-config must be a JSON object"),
    ],
)
def test_bad_config_overrides_stop_before_any_work(tmp_path, capsys, flag, value, message):
    out = tmp_path / "pair"
    with pytest.raises(SystemExit):
        train.main(["--tokens", str(tmp_path / "missing.npz"), "--out", str(out), flag, value])
    assert message in capsys.readouterr().err
    assert not out.exists()
