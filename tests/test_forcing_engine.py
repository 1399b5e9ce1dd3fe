"""Token forcing and the controller on the real pure-torch engine (a tiny random model, synthetic)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specpilot_mem.controller.engine_system import EngineSystem
from specpilot_mem.controller.requests import Request
from specpilot_mem.controller.system import RequestOutput
from conftest import tiny_pair
from specpilot_mem.engine.config import EngineOptions
from specpilot_mem.engine.engine import Engine
from specpilot_mem.errors import RoundError
from specpilot_mem.forcing.engine_adapter import EngineScorer, utf8_bytes
from specpilot_mem.forcing.scorer import score_outputs
from specpilot_mem.forcing.verdict import TokenForcing

TARGET, DRAFTER = tiny_pair()


@pytest.fixture(scope="module")
def engine():
    return Engine.random(3, TARGET, DRAFTER, options=EngineOptions(positions=DRAFTER.block_size), max_len=256)


@pytest.fixture(scope="module")
def requests():
    return [
        Request("code-1", "code", "dev", 12, prompt="def add(a, b):"),
        Request("prose-1", "prose", "dev", 12, prompt_ids=tuple(utf8_bytes("The harbour at dawn"))),
    ]


def test_engine_system_serves_with_timestamps(engine, requests):
    system = EngineSystem("stock", engine, mode="ar", encode=utf8_bytes)
    outputs = system.run(requests, batch_size=1, device=str(engine.device))
    assert [o.id for o in outputs] == ["code-1", "prose-1"]
    assert all(len(o.output_ids) == 12 and len(o.token_times) == 12 and o.rate > 0 for o in outputs)
    with pytest.raises(RoundError, match="one request at a time"):
        system.run(requests, batch_size=2, device=str(engine.device))
    with pytest.raises(RoundError, match="no engine on"):
        system.run(requests, batch_size=1, device="cuda:7")


def test_engine_scorer_agrees_with_the_engines_greedy_decode(engine, requests):
    ar = {
        o.id: o
        for o in EngineSystem("ar", engine, mode="ar", encode=utf8_bytes).run(requests, batch_size=1, device="cpu")
    }
    scorer = EngineScorer(engine)
    scored = score_outputs(scorer, requests, ar)
    for output in scored.values():
        assert output.scores.token_logprob.shape == (12,)
        assert np.all(output.scores.argmax_logprob >= output.scores.token_logprob - 1e-9)
        assert np.all(output.scores.top2_margin >= 0)
    # AR is the target's greedy decode; with random weights there are no near-ties to flip
    assert sum(int(o.mismatch.sum()) for o in scored.values()) == 0
    prefill = scorer.score(
        scored["code-1"].prompt_ids, scored["code-1"].output_ids, prefill_len=len(scored["code-1"].prompt_ids) + 5
    )
    assert prefill.argmax.shape == (12,)


def test_the_injected_fault_shows_up_as_mismatches_after_its_position(engine, requests):
    faulty = engine.with_options(fault_after=4, fault_bias=50.0)  # a large bias so the tiny model surely flips
    outputs = {
        o.id: o
        for o in EngineSystem("fault", faulty, mode="ar", encode=utf8_bytes).run(requests, batch_size=1, device="cpu")
    }
    stock = {
        o.id: o
        for o in EngineSystem("stock", engine, mode="ar", encode=utf8_bytes).run(requests, batch_size=1, device="cpu")
    }
    scorer = EngineScorer(engine)
    scored, stock_scored = score_outputs(scorer, requests, outputs), score_outputs(scorer, requests, stock)
    for output in scored.values():
        positions = np.nonzero(output.mismatch)[0]
        assert len(positions) > 0 and positions.min() >= 4
        assert all(output.output_ids[p] % 7 == 0 for p in positions)  # biased ids are multiples of the stride
    verdict = TokenForcing(scorer, stock_scored, delta=0.125).judge("fault", scored, synthetic=True)
    assert verdict.events.system_events > 0 and verdict.events.unexplained == verdict.events.audited


def test_cli_factory_builds_an_engine_scorer():
    from specpilot_mem.forcing.scorer import Scorer, load_scorer

    scorer = load_scorer("specpilot_mem.forcing.engine_adapter:load_scorer", {"model": "random", "seed": "1"})
    assert isinstance(scorer, Scorer) and isinstance(scorer, EngineScorer)
    assert scorer.fp32_head and scorer.engine.synthetic
    assert scorer.encode("ab") == [97, 98]


def test_batched_scoring_agrees_with_the_engines_own_scorer(engine, requests):
    ar = {
        o.id: o
        for o in EngineSystem("ar", engine, mode="ar", encode=utf8_bytes).run(requests, batch_size=1, device="cpu")
    }
    scorer = EngineScorer(engine)
    batched = score_outputs(scorer, requests, ar)
    for request in requests:
        one = scorer.score(batched[request.id].prompt_ids, batched[request.id].output_ids)
        assert np.array_equal(one.argmax, batched[request.id].scores.argmax)
        assert np.allclose(one.token_logprob, batched[request.id].scores.token_logprob, atol=1e-4)


trained = pytest.mark.skipif(
    not __import__("specpilot_mem.engine.weights", fromlist=["x"]).has_trained_pair(),
    reason="the trained pair is not committed",
)


@trained
def test_cli_scorer_encodes_text_prompts_with_the_trained_tokenizer():
    """The default CLI scorer must read a text prompt as the trained pair's tokens, not as UTF-8 bytes:
    scored on byte ids, the trained model's own greedy output looks like a stream of mismatches."""
    pytest.importorskip("tokenizers")
    from specpilot_mem.controller.requests import load_requests
    from specpilot_mem.engine.train.corpus import load_tokenizer
    from specpilot_mem.engine.weights import DEFAULT_MODEL_DIR
    from specpilot_mem.forcing.scorer import load_scorer

    scorer = load_scorer("specpilot_mem.forcing.engine_adapter:load_scorer", {"model": "default"})
    request = load_requests("requests/specpilot-v1.jsonl", split="unseen")[0]
    ids = scorer.encode(request.prompt)
    assert ids == load_tokenizer(DEFAULT_MODEL_DIR).encode(request.prompt).ids and ids != utf8_bytes(request.prompt)
    short = type(request)(request.id, request.benchmark, request.split, 24, prompt=request.prompt)
    ar = {
        o.id: o
        for o in EngineSystem("ar", scorer.engine, mode="ar", encode=scorer.encode).run(
            [short], batch_size=1, device="cpu"
        )
    }
    scored = score_outputs(scorer, [short], ar)
    assert int(scored[short.id].mismatch.sum()) == 0  # the greedy output, scored on the tokens it was decoded from


