"""The SGLang-side entries (options, w12, ...), checked through the real store and real SGLang imports.

One export of stock and one of every SGLang entry applied together are imported in fresh processes
(SGLang's sources with the torchvision stand-in): the patched ``server_args`` must expose exactly the
flags each record lists, parse a stock command line to the stock values, and the ``w12`` weight
method must give the unquantized method's output bit for bit. Every pair of entries must apply onto
stock, and each entry's sources must be what its delta puts in the fork, each file once.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap

import pytest

from specpilot_mem.sglang.cpu_import import import_environment, write_torchvision_standin
from specpilot_mem.sglang.entry_src import sglang_entry_ids
from specpilot_mem.store.kernels import vendored_sources
from specpilot_mem.store.records import load_entries
from specpilot_mem.store.resolver import apply_entries

pytestmark = pytest.mark.sglang

# A stock command line with flags from several namespaces.
STOCK_ARGV = [
    "--model-path",
    "/models/target",
    "--speculative-algorithm",
    "DFLASH",
    "--speculative-num-draft-tokens",
    "16",
    "--tp-size",
    "1",
    "--mem-fraction-static",
    "0.8",
    "--quantization",
    "fp8",
    "--port",
    "31000",
]

PARSE = textwrap.dedent("""
    import json, sys
    import msgspec
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    argv = json.loads(sys.argv[1])
    fields = msgspec.structs.asdict(prepare_server_args(argv))
    print(json.dumps({"fields": fields, "namespaces": dict(ServerArgs._NS_BY_FIELD)}, default=repr))
