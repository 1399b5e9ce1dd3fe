"""The system engine (specpilot_mem.engine.system/decode): options, tree packing, the composed paths on tiny
shapes and on the trained pair (token identity with the existing engine where exactness holds), batching."""

import json

import pytest
import torch

from specpilot_mem.engine.model import make_rows
from specpilot_mem.engine.options import OptionsError, SystemOptions, check_fits, memory_needed
from specpilot_mem.engine.shapes import SHAPES, ShapeError, get_shape
from specpilot_mem.engine.system import Caches, StepBuffers, SystemModel, Weights, pack_trees
from specpilot_mem.engine.weights import DEFAULT_MODEL_DIR, has_trained_pair

needs_pair = pytest.mark.skipif(not has_trained_pair(), reason="needs the trained pair under models/")


def test_default_options_are_stock_and_parse_round_trips():
    assert SystemOptions().label() == "stock"
    opts = SystemOptions.parse("linears=w12,gdn_verify=path,tree=best-first,nodes=24")
    assert opts.linears == "w12" and opts.nodes == 24 and opts.rows == 25
    assert SystemOptions.parse("") == SystemOptions()


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("linears=fp8", "linears='fp8' is not an option"),
        ("lm_head=int4", "lm_head='int4'"),
        ("tree=best-first,nodes=8,positions=16", "cannot reach depth 16"),
        ("positions=17", "drafts 16 positions"),
        ("tree=best-first,nodes=64", "at most 64"),
    ],
)
def test_impossible_options_are_clear_errors(text, fragment):
    with pytest.raises(OptionsError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        SystemOptions.parse(text).validate(SHAPES["qwen3.8-27b-like"])


def test_unknown_option_and_shape_names():
    with pytest.raises(OptionsError, match="unknown option 'treee'"):
        SystemOptions.parse("treee=chain")
    with pytest.raises(OptionsError, match="unknown option"):
        SystemOptions().replace(cuda_graph=False)
    with pytest.raises(ShapeError, match="unknown shape"):
        get_shape("qwen9-1t")


def test_memory_estimate_says_what_it_needs():
    shape = SHAPES["qwen3.8-27b-like"]
    need = memory_needed(shape, SystemOptions(linears="w12"), batch=1, max_len=2048)
    assert 80e9 < need["weights"] < 100e9  # 26.9 B parameters in BF16 plus the W12 copy of the linears
    with pytest.raises(OptionsError, match=r"needs \d+\.\d GiB .*weights"):
        check_fits(need, 40 * 2**30, "single")


def test_paper_shapes_have_the_papers_sizes():
    p = SHAPES["qwen3.8-27b-like"].params()
    assert 25e9 < sum(p.values()) - p["drafter_linears"] < 28e9
    assert SHAPES["llama-3.1-8b-like"].gdn_layers == 0
    assert SHAPES["qwen3.5-4b-like"].tied_head


def test_pack_trees_matches_the_engines_rows():
    tokens, parents = [5, 6, 7, 8, 9], [-1, 0, 0, 1, 3]
    packed = pack_trees([(tokens, parents), ([1, 2], [-1, 0])], T=6, conv_size=4)
    rows = make_rows(tokens, parents, 4, "cpu")
    assert (packed["anc"][0, :5, :5] == rows.anc.numpy()).all()
    assert (packed["depth"][0, :5] == rows.depth.numpy()).all()
    assert (packed["conv_idx"][0, :5] == rows.conv_idx.numpy()).all()
    assert packed["num_nodes"].tolist() == [5, 2]
    assert packed["parents"][1].tolist() == [-1, 0, 1, 2, 3, 4]  # padding continues as a chain
    with pytest.raises(ValueError, match="bucket"):
        pack_trees([(list(range(7)), list(range(-1, 6)))], T=6, conv_size=4)


def _smoke_step(options, shape_name="qwen3.8-27b-like", rows=5, B=2):
    shape = get_shape(shape_name, smoke=True)
    weights = Weights.synthetic(shape, "cpu", torch.float32, seed=3)
    caches = Caches(shape, B, 32, "cpu", torch.float32)
    caches.randomize(7, seed=1)
    model = SystemModel(weights, options)
    buf = StepBuffers.empty(B, rows, shape.conv_size, "cpu")
    trees = [([1, 2, 3, 4, 5][:rows], [-1, 0, 0, 1, 2][:rows]), ([9, 8], [-1, 0])]
    buf.fill(pack_trees(trees[:B], rows, shape.conv_size))
    buf.forced.copy_(torch.tensor([3, 1][:B]))
    out, accept_len = model.step(buf, caches)
    return out, accept_len, caches


def test_gdn_path_verify_and_commit_give_stocks_step():
    """SGLang-style snapshot verify + copy commit vs path verify + replay commit: same tokens, same caches."""
    out_s, len_s, c_s = _smoke_step(SystemOptions(tree="best-first", nodes=16))
    out_p, len_p, c_p = _smoke_step(SystemOptions(tree="best-first", nodes=16, gdn_verify="path"))
    assert len_s.tolist() == len_p.tolist() == [3, 2]  # the root path to the forced node
    assert torch.equal(out_s, out_p)
    assert c_s.lengths.tolist() == c_p.lengths.tolist() == [10, 9]
    first = min(c_s.state)  # the first GDN layer sees the same inputs; later ones carry the GDN's rounding
    assert torch.equal(c_s.conv[first], c_p.conv[first])
    for i in c_s.state:
        torch.testing.assert_close(c_s.state[i], c_p.state[i], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(c_s.conv[i], c_p.conv[i], rtol=1e-4, atol=1e-5)
    for i in c_s.k:  # committed slots only: padding rows (past num_nodes) are zero in path verify, not in SGLang's
        for b, n in enumerate(c_s.lengths.tolist()):
            torch.testing.assert_close(c_s.k[i][b, :, :n], c_p.k[i][b, :, :n], rtol=1e-4, atol=1e-5)


def test_path_inputs_copy_only_strided_views():
    """The path kernels get contiguous q, k, v, a, b: one request's one-row views are contiguous already and go as
    they are (no copy launch); several rows' strided views are copied, values unchanged."""
    s = get_shape("qwen3.8-27b-like", smoke=True)
    H, HV, D = s.gdn_key_heads, s.gdn_value_heads, s.gdn_head_dim
    for T, copied in ((1, False), (3, True)):
        mixed = torch.randn(1, T, 2 * H * D + HV * D)
        ab = torch.randn(1, T, 3 * HV)[..., HV:]  # inside a wider projection row, as the engine's a | b are
        q, k, v = mixed.split([H * D, H * D, HV * D], dim=-1)
        views = (q.view(1, T, H, D), k.view(1, T, H, D), v.view(1, T, HV, D), *ab.split([HV, HV], dim=-1))
        inputs = SystemModel._path_inputs(*views)
        assert all(x.is_contiguous() and torch.equal(x, y) for x, y in zip(inputs, views))
        assert [x.data_ptr() != y.data_ptr() for x, y in zip(inputs, views)] == [copied] * 5


def test_path_commit_indices_are_int32_once_a_step():
    accepted, accept_len = torch.tensor([[0, 2, 3], [0, 1, 0]]), torch.tensor([3, 2])
    path, length = SystemModel._commit_indices(accepted, accept_len)
    assert path.dtype == length.dtype == torch.int32 and path.is_contiguous()
    assert path.tolist() == accepted.tolist() and length.tolist() == accept_len.tolist()


@pytest.mark.parametrize("rows", [1, 4])
def test_gdn_path_on_one_request_chain_gives_stocks_step(rows):
    """The benchmark's single-request chains (1 row: the views uncopied) through path verify + commit vs stock."""
    shape = get_shape("qwen3.8-27b-like", smoke=True)
    weights = Weights.synthetic(shape, "cpu", torch.float32, seed=3)
    runs = []
    for options in (SystemOptions(), SystemOptions(gdn_verify="path")):
        caches = Caches(shape, 1, 32, "cpu", torch.float32)
        caches.randomize(7, seed=1)
        buf = StepBuffers.empty(1, rows, shape.conv_size, "cpu")
        buf.fill(pack_trees([(list(range(5, 5 + rows)), list(range(-1, rows - 1)))], rows, shape.conv_size))
        buf.forced.fill_(rows - 1)
        out, accept_len = SystemModel(weights, options).step(buf, caches)
        runs.append((out, accept_len, caches))
    (out_s, len_s, c_s), (out_p, len_p, c_p) = runs
    assert len_s.tolist() == len_p.tolist() == [rows] and torch.equal(out_s, out_p)
    torch.testing.assert_close(c_p.state_all, c_s.state_all, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(c_p.conv_all, c_s.conv_all, rtol=1e-4, atol=1e-5)


def test_w12_linears_are_exact_on_the_cpu():
    out_s, _, c_s = _smoke_step(SystemOptions())
    out_w, _, c_w = _smoke_step(SystemOptions(linears="w12", lm_head="w12"))
    assert torch.equal(out_s, out_w)
    for i in c_s.k:
        assert torch.equal(c_s.k[i], c_w.k[i])


def test_dense_shape_runs_and_q_pass_leaves_caches_alone():
    shape = get_shape("llama-3.1-8b-like", smoke=True)
    weights = Weights.synthetic(shape, "cpu", torch.float32)
    caches = Caches(shape, 1, 32, "cpu", torch.float32)
    caches.randomize(5)
    model = SystemModel(weights, SystemOptions())
    buf = StepBuffers.empty(1, 3, shape.conv_size, "cpu")
    buf.fill(pack_trees([([4, 5, 6], [-1, 0, 0])], 3, shape.conv_size))
    before = {i: caches.k[i].clone() for i in caches.k}
    hidden_q, _, _ = model.forward(buf, caches, write_cache=False)
    assert all(torch.equal(before[i], caches.k[i]) for i in caches.k)
    hidden, _, _ = model.forward(buf, caches)
    torch.testing.assert_close(hidden_q, hidden, rtol=1e-5, atol=1e-5)


def test_draft_pass_gives_top_k_per_position():
    shape = get_shape("qwen3.5-4b-like", smoke=True)
    model = SystemModel(Weights.synthetic(shape, "cpu", torch.float32), SystemOptions())
    buf = StepBuffers.empty(2, 5, shape.conv_size, "cpu")
    ids, scores = model.draft(buf, positions=4, top_k=3)
    assert ids.shape == scores.shape == (2, 4, 3)
    # a chain's drafter takes each position's argmax alone: the first of the top-k
    first, best = model.draft(buf, positions=4, top_k=1)
    assert first.shape == (2, 4, 1) and torch.equal(first[..., 0], ids[..., 0])
    torch.testing.assert_close(best[..., 0], scores[..., 0])


def test_certified_head_in_graph_fallback_recovers_overflowing_rows():
    """max_survivors=1 overflows nearly every row: the guarded exact fallback must give the exact argmax."""
    from specpilot_kernels.certified_head import certified_argmax_in_graph, exact_head_logits, quantize_head

    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(512, 128, generator=gen) * 0.02).bfloat16()
    x = torch.randn(3, 128, generator=gen).bfloat16()
    head = quantize_head(w, exact_depth=128)
    scratch = torch.empty(32, 512)
    want = exact_head_logits(x, w, exact="triton").argmax(1)
    assert torch.equal(certified_argmax_in_graph(x, head, scratch, max_survivors=1), want)
    assert torch.equal(certified_argmax_in_graph(x, head, scratch, max_survivors=512), want)


def _pair_prompts(n, length):
    return [p[:length] for p in json.loads((DEFAULT_MODEL_DIR / "greedy-reference.json").read_text())["prompts"][:n]]


@needs_pair
def test_system_decoder_reproduces_the_engine_and_batches_like_sequential():
    from specpilot_mem.engine import Engine
    from specpilot_mem.engine.decode import SystemDecoder

    engine = Engine.load_default()
    prompts = _pair_prompts(3, 20)
    want = [g.output_ids for g in engine.generate(prompts, "ar", max_new_tokens=8)]
    decoder = SystemDecoder(engine, SystemOptions(positions=6), batch=1, max_len=128)
    assert [g.output_ids for g in decoder.generate(prompts, "ar", 8)] == want
    chains = decoder.with_options(SystemOptions(positions=6), batch=2).generate(prompts, "spec", 8)
    assert [g.output_ids for g in chains] == want
    assert all(g.tau > 1 for g in chains)


@needs_pair
def test_composed_mechanisms_are_token_identical_in_fp32():
    from specpilot_mem.engine import Engine
    from specpilot_mem.engine.decode import SystemDecoder

    engine = Engine.load_default()
    prompts = _pair_prompts(1, 16)
    want = [g.output_ids for g in engine.generate(prompts, "ar", max_new_tokens=6)]
    options = SystemOptions(positions=6, linears="w12", lm_head="w12", gdn_verify="path", tree="best-first", nodes=8)
    runs = SystemDecoder(engine, options, batch=1, max_len=128).generate(prompts, "spec", 6)
    assert [g.output_ids for g in runs] == want


@pytest.mark.gpu
def test_cuda_graph_step_equals_eager_step():
    shape = get_shape("qwen3.8-27b-like", smoke=True)
    weights = Weights.synthetic(shape, "cuda", torch.bfloat16)
    for options in (
        SystemOptions(),
        SystemOptions(linears="w12", lm_head="certified", gdn_verify="path", tree="best-first", nodes=16),
    ):
        results = []
        for graphs in (False, True):
            caches = Caches(shape, 2, 64, "cuda", torch.bfloat16)
            caches.randomize(9)
            model = SystemModel(weights, options.replace(cuda_graphs=graphs))
            buf = StepBuffers.empty(2, 5, shape.conv_size, "cuda")
            buf.fill(pack_trees([([1, 2, 3, 4, 5], [-1, 0, 0, 1, 2]), ([9, 8], [-1, 0])], 5, shape.conv_size))
            buf.forced.copy_(torch.tensor([3, 1]))
            out, n = model.graphed("step", lambda m=model, b=buf, c=caches: m.step(b, c))
            results.append((out.clone(), n.clone(), caches.lengths.clone()))
            assert model.graph_error is None
        assert all(torch.equal(a, b) for a, b in zip(*results))


@needs_pair
@pytest.mark.slow
@pytest.mark.parametrize(
    "faults",
    [
        {"flip_rate": 0.2, "flip_seed": 3},
        {"rope_offset": 7},
        {"attn_window": 4},
        {"verify_weights": "int4"},
        {"verify_weights": "fp8", "verify_weight_scope": "head"},
        {"stop_after": 5},
    ],
    ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()),
)
def test_fault_study_faults_in_the_system_engine_match_the_pure_torch_engines(faults):
    """The fault study's verify faults wired into the composed system engine are the pure-torch engine's faults:
    in fp32 both emit the same tokens (and the faults do change them)."""
    from specpilot_mem.engine import Engine
    from specpilot_mem.engine.decode import SystemDecoder

    engine = Engine.load_default()
    prompts = _pair_prompts(2, 24)
    want = [g.output_ids for g in engine.with_options(positions=6, **faults).generate(prompts, "spec", 10)]
    decoder = SystemDecoder(engine, SystemOptions(positions=6, **faults), batch=2, max_len=128)
    assert [g.output_ids for g in decoder.generate(prompts, "spec", 10)] == want
    assert want != [g.output_ids for g in engine.generate(prompts, "ar", 10)]


def test_fault_options_are_checked():
    shape = SHAPES["qwen3.8-27b-like"]
    for text, fragment in [
        ("verify_weights=int3", "not a weight format"),
        ("flip_rate=1.5", "not a share"),
        ("stop_after=0", "stop_after >= 1"),
        ("lm_head=certified,flip_rate=0.01", "certified head returns only the argmax"),
        ("linears=w12,verify_weights=int8", "replaces the BF16 weights"),
    ]:
        with pytest.raises(OptionsError, match=fragment):
            SystemOptions.parse(text).validate(shape)
    assert SystemOptions(flip_rate=0.01, attn_window=32).verify_faults == {"flip_rate": 0.01, "attn_window": 32}


@needs_pair
def test_batched_prefill_of_a_full_batch_gives_the_same_tokens():
    from specpilot_mem.engine import Engine
    from specpilot_mem.engine.decode import SystemDecoder

    engine = Engine.load_default()
    prompts = _pair_prompts(3, 20)
    decoder = SystemDecoder(engine, SystemOptions(positions=6, flip_rate=0.2), batch=3, max_len=128)
    want = [g.output_ids for g in decoder.generate(prompts, "spec", 8)]
    assert [g.output_ids for g in decoder.generate(prompts, "spec", 8, batched_prefill=True)] == want
    with pytest.raises(OptionsError, match="one length"):
        decoder.prefill_batch([prompts[0][:5], prompts[1][:6]])


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (conftest)")
@pytest.mark.parametrize("shape_name", ["qwen3.8-27b-like", "llama-3.1-8b-like"])
def test_step_through_the_fused_kernels_matches_the_torch_references(shape_name):
    """The whole stock step (a tree and a padded chain) with every fused kernel run by the Triton interpreter in
    fp32 vs the same step through the torch references: same tokens, caches, states and conv windows."""
    from specpilot_kernels.fused_ops import interpreted_kernels

    options = SystemOptions(tree="best-first", nodes=16)
    out_r, len_r, c_r = _smoke_step(options, shape_name)
    with interpreted_kernels():
        out_k, len_k, c_k = _smoke_step(options, shape_name)
    assert torch.equal(out_r, out_k) and torch.equal(len_r, len_k)
    assert torch.equal(c_r.lengths, c_k.lengths)
    for i in c_r.k:
        for b, n in enumerate(c_r.lengths.tolist()):
            torch.testing.assert_close(c_k.k[i][b, :, :n], c_r.k[i][b, :, :n], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(c_k.v[i][b, :, :n], c_r.v[i][b, :, :n], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_k.state_all, c_r.state_all, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(c_k.conv_all, c_r.conv_all, rtol=1e-5, atol=1e-5)