@trained
def test_trained_engine_refuses_text_without_its_tokenizer(tmp_path):
    """A trained model whose tokenizer is missing refuses text prompts instead of reading them as bytes."""
    import shutil

    from specpilot_mem.engine.weights import DEFAULT_MODEL_DIR
    from specpilot_mem.forcing.engine_adapter import load_scorer
    from specpilot_mem.forcing.scorer import ForcingError

    for name in ("target.safetensors", "drafter.safetensors"):
        shutil.copy(DEFAULT_MODEL_DIR / name, tmp_path / name)
    scorer = load_scorer(model=str(tmp_path))
    with pytest.raises(ForcingError, match="cannot encode a text prompt"):
        scorer.encode("def add(a, b):")


def test_fault_options_change_only_what_they_name(engine):
    """Each fault of the study changes the outputs of the requests it applies to; switched off, or on
    requests fault_requests leaves out, the engine serves exactly stock's tokens."""
    prompts = [[5 + i, 17, 33, 2 * i + 1] for i in range(6)]
    stock = [g.output_ids for g in engine.generate(prompts, mode="spec", max_new_tokens=24)]
    quantized = engine.with_options(verify_weights="int4")
    assert quantized._verify_target is not engine.target  # a copy: stock's weights stay as they are
    levels = [torch.unique(row).numel() for row in quantized._verify_target.blocks[0].mlp.down.weight]
    assert (
        max(levels) <= 15
        and quantized._verify_target.blocks[0].mlp.down.weight.ne(engine.target.blocks[0].mlp.down.weight).any()
    )
    flips = engine.with_options(flip_rate=0.2, flip_seed=1)
    flipped = [g.output_ids for g in flips.generate(prompts, mode="spec", max_new_tokens=24)]
    assert (
        flipped != stock and [g.output_ids for g in flips.generate(prompts, mode="spec", max_new_tokens=24)] == flipped
    )
    short = engine.with_options(stop_after=10).generate(prompts, mode="spec", max_new_tokens=24)
    assert all(len(g.output_ids) == 10 and g.output_ids == s[:10] for g, s in zip(short, stock))
    some = engine.with_options(flip_rate=0.2, fault_requests=0.5).generate(prompts, mode="spec", max_new_tokens=24)
    changed = [g.output_ids != s for g, s in zip(some, stock)]
    assert 0 < sum(changed) < len(prompts)
    assert not engine.with_options(lm_head="splitk").lossy and engine.with_options(rope_offset=1).lossy
    with pytest.raises(ValueError, match="unknown verify_weights"):
        engine.with_options(verify_weights="fp4")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_logprobs_are_the_re_scores_bit_for_bit(dtype):
    """The audit's prefill-length re-scores from one shared pass equal ``score(..., prefill_len=...)`` exactly: the
    same log-probabilities at the event's row, for prefills ending on, before and across chunk boundaries."""
    engine = Engine.random(
        5, TARGET, DRAFTER, dtype=dtype, options=EngineOptions(positions=4, chunk_size=8), max_len=256
    )
    prompt = list(range(3, 22))  # 19 tokens: the prompt ends inside the third chunk
    output = [int(t) for t in torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(1))]
    queries = [(p, s) for p in (0, 5, 13, 39) for s in (19 + p, 19 + p - 1, 8, 1) if 0 < s <= 20 + p]
    rows = engine.prefill_logprobs(prompt, output, queries)
    for (position, split), row in zip(queries, rows):
        want = engine.score(prompt, output[: position + 1], prefill_len=split)
        top2 = row.topk(2)
        assert int(top2.indices[0]) == want.argmax[position]
        assert float(row[output[position]]) == want.logprob[position]
        assert float(top2.values[0] - top2.values[1]) == want.top2_margin[position]
    assert engine.prefill_argmax(prompt, output, queries) == [int(r.argmax()) for r in rows]
    with pytest.raises(ValueError, match="outside"):
        engine.prefill_logprobs(prompt, output, [(40, 10)])