""")

PROBE = textwrap.dedent("""
    import argparse, json, sys
    import msgspec
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    from sglang.srt.specpilot import all_options, discover
    argv = json.loads(sys.argv[1])
    out = {"fields": msgspec.structs.asdict(prepare_server_args(argv)), "namespaces": dict(ServerArgs._NS_BY_FIELD)}
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    mine = {f for f, ns in ServerArgs._NS_BY_FIELD.items() if ns == "specpilot"}
    out["flags"] = {a.option_strings[0]: {"default": a.default, "choices": a.choices, "help": a.help}
                    for a in parser._actions if a.dest in mine}
    out["entries"] = {spec.id: [o.as_record() for o in spec.options] for spec in discover().values()}
    # Every flag set to a value other than its default, all at once.
    given, expected = [], {}
    for option in all_options():
        if option.type == "bool":
            given.append(option.name); expected[option.field] = True
        else:
            value = {"int": 7, "float": 0.25, "str": "x"}.get(option.type)
            if option.type == "choice":
                value = next(c for c in option.choices if c != option.default)
            given += [option.name, str(value)]; expected[option.field] = value
    parsed = prepare_server_args(["--model-path", "m", *given])
    out["non_default"] = {"expected": expected, "parsed": {f: getattr(parsed, f) for f in expected}}
    if "w12" in discover():
        import torch
        from sglang.srt.layers.linear import LinearBase
        from sglang.srt.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
        from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
        from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
        from sglang.srt.specpilot.w12_method import W12Config, W12LinearMethod
        head = ParallelLMHead.__new__(ParallelLMHead)
        w12 = {"registered": get_quantization_config("w12") is W12Config,
               "cli": prepare_server_args(["--model-path", "m", "--quantization", "w12"]).quantization,
               "linear": type(W12Config(lm_head=False, qpass="fp8").get_quant_method(LinearBase(8, 8), "p")).__name__,
               "head_off": type(W12Config(lm_head=False, qpass="fp8").get_quant_method(head, "lm_head")).__name__,
               "head_on": type(W12Config(lm_head=True, qpass="fp8").get_quant_method(head, "lm_head")).__name__}
        torch.manual_seed(0)
        weight = (torch.randn(384, 256) * 0.05).to(torch.bfloat16)  # whole 128-row tiles: W12 pays
        weight[0, :7] = 0.0                      # zeros and denormals take the escape list
        weight[1, 3] = 1e-40
        weight[2, 9] = 3.0e4                     # far outside its row's window
        x = torch.randn(5, 256).to(torch.bfloat16)
        bias = torch.randn(384).to(torch.bfloat16)
        layers = {}
        for name, method in (("unquantized", UnquantizedLinearMethod()), ("w12", W12LinearMethod("p"))):
            layer = torch.nn.Module()
            method.create_weights(layer, 256, [128, 256], 256, 384, torch.bfloat16, weight_loader=None)
            layer.weight.data.copy_(weight)
            method.process_weights_after_loading(layer)
            layers[name] = (layer, method)
        outputs = {n: m.apply(l, x, bias) for n, (l, m) in layers.items()}
        w12["bit_equal"] = bool(torch.equal(outputs["w12"].view(torch.int16), outputs["unquantized"].view(torch.int16)))
        w12["bf16_released"] = not hasattr(layers["w12"][0], "weight")
        w12["fp32_equal"] = bool(torch.equal(layers["w12"][1].apply(layers["w12"][0], x.float()),
                                             torch.nn.functional.linear(x.float(), weight.float())))
        stored = W12LinearMethod.w12_tensor(layers["w12"][0])
        from sglang.srt.specpilot.kernels.w12 import decode
        w12["planes_exact"] = bool(torch.equal(decode(stored).view(torch.int16), weight.view(torch.int16)))
        # a layer whose W12 form would not pay (64 rows padded to a 128-row tile) stays BF16 on stock's method
        small = torch.nn.Module()
        small_method = W12LinearMethod("small")
        small_method.create_weights(small, 256, [64], 256, 64, torch.bfloat16, weight_loader=None)
        small.weight.data.copy_(weight[:64])
        small_method.process_weights_after_loading(small)
        w12["small_kept_bf16"] = bool(small.w12_report["kept_bf16"] and small.w12_layout is None and
                                      torch.equal(small_method.apply(small, x).view(torch.int16),
                                                  torch.nn.functional.linear(x, weight[:64]).view(torch.int16)))
        from sglang.srt.specpilot.kernels.w12 import mma as vendored_mma
        w12["tuned_partitions"] = vendored_mma._tuned()  # what the vendored GEMM reads beside itself
        out["w12"] = w12
    if "certified-head" in discover():
        import types
        import torch
        from sglang.srt.layers.logits_processor import LogitsMetadata
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.specpilot.certified_head import argmax_only, certified_argmax_logits, certified_copy

        def batch(mode, greedy=True, logprob=False, spec=None, bias=None):
            info = types.SimpleNamespace(is_all_greedy=greedy, logit_bias=bias, grammars=[None],
                                         penalizer_orchestrator=None)
            return types.SimpleNamespace(forward_mode=mode, spec_info=spec, sampling_info=info, return_logprob=logprob)

        gate = {"decode": argmax_only(batch(ForwardMode.DECODE)),
                "verify": argmax_only(batch(ForwardMode.TARGET_VERIFY)),
                "sampling": argmax_only(batch(ForwardMode.DECODE, greedy=False)),
                "logprob": argmax_only(batch(ForwardMode.DECODE, logprob=True)),
                "draft": argmax_only(batch(ForwardMode.DECODE, spec=object())),
                "prefill": argmax_only(batch(ForwardMode.EXTEND)),
                "logit_bias": argmax_only(batch(ForwardMode.DECODE, bias=torch.zeros(1))),
                "metadata_default": LogitsMetadata(forward_mode=ForwardMode.DECODE).specpilot_argmax_only}
        torch.manual_seed(1)
        vocab, padded, hidden = 1000, 1024, 256
        weight = torch.zeros(padded, hidden, dtype=torch.bfloat16)
        weight[:vocab] = (torch.randn(vocab, hidden) * 0.1).to(torch.bfloat16)
        lm_head = torch.nn.Module()
        lm_head.weight = torch.nn.Parameter(weight, requires_grad=False)
        head = certified_copy(lm_head, vocab)
        x = torch.randn(40, hidden).to(torch.bfloat16)  # more rows than one kernel call takes
        logits = certified_argmax_logits(head, x, padded)
        exact = x.double() @ weight[:vocab].double().T
        # all real logits negative: a zero padding row would win a head that kept the padding
        negative = x.abs()
        lm_neg = torch.nn.Module()
        lm_neg.weight = torch.nn.Parameter(torch.cat([-weight[:vocab].abs(), weight[vocab:]]), requires_grad=False)
        neg_logits = certified_argmax_logits(certified_copy(lm_neg, vocab), negative, padded)
        out["certified_head"] = {
            "gate": gate,
            "argmax_equal": bool(torch.equal(logits.argmax(1), exact.argmax(1))),
            "one_hot": bool(((logits == 0).sum(1) == 1).all() and torch.isinf(logits).sum() == 40 * (padded - 1)),
            "width": logits.shape[1],
            "padding_never_wins": bool((neg_logits.argmax(1) < vocab).all()
                                       and torch.equal(neg_logits.argmax(1), (negative.double() @ lm_neg.weight[:vocab].double().T).argmax(1))),
            "cached": certified_copy(lm_head, vocab) is head,
        }
    print(json.dumps(out, default=repr))
