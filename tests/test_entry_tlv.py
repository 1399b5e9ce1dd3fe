"""The ``tlv`` SGLang entry on the CPU, through the export of every SGLang entry applied to stock, and through the
memory store (``apply w12 tlv --onto stock``, ``deploy new NAME --from w12,tlv``).

A fresh process imports the patched SGLang (torchvision stand-in, TorchDynamo off, Triton interpreter) and checks:

- server arguments: a stock DFLASH command line resolves as before (--specpilot-tlv off); --specpilot-tlv without
  --quantization w12, without a tree budget, or with another attention backend is refused while parsing, naming the
  flag; with everything the verify window holds C and the second draft block;
- the W12 method in the Q pass: a real ``W12LinearMethod`` layer's Q-pass output is x times the 8-bit view's weights
  bit for bit, no buffer is added (no second copy), the Q pass does not read the nibble plane (zeroing it changes the
  exact output only); RadixAttention asks its backend not to store keys and values in the Q pass only;
- the cycle's trees: from a real tree step (dflash-tree's TreeStep, the vendored draft_tree kernels) a Q pass wrong
  everywhere and a right one each give a chain C, C plus the second subtree is a valid N-node tree, and the exact
  pass's acceptance over it commits exactly the target's greedy tokens (more of them with the right Q pass);
- with --specpilot-tlv unset the worker's TLV decoder is None (dflash-tree's step runs); a W12 layer whose record
  version has no readable view is refused at start-up with the conversion command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from specpilot_kernels.w12.format import FORMAT_VERSION
from test_entry_dflash_tree import write_models

from specpilot_mem.sglang.cpu_import import import_environment, write_torchvision_standin

pytestmark = pytest.mark.sglang

PROBE = textwrap.dedent(r"""
    import json, sys, types
    from pathlib import Path
    import torch
    import torch.nn.functional as F

    models = Path(sys.argv[1])
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.runtime_context import get_context

    base = ["--model-path", str(models / "target"), "--device", "cuda", "--skip-tokenizer-init"]
    dflash = base + ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(models / "dflash2")]
    tree = dflash + ["--specpilot-tree-nodes", "32", "--specpilot-tree-drafted-positions", "16", "--specpilot-tree-depth", "15"]
    out = {}

    def resolved(argv):
        args = prepare_server_args(argv)
        args.resolve_once()
        return args

    stock = resolved(dflash)
    view = resolving_view(stock)
    out["stock"] = {"tlv": view.specpilot_tlv, "low_bits": view.specpilot_tlv_low_bits,
                    "qpass": view.specpilot_tlv_qpass, "window": view.speculative_num_draft_tokens}
    on = resolved(tree + ["--specpilot-tlv", "--quantization", "w12", "--attention-backend", "triton"])
    out["on"] = {"tlv": resolving_view(on).specpilot_tlv, "window": resolving_view(on).speculative_num_draft_tokens}
    bad = {
        "no_w12": tree + ["--specpilot-tlv", "--attention-backend", "triton"],
        "no_tree_budget": dflash + ["--specpilot-tlv", "--quantization", "w12", "--attention-backend", "triton"],
        "other_backend": tree + ["--specpilot-tlv", "--quantization", "w12", "--attention-backend", "fa3"],
    }
    out["refused"] = {}
    for name, argv in bad.items():
        try:
            resolved(argv)
            out["refused"][name] = None
        except ValueError as err:
            out["refused"][name] = {"flag": getattr(err, "flag", None), "message": str(err)}

    # the W12 method in the Q pass
    from sglang.srt.specpilot.w12_method import W12LinearMethod
    from sglang.srt.specpilot.tlv_state import qpass_mode
    from sglang.srt.specpilot.kernels.w12 import encode
    from sglang.srt.specpilot.kernels.w12.reference import qpass_weight_reference

    torch.manual_seed(0)
    weight = (torch.randn(384, 256) * 0.02).to(torch.bfloat16)
    weight[0, :7] = 0.0
    x = torch.randn(5, 256).to(torch.bfloat16)
    method, layer = W12LinearMethod("p"), torch.nn.Module()
    method.create_weights(layer, 256, [384], 256, 384, torch.bfloat16, weight_loader=None)
    layer.weight.data.copy_(weight)
    method.process_weights_after_loading(layer)
    buffers = lambda: sorted((n, b.data_ptr(), b.numel() * b.element_size()) for n, b in layer.named_buffers())
    before = buffers()
    exact = method.apply(layer, x)
    with qpass_mode("midpoint"):
        q = method.apply(layer, x)
    with qpass_mode("truncated"):
        q_truncated = method.apply(layer, x)
    out["w12"] = {
        "exact_equal": bool(torch.equal(exact, F.linear(x, weight))),
        "q_equal_view": bool(torch.equal(q, F.linear(x, qpass_weight_reference(encode(weight), "midpoint")))),
        "q_truncated_equal_view": bool(torch.equal(q_truncated, F.linear(x, qpass_weight_reference(encode(weight), "truncated")))),
        "q_differs": not bool(torch.equal(q, exact)),
        "buffers_unchanged": buffers() == before, "bf16_released": not hasattr(layer, "weight"),
        "version": layer.w12_version,
    }
    layer.w12_nibbles.zero_()  # the low mantissa plane: the exact pass reads it, the Q pass must not
    with qpass_mode("midpoint"):
        out["w12"]["q_ignores_nibbles"] = bool(torch.equal(method.apply(layer, x), q))
    out["w12"]["exact_reads_nibbles"] = not bool(torch.equal(method.apply(layer, x), exact))

    # the INT8 Q-pass copy variant (--specpilot-tlv-qpass int8): made at load, its memory on top of W12's
    from sglang.srt.specpilot.kernels.w12.int8_copy import int8_copy, int8_weight_reference
    int8_method, int8_layer = W12LinearMethod("p", qpass="int8"), torch.nn.Module()
    int8_method.create_weights(int8_layer, 256, [384], 256, 384, torch.bfloat16, weight_loader=None)
    int8_layer.weight.data.copy_(weight)
    int8_method.process_weights_after_loading(int8_layer)
    sizes = {n: b.numel() * b.element_size() for n, b in int8_layer.named_buffers()}
    with qpass_mode("midpoint"):
        q_int8 = int8_method.apply(int8_layer, x)
    want = F.linear(x, int8_weight_reference(int8_copy(weight)).to(torch.bfloat16))
    out["int8"] = {
        "copy_bytes": sizes.get("tlv_int8_weight", 0) + sizes.get("tlv_int8_scale", 0),
        "w12_bytes": sum(v for n, v in sizes.items() if n.startswith("w12_")),
        "q_equal_copy": bool(torch.equal(q_int8, want)),
        "exact_unchanged": bool(torch.equal(int8_method.apply(int8_layer, x), exact)),
        "view_method_has_no_copy": not any(n.startswith("tlv_int8") for n, _ in layer.named_buffers()),
    }

    # which product the Q pass runs, per --specpilot-tlv-qpass and GPU
    from sglang.srt.specpilot.tlv import qpass_product
    places = {"cpu": (False, None), "sm80": (True, (8, 0)), "sm89": (True, (8, 9)), "sm90": (True, (9, 0))}
    out["products"] = {f"{choice}@{place}": qpass_product(choice, cuda, cap, True)
                       for choice in ("fp8", "bf16", "int8") for place, (cuda, cap) in places.items()}
    out["products"]["fp8@sm90-planes"] = qpass_product("fp8", True, (9, 0), False)

    # RadixAttention: no KV store in the Q pass (the backend is recorded: no attention backend runs on the CPU)
    import sglang.srt.layers.radix_attention as radix
    calls = []
    class Recorder:
        def forward(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs):
            calls.append(save_kv_cache)
            return q
    radix.get_attn_backend = lambda: Recorder()
    radix.padded_extend_real_tokens = lambda q, forward_batch: None
    attn = radix.RadixAttention(num_heads=2, head_dim=8, scaling=1.0, num_kv_heads=2, layer_id=0)
    t = torch.zeros(3, 16)
    batch = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_extend=lambda: True))
    attn.forward(t, t, t, batch)
    with qpass_mode("midpoint"):
        attn.forward(t, t, t, batch)
    out["save_kv_cache"] = calls

    # the cycle's trees and acceptance with a Q pass wrong everywhere and a right one
    from sglang.srt.specpilot.dflash_tree import TreeStep
    from sglang.srt.specpilot.dflash_tree_args import tree_settings
    from sglang.srt.specpilot.kernels.draft_tree import best_first_tree
    from sglang.srt.specpilot.tlv import TlvDecoder, combined_tree, q_chain

    B, P, K, V, N = 3, 16, 16, 64, 32
    settings = tree_settings(N, 15, P, algorithm="DFLASH", trained_block=P + 1, selector_top_k=K)
    greedy = lambda seq: (seq[-1] * 31 + seq[-2] * 7 + 3) % V  # the target's greedy next token
    g = torch.Generator().manual_seed(1)
    history = [torch.randint(0, V, (10 + 7 * b,), generator=g).tolist() for b in range(B)]
    anchor = torch.randint(0, V, (B,), generator=g)
    prefix = torch.tensor([len(h) for h in history])

    def lattice(starts):
        # a drafter that is right at candidate 0 with high score (the greedy continuation of each start)
        cand = torch.randint(0, V, (B, P, K), generator=g)
        for b, seq in enumerate(starts):
            seq = list(seq)
            for s in range(P):
                cand[b, s, 0] = greedy(seq)
                seq.append(int(cand[b, s, 0]))
        scores = torch.randn(B, P, K, K, generator=g)
        scores[:, :, :, 0] += 3.0
        return cand, scores

    def predict(step):
        # the target's argmax at every column: its greedy token after the column's root path
        tokens, parent = step.tokens, step.layout.retrieve_parent
        out_ = torch.zeros_like(tokens)
        for b in range(B):
            for col in range(tokens.shape[1]):
                path, c = [], col
                while c >= 0:
                    path.append(int(tokens[b, c]))
                    c = int(parent[b, c])
                out_[b, col] = greedy(history[b] + path[::-1])
        return out_

    cand, scores = lattice([h + [int(a)] for h, a in zip(history, anchor)])
    first = TreeStep.build(settings, cand, scores, anchor, prefix)
    exact_first = predict(first)
    decoder = TlvDecoder.__new__(TlvDecoder)
    out["cycle"] = {}
    for name, q_predict in (("wrong_q", (exact_first + 1) % V), ("right_q", exact_first)):
        chain_tokens, chain_len, _ = q_chain(first, q_predict)
        starts = [history[b] + [int(anchor[b])] + chain_tokens[b, : int(chain_len[b])].tolist() for b in range(B)]
        cand2, scores2 = lattice(starts)
        sub, sub_tokens, _, _ = best_first_tree(scores2, cand2, N - 1, 15)
        tree, node_tokens = combined_tree(chain_tokens, chain_len, sub, sub_tokens, N)
        step = decoder._padded_step(tree, node_tokens, anchor, prefix)
        acceptance = step.accept(predict(step))
        committed, lens = step.commit_tokens(acceptance)
        lossless, valid = True, True
        for b in range(B):
            seq = history[b] + [int(anchor[b])]
            for i in range(int(lens[b])):
                lossless &= int(committed[b, i]) == greedy(seq)
                seq.append(int(committed[b, i]))
            n = int(tree.num_nodes[b])
            for i in range(n):
                p = int(tree.parents[b, i])
                valid &= p < i and int(tree.depths[b, i]) == (1 if p < 0 else int(tree.depths[b, p]) + 1)
            valid &= node_tokens[b, : int(chain_len[b])].tolist() == chain_tokens[b, : int(chain_len[b])].tolist()
        out["cycle"][name] = {"lossless": bool(lossless), "valid_tree": bool(valid), "nodes": tree.num_nodes.tolist(),
                              "chain": chain_len.tolist(), "committed": lens.tolist()}

    # the worker's decoder: None with --specpilot-tlv unset; an unreadable view refused
    from sglang.srt.specpilot.tlv import check_readable_views
    get_context().set_server_args(stock)
    out["decoder_flag_unset"] = TlvDecoder.from_worker(types.SimpleNamespace()) is None
    old = torch.nn.Module()
    old.proj = layer
    out["readable_checked"] = check_readable_views(old)
    layer.w12_version = 0
    try:
        check_readable_views(old)
        out["old_view_refused"] = None
    except ValueError as err:
        out["old_view_refused"] = str(err)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def probe(sglang_entries_export, tmp_path_factory):
    export, order = sglang_entries_export
    assert "tlv" in order, "entries/tlv is missing from the memory"
    standin = write_torchvision_standin(tmp_path_factory.mktemp("standin"))
    models = write_models(tmp_path_factory.mktemp("models"))
    env = {**import_environment(export, standin), "TORCHDYNAMO_DISABLE": "1", "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(models)], capture_output=True, env=env, text=True, timeout=900
    )
    assert proc.returncode == 0, f"probe failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_flags_unset_resolve_as_stock(probe):
    assert probe["stock"]["tlv"] is False and probe["stock"]["low_bits"] == "midpoint"
    assert probe["stock"]["qpass"] == "fp8"
    assert probe["decoder_flag_unset"]


