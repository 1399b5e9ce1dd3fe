"""The certified-head entry under SGLang's CUDA-graph decode, checked on the CPU through the patched modules.

One export of every SGLang entry applied together is imported in a fresh process (SGLang's sources with the
torchvision stand-in, Triton kernels under the interpreter on tiny shapes). The head's one-hot logits must
carry the exact head's argmax (the Triton exact head, whose order the rescore and the in-graph fallback share)
on random and adversarial inputs, with survivor lists small enough that rows overflow into the in-graph
fallback; the path must call nothing that synchronises with the host or has a data-dependent shape; the
decode graph runner must capture the certified head only for a target's decode or verify with the flag on and
replay those graphs only for argmax-only batches; with the flag unset everything is stock.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from specpilot_mem.sglang.cpu_import import import_environment, write_torchvision_standin

pytestmark = pytest.mark.sglang

PROBE = textwrap.dedent("""
    import inspect, json, sys, types
    import torch
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner as runner_mod
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.runtime_context import get_context
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.specpilot import certified_head as ch
    from sglang.srt.specpilot.kernels.certified_head import certified_argmax_graphable, exact_head_logits
    from sglang.srt.specpilot.kernels.certified_head.adversarial import adversarial_head, adversarial_inputs

    Runner = runner_mod.DecodeCudaGraphRunner
    out = {}

    def batch(mode=ForwardMode.DECODE, greedy=True, logprob=False, spec=None, bs=4):
        info = types.SimpleNamespace(is_all_greedy=greedy, logit_bias=None, grammars=[None],
                                     penalizer_orchestrator=None)
        return types.SimpleNamespace(forward_mode=mode, spec_info=spec, sampling_info=info, return_logprob=logprob,
                                     replace_embeds=None, batch_size=bs)

    def fake_runner(certified):
        # the attributes can_run_graph reads past the certified gate, set as a plain decode runner has them
        r = types.SimpleNamespace(specpilot_certified_head=certified, ragged_verify_mode=False, captured_req_width=1,
                                  require_mlp_tp_gather=False, enable_pdmux=False, disable_padding=False, max_bs=8,
                                  require_mlp_sync=False, is_encoder_decoder=False, enable_two_batch_overlap=False,
                                  record_nolora_graph=False,
                                  model_runner=types.SimpleNamespace(spec_algorithm=types.SimpleNamespace(is_ngram=lambda: False)))
        r._make_graph_key = lambda *a, **k: None
        r._resolve_lora_variant = lambda fb: None
        return r

    def gate():
        target = types.SimpleNamespace(is_draft_worker=False)
        lm_bf16, lm_fp32 = torch.nn.Module(), torch.nn.Module()
        lm_bf16.weight = torch.nn.Parameter(torch.zeros(8, 256, dtype=torch.bfloat16), requires_grad=False)
        lm_fp32.weight = torch.nn.Parameter(torch.zeros(8, 256), requires_grad=False)
        def model(lm, sharded=False):
            proc = types.SimpleNamespace(do_tensor_parallel_all_gather=sharded, use_fp32_lm_head=False)
            return types.SimpleNamespace(is_draft_worker=False,
                                         model=types.SimpleNamespace(logits_processor=proc, lm_head=lm))
        draft = types.SimpleNamespace(is_draft_worker=True)
        capture = types.SimpleNamespace(specpilot_capture_argmax_only=True, forward_mode=ForwardMode.DECODE,
                                        sampling_info=None, return_logprob=False, spec_info=None)
        unmarked = types.SimpleNamespace(forward_mode=ForwardMode.DECODE, sampling_info=None, return_logprob=False,
                                         spec_info=None)
        return {
            "decode": ch.certified_graphs(target, ForwardMode.DECODE),
            "verify": ch.certified_graphs(target, ForwardMode.TARGET_VERIFY),
            "draft_worker": ch.certified_graphs(draft, ForwardMode.TARGET_VERIFY),
            "dllm": ch.certified_graphs(target, ForwardMode.DLLM_EXTEND),
            "eligible_head": ch.certified_graphs(model(lm_bf16), ForwardMode.DECODE),
            "fp32_head": ch.certified_graphs(model(lm_fp32), ForwardMode.DECODE),
            "sharded_head": ch.certified_graphs(model(lm_bf16, sharded=True), ForwardMode.DECODE),
            "capture_batch": ch.argmax_only(capture),
            "unmarked_capture_batch": ch.argmax_only(unmarked),
            # a target decode runner as __init__ decides it, asked about batches of each kind
            "replay": {name: Runner.can_run_graph(fake_runner(ch.certified_graphs(target, ForwardMode.DECODE)), fb)
                       for name, fb in (("greedy", batch()), ("sampling", batch(greedy=False)),
                                        ("logprob", batch(logprob=True)), ("too_big", batch(bs=9)))},
        }

    def flagged(argv):
        get_context().set_server_args(prepare_server_args(["--model-path", "m", *argv]))

    flagged([])
    out["unset"] = gate()
    processor = types.SimpleNamespace(do_tensor_parallel_all_gather=False, use_fp32_lm_head=False, vocab_size=8)
    lm = torch.nn.Module()
    lm.weight = torch.nn.Parameter(torch.zeros(8, 256, dtype=torch.bfloat16), requires_grad=False)
    out["unset_logits"] = repr(ch.certified_logits(processor, torch.zeros(2, 256, dtype=torch.bfloat16), lm,
                                                   types.SimpleNamespace(specpilot_argmax_only=True), None))
    flagged(["--specpilot-certified-head"])
    out["set"] = gate()

    # a DFlash draft worker's block forward, built as dflash_worker_v2 builds it: TARGET_VERIFY mode, the draft
    # block's spec input (a DFlashVerifyInput), no sampling_info; then the same batch with a target's greedy info
    from sglang.srt.layers.logits_processor import LogitsMetadata
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
    from sglang.srt.models import dflash as dflash_models, dspark as dspark_models
    from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    bs, block = 2, 4
    draft_block = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=torch.zeros(bs * block, dtype=torch.long),
        req_pool_indices=torch.arange(bs), seq_lens=torch.tensor([5, 7]), out_cache_loc=torch.arange(bs * block),
        seq_lens_sum=12, seq_lens_cpu=torch.tensor([9, 11]), positions=torch.arange(bs * block),
        spec_algorithm=SpeculativeAlgorithm.DFLASH,
        spec_info=make_draft_block_spec_info(draft_token_num=block, device=torch.device("cpu")),
        capture_hidden_mode=CaptureHiddenMode.NULL)
    draft = {"no_sampling_info": draft_block.sampling_info is None,
             "eager_gate": ch.argmax_only(draft_block),
             "logits_metadata": LogitsMetadata.from_forward_batch(draft_block).specpilot_argmax_only,
             "draft_models_import_no_logits_processor": not any(hasattr(m, "LogitsProcessor")
                                                                for m in (dflash_models, dspark_models))}
    draft_block.sampling_info = batch().sampling_info
    draft["eager_gate_given_greedy_sampling_info"] = ch.argmax_only(draft_block)
    out["draft_block"] = draft
    # the capture mark is set from the runner's decision on the batch every capture builds
    prepare = inspect.getsource(Runner.capture_prepare)
    init = inspect.getsource(Runner.__init__)
    out["runner_marks_capture"] = ("forward_batch.specpilot_capture_argmax_only = self.specpilot_certified_head"
                                   in prepare and "certified_graphs(" in init)

    # Host synchronisation or data-dependent shapes anywhere in the head's torch calls (the Triton launcher's
    # own host-side argument handling under the interpreter excepted: on a GPU that is a kernel launch).
    FORBIDDEN = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero",
                 "masked_select", "unique", "synchronize", "argwhere", "bincount"}

    class NoSync(torch.overrides.TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_function__(self, func, types_, args=(), kwargs=None):
            name = getattr(func, "__name__", str(func))
            sync = name in FORBIDDEN or (name == "to" and any(str(a) == "cpu" for a in args[1:]))
            if name == "where" and len(args) + len(kwargs or {}) == 1:
                sync = True  # torch.where(cond): nonzero
            if name == "__getitem__" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                            for i in (args[1] if isinstance(args[1], tuple) else (args[1],))):
                sync = True
            if sync:
                frames = [f.filename for f in inspect.stack()[1:]]
                if not any("/triton/" in f for f in frames):
                    self.calls.append(name)
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    vocab, padded, hidden = 700, 768, 256
    w, pairs = adversarial_head(vocab, hidden, gen)
    weight = torch.zeros(padded, hidden, dtype=torch.bfloat16)
    weight[:vocab] = w
    lm_head = torch.nn.Module()
    lm_head.weight = torch.nn.Parameter(weight, requires_grad=False)
    state = ch.certified_copy(lm_head, vocab)
    x = torch.cat([adversarial_inputs(w, pairs, 36, gen), torch.randn(4, hidden).to(torch.bfloat16)])
    x[::9] = 0  # every logit 0: every row survives, lowest index wins
    results = {}
    for cap in (4096, 8):  # the entry's capacity, and one small enough that near-tied rows overflow too
        ch.MAX_SURVIVORS = cap
        buffer = torch.empty(x.shape[0], padded, dtype=torch.float32)
        mode = NoSync()
        with mode:
            logits = ch.certified_argmax_logits(state, x, padded, out=buffer)
        exact = torch.cat([exact_head_logits(x[i:i + 32].contiguous(), w, exact="triton") for i in (0, 32)])
        counts = torch.cat([certified_argmax_graphable(x[i:i + 32].contiguous(), state.head, max_survivors=cap,
                                                       exact="triton")[1] for i in (0, 32)])
        bf16 = (x @ w.T).float()
        tokens = logits.argmax(1)
        top_tied = bf16.gather(1, tokens[:, None]).squeeze(1) == bf16.max(1).values
        results[cap] = {
            "argmax_equal": bool(torch.equal(tokens, exact.argmax(1))),
            "zero_rows_lowest": bool((tokens[::9] == 0).all()),
            "overflow_rows": int((counts > cap).sum()),
            "one_hot": bool(((logits == 0).sum(1) == 1).all() and torch.isinf(logits).sum() == x.shape[0] * (padded - 1)),
            "into_buffer": logits.data_ptr() == buffer.data_ptr(),
            "sync_calls": sorted(set(mode.calls)),
            "stock_differs_only_at_bf16_ties": bool(top_tied.all()),
            "stock_differs": int((bf16.argmax(1) != tokens).sum()),
        }
    out["heads"] = results
    # the detector itself: the eager form looks at its overflow flag on the host
    from sglang.srt.specpilot.kernels.certified_head import certified_argmax
    mode = NoSync()
    with mode:
        certified_argmax(x[:32].contiguous(), state.head, max_survivors=24, exact="triton")
    out["eager_form_sync_calls"] = sorted(set(mode.calls))
    print(json.dumps(out, default=repr))
