"""The pure-torch engine: GDN forms agree, tree verify commits what a chain would, speculative decoding
reproduces AR, the scorer, the injected fault and the lossless variants (synthetic random weights)."""

import copy

import pytest
import torch

from conftest import tiny_pair
from specpilot_mem.engine import gdn
from specpilot_mem.engine.engine import Engine
from specpilot_mem.engine.model import Cache, HybridTarget, chain_rows, make_rows

SMALL, SMALL_DRAFTER = tiny_pair(
    vocab_size=512,
    d_model=64,
    block_size=8,
    top_k=16,
    layer_types=("gdn", "gdn", "attn", "gdn", "gdn", "attn"),
    feature_layers=(1, 3, 5),
    max_seq_len=512,
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_gdn_inputs(T, B=2, H=3, K=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, H, T, K, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, H, T, K, generator=g), dim=-1)
    v = torch.randn(B, H, T, K, generator=g)
    log_decay = -torch.rand(B, H, T, generator=g)
    beta = torch.rand(B, H, T, generator=g)
    state = torch.randn(B, H, K, K, generator=g)
    return q, k, v, log_decay, beta, state


def ancestors(parents):
    anc = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] = anc[p]
        anc[i, i] = True
    return anc


def test_chunked_form_matches_float64_recurrence():
    inputs = random_gdn_inputs(45)
    o_ref, s_ref = gdn.recurrent(*(x.double() for x in inputs))
    o, s = gdn.chunked(*inputs, chunk_size=16)
    assert torch.allclose(o.double(), o_ref, atol=1e-5) and torch.allclose(s.double(), s_ref, atol=1e-5)


def test_masked_wy_tree_matches_path_reference():
    parents = [-1, 0, 0, 1, 1, 2, 5, 6, 3]
    q, k, v, log_decay, beta, state = random_gdn_inputs(len(parents), seed=3)
    o_ref, ends_ref = gdn.tree_path_reference(q, k, v, log_decay, beta, state, parents)
    o, ends = gdn.masked_wy(q, k, v, log_decay, beta, state, ancestors(parents))
    assert torch.allclose(o, o_ref, atol=1e-5) and torch.allclose(ends, ends_ref, atol=1e-5)


def test_chunked_form_is_stable_when_keys_align():
    """Trained keys align: with identical keys, full writes and no decay, the WY system's inverse has
    entries like C(62, 31) ~ 1e17 in intermediate powers; the solve must still match the recurrence."""
    q, k, v, _, _, state = random_gdn_inputs(64, B=1, H=2)
    k = k[:, :, :1].expand_as(k).contiguous()
    log_decay, beta = torch.zeros(1, 2, 64), torch.ones(1, 2, 64) * 0.999
    o_ref, s_ref = gdn.recurrent(*(x.double() for x in (q, k, v, log_decay, beta, state)))
    o, s = gdn.chunked(q, k, v, log_decay, beta, state, chunk_size=64)
    assert torch.isfinite(o).all()
    assert torch.allclose(o.double(), o_ref, atol=1e-3) and torch.allclose(s.double(), s_ref, atol=1e-3)


@pytest.fixture(scope="module")
def small_target():
    torch.manual_seed(0)
    return HybridTarget(SMALL).eval()


@torch.no_grad()
def test_row_passes_match_training_forward(small_target):
    tokens = torch.randint(0, SMALL.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    hidden_ref, feats_ref = small_target.forward_train(tokens, chunk_size=16)
    cache = Cache(SMALL, 128, "cpu", torch.float32)
    pieces = []
    for start in range(0, 40, 13):
        piece = tokens[0, start : start + 13].tolist()
        hidden, pending = small_target.forward_rows(
            chain_rows(piece, SMALL.conv_size, "cpu"), cache, window=cache.length + len(piece)
        )
        cache.commit(pending, list(range(len(piece))))
        pieces.append(hidden[0])
    assert torch.allclose(torch.cat(pieces), hidden_ref[0], atol=1e-5)
    assert torch.allclose(cache.features[:40], feats_ref[0], atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("method", ["wy", "path"])
def test_tree_commit_equals_chain_along_accepted_path(small_target, method):
    cache = Cache(SMALL, 128, "cpu", torch.float32)
    prompt = list(range(3, 23))
    _, pending = small_target.forward_rows(chain_rows(prompt, SMALL.conv_size, "cpu"), cache)
    cache.commit(pending, list(range(len(prompt))))
    chain_cache = copy.deepcopy(cache)
    tokens, parents = [5, 6, 7, 8, 9, 10, 11], [-1, 0, 0, 1, 2, 4, 4]
    path = [0, 2, 4, 5]
    tree_hidden, tree_pending = small_target.forward_rows(
        make_rows(tokens, parents, SMALL.conv_size, "cpu"), cache, method
    )
    chain_hidden, chain_pending = small_target.forward_rows(
        chain_rows([tokens[i] for i in path], SMALL.conv_size, "cpu"), chain_cache, method
    )
    assert torch.allclose(tree_hidden[0, path], chain_hidden[0], atol=1e-5)
    cache.commit(tree_pending, path)
    chain_cache.commit(chain_pending, list(range(len(path))))
    assert cache.length == chain_cache.length == len(prompt) + len(path)
    for i in cache.state:
        assert torch.allclose(cache.state[i], chain_cache.state[i], atol=1e-6)
        assert torch.allclose(cache.conv[i], chain_cache.conv[i], atol=1e-6)
    for i in cache.keys:
        assert torch.allclose(cache.keys[i][:, : cache.length], chain_cache.keys[i][:, : cache.length], atol=1e-6)
    assert torch.allclose(cache.features[: cache.length], chain_cache.features[: cache.length], atol=1e-5)


@pytest.fixture(scope="module")
def engine():
    return Engine.random(0, SMALL, SMALL_DRAFTER, max_len=512)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, SMALL.vocab_size, (n,), generator=g).tolist() for n in (30, 70)]