def test_tlv_widens_the_window_for_the_second_draft(probe):
    assert probe["on"]["tlv"] is True
    assert probe["on"]["window"] == max(32 + 1, 15 + 16 + 2)


@pytest.mark.parametrize(
    "case, flag",
    [
        ("no_w12", "--quantization"),
        ("no_tree_budget", "--specpilot-tree-nodes"),
        ("other_backend", "--attention-backend"),
    ],
)
def test_missing_requirements_are_refused_while_parsing(probe, case, flag):
    refused = probe["refused"][case]
    assert refused is not None, f"{case} was accepted"
    assert refused["flag"] == flag and flag in refused["message"] and "Fix:" in refused["message"]


def test_the_qpass_reads_the_layers_own_8_bit_view(probe):
    w12 = probe["w12"]
    assert w12["exact_equal"] and w12["q_equal_view"] and w12["q_truncated_equal_view"] and w12["q_differs"]
    assert w12["buffers_unchanged"] and w12["bf16_released"]  # no second copy of the weights
    assert w12["q_ignores_nibbles"] and w12["exact_reads_nibbles"]
    assert w12["version"] == FORMAT_VERSION  # the entry vendors the library's current format


def test_the_int8_copy_variant_costs_a_byte_a_weight_and_feeds_the_qpass(probe):
    int8 = probe["int8"]
    assert int8["copy_bytes"] == 384 * 256 + 4 * 384  # 8 bits a weight + an fp32 scale a row, beside W12's planes
    assert int8["w12_bytes"] > 0 and int8["view_method_has_no_copy"]
    assert int8["q_equal_copy"] and int8["exact_unchanged"]