""")


@pytest.fixture(scope="module")
def probe(sglang_entries_export, tmp_path_factory):
    export, order = sglang_entries_export
    if "certified-head" not in order:
        pytest.fail("entries/certified-head is missing from the memory")
    standin = write_torchvision_standin(tmp_path_factory.mktemp("standin"))
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=600,
        env=import_environment(export, standin),
    )
    assert proc.returncode == 0, f"probe failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_with_the_flag_the_target_graphs_hold_the_certified_head_and_replay_only_argmax_batches(probe):
    gate = probe["set"]
    assert gate["decode"] and gate["verify"]
    assert not gate["draft_worker"] and not gate["dllm"]
    # an ineligible head is captured stock: its full-logit batches keep replaying
    assert gate["eligible_head"] and not gate["fp32_head"] and not gate["sharded_head"]
    assert gate["capture_batch"] and not gate["unmarked_capture_batch"]
    assert probe["runner_marks_capture"]
    assert gate["replay"] == {"greedy": True, "sampling": False, "logprob": False, "too_big": False}


def test_a_draft_workers_target_verify_forward_never_takes_the_certified_head(probe):
    """DFlash's draft forwards run in TARGET_VERIFY mode, as the target's verify does. The eager gate keeps them
    out because the worker builds their batches without sampling_info (a target verify batch carries the requests');
    their models (DFlash, DSpark) build no LogitsProcessor, and their graph runner captures the stock head."""
    draft = probe["draft_block"]
    assert draft["no_sampling_info"] and not draft["eager_gate"] and not draft["logits_metadata"]
    assert draft["draft_models_import_no_logits_processor"]
    assert not probe["set"]["draft_worker"]
    # what the gate rests on: the same batch carrying greedy sampling info would pass it
    assert draft["eager_gate_given_greedy_sampling_info"]


def test_with_the_flag_unset_capture_and_replay_are_stock(probe):
    gate = probe["unset"]
    assert not gate["decode"] and not gate["verify"] and not gate["eligible_head"]
    # a runner that did not capture the certified head replays every batch it fits, as stock does
    assert gate["replay"] == {"greedy": True, "sampling": True, "logprob": True, "too_big": False}
    assert probe["unset_logits"] == "None"


@pytest.mark.parametrize("cap", ["4096", "8"])
def test_graph_safe_head_gives_the_exact_argmax_without_host_sync(probe, cap):
    head = probe["heads"][cap]
    assert head["argmax_equal"] and head["zero_rows_lowest"]
    assert head["one_hot"] and head["into_buffer"]
    assert head["sync_calls"] == []
    assert head["stock_differs_only_at_bf16_ties"]
    if cap == "8":  # beyond the 5 zero rows (every vocabulary row survives) near-tied rows overflow too
        assert head["overflow_rows"] > 5, "the small capacity must send rows through the in-graph fallback"


def test_the_sync_detector_sees_the_eager_forms_host_read(probe):
    assert "__bool__" in probe["eager_form_sync_calls"] or "item" in probe["eager_form_sync_calls"]
