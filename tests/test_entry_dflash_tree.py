"""The ``dflash-tree`` SGLang entry on the CPU, through the export of every SGLang entry applied to stock.

A fresh process (torchvision stand-in, TorchDynamo off so SGLang's compiled helpers run eagerly) imports the
patched SGLang and checks:

- server arguments: a stock DFLASH command line resolves as before (no tree flag, the window stock's); with
  tree flags the window is N + 1; bad flags are refused while parsing, each naming its flag and the fix;
- a real ``CandidateSelector`` (SGLang's DFlash2 module) scores a lattice; the entry's ``TreeStep`` builds
  trees from it that equal the replay package's best-first builder node for node, and its verify layout,
  SGLang custom mask, acceptance, committed tokens and KV slot order equal brute-force constructions;
- with the flags unset the worker's tree decoder is None (stock's chain step runs); with them set, an attention
  backend without the custom-mask verify is refused at start-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from specpilot_mem.sglang.cpu_import import import_environment, write_torchvision_standin

pytestmark = pytest.mark.sglang

PROBE = textwrap.dedent(r"""
    import json, sys, types
    from pathlib import Path
    import numpy as np
    import torch

    models = Path(sys.argv[1])
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.runtime_context import get_context

    base = ["--model-path", str(models / "target"), "--device", "cuda", "--skip-tokenizer-init"]
    dflash = base + ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(models / "dflash2")]
    tree = dflash + ["--specpilot-tree-nodes", "32", "--specpilot-tree-drafted-positions", "16",
                     "--specpilot-tree-depth", "15", "--attention-backend", "fa3"]
    out = {}

    def resolved(argv):
        args = prepare_server_args(argv)
        args.resolve_once()
        return args

    stock = resolved(dflash)
    view = resolving_view(stock)
    out["stock"] = {"nodes": view.specpilot_tree_nodes, "window": view.speculative_num_draft_tokens,
                    "topk": view.speculative_eagle_topk}
    with_tree = resolved(tree)
    out["tree"] = {"nodes": resolving_view(with_tree).specpilot_tree_nodes,
                   "window": resolving_view(with_tree).speculative_num_draft_tokens}
    dspark = base + ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(models / "dspark")]
    dspark_stock, dspark_tree = resolved(dspark), resolved(dspark + tree[len(dflash):])
    out["dspark_stock"] = {"nodes": resolving_view(dspark_stock).specpilot_tree_nodes,
                           "window": resolving_view(dspark_stock).speculative_num_draft_tokens}
    out["dspark_tree"] = {"nodes": resolving_view(dspark_tree).specpilot_tree_nodes,
                          "window": resolving_view(dspark_tree).speculative_num_draft_tokens}
    bad = {
        "budget_zero": dflash + ["--specpilot-tree-nodes", "0"],
        "budget_over_buffers": dflash + ["--specpilot-tree-nodes", "64"],
        "depth_over_positions": dflash + ["--specpilot-tree-nodes", "32", "--specpilot-tree-depth", "16"],
        "no_lattice": base + ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
                              str(models / "dflash"), "--specpilot-tree-nodes", "32"],
        "not_dflash": base + ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                              str(models / "dflash2"), "--specpilot-tree-nodes", "32"],
        "depth_without_nodes": dflash + ["--specpilot-tree-depth", "4"],
        "dspark_recurrent_head": base + ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path",
                                         str(models / "dspark_rnn"), "--specpilot-tree-nodes", "32"],
        "dspark_depth_over_positions": dspark + ["--specpilot-tree-nodes", "32", "--specpilot-tree-drafted-positions",
                                                 "8", "--specpilot-tree-depth", "9"],
    }
    out["refused"] = {}
    for name, argv in bad.items():
        try:
            resolved(argv)
            out["refused"][name] = None
        except ValueError as err:
            out["refused"][name] = {"flag": getattr(err, "flag", None), "message": str(err)}

    # a real CandidateSelector lattice -> trees, layout, mask, acceptance, KV order
    from sglang.srt.models.dflash import CandidateSelector
    from sglang.srt.specpilot.dflash_tree import TreeStep, permute_window_slots
    from sglang.srt.specpilot.dflash_tree_args import tree_settings
    from sglang.srt.specpilot.kernels.draft_tree import greedy_accept_reference, verify_layout_reference
    from specpilot_mem.replay.trees import get_builder
    from specpilot_mem.replay.trees.base import StepBatch

    torch.manual_seed(0)
    B, P, K, V, H = 3, 16, 16, 512, 32
    selector = CandidateSelector(hidden_size=H, vocab_size=V, state_rank=8, top_k=K)
    with torch.no_grad():
        for p in selector.parameters():
            p.normal_(0, 0.7)
    unary_full = torch.randn(B, P, V) * 2
    unary, cand = unary_full.topk(K, dim=-1)
    anchor = torch.randint(0, V, (B,))
    with torch.no_grad():
        scores = selector.build_lattice(candidate_ids=cand, unary_logits=unary, hidden_states=torch.randn(B, P, H),
                                        anchor_token_ids=anchor)
    settings = tree_settings(32, 15, 16, algorithm="DFLASH", trained_block=17, selector_top_k=K)
    prefix = torch.tensor([5, 0, 11])
    step = TreeStep.build(settings, cand, scores.float(), anchor, prefix)
    replay = get_builder("best-first")(StepBatch.from_scores(cand, unary.numpy(), scores.float().numpy()), 32, 15)
    out["replay_equal"] = {
        "parents": bool(np.array_equal(step.tree.parents.numpy(), replay.parents)),
        "depths": bool(np.array_equal(step.tree.depths.numpy(), replay.depths)),
        "ranks": bool(np.array_equal(step.tree.ranks.numpy(), replay.ranks)),
        "tokens": bool(np.array_equal(step.tokens[:, 1:].numpy(), replay.tokens)),
        "scores": bool(np.array_equal(step.tree.scores.numpy(), replay.scores)),
        "max_depth": int(step.tree.depths.max()),
    }
    again = TreeStep.from_tree(step.tree, step.tokens[:, 1:].masked_fill(step.tokens[:, 1:] < 0, -1), anchor, prefix)
    out["from_tree_equal"] = all(bool(torch.equal(a, b)) for a, b in zip(again.layout, step.layout))
    brute = verify_layout_reference(step.tree.parents, step.tree.num_nodes, prefix)
    out["layout_equal"] = {f: bool(torch.equal(getattr(step.layout, f), getattr(brute, f))) for f in brute._fields}
    flat = step.custom_mask(prefix)
    rows = []
    for b in range(B):
        for i in range(33):
            rows.append(torch.cat([torch.ones(int(prefix[b]), dtype=torch.bool), brute.mask[b, i]]))
    out["custom_mask_equal"] = bool(torch.equal(flat, torch.cat(rows)))

    # target argmax: request 0 follows its deepest path 3 levels, request 1 misses at once, request 2 follows
    # its deepest path to the end (a full-depth hit)
    predict = torch.randint(0, V, (B, 33))
    def follow(b, levels):
        node = int(step.tree.depths[b].argmax())
        path = []
        while node >= 0:
            path.insert(0, node)
            node = int(step.tree.parents[b, node])
        col = 0
        for node in path[:levels]:
            predict[b, col] = step.tokens[b, node + 1]
            col = node + 1
        return len(path)
    follow(0, 3)
    out["deepest_2"] = follow(2, 99)
    predict[1, 0] = V + 1  # no token of the tree
    acc = step.accept(predict)
    ref = greedy_accept_reference(step.tokens[:, 1:], step.tree.parents, step.tree.num_nodes, predict)
    out["accept_equal"] = all(bool(torch.equal(a, b)) for a, b in zip(acc, ref))
    out["accept_length"] = acc.accept_length.tolist()
    tokens, commit_lens = acc.commit_tokens, acc.accept_length + 1
    ok = True
    for b in range(B):
        path = [c for c in acc.accept_columns[b].tolist() if c >= 0][1:]
        want = [int(step.tokens[b, c]) for c in path] + [int(acc.bonus[b])]
        ok &= tokens[b, :len(want)].tolist() == want and int(commit_lens[b]) == len(want)
    out["commit_tokens_ok"] = bool(ok)
    req_to_token = torch.arange(4 * 64).view(4, 64) * 10
    pool_rows = torch.tensor([2, 0, 3])
    before = req_to_token.clone()
    order = acc.commit_order
    slots = permute_window_slots(req_to_token, pool_rows, prefix, order)
    ok = True
    for b in range(B):
        r, p0 = int(pool_rows[b]), int(prefix[b])
        window = before[r, p0:p0 + 33].tolist()
        path = [c for c in acc.accept_columns[b].tolist() if c >= 0]
        rest = [c for c in range(33) if c not in path]
        ok &= req_to_token[r, p0:p0 + 33].tolist() == [window[c] for c in path + rest] == slots[b].tolist()
        ok &= torch.equal(req_to_token[r, :p0], before[r, :p0]) and torch.equal(req_to_token[r, p0 + 33:], before[r, p0 + 33:])
    out["slot_order_ok"] = bool(ok)
    out["untouched_row"] = bool(torch.equal(req_to_token[1], before[1]))

    # DSpark: Eq. (1) with the parent as x_{s-1} from SGLang's own Markov heads, the same builder
    from sglang.srt.models.dspark import GatedMarkovHead, RNNHead, VanillaMarkov
    from sglang.srt.specpilot.dflash_tree import markov_lattice

    out["markov"] = {}
    base_logits, hidden = torch.randn(B, P, V) * 2, torch.randn(B, P, H)
    for head in (VanillaMarkov(vocab_size=V, markov_rank=8), GatedMarkovHead(vocab_size=V, markov_rank=8, hidden_size=H)):
        with torch.no_grad():
            for p in head.parameters():
                p.normal_(0, 0.7)
            m_cand, m_unary, m_pair = markov_lattice(head, base_logits, anchor, hidden, K)
            worst = 0.0
            for s in range(P):  # the head's own step_bias for every parent, read at the candidates
                parents = anchor[:, None].expand(B, K) if s == 0 else m_cand[:, s - 1]
                hs = hidden[:, s, None, :].expand(B, K, H).reshape(-1, H)
                bias, _ = head.step_bias(parents.reshape(-1), hidden_states=hs, state=None)
                want = bias.view(B, K, V).gather(-1, m_cand[:, s, None, :].expand(B, K, K))
                worst = max(worst, float((want - m_pair[:, s]).abs().max()))
        m_step = TreeStep.build(settings, m_cand, m_pair, anchor, prefix, unary=m_unary, kind="markov")
        m_replay = get_builder("best-first")(StepBatch.from_scores(m_cand, m_unary.numpy(), m_pair.numpy(),
                                                                   kind="markov"), 32, 15)
        out["markov"][type(head).__name__] = {
            "pair_vs_step_bias": worst,
            "tree_equal": bool(np.array_equal(m_step.tree.parents.numpy(), m_replay.parents)
                               and np.array_equal(m_step.tokens[:, 1:].numpy(), m_replay.tokens)
                               and np.array_equal(m_step.tree.scores.numpy(), m_replay.scores)),
            "max_depth": int(m_step.tree.depths.max())}
    try:
        markov_lattice(RNNHead(vocab_size=V, markov_rank=8, hidden_size=H), base_logits, anchor, hidden, K)
        out["markov"]["rnn_refused"] = None
    except ValueError as err:
        out["markov"]["rnn_refused"] = str(err)

    # DSpark's tree step through DSparkTreeDecoder.draft_trees: the block through the drafter (a stand-in runner
    # that records the ForwardBatch and returns fixed hidden rows), the base logits of the rows after the anchor,
    # Eq. (1) with SGLang's VanillaMarkov head, the trees: equal to the replay builder on the same lattice
    import contextlib
    from sglang.srt.specpilot.dflash_tree import DSparkTreeDecoder
    from sglang.srt.utils.hf_transformers_utils import get_config

    get_context().set_server_args(dspark_tree)
    head = VanillaMarkov(vocab_size=V, markov_rank=8)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.7)
    lm_head = torch.randn(V, H)
    rows = torch.randn(B * 17, H)
    seen = {}

    def draft_forward(forward_batch):
        seen["batch"] = forward_batch
        return types.SimpleNamespace(logits_output=types.SimpleNamespace(hidden_states=rows))

    plans = types.SimpleNamespace(plan=lambda **kw: types.SimpleNamespace(bind=lambda *a: None))
    dworker = types.SimpleNamespace(
        draft_model=types.SimpleNamespace(markov_head=head, embed_tokens=torch.nn.Embedding(V, H),
                                          compute_base_logits=lambda h: (h @ lm_head.T, h)),
        draft_model_runner=types.SimpleNamespace(model_config=types.SimpleNamespace(
            hf_config=get_config(str(models / "dspark"), trust_remote_code=False)), forward=draft_forward,
            kv_index_translator=None),
        target_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(
            server_args=types.SimpleNamespace(attention_backend="triton"), kv_index_translator=plans)),
        sample_from_anchor=False, _target_is_mambaish=False, _deferred_commit=lambda: None, _draft_is_moe=False,
        verify_num_draft_tokens=33, device="cpu", _mask_token_id=V - 1,
        _proposer=types.SimpleNamespace(_base_logits_context=contextlib.nullcontext))
    decoder = DSparkTreeDecoder.from_worker(dworker)
    out["dspark_decoder"] = {"window": decoder.window, "draft_block": decoder.draft_block,
                             "nodes": decoder.settings.nodes, "depth": decoder.settings.depth,
                             "candidates": decoder.settings.candidates}
    window_slots = torch.arange(B * 33).view(B, 33) + 1000
    dbatch = types.SimpleNamespace(seq_lens=prefix, req_pool_indices=torch.tensor([2, 0, 3]))
    d_step = decoder.draft_trees(dbatch, types.SimpleNamespace(bonus_tokens=anchor), window_slots, None)
    fb = seen["batch"]
    want_ids = torch.full((B, 17), V - 1)
    want_ids[:, 0] = anchor
    out["dspark_draft_batch"] = {
        "ids": bool(torch.equal(fb.input_ids, want_ids.flatten())),
        "slots": bool(torch.equal(fb.out_cache_loc, window_slots[:, :17].reshape(-1))),
        "positions": bool(torch.equal(fb.positions, (prefix[:, None] + torch.arange(17)).reshape(-1))),
        "algorithm": str(fb.spec_algorithm)}
    hidden = rows.view(B, 17, H)[:, 1:]
    with torch.no_grad():
        d_cand, d_unary, d_pair = markov_lattice(head, hidden @ lm_head.T, anchor, hidden, 16)
    d_replay = get_builder("best-first")(StepBatch.from_scores(d_cand, d_unary.numpy(), d_pair.numpy(),
                                                               kind="markov"), 32, 15)
    out["dspark_tree_equal"] = bool(np.array_equal(d_step.tree.parents.numpy(), d_replay.parents)
                                    and np.array_equal(d_step.tokens[:, 1:].numpy(), d_replay.tokens)
                                    and np.array_equal(d_step.tree.scores.numpy(), d_replay.scores))
    dworker.target_worker.model_runner.server_args.attention_backend = "fa3"
    dworker._target_is_mambaish = True
    try:
        DSparkTreeDecoder.from_worker(dworker)
        out["dspark_refused"] = None
    except ValueError as err:
        out["dspark_refused"] = str(err)
    get_context().set_server_args(dspark_stock)
    out["dspark_decoder_flags_unset"] = DSparkTreeDecoder.from_worker(dworker) is None

    # the worker's decoder: None with the flags unset, refused with a backend that ignores the tree mask
    from sglang.srt.specpilot.dflash_tree import TreeDecoder
    worker = types.SimpleNamespace(selector=selector, draft_model=types.SimpleNamespace(block_size=16), block_size=33,
                                   use_compact_draft_cache=False,
                                   target_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(
                                       server_args=types.SimpleNamespace(attention_backend="fa3"))))
    get_context().set_server_args(stock)
    out["decoder_flags_unset"] = TreeDecoder.from_worker(worker) is None
    print(json.dumps(out))