def test_the_qpass_runs_the_fp8_tensor_cores_where_it_can(probe):
    products = probe["products"]
    assert [products[f"fp8@{p}"] for p in ("cpu", "sm80", "sm89", "sm90")] == ["view-reference", "bf16", "fp8", "fp8"]
    assert [products[f"bf16@{p}"] for p in ("cpu", "sm80", "sm90")] == ["view-reference", "bf16", "bf16"]
    assert [products[f"int8@{p}"] for p in ("cpu", "sm90")] == ["int8-reference", "int8"]
    assert products["fp8@sm90-planes"] == "bf16"  # a W12Tensor (no fragment layout) cannot feed the FP8 MMA


def test_radix_attention_stores_no_kv_in_the_qpass_only(probe):
    assert probe["save_kv_cache"] == [True, False]


def test_the_exact_pass_alone_decides_the_committed_tokens(probe):
    wrong, right = probe["cycle"]["wrong_q"], probe["cycle"]["right_q"]
    assert wrong["lossless"] and right["lossless"] and wrong["valid_tree"] and right["valid_tree"]
    assert all(n == 32 for n in wrong["nodes"] + right["nodes"])
    assert all(c >= 1 for c in wrong["committed"])
    # the right Q pass's chain is the greedy path: the exact pass accepts all of it and more
    assert all(k >= c for k, c in zip(right["committed"], right["chain"]))
    assert sum(right["committed"]) > sum(wrong["committed"])