@pytest.fixture(scope="module")
def ar_outputs(engine, prompts):
    return engine.generate(prompts, "ar", max_new_tokens=24)


def test_speculative_chain_and_variants_reproduce_ar(engine, prompts, ar_outputs):
    for variant in (engine, engine.with_options(gdn_verify="path"), engine.with_options(lm_head="splitk")):
        spec = variant.generate(prompts, "spec", max_new_tokens=24)
        assert [g.output_ids for g in spec] == [g.output_ids for g in ar_outputs]
        assert all(len(g.token_times) == 24 and g.steps == len(g.accepted) for g in spec)


def test_generation_timing_fields(ar_outputs):
    g = ar_outputs[0]
    assert len(g.output_ids) == 24 and g.steps == 23 and g.accepted == [1] * 23
    assert g.token_times == sorted(g.token_times) and g.total_time >= g.token_times[-1] > 0
    assert g.to_dict()["output_rate"] == pytest.approx(24 / g.total_time)


def test_scorer_agrees_with_ar_and_reports_margins(engine, prompts, ar_outputs):
    out = ar_outputs[1].output_ids
    score = engine.score(prompts[1], out)
    assert len(score.logprob) == len(out)
    assert all(m < 1e-3 for m in score.margin)  # AR's own tokens: argmax up to rounding
    assert all(t >= 0 for t in score.top2_margin)
    forced = list(out)
    forced[5] = (score.argmax[5] + 1) % SMALL.vocab_size
    bad = engine.score(prompts[1], forced)
    assert bad.margin[5] > 0 and bad.argmax[5] == score.argmax[5]
    moved = engine.score(prompts[1], out, prefill_len=40)
    assert moved.argmax == score.argmax
    assert max(abs(a - b) for a, b in zip(moved.logprob, score.logprob)) < 1e-3


def test_injected_fault_changes_outputs_after_its_position(engine, prompts, ar_outputs):
    faulty = engine.with_options(fault_after=8, fault_bias=4.0).generate(prompts, "ar", max_new_tokens=24)
    for f, g in zip(faulty, ar_outputs):
        assert f.output_ids[:8] == g.output_ids[:8]
    hits = sum(t % 7 == 0 for f in faulty for t in f.output_ids[8:])
    clean = sum(t % 7 == 0 for g in ar_outputs for t in g.output_ids[8:])
    assert hits > clean


def test_bad_requests_are_rejected(engine):
    with pytest.raises(ValueError, match="mode"):
        engine.generate([[1, 2]], "beam")
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[]], "ar")
    with pytest.raises(ValueError, match="max_len"):
        engine.generate([[1] * 500], "ar", max_new_tokens=100)


@pytest.mark.parametrize("builder", ["best-first", "ddtree"])
def test_tree_verification_reproduces_ar(engine, prompts, ar_outputs, builder):
    tree_engine = engine.with_options(tree=builder, nodes=12, positions=8)
    spec = tree_engine.generate(prompts[:1], "spec", max_new_tokens=24)
    assert spec[0].output_ids == ar_outputs[0].output_ids


def test_recorded_lattices_match_live_drafts(engine, prompts, tmp_path):
    """The step recorded at position p is what a live step drafts with p output tokens committed."""
    import numpy as np

    from specpilot_mem.replay.lattice import LatticeRecorder, load_lattice
    from specpilot_mem.replay.replay import replay

    recorder = LatticeRecorder(tmp_path / "lat.npz", kind="selector", positions=8, meta={"synthetic": True})
    runs = engine.record_lattices(recorder, prompts, positions=8, max_new_tokens=24, labels=["a/dev", "b/unseen"])
    recorder.close()
    lat = load_lattice(tmp_path / "lat.npz")
    assert lat.num_steps == 48 and list(lat.labels) == ["a/dev", "b/unseen"]
    out = runs[1].output_ids
    assert lat.greedy_tokens[lat.greedy_offsets[1] : lat.greedy_offsets[2]].tolist() == out
    lookup = lat.step_lookup()
    for p in (1, 9, 23):
        engine.cache.reset()
        engine.prefill(prompts[1] + out[: p - 1])
        live = engine.draft(out[p - 1], 8)
        step = lookup[lat.greedy_offsets[1] + p]
        assert lat.cand[step].tolist() == live.cand.tolist()
        assert np.allclose(lat.pair[step].astype(np.float32), live.pair.numpy(), atol=2e-2)
    steps, tokens = replay(lat, "chain", 8)
    assert list(tokens) == [24, 24] and all(steps <= tokens)


@pytest.mark.gpu
def test_cuda_graph_passes_match_eager_passes(prompts):
    """On CUDA, verify and draft run as captured graphs; their outputs equal the eager passes'."""
    graphs = Engine.random(0, SMALL, SMALL_DRAFTER, device="cuda", max_len=512)
    eager = graphs.with_options(cuda_graphs=False)
    for mode in ("ar", "spec"):
        a = graphs.generate(prompts, mode, max_new_tokens=24)
        b = eager.generate(prompts, mode, max_new_tokens=24)
        assert [g.output_ids for g in a] == [g.output_ids for g in b]
    tree = graphs.with_options(tree="best-first", nodes=12)
    assert [g.output_ids for g in tree.generate(prompts, "spec", 24)] == [g.output_ids for g in b]


def test_bad_options_are_rejected(engine):
    with pytest.raises(ValueError, match="positions"):
        engine.with_options(positions=9)
    with pytest.raises(ValueError, match="lm_head"):
        engine.with_options(lm_head="int8")
