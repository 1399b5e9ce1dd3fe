"""The ``gdn-tree`` SGLang entry, run on the CPU through SGLang's own backend, pool and commit code.

Two fresh processes import the export of every SGLang entry applied to stock (with the torchvision
stand-in). Each builds a real ``HybridReqToTokenPool`` and ``GDNAttnBackend`` (the model runner is a
namespace holding what the constructor reads), fills the metadata through
``init_forward_metadata`` for an EAGLE tree verify step and runs two GDN layers' ``forward_extend``,
then commits through ``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify``:

- flag on: no ``intermediate_ssm``; outputs equal the vendored path reference, the committed states its
  replay reference (radix track slot included), conv windows scatter as stock's; a chain step too;
- flag off (the default): the pool allocates ``intermediate_ssm`` and the verify and commit reach
  SGLang's own kernels. Those cannot run here (the verify kernel fails under the Triton interpreter, the
  scatter needs CUDA), so the off process replaces the two with recorders and checks what they receive.

Activations are FP32: SGLang's conv1d kernel returns garbage for BF16 under the interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from specpilot_mem.main import main
from specpilot_mem.sglang.cpu_import import import_environment, write_torchvision_standin

pytestmark = pytest.mark.sglang

PROBE = textwrap.dedent("""
    import json, sys, types
    import torch
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.runtime_context import get_context

    on = sys.argv[1] == "on"
    argv = ["--model-path", "m", "--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "2",
            "--speculative-num-draft-tokens", "6", "--speculative-num-steps", "3"]
    args = prepare_server_args(argv + (["--specpilot-gdn-tree-verify"] if on else []))
    get_context().set_server_args(args)
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hybrid_module
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from sglang.srt.layers.attention.linear.utils import LinearAttnBackends, LinearAttnKernelBackend
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.specpilot.kernels.gdn_tree.reference import commit_reference, path_verify_reference

    out = {"flag": args.specpilot_gdn_tree_verify}
    H, HV, K, V, T, B, W = 1, 2, 16, 8, 6, 2, 4
    layers = [1, 3]
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=HV * V, n_groups=H, num_heads=HV, head_dim=V,
                                    state_size=K, conv_kernel=W, conv_shard_groups=[H * K, H * K, HV * V])
    params = Mamba2CacheParams(shape=shape, layers=layers,
                               dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32))
    pool = HybridReqToTokenPool(size=4, mamba_size=4, mamba_spec_state_size=4, max_context_len=64, device="cpu",
                                enable_memory_saver=False, cache_params=params, mamba_layer_ids=layers,
                                enable_mamba_extra_buffer=False, speculative_num_draft_tokens=T,
                                speculative_eagle_topk=2)
    cache = pool.mamba_pool.mamba_cache
    snapshots = cache.intermediate_ssm
    out["snapshots"] = None if snapshots is None else list(snapshots.shape)
    triton_kernels = LinearAttnKernelBackend.TRITON
    runner = types.SimpleNamespace(server_args=types.SimpleNamespace(enable_mis=False), device="cpu",
                                   is_draft_worker=False, req_to_token_pool=pool, token_to_kv_pool=None,
                                   linear_attn_backends=LinearAttnBackends(decode=triton_kernels,
                                                                           prefill=triton_kernels,
                                                                           verify=triton_kernels))
    backend = GDNAttnBackend(runner)
    verifier = backend.specpilot_gdn_tree
    out["verifier"] = verifier is not None

    torch.manual_seed(0)
    trees = torch.tensor([[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 1, 3, 4]])  # parents, topological order
    first_child = torch.full((B, T), -1, dtype=torch.int64)
    next_sibling = torch.full((B, T), -1, dtype=torch.int64)
    for r in range(B):
        children = {}
        for i in range(1, T):
            children.setdefault(int(trees[r, i]), []).append(i)
        for parent, kids in children.items():
            first_child[r, parent] = kids[0]
            for left, right in zip(kids, kids[1:]):
                next_sibling[r, left] = right
    slots = torch.tensor([3, 1])
    requests = torch.tensor([1, 2])
    pool.req_index_to_mamba_index_mapping[requests] = slots.to(pool.req_index_to_mamba_index_mapping.dtype)
    cache.temporal.normal_()
    for conv in cache.conv:
        conv.normal_()

    def verify_step():
        batch = types.SimpleNamespace(
            batch_size=B, forward_mode=ForwardMode.TARGET_VERIFY, logical_forward_mode=ForwardMode.TARGET_VERIFY,
            req_pool_indices=requests, mamba_track_indices=None, mamba_track_mask=None,
            input_ids=torch.zeros(B * T, dtype=torch.int64), multi_item_delimiter_indices=None,
            extend_start_loc=None, extend_seq_lens=None,
            spec_info=types.SimpleNamespace(draft_token_num=T, ragged_verify_layout=None,
                                            retrieve_next_token=first_child, retrieve_next_sibling=next_sibling))
        backend.init_forward_metadata(batch)
        outputs, inputs = {}, {}
        for layer_id in layers:
            dim = 2 * H * K + HV * V
            if layer_id == layers[0]:  # an identity conv (last tap 1, no activation): q, k, v are the input
                conv_weights, activation = torch.zeros(dim, W), None
                conv_weights[:, -1] = 1.0
            else:
                conv_weights, activation = torch.randn(dim, W) * 0.3, "silu"
            layer = types.SimpleNamespace(
                layer_id=layer_id, conv_weights=conv_weights, bias=None, activation=activation,
                A_log=torch.randn(HV) * 0.5, dt_bias=torch.randn(HV) * 0.5, q_dim=H * K, k_dim=H * K, v_dim=HV * V,
                num_q_heads=H, num_k_heads=H, num_v_heads=HV, head_q_dim=K, head_k_dim=K, head_v_dim=V)
            inputs[layer_id] = (torch.randn(B * T, dim), torch.randn(B * T, HV), torch.randn(B * T, HV))
            outputs[layer_id] = backend.forward_extend(layer, batch, *inputs[layer_id])
        return outputs, inputs

    def worst_error(result, expected):
        return float((result - expected).abs().max() / expected.abs().max())

    hybrid = hybrid_module.HybridLinearAttnBackend.__new__(hybrid_module.HybridLinearAttnBackend)
    hybrid.linear_attn_backend = backend
    last = torch.tensor([4, 5])  # accepted root paths [0, 1, 4] and [0, 1, 3, 4, 5]
    track_slots, track_steps = torch.tensor([2, 4]), torch.tensor([1, -1])  # row 0 tracks the state after [0, 1]
    if not on:
        seen = {}

        def stock_verify(**kwargs):
            seen["verify_buffer"] = kwargs["intermediate_states_buffer"].data_ptr()
            return torch.zeros(B * T, HV, V)

        def stock_scatter(caches, *args, **kwargs):
            seen["scatter_snapshots"] = caches.intermediate_ssm is snapshots

        backend.kernel_dispatcher.target_verify = stock_verify
        hybrid_module.scatter_mamba_states_after_mtp_verify = stock_scatter
        verify_step()
        hybrid.update_mamba_state_after_mtp_verify(last_correct_step_indices=last, mamba_track_indices=track_slots,
                                                   mamba_steps_to_track=track_steps, model=None)
        out["stock_verify_reads_the_pool_snapshots"] = seen["verify_buffer"] == snapshots[1].data_ptr()
        out["stock_commit_scatters_the_snapshots"] = seen["scatter_snapshots"]
        print(json.dumps(out))
        raise SystemExit(0)

    before = cache.temporal.clone()
    outputs, inputs = verify_step()
    mixed, a, b = inputs[layers[0]]
    q, k, v = mixed.split([H * K, H * K, HV * V], dim=1)
    out["inputs_kept_exactly"] = (
        torch.equal(verifier.q[0, :B], q.reshape(B, T, H, K)) and torch.equal(verifier.k[0, :B], k.reshape(B, T, H, K))
        and torch.equal(verifier.v[0, :B], v.reshape(B, T, HV, V))
        and all(torch.equal(verifier.a[i, :B], inputs[layer_id][1].reshape(B, T, HV))
                and torch.equal(verifier.b[i, :B], inputs[layer_id][2].reshape(B, T, HV))
                for i, layer_id in enumerate(layers)))
    out["parents_from_sglang"] = backend.forward_metadata.retrieve_parent_token[:, 1:].tolist()
    out["verify_error"] = max(
        worst_error(outputs[layer_id].reshape(B, T, HV, V),
                    path_verify_reference(verifier.q[i, :B], verifier.k[i, :B], verifier.v[i, :B], verifier.a[i, :B],
                                          verifier.b[i, :B], *verifier.gates[layer_id], before[i], slots, trees,
                                          torch.full((B,), T)))
        for i, layer_id in enumerate(layers))
    window = cache.intermediate_conv_window[0].clone()
    conv_before = cache.conv[0].clone()
    hybrid.update_mamba_state_after_mtp_verify(last_correct_step_indices=last, mamba_track_indices=track_slots,
                                               mamba_steps_to_track=track_steps, model=None)
    accepted = torch.tensor([[0, 1, 4, 0, 0, 0], [0, 1, 3, 4, 5, 0]])
    commit_error, track_error, untouched = 0.0, 0.0, True
    for i, layer_id in enumerate(layers):
        kept = [buffer[i, :B] for buffer in (verifier.k, verifier.v, verifier.a, verifier.b)]
        expected = commit_reference(*kept, *verifier.gates[layer_id], before[i], slots, accepted, torch.tensor([3, 5]))
        commit_error = max(commit_error, worst_error(cache.temporal[i][slots], expected[slots]))
        tracked = commit_reference(*kept, *verifier.gates[layer_id], before[i], slots, accepted, torch.tensor([2, 0]))
        track_error = max(track_error, worst_error(cache.temporal[i][2], tracked[3]))
        untouched &= torch.equal(cache.temporal[i][[0, 4]], before[i][[0, 4]])
    out["commit_error"], out["track_error"], out["other_slots_untouched"] = commit_error, track_error, untouched
    out["conv_windows"] = (torch.equal(cache.conv[0][:, slots], window[:, torch.arange(B), last])
                           and torch.equal(cache.conv[0][:, 2], window[:, 0, 1])
                           and torch.equal(cache.conv[0][:, [0, 4]], conv_before[:, [0, 4]]))

    backend.topk = 1  # a chain draft: SGLang builds no parent links, the verifier uses a one-branch tree
    before = cache.temporal.clone()
    outputs, _ = verify_step()
    chain = torch.arange(T).expand(B, T) - 1
    out["chain_parents_from_sglang"] = backend.forward_metadata.retrieve_parent_token
    out["chain_verify_error"] = max(
        worst_error(outputs[layer_id].reshape(B, T, HV, V),
                    path_verify_reference(verifier.q[i, :B], verifier.k[i, :B], verifier.v[i, :B], verifier.a[i, :B],
                                          verifier.b[i, :B], *verifier.gates[layer_id], before[i], slots, chain,
                                          torch.full((B,), T)))
        for i, layer_id in enumerate(layers))
    hybrid.update_mamba_state_after_mtp_verify(last_correct_step_indices=torch.tensor([2, -1]),
                                               mamba_track_indices=None, mamba_steps_to_track=None, model=None)
    out["chain_commit_error"] = max(
        worst_error(cache.temporal[i][slots[0]],
                    commit_reference(verifier.k[i, :1], verifier.v[i, :1], verifier.a[i, :1], verifier.b[i, :1],
                                     *verifier.gates[layer_id], before[i], slots[:1], torch.arange(T)[None],
                                     torch.tensor([3]))[slots[0]])
        for i, layer_id in enumerate(layers))
    out["chain_row_left_alone"] = torch.equal(cache.temporal[:, slots[1]], before[:, slots[1]])

    from sglang.srt.specpilot.gdn_tree import replaces_state_snapshots
    refusals = []
    try:
        replaces_state_snapshots(types.SimpleNamespace(is_kda=True))
    except ValueError as err:
        refusals.append(str(err))
    ring_pool = HybridReqToTokenPool(size=4, mamba_size=4, mamba_spec_state_size=4, max_context_len=64, device="cpu",
                                     enable_memory_saver=False, cache_params=params, mamba_layer_ids=layers,
                                     enable_mamba_extra_buffer=False, speculative_num_draft_tokens=T,
                                     speculative_eagle_topk=2, enable_linear_replayssm_spec=True)
    try:
        GDNAttnBackend(types.SimpleNamespace(**{**vars(runner), "req_to_token_pool": ring_pool}))
    except ValueError as err:
        refusals.append(str(err))
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend
    from sglang.srt.specpilot.gdn_tree import check_linear_backend
    check_linear_backend(GDNAttnBackend.__new__(GDNAttnBackend))  # GDN layers: accepted
    try:
        check_linear_backend(Mamba2AttnBackend.__new__(Mamba2AttnBackend))
    except ValueError as err:
        refusals.append(str(err))
    out["refusals"] = refusals
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def probes(sglang_entries_export, tmp_path_factory):
    """The probe with the flag on and off, in two processes at once."""
    export, order = sglang_entries_export
    assert "gdn-tree" in order, "entries/gdn-tree is missing from the memory"
    standin = write_torchvision_standin(tmp_path_factory.mktemp("standin"))
    runs = {
        mode: subprocess.Popen(
            [sys.executable, "-c", PROBE, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=import_environment(export, standin),
            text=True,
        )
        for mode in ("on", "off")
    }
    out = {}
    for mode, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"probe with the flag {mode} failed:\n{stderr[-4000:]}"
        out[mode] = json.loads(stdout.strip().splitlines()[-1])
    return out


def test_flag_defaults_off_and_stock_keeps_its_snapshot_verify_and_commit(probes):
    off = probes["off"]
    assert off["flag"] is False
    assert off["snapshots"] == [2, 5, 6, 2, 8, 16]  # [layers, rows + 1, draft tokens, HV, V, K]
    assert off["verifier"] is False
    assert off["stock_verify_reads_the_pool_snapshots"]
    assert off["stock_commit_scatters_the_snapshots"]


def test_flag_on_allocates_no_per_token_states(probes):
    on = probes["on"]
    assert on["flag"] is True
    assert on["snapshots"] is None
    assert on["verifier"] is True


def test_tree_verify_runs_the_vendored_path_kernel_on_sglangs_parent_links(probes):
    on = probes["on"]
    assert on["inputs_kept_exactly"]
    assert on["parents_from_sglang"] == [[0, 0, 1, 1, 2], [0, 1, 1, 3, 4]]
    assert on["verify_error"] < 1e-5  # FP32 under the interpreter: reduction order only


def test_commit_replays_the_accepted_path_into_the_slot_and_the_track_slot(probes):
    on = probes["on"]
    assert on["commit_error"] < 1e-5
    assert on["track_error"] < 1e-5
    assert on["other_slots_untouched"]
    assert on["conv_windows"]


def test_chain_drafts_verify_as_one_branch_trees(probes):
    on = probes["on"]
    assert on["chain_parents_from_sglang"] is None
    assert on["chain_verify_error"] < 1e-5
    assert on["chain_commit_error"] < 1e-5  # accepted [0, 1, 2] of the first request
    assert on["chain_row_left_alone"]  # last step -1: the second request's state is not touched


def test_settings_it_does_not_cover_are_refused_at_start_up(probes):
    kda, replay_rings, mamba2 = probes["on"]["refusals"]
    assert "GDN layers only" in kda and "KDA" in kda
    assert "GDN layers only" in mamba2 and "Mamba2AttnBackend" in mamba2
    assert "--specpilot-gdn-tree-verify cannot run here" in replay_rings and "replayssm" in replay_rings


def test_apply_reproduces_and_verify_is_clean(project_entries_home, capsys):
    home = str(project_entries_home.root)
    assert main(["apply", "options", "gdn-tree", "--onto", "stock", "--home", home, "--json"]) == 0
    applied = json.loads(capsys.readouterr().out)
    assert applied["order"] == ["options", "gdn-tree"]
    assert all(entry["status"] == "applied" and entry["reproduced"] for entry in applied["entries"])
    assert main(["verify", "--home", home, "--json"]) == 0
    verified = {entry["id"]: entry for entry in json.loads(capsys.readouterr().out)["entries"]}
    assert verified["gdn-tree"]["ok"] and verified["gdn-tree"]["problem"] is None