def test_a_record_without_a_readable_view_is_refused_at_start(probe):
    assert probe["readable_checked"] == 1
    message = probe["old_view_refused"]
    assert message and "format-version 0" in message and "specpilot_kernels.w12.convert" in message


def test_apply_and_deploy_from_the_memory(stock_fork_home, tmp_path):
    from conftest import _shared_fork_home

    from specpilot_mem.main import main
    from specpilot_mem.store import init_memory

    project = Path(__file__).resolve().parents[1]
    root = tmp_path / "home"
    (root / "entries").mkdir(parents=True)
    for record in sorted((project / "entries").glob("*/entry.yaml")):
        shutil.copytree(
            record.parent, root / "entries" / record.parent.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    (root / "kernels").symlink_to(project / "kernels")
    home = _shared_fork_home(stock_fork_home, root)
    init_memory(home, checkout=False)
    assert main(["apply", "w12", "tlv", "--onto", "stock", "--home", str(root), "--json"]) == 0
    assert (
        main(
            [
                "deploy",
                "new",
                "tlv-demo",
                "--home",
                str(root),
                "--gpu",
                "H200",
                "--model",
                "Qwen3.8-27B",
                "--drafter",
                "DFlash2",
                "--regime",
                "single",
                "--from",
                "w12,tlv",
                "--json",
            ]
        )
        == 0
    )
    deployment = (root / "rounds" / "tlv-demo" / "deployment.yaml").read_text()
    assert "tlv" in deployment and "dflash-tree" in deployment and "w12" in deployment
    branches = subprocess.run(
        ["git", "-C", str(home.fork), "branch", "--list", "deploy/tlv-demo"],
        capture_output=True,
        text=True,
        env={**os.environ},
    ).stdout
    assert "deploy/tlv-demo" in branches