""")


@pytest.fixture(scope="module")
def results(project_entries_home, sglang_entries_export, tmp_path_factory):
    """Import stock and every SGLang entry applied together, in two processes at once."""
    from specpilot_mem.sglang.export import cached_export, read_manifest

    home = project_entries_home
    standin = write_torchvision_standin(tmp_path_factory.mktemp("standin"))
    exports = {"stock": cached_export(home, "stock")}
    exports["applied"], order = sglang_entries_export
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-c", script, json.dumps(STOCK_ARGV)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=import_environment(exports[name], standin),
            text=True,
        )
        for name, script in (("stock", PARSE), ("applied", PROBE))
    }
    out = {}
    for name, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{name} import failed:\n{stderr[-3000:]}"
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    out["ids"] = sglang_entry_ids(home)
    out["order"] = order
    out["manifest"] = read_manifest(exports["applied"])
    return out


def test_every_pair_of_entries_applies_onto_stock(project_entries_home):
    ids = sorted(load_entries(project_entries_home))
    assert "options" in ids
    for pair in itertools.combinations(ids, 2):
        result = apply_entries(project_entries_home, list(pair))
        assert not result.conflicts, pair
        assert all(o.reproduced for o in result.outcomes), pair


def test_sources_are_what_the_entry_puts_in_the_fork_each_file_once(project_entries_home):
    # whole files and patches rebuild every file of the delta outside the vendored kernels byte for byte, in the
    # layout `specpilot-mem sources` writes: no entry holds a whole copy of a file a requirement changes
    from specpilot_mem.store.fork import open_fork
    from specpilot_mem.store.resolver import Resolver
    from specpilot_mem.store.sources import read_sources, render_sources, source_problems

    resolver = Resolver(open_fork(project_entries_home))
    for entry_id in sglang_entry_ids(project_entries_home):
        files = read_sources(project_entries_home, entry_id)
        assert source_problems(resolver, entry_id, files) == [], entry_id
        assert files == render_sources(resolver, entry_id), f"{entry_id}: run `specpilot-mem sources`"


def test_record_src_would_re_vendor_exactly_the_recorded_kernels(project_entries_home, tmp_path):
    # `record ID --src` re-vendors the op folders and top-level files a record already vendors: with the
    # library as recorded, that is every pinned file with its pinned bytes, and nothing else (records pin
    # no package __init__.py)
    from specpilot_mem.store.kernels import vendor_kernels

    for entry_id, record in load_entries(project_entries_home).items():
        if not record.kernels:
            continue
        pins = vendor_kernels(project_entries_home, tmp_path / entry_id, vendored_sources(record))
        assert {p: h for p, h in pins.items() if not p.endswith("/__init__.py")} == record.kernels, entry_id


def test_every_sglang_entry_requires_options(project_entries_home):
    records = load_entries(project_entries_home)
    for entry_id in sglang_entry_ids(project_entries_home):
        if entry_id != "options":
            assert "options" in records[entry_id].requires, entry_id


def test_record_options_equal_the_flags_the_patched_server_args_exposes(results, project_entries_home):
    records = load_entries(project_entries_home)
    probe = results["applied"]
    declared = probe["entries"]
    for entry_id in results["ids"]:
        # a default of None (unset reproduces stock) is a value: kept, unlike the other None fields
        recorded = [
            {**o.model_dump(mode="json", exclude_none=True), "default": o.default} for o in records[entry_id].options
        ]
        assert declared.get(entry_id, []) == recorded, entry_id
    every = {o["name"]: o for options in declared.values() for o in options}
    assert set(probe["flags"]) == set(every)
    for flag, seen in probe["flags"].items():
        assert seen["default"] == every[flag]["default"], flag
        assert seen["help"] == every[flag]["help"], flag
    assert results["manifest"]["options"] == {name: o["default"] for name, o in every.items()}


def test_a_stock_command_line_parses_exactly_as_on_stock(results):
    stock, applied = results["stock"], results["applied"]
    added = {f for f, ns in applied["namespaces"].items() if ns == "specpilot"}
    assert set(applied["namespaces"]) - set(stock["namespaces"]) == added
    assert {f: v for f, v in applied["fields"].items() if f not in added} == stock["fields"]
    defaults = {o["name"][2:].replace("-", "_"): o["default"] for opts in applied["entries"].values() for o in opts}
    assert {f: applied["fields"][f] for f in added} == defaults


def test_every_flag_parses_to_a_non_default_value(results):
    non_default = results["applied"]["non_default"]
    assert non_default["parsed"] == non_default["expected"]


def test_w12_is_a_registered_weight_method_for_every_decoder_linear(results):
    assert "w12" in results["ids"], "entries/w12 is missing from the memory"
    w12 = results["applied"]["w12"]
    assert w12["registered"] and w12["cli"] == "w12"
    assert w12["linear"] == "W12LinearMethod"
    assert (w12["head_off"], w12["head_on"]) == ("NoneType", "W12LinearMethod")


def test_w12_output_equals_the_unquantized_method_bit_for_bit(results):
    assert "w12" in results["ids"], "entries/w12 is missing from the memory"
    w12 = results["applied"]["w12"]
    assert w12["bit_equal"]
    assert w12["bf16_released"]
    assert w12["small_kept_bf16"]
    assert w12["fp32_equal"]
    assert w12["planes_exact"]


def test_w12_in_the_fork_reads_the_tuned_partitions(results):
    # the vendored GEMM picks the same per-GPU partitions (and staging) as the library: mma_configs.json is vendored
    from specpilot_kernels.w12.mma import TUNED_PATH

    tuned = results["applied"]["w12"]["tuned_partitions"]
    assert tuned and tuned == json.loads(TUNED_PATH.read_text())


def test_certified_head_runs_only_where_the_argmax_is_all_that_is_read(results):
    assert "certified-head" in results["ids"], "entries/certified-head is missing from the memory"
    gate = results["applied"]["certified_head"]["gate"]
    assert gate == {
        "decode": True,
        "verify": True,
        "sampling": False,
        "logprob": False,
        "draft": False,
        "prefill": False,
        "logit_bias": False,
        "metadata_default": False,
    }


def test_certified_head_logits_carry_the_exact_heads_argmax(results):
    assert "certified-head" in results["ids"], "entries/certified-head is missing from the memory"
    head = results["applied"]["certified_head"]
    assert head["argmax_equal"] and head["one_hot"] and head["width"] == 1024
    assert head["padding_never_wins"]
    assert head["cached"]


@pytest.mark.parametrize(
    "module",
    [
        "sglang.srt.mem_cache.memory_pool",
        "sglang.srt.layers.attention.linear.gdn_backend",
        "sglang.srt.layers.quantization",
    ],
)
def test_patched_modules_import_first_in_a_fresh_process(sglang_entries_export, tmp_path, module):
    """Entries must not add import cycles: SGLang imports these modules in this order at start-up."""
    export, _ = sglang_entries_export
    standin = write_torchvision_standin(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        timeout=600,
        env=import_environment(export, standin),
    )
    assert proc.returncode == 0, f"importing {module} first failed:\n{proc.stderr[-3000:]}"