def test_audit_with_the_shared_prefill_pass_explains_what_per_event_re_scores_explain(engine):
    """The audit's batched prefill-length check (``EngineScorer.prefill_argmax``) reaches the same explanations
    as one ``score`` per event and prefill length."""
    from specpilot_mem.forcing.audit import audit, find_events

    class PerEvent:  # the same scorer without the shared pass
        def __init__(self, inner):
            self.inner = inner

        def score(self, prompt_ids, output_ids, prefill_len=None):
            return self.inner.score(prompt_ids, output_ids, prefill_len=prefill_len)

    scorer = EngineScorer(engine)
    prompt = list(range(5, 30))
    rng = torch.Generator().manual_seed(2)
    outs = {
        f"r{i}": RequestOutput(f"r{i}", tuple(torch.randint(0, 256, (30,), generator=rng).tolist())) for i in range(2)
    }
    reqs = [Request(rid, "code", "dev", 30, prompt_ids=tuple(prompt)) for rid in outs]
    scored = score_outputs(scorer, reqs, outs)
    events = find_events(scored, 0.01)
    assert len(events) > 20
    paths = {rid: [] for rid in outs}
    fast = audit(events, scored, scorer=scorer, stock_paths=paths, sample=40)
    slow = audit(events, scored, scorer=PerEvent(scorer), stock_paths=paths, sample=40)
    assert fast == slow