""")

PROBE_ON = textwrap.dedent(r"""
    import json, sys, types
    from pathlib import Path
    models = Path(sys.argv[1])
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.runtime_context import get_context
    from sglang.srt.specpilot.dflash_tree import TreeDecoder
    args = prepare_server_args(["--model-path", str(models / "target"), "--device", "cuda", "--skip-tokenizer-init",
                                "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
                                str(models / "dflash2"), "--specpilot-tree-nodes", "32",
                                "--specpilot-tree-drafted-positions", "16", "--attention-backend", "fa3"])
    args.resolve_once()
    get_context().set_server_args(args)
    worker = types.SimpleNamespace(selector=types.SimpleNamespace(top_k=16), draft_model=types.SimpleNamespace(block_size=16),
                                   block_size=33, use_compact_draft_cache=False,
                                   target_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(
                                       server_args=types.SimpleNamespace(attention_backend="fa3"))))
    out = {}
    try:
        TreeDecoder.from_worker(worker)
        out["refused"] = None
    except ValueError as err:
        out["refused"] = str(err)
    worker.target_worker.model_runner.server_args.attention_backend = "triton"
    decoder = TreeDecoder.from_worker(worker)
    out["triton"] = {"window": decoder.window, "draft_block": decoder.draft_block, "nodes": decoder.settings.nodes,
                     "depth": decoder.settings.depth}
    print(json.dumps(out))
""")


def write_models(root):
    """Config files only: a small Qwen3 target, a DFlash2 drafter (selector) and a plain DFlash one."""
    common = {
        "model_type": "qwen3",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 512,
        "vocab_size": 4096,
        "max_position_embeddings": 4096,
        "head_dim": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
    }
    configs = {
        "target": {**common, "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 6},
        "dflash2": {
            **common,
            "architectures": ["DFlashDraftModel"],
            "block_size": 16,
            "num_target_layers": 6,
            "dflash_config": {
                "block_size": 16,
                "selector_rank": 64,
                "selector_top_k": 16,
                "target_layer_ids": [1, 3, 5],
            },
        },
        "dflash": {
            **common,
            "architectures": ["DFlashDraftModel"],
            "block_size": 16,
            "num_target_layers": 6,
            "dflash_config": {"block_size": 16, "target_layer_ids": [1, 3, 5]},
        },
    }
    for name, head in (("dspark", "vanilla"), ("dspark_rnn", "rnn")):  # DSpark drafters: gamma 16, Markov heads
        configs[name] = {
            **common,
            "architectures": ["DSparkDraftModel"],
            "num_target_layers": 6,
            "dflash_config": {
                "block_size": 16,
                "target_layer_ids": [1, 3, 5],
                "markov_rank": 8,
                "markov_head_type": head,
                "mask_token_id": 4095,
            },
        }
    for name, config in configs.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def probes(sglang_entries_export, tmp_path_factory):
    export, order = sglang_entries_export
    assert "dflash-tree" in order, "entries/dflash-tree is missing from the memory"
    standin = write_torchvision_standin(tmp_path_factory.mktemp("standin"))
    models = write_models(tmp_path_factory.mktemp("models"))
    env = {**import_environment(export, standin), "TORCHDYNAMO_DISABLE": "1", "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], os.getcwd()])  # the replay builder to compare with
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-c", code, str(models)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for name, code in (("main", PROBE), ("on", PROBE_ON))
    }
    out = {}
    for name, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"probe {name} failed:\n{stderr[-4000:]}"
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    return out


def test_flags_unset_resolve_as_stock(probes):
    stock = probes["main"]["stock"]
    assert stock["nodes"] is None
    assert stock["window"] == 16 and stock["topk"] == 1  # stock DFLASH: the drafter's block, a chain
    assert probes["main"]["decoder_flags_unset"] is True


def test_tree_flags_widen_the_verify_window(probes):
    assert probes["main"]["tree"] == {"nodes": 32, "window": 33}


@pytest.mark.parametrize(
    "case,flag",
    [
        ("budget_zero", "--specpilot-tree-nodes"),
        ("budget_over_buffers", "--specpilot-tree-nodes"),
        ("depth_over_positions", "--specpilot-tree-depth"),
        ("no_lattice", "--specpilot-tree-nodes"),
        ("not_dflash", "--specpilot-tree-nodes"),
        ("depth_without_nodes", "--specpilot-tree-depth"),
        ("dspark_recurrent_head", "--specpilot-tree-nodes"),
        ("dspark_depth_over_positions", "--specpilot-tree-depth"),
    ],
)
def test_bad_tree_flags_are_refused_while_parsing(probes, case, flag):
    refused = probes["main"]["refused"][case]
    assert refused is not None, f"{case} was accepted"
    assert refused["flag"] == flag and refused["message"].startswith(flag) and "Fix:" in refused["message"]


def test_dspark_tree_flags(probes):
    main = probes["main"]
    assert main["dspark_stock"] == {"nodes": None, "window": 17}  # stock DSpark: gamma 16 + the anchor
    assert main["dspark_tree"] == {"nodes": 32, "window": 33}
    assert "recurrent" in main["refused"]["dspark_recurrent_head"]["message"]


def test_dspark_decoder_builds_eq1_trees_through_the_drafter(probes):
    main = probes["main"]
    assert main["dspark_decoder"] == {"window": 33, "draft_block": 17, "nodes": 32, "depth": 15, "candidates": 16}
    assert main["dspark_draft_batch"] == {
        "ids": True,
        "slots": True,
        "positions": True,
        "algorithm": "SpeculativeAlgorithm.DSPARK",
    }
    assert main["dspark_tree_equal"]
    refused = main["dspark_refused"]
    assert refused is not None and "--attention-backend fa3" in refused and "hybrid" in refused
    assert main["dspark_decoder_flags_unset"] is True


def test_trees_from_a_candidate_selector_lattice_equal_the_replay_builder(probes):
    equal = probes["main"]["replay_equal"]
    assert all(equal[f] for f in ("parents", "depths", "ranks", "tokens", "scores")), equal
    assert equal["max_depth"] >= 3  # a real tree, not only a fan


def test_layout_and_custom_mask_equal_brute_force(probes):
    assert all(probes["main"]["layout_equal"].values()), probes["main"]["layout_equal"]
    assert probes["main"]["from_tree_equal"]  # a tree handed in from elsewhere lays out the same
    assert probes["main"]["custom_mask_equal"]


def test_acceptance_commit_and_kv_slot_order(probes):
    main = probes["main"]
    assert main["accept_equal"]
    assert main["accept_length"] == [3, 0, main["deepest_2"]] and main["deepest_2"] >= 3
    assert main["commit_tokens_ok"] and main["slot_order_ok"] and main["untouched_row"]


@pytest.mark.parametrize("head", ["VanillaMarkov", "GatedMarkovHead"])
def test_dspark_markov_trees_from_sglangs_heads(probes, head):
    markov = probes["main"]["markov"][head]
    assert markov["pair_vs_step_bias"] < 1e-4  # the same dot products, summed in another order
    assert markov["tree_equal"] and markov["max_depth"] >= 2


def test_recurrent_markov_heads_are_refused(probes):
    assert "RNNHead" in probes["main"]["markov"]["rnn_refused"]


def test_attention_backend_without_tree_mask_is_refused_at_start(probes):
    refused = probes["on"]["refused"]
    assert refused is not None and "--attention-backend fa3" in refused


def test_tree_decoder_with_the_triton_backend(probes):
    # 16 drafted positions (a block of 17 with the anchor), depth capped at 15 by the kernel key, window N + 1
    assert probes["on"]["triton"] == {"window": 33, "draft_block": 17, "nodes": 32, "depth": 15}
