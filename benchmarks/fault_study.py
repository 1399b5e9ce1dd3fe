"""Fault study (paper §6.2, issue 38): what token forcing rejects, accepts and cannot tell.

Each seed draws a sample of the fault-study request set (token-id prompts cut from CPython
standard-library files of the trained pair's unseen split, ``requests/fault-study-v1.jsonl``) and
serves it through the composed engine (speculative, chain verify unless named) as AR, stock, the
lossless controls (other reduction orders, tree builders and budgets, chunked prefill, path verify)
and the faults (low-precision verify at several bit widths on the LM head and on all linears, rare
flips to the runner-up at several rates, a RoPE position off by one, attention context cut beyond k
tokens, faults on a share of the requests, outputs cut short, the paper's logit-bias fault). The
engine's batched teacher-forced scorer (FP32 head) scores every output, δ is calibrated on AR vs
stock, and every system is judged against stock with all four rules and the power statement.

Prints JSON (per seed, per system: verdict, rule outcomes, the fault's real size) and, per system,
the rejection, inconclusive and acceptance rates with sample sizes; ``--figure`` draws Figure 4
(detection rate per fault, false-reject rate per control) from a results file.

    python benchmarks/fault_study.py --device cpu --seeds 10 --fault-seeds 5 --requests-per-seed 4 --max-new-tokens 96
    python benchmarks/fault_study.py --device cuda --dtype bfloat16 --seeds 4 --first-seed 8 > part.json
    python benchmarks/fault_study.py --merge part*.json > all.json
    python benchmarks/fault_study.py --figure all.json figure4.png
    python benchmarks/fault_study.py --write-requests requests/fault-study-v1.jsonl   # needs tokenizers

Imports only torch, numpy and this package's engine/forcing/controller modules (no rich, pydantic or
duckdb), so it runs on the lent GPU machine.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from specpilot_mem.bench.runs import log  # noqa: E402
from specpilot_mem.controller.engine_system import EngineSystem  # noqa: E402
from specpilot_mem.controller.requests import Request, load_requests  # noqa: E402
from specpilot_mem.controller.system import RequestOutput  # noqa: E402
from specpilot_mem.engine.engine import Engine  # noqa: E402
from specpilot_mem.forcing.calibrate import calibrate_delta, round_up_to_step  # noqa: E402
from specpilot_mem.forcing.engine_adapter import EngineScorer  # noqa: E402
from specpilot_mem.forcing.rules import (  # noqa: E402
    CHANGE_FLOOR,
    EVENT_ALPHA,
    EVENT_FLOOR,
    needed_events,
    poisson_at_least,
)
from specpilot_mem.forcing.scorer import ForcingError, score_outputs  # noqa: E402
from specpilot_mem.forcing.verdict import TokenForcing, Verdict  # noqa: E402
from specpilot_mem.provenance import result_header  # noqa: E402

REQUESTS = ROOT / "requests" / "fault-study-v1.jsonl"
STARTED = time.perf_counter()  # the process's start: a lease's budget counts the engine's loading too

# Lossless controls: engine options that change floating-point reduction order, the verified shape
# or the prefill's chunking, never which tokens a correct system may accept.
CONTROLS = {
    "splitk-head": {"lm_head": "splitk"},
    "path-verify": {"gdn_verify": "path"},
    "best-first-32": {"tree": "best-first", "nodes": 32},
    "ddtree-16": {"tree": "ddtree", "nodes": 16},
    "positions-4": {"positions": 4},
    "prefill-chunk-16": {"chunk_size": 16},
}
# The same study through the composed system engine (``specpilot_mem.engine.system`` driven by ``decode.SystemDecoder``:
# every request of every seed in flight at once, CUDA graphs): its stock is SystemOptions(positions=8) (the pure-torch
# engine's chain of 8) and its lossless controls are its own mechanisms; the faults are FAULTS as SystemOptions.
SYSTEM_STOCK = {"positions": 8}
SYSTEM_CONTROLS = {  # served in this order; the trees last (their builders run per request on the host)
    "path-verify": {"gdn_verify": "path"},
    "positions-4": {"positions": 4},
    "w12-linears-head": {"linears": "w12", "lm_head": "w12"},
    "certified-head": {"lm_head": "certified"},
    "best-first-32": {"tree": "best-first", "nodes": 32},
    "ddtree-16": {"tree": "ddtree", "nodes": 16},
}
# Faults, each a lossy verify the issue names. ``{seed}`` in flip_seed is the run's seed.
FAULTS = {
    "fp8-head": {"verify_weights": "fp8", "verify_weight_scope": "head"},
    "fp8-all": {"verify_weights": "fp8"},
    "int8-all": {"verify_weights": "int8"},
    "int6-all": {"verify_weights": "int6"},
    "int4-head": {"verify_weights": "int4", "verify_weight_scope": "head"},
    "int4-all": {"verify_weights": "int4"},
    "flip-0.1%": {"flip_rate": 0.001},
    "flip-0.3%": {"flip_rate": 0.003},
    "flip-1%": {"flip_rate": 0.01},
    "rope-off-by-one": {"rope_offset": 1},
    "context-32": {"attn_window": 32},
    "context-8": {"attn_window": 8},
    "flip-2%-quarter-of-requests": {"flip_rate": 0.02, "fault_requests": 0.25},
    "int4-all-quarter-of-requests": {"verify_weights": "int4", "fault_requests": 0.25},
    "cut-short": {"stop_after": -4},  # negative: this many tokens before max_new_tokens
    "bias-fault": {"fault_after": 32},
}
ALL_CONTROLS = {**CONTROLS, **SYSTEM_CONTROLS}
# The system study serves faults in this order (a lease's budget may stop it early): the hard cases first.
SYSTEM_FAULT_ORDER = (
    "fp8-head",
    "flip-0.3%",
    "fp8-all",
    "flip-0.1%",
    "int8-all",
    "rope-off-by-one",
    "flip-1%",
    "int6-all",
    "context-32",
    "flip-2%-quarter-of-requests",
    "int4-head",
    "int4-all",
    "int4-all-quarter-of-requests",
    "context-8",
    "cut-short",
    "bias-fault",
)
# The targets: faults at least this large must be rejected in >= 95% of seeds.
TARGET_CHANGED = CHANGE_FLOOR
TARGET_EVENTS_PER_1000 = 1000 * EVENT_FLOOR
# The default sealed sample: the 12 requests of requests/specpilot-v1.jsonl's unseen split with the long-output pass,
# each run to the trained pair's 2,048-token context less its prompt (tokenized with the pair's tokenizer; the GPU
# machine has none, so the sum is kept here and checked in tests/test_fault_study.py).
SEALED_REQUESTS, SEALED_TOKENS = 12, 24_262


def fault_options(name: str, seed: int, max_new_tokens: int) -> dict:
    opts = dict(FAULTS[name])
    if "flip_rate" in opts:
        opts["flip_seed"] = seed
    if opts.get("stop_after") is not None and opts["stop_after"] < 0:
        opts["stop_after"] = max_new_tokens + opts["stop_after"]
    return opts


def summary(verdict: Verdict) -> dict:
    rate, events, band, seen = verdict.rate, verdict.events, verdict.band, verdict.power
    return {
        "verdict": verdict.verdict,
        "mismatch_rate": rate.system_rate,
        "stock_rate": rate.stock_rate,
        "difference_low": rate.difference_low,
        "rate_reject": rate.reject,
        "events": events.system_events,
        "audited": events.audited,
        "unexplained": events.unexplained,
        "stock_events": events.stock_events,
        "p_value": events.p_value,
        "event_reject": events.reject,
        "band_mismatches": band.system_mismatches,
        "band_stock": band.stock_mismatches,
        "band_p": band.p_value,
        "band_reject": band.reject,
        "length_reject": verdict.length.reject,
        "tail_requests": verdict.tail.requests,
        "tail_mismatches": verdict.tail.system_mismatches,
        "tail_stock": verdict.tail.stock_mismatches,
        "rank_z": verdict.tail.rank_z,
        "rank_p": verdict.tail.rank_p,
        "gap_band_p": verdict.tail.band_p,
        "tail_reject": verdict.tail.reject,
        "request_p": verdict.request.p_value,
        "request_tests": verdict.request.tests,
        "request_worst": verdict.request.worst,
        "request_reject": verdict.request.reject,
        "rate_detectable": seen.rate_detectable,
        "events_needed": seen.events_needed,
        "event_power": seen.event_power,
        "sufficient": seen.sufficient,
        "requests_needed": seen.requests_needed,
        "tokens_needed": seen.tokens_needed,
        "flagged_requests": sum(1 for r in verdict.per_request if r["flagged"]),
        "explained_by": verdict.explained_by,
    }


def effect(system: dict, stock: dict, scored_sys, scored_stock, delta: float, size_delta: float) -> dict:
    """How large the fault really was on this sample: tokens it changed against stock's outputs (after
    the first divergence everything differs, so this counts mismatches against the scorer beyond
    stock's) and its large-margin events per 1,000 tokens, and stock's, at the verdict's ``delta`` (the
    ``..._at_delta`` keys: the events the rules call large-margin) and at ``size_delta`` (the first departures'
    alone, the size earlier studies held to the target: on seeds where stock never departs from AR it sits on the
    2^-10 floor, where nearly every mismatch counts as an event). ``target_size``: this instance of the fault is of
    issue 38's size (>= 0.3% of the tokens changed, >= 1 added large-margin event per 1,000 tokens, or outputs
    cut short); ``target_size_first_departure``: the same with the events at ``size_delta``."""
    tokens = sum(o.tokens for o in scored_stock.values())
    excess = (
        sum(int(o.mismatch.sum()) for o in scored_sys.values())
        - sum(int(o.mismatch.sum()) for o in scored_stock.values())
    ) / tokens

    def per_1000(scored, at: float) -> float:
        return 1000 * sum(int((o.margin > 2 * at).sum()) for o in scored.values()) / tokens

    changed = sum(system[rid].output_ids != stock[rid].output_ids for rid in stock)
    shorter = sum(len(system[rid].output_ids) < len(stock[rid].output_ids) for rid in stock)
    found = {
        "excess_mismatch": excess,
        "events_per_1000": per_1000(scored_sys, size_delta),
        "stock_events_per_1000": per_1000(scored_stock, size_delta),
        "events_per_1000_at_delta": per_1000(scored_sys, delta),
        "stock_events_per_1000_at_delta": per_1000(scored_stock, delta),
        "changed_requests": changed,
        "shorter_requests": shorter,
    }
    found["target_size"] = of_target_size(found)
    found["target_size_first_departure"] = of_target_size(found, first_departure=True)
    return found


def of_target_size(found: dict, first_departure: bool = False) -> bool:
    """Whether one instance of a fault (its ``effect`` on one seed's sample) is of issue 38's size: >= 0.3% of the
    tokens changed, >= 1 large-margin event per 1,000 tokens beyond stock's (at the verdict's δ; at the first
    departures' with ``first_departure``), or outputs cut short."""
    if first_departure:
        added = found["events_per_1000"] - found["stock_events_per_1000"]
    else:
        added = found["events_per_1000_at_delta"] - found["stock_events_per_1000_at_delta"]
    return bool(
        found["excess_mismatch"] >= TARGET_CHANGED or added >= TARGET_EVENTS_PER_1000 or found["shorter_requests"]
    )


def seed_sample(seed: int, pool: list[Request], args) -> list[Request]:
    """The seed's requests: a seeded sample of the pool, with the study's output length."""
    sample = sorted(random.Random(seed).sample(pool, min(args.requests_per_seed, len(pool))), key=lambda r: r.id)
    return [Request(r.id, r.benchmark, "unseen", args.max_new_tokens, prompt_ids=r.prompt_ids) for r in sample]


def one_seed(seed: int, pool: list[Request], args, engine: Engine, with_faults: bool) -> dict:
    """One seed through the pure-torch engine (batch 1): serve every system on the seed's sample, then judge."""
    sample = seed_sample(seed, pool, args)
    systems = {"ar": EngineSystem("ar", engine, mode="ar"), "stock": EngineSystem("stock", engine, mode="spec")}
    chosen = (lambda name: name in args.only) if args.only else (lambda name: True)
    systems.update(
        {
            name: EngineSystem(name, engine.with_options(**opts), mode="spec")
            for name, opts in CONTROLS.items()
            if chosen(name)
        }
    )
    if with_faults:
        systems.update(
            {
                name: EngineSystem(
                    name, engine.with_options(**fault_options(name, seed, args.max_new_tokens)), mode="spec"
                )
                for name in FAULTS
                if chosen(name)
            }
        )
    device = str(engine.device)
    outputs, seconds = {}, {}
    for name, system in systems.items():
        start = time.perf_counter()
        outputs[name] = {o.id: o for o in system.run(sample, batch_size=1, device=device)}
        seconds[name] = time.perf_counter() - start
    log(f"seed {seed}: served {len(systems)} systems x {len(sample)} requests in {sum(seconds.values()):.1f} s")
    return judge_seed(seed, sample, outputs, seconds, engine, args)


def faulty_requests(requests: list[Request], share: float) -> set[str]:
    """The requests a fault confined to ``share`` of them applies to: the pure-torch engine's choice (a hash of
    the prompt, ``Engine._start_request``)."""
    import zlib

    import numpy as np

    chosen = set()
    for r in requests:
        key = zlib.crc32(np.asarray(r.prompt_ids, dtype=np.int64).tobytes())
        if (key % 100_000) / 100_000 < share:
            chosen.add(r.id)
    return chosen


def system_outputs(
    seeds: list[int], pool: list[Request], args, engine: Engine, on_served=None
) -> tuple[dict, dict, dict, dict]:
    """Every system through the composed system engine, all seeds' requests in flight at once (a request drawn by
    two seeds is served once). A fault confined to a share of the requests is served on that share only
    (``with_unfaulted`` gives the others stock's outputs). Systems are served in the order AR, stock, then
    controls and faults alternating (``--serve``: exactly those named, in that order), and no new one starts
    after ``--budget-seconds``; ``on_served(outputs, seconds, labels)`` follows each system.
    Returns (outputs per system and request id, serving seconds and SystemOptions label per system, samples per
    seed)."""
    from specpilot_mem.engine.decode import SystemDecoder
    from specpilot_mem.engine.options import SystemOptions

    samples = {seed: seed_sample(seed, pool, args) for seed in seeds}
    union = {r.id: r for sample in samples.values() for r in sample}
    requests = [union[rid] for rid in sorted(union)]
    chosen = (lambda name: name in args.only) if args.only else (lambda name: True)
    controls = [(n, dict(SYSTEM_STOCK, **o)) for n, o in SYSTEM_CONTROLS.items() if chosen(n)]
    faults = []
    for name in SYSTEM_FAULT_ORDER:
        if chosen(name):
            opts = fault_options(name, seeds[0], args.max_new_tokens)
            faults.append((name, dict(SYSTEM_STOCK, **opts)))
    order = [("ar", dict(SYSTEM_STOCK)), ("stock", dict(SYSTEM_STOCK))]
    for pair in zip(controls + [None] * len(faults), faults + [None] * len(controls)):
        order.extend(item for item in pair if item is not None)
    if args.serve:  # a worker of a stage that shares the systems out between processes
        everything = {name: opts for name, opts in order}
        everything.update((n, dict(SYSTEM_STOCK, **o)) for n, o in SYSTEM_CONTROLS.items())
        everything.update((n, dict(SYSTEM_STOCK, **fault_options(n, seeds[0], args.max_new_tokens))) for n in FAULTS)
        unknown = [name for name in args.serve if name not in everything]
        if unknown:
            raise SystemExit(f"--serve names unknown systems {unknown}")
        order = [(name, everything[name]) for name in args.serve]
    rows = max(SystemOptions(**{k: v for k, v in o.items() if k != "fault_requests"}).rows for _, o in order)
    max_len = max(len(r.prompt_ids) for r in requests) + args.max_new_tokens + 2 * rows + 1
    base = SystemDecoder(engine, SystemOptions(**SYSTEM_STOCK), batch=min(args.batch, len(requests)), max_len=max_len)
    outputs, seconds, labels = {}, {}, {}
    for name, opts in order:
        if outputs and args.budget_seconds is not None and time.perf_counter() - STARTED > args.budget_seconds:
            log(f"budget of {args.budget_seconds:.0f} s spent: {name} and the systems after it not served")
            break
        share = opts.pop("fault_requests", 1.0)
        options = SystemOptions(**opts)
        serve = requests if share >= 1.0 else [r for r in requests if r.id in faulty_requests(requests, share)]
        start = time.perf_counter()
        runs = (
            base.with_options(options).generate(
                [list(r.prompt_ids) for r in serve],
                "ar" if name == "ar" else "spec",
                args.max_new_tokens,
                batched_prefill=True,  # the study's prompts have one length: one prefill pass per system
            )
            if serve
            else []
        )
        outputs[name] = {r.id: RequestOutput(r.id, tuple(g.output_ids)) for r, g in zip(serve, runs)}
        seconds[name] = time.perf_counter() - start
        labels[name] = options.label() + (f",{FAULT_SHARE}={share}" if share < 1.0 else "")
        log(f"system engine: {name} ({labels[name]}) served {len(serve)} requests in {seconds[name]:.1f} s")
        if on_served is not None:
            on_served(outputs, seconds, labels)
    return outputs, seconds, labels, samples


FAULT_SHARE = "fault_requests"


def with_unfaulted(outputs: dict, labels: dict) -> dict:
    """A fault confined to a share of the requests was served on that share: the other requests get stock's
    outputs (what a system whose fault skips them emits). Any other system must cover every request."""
    full = {}
    for name, outs in outputs.items():
        if f",{FAULT_SHARE}=" in labels.get(name, "") and "stock" in outputs:
            full[name] = {rid: outs.get(rid, out) for rid, out in outputs["stock"].items()}
        else:
            full[name] = outs
    return full


def write_outputs(path: str, seeds: list[int], args, outputs: dict, seconds: dict, labels: dict) -> None:
    """``--outputs-out``: every system served so far (gzip'd when the name ends in .gz), rewritten atomically."""
    import gzip

    doc = {
        "seeds": seeds,
        "requests_per_seed": args.requests_per_seed,
        "max_new_tokens": args.max_new_tokens,
        "dtype": args.dtype,
        "options": labels,
        "serve_seconds": seconds,
        "outputs": {n: {r: list(o.output_ids) for r, o in outs.items()} for n, outs in outputs.items()},
    }
    target = Path(path)
    scratch = target.with_name(target.name + ".tmp")
    data = json.dumps(doc).encode()
    scratch.write_bytes(gzip.compress(data, 6) if target.name.endswith(".gz") else data)
    scratch.replace(target)


def read_outputs(paths: list[str], args) -> tuple[dict, dict, dict]:
    """Several ``--outputs-out`` files (workers that served different systems, or different seeds of one system) as
    one: (outputs per system, serving seconds, labels); a request served twice keeps the first file's output. They
    must agree on the sizes."""
    import gzip

    outputs, seconds, labels = {}, {}, {}
    for path in paths:
        raw = Path(path).read_bytes()
        doc = json.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)
        shape = (doc.get("requests_per_seed"), doc.get("max_new_tokens"))
        if shape != (args.requests_per_seed, args.max_new_tokens):
            raise SystemExit(
                f"{path} was served at {shape} (requests per seed, tokens), not the {args.requests_per_seed, args.max_new_tokens} asked"
            )
        for name, outs in doc["outputs"].items():  # workers may share one system's seeds out: join by request
            mine = outputs.setdefault(name, {})
            mine.update((rid, RequestOutput(rid, tuple(ids))) for rid, ids in outs.items() if rid not in mine)
        for name, label in doc["options"].items():
            labels.setdefault(name, label)
        for name, value in doc["serve_seconds"].items():
            seconds.setdefault(name, value)
    return outputs, seconds, labels


def judge_seed(
    seed: int,
    sample: list[Request],
    outputs: dict,
    seconds: dict,
    engine: Engine,
    args,
    scored: dict | None = None,
    scorer=None,
    audit_only: bool = False,
) -> dict | None:
    """Score one seed's outputs with the engine's batched scorer (unless ``scored`` holds them already, with the
    ``scorer`` that scored them), calibrate δ on its AR and stock, and judge every other system against stock with
    all the rules and the power. ``audit_only``: just run the audit of every system's events (``SharedAudit``'s
    recording pass) and return None."""
    scorer = scorer or EngineScorer(engine)
    start = time.perf_counter()
    if scored is None:
        scored = {name: score_outputs(scorer, sample, outs) for name, outs in outputs.items()}
    else:
        scored = {name: {r.id: scored[name][r.id] for r in sample} for name in outputs}
    score_seconds = time.perf_counter() - start
    raw = {name: {rid: list(o.output_ids) for rid, o in outs.items()} for name, outs in outputs.items()}
    try:
        calibration = calibrate_delta(scored["ar"], scored["stock"])
    except ForcingError as err:  # stock not lossless against AR on this sample: a finding, not a crash
        log(f"seed {seed}: calibration refused: {err.what}")
        return {
            "seed": seed,
            "requests": [r.id for r in sample],
            "error": err.to_dict(),
            "verdicts": {},
            "effects": {},
            "outputs": raw,
        }
    forcing = TokenForcing(
        scorer,
        scored["stock"],
        calibration.delta,
        audit_sample=args.audit_sample,
        seed=seed,
        skip_settled_audit=args.skip_settled_audit,
    )
    if audit_only:
        for name in outputs:
            if name not in ("ar", "stock") and forcing.needs_audit(scored[name]):
                forcing.audit(scored[name])
        return None
    verdicts, effects = {}, {}
    size_delta = round_up_to_step(max((d.gap for d in calibration.departures), default=0.0))
    for name in outputs:
        if name in ("ar", "stock"):
            continue
        verdicts[name] = forcing.judge(name, scored[name], synthetic=engine.synthetic)
        effects[name] = effect(
            outputs[name], outputs["stock"], scored[name], scored["stock"], calibration.delta, size_delta
        )
        log(
            f"seed {seed}: {name} -> {verdicts[name].verdict} (mismatch {100 * verdicts[name].rate.system_rate:.2f}%, "
            f"events {verdicts[name].events.system_events}, band {verdicts[name].band.system_mismatches})"
        )
    return {
        "seed": seed,
        "requests": [r.id for r in sample],
        "tokens": sum(s.tokens for s in scored["stock"].values()),
        "delta": calibration.delta,
        "delta_basis": calibration.basis,
        "departures": len(calibration.departures),
        "scorer_departures": len(calibration.scorer_departures),
        "size_delta": size_delta,
        "largest_gap": calibration.largest_gap,
        "stock_mismatch_rate": next(iter(verdicts.values())).rate.stock_rate if verdicts else None,
        "serve_seconds": seconds,
        "score_seconds": score_seconds,
        "verdicts": {name: summary(v) for name, v in verdicts.items()},
        "effects": effects,
        "outputs": raw,
        "full_verdicts": {name: v.to_dict() for name, v in verdicts.items()} if seed == args.first_seed else {},
    }


def score_all(scorer, samples: dict[int, list[Request]], outputs: dict) -> dict:
    """Every system's outputs on the union of the seeds' samples, scored in one batched call (``score_batch``:
    whole-sequence passes batched over requests): each distinct (request, output) once, however many systems and
    seeds share it (controls that emit stock's tokens, faults confined to a few requests, requests drawn by two
    seeds). Returns the scored outputs per system and request id."""
    from dataclasses import replace

    requests = {r.id: r for sample in samples.values() for r in sample}
    distinct: dict[tuple, Request] = {}
    keyed: dict[str, RequestOutput] = {}
    for outs in outputs.values():
        for rid, out in outs.items():
            if rid in requests and (rid, out.output_ids) not in distinct:
                key = f"{rid}#{len(distinct)}"
                distinct[(rid, out.output_ids)] = replace(requests[rid], id=key)
                keyed[key] = out
    flat = score_outputs(scorer, list(distinct.values()), keyed)
    return {
        name: {
            rid: replace(flat[distinct[(rid, out.output_ids)].id], id=rid)
            for rid, out in outs.items()
            if rid in requests
        }
        for name, outs in outputs.items()
    }


class SharedAudit:
    """The audit's prefill-length re-scores of a whole study at once. Judging runs twice: first ``recording``,
    when ``prefill_argmax`` only notes the (position, prefill length) queries each output's events ask (and answers
    "not explained"), then ``answer`` runs each distinct output's queries, of every system and seed, as one shared
    pass, and the second judging reads the answers. Everything else is the wrapped scorer's."""

    def __init__(self, scorer):
        self.scorer = scorer
        self.asked: dict[tuple, set] = {}
        self.answers: dict[tuple, dict] = {}
        self.recording = True

    def __getattr__(self, name):
        return getattr(self.scorer, name)

    def prefill_argmax(self, prompt_ids, output_ids, queries) -> list[int]:
        key = (tuple(prompt_ids), tuple(output_ids))
        if self.recording:
            self.asked.setdefault(key, set()).update(queries)
            return [-1] * len(queries)  # no token id: explains nothing
        known = self.answers[key]
        return [known[q] for q in queries]

    def answer(self) -> None:
        for (prompt, output), queries in self.asked.items():
            ordered = sorted(queries)
            found = self.scorer.prefill_argmax(list(prompt), list(output), ordered)
            self.answers[(prompt, output)] = dict(zip(ordered, found))
        self.recording = False


def judge_all(seeds: list[int], samples: dict, outputs: dict, engine: Engine, args, scorer=None) -> list[dict]:
    """Every seed judged (``judge_seed``) from one batched scoring of all seeds' outputs (``score_all``) and one
    shared set of audit re-scores (``SharedAudit``), with ``scorer`` (default: the engine's)."""
    audit = SharedAudit(scorer or EngineScorer(engine))
    start = time.perf_counter()
    scored = score_all(audit, {seed: samples[seed] for seed in seeds}, outputs)
    tokens = sum(o.tokens for outs in scored.values() for o in outs.values())
    log(f"scored {len(seeds)} seeds ({tokens} output tokens in all) in {time.perf_counter() - start:.1f} s")

    def judged(audit_only: bool) -> list[dict]:
        runs = []
        for seed in seeds:
            sample = samples[seed]
            mine = {name: {r.id: outs[r.id] for r in sample} for name, outs in outputs.items()}
            runs.append(judge_seed(seed, sample, mine, {}, engine, args, scored, audit, audit_only))
        return runs

    judged(audit_only=True)  # records the audit's re-scores
    start = time.perf_counter()
    audit.answer()
    queries = sum(len(q) for q in audit.asked.values())
    log(f"audit: {queries} prefill re-scores of {len(audit.asked)} outputs in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    runs = judged(audit_only=False)
    log(f"judged {len(runs)} seeds in {time.perf_counter() - start:.1f} s")
    if args.scores_out:
        write_scores(args.scores_out, scored, samples, seeds)
    return runs


def write_scores(path: str, scored: dict, samples: dict, seeds: list[int]) -> None:
    """``--scores-out``: what the tail and request rules read, so rules can be studied again without the scorer
    (npz): per distinct (request, output) of the seeds' samples, every position whose scorer top-2 gap is below
    1 nat or whose token is a mismatch, with its gap, margin, argmax and mismatch flag (elsewhere the argmax is
    the emitted token); ``outputs`` maps each system and request to its row."""
    import numpy as np

    rids = sorted({r.id for seed in seeds for r in samples[seed]})
    rows: dict[tuple, int] = {}
    owners, index, positions, gaps, margins, argmax, flags = [], [], [], [], [], [], []
    for name, outs in scored.items():
        for rid in rids:
            out = outs[rid]
            key = (rid, out.output_ids)
            if key not in rows:
                rows[key] = len(rows)
                keep = np.nonzero((out.scores.top2_margin < 1.0) | out.mismatch)[0]
                index.append((rids.index(rid), out.tokens, len(keep)))
                positions.append(keep.astype(np.int16))
                gaps.append(out.scores.top2_margin[keep].astype(np.float32))
                margins.append(out.margin[keep].astype(np.float32))
                argmax.append(out.scores.argmax[keep].astype(np.int16))
                flags.append(out.mismatch[keep])
            owners.append((name, rid, rows[key]))
    np.savez_compressed(
        path,
        requests=np.asarray(rids),
        outputs=np.asarray([f"{name}|{rid}|{row}" for name, rid, row in owners]),
        index=np.asarray(index, dtype=np.int32),
        positions=np.concatenate(positions),
        gaps=np.concatenate(gaps),
        margins=np.concatenate(margins),
        argmax=np.concatenate(argmax),
        mismatch=np.concatenate(flags),
    )


def read_scores(path: str, outputs: dict, pool: dict[str, Request], max_new_tokens: int) -> dict:
    """``--scores-out``'s file back as scored outputs (per system and request id) of ``outputs`` (the outputs it was
    written from). Where it kept nothing (top-2 gap of 1 nat or more, no mismatch) the argmax is the emitted token
    and the gap is recorded as infinite: enough for every rule while 4δ stays below 1 nat (the tail rule's widest
    gap band), which ``rejudge`` checks. Log-probabilities are relative to the argmax (0 there)."""
    import numpy as np

    from specpilot_mem.forcing.scorer import ScoredOutput, TokenScores

    data = np.load(path)
    rids, index = list(data["requests"]), data["index"]
    starts = np.concatenate([[0], np.cumsum(index[:, 2])])
    scores: dict[int, TokenScores] = {}
    scored: dict[str, dict] = {}
    for owner in data["outputs"]:
        name, rid, row = str(owner).split("|")
        row = int(row)
        ids = outputs[name][rid].output_ids
        if row not in scores:
            request, tokens, kept = (int(v) for v in index[row])
            if rids[request] != rid or tokens != len(ids):
                raise SystemExit(f"{path} row {row} ({rids[request]}, {tokens} tokens) is not {name}'s output of {rid}")
            at = slice(starts[row], starts[row] + kept)
            positions = data["positions"][at].astype(np.int64)
            argmax = np.asarray(ids, dtype=np.int64)
            argmax[positions] = data["argmax"][at]
            gaps = np.full(tokens, np.inf)
            gaps[positions] = data["gaps"][at]
            logprob = np.zeros(tokens)
            logprob[positions] = -data["margins"][at].astype(np.float64)
            scores[row] = TokenScores(logprob, argmax, np.zeros(tokens), gaps)
        prompt = tuple(pool[rid].prompt_ids)
        scored.setdefault(name, {})[rid] = ScoredOutput(rid, prompt, tuple(ids), scores[row], max_new_tokens)
    return scored


class StoredScores:
    """The scorer of a study re-judged from ``--scores-out``: it has no model, so the audit's prefill-length
    re-scores answer "not explained"; ``rejudge`` then checks every event rule's counts against the study that
    audited on the scorer (``--audits-from``), so a re-judge that would lose an explanation stops instead."""

    synthetic = False

    def score(self, prompt_ids, output_ids, prefill_len=None):
        raise SystemExit("a study re-judged from stored scores cannot score outputs")

    def prefill_argmax(self, prompt_ids, output_ids, queries) -> list[int]:
        return [-1] * len(queries)


def rejudge(args) -> dict:
    """``--from-scores``: the study judged again on the CPU from its stored outputs and scores, no model loaded (the
    rules and the power as they are now); the event rule's audit counts must equal those of ``--audits-from``."""
    outputs, seconds, labels = read_outputs(args.from_outputs, args)
    outputs = with_unfaulted(outputs, labels)
    pool = {r.id: r for r in load_requests(args.requests)}
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    samples = {seed: seed_sample(seed, list(pool.values()), args) for seed in seeds}
    scored = read_scores(args.from_scores, outputs, pool, args.max_new_tokens)
    reference = {run["seed"]: run for run in json.loads(Path(args.audits_from).read_text())["runs"]}
    args.system_labels, args.system_seconds = labels, seconds
    scorer, runs = StoredScores(), []  # it stands in for the engine too: judging reads only its ``synthetic``
    for seed in seeds:
        sample = samples[seed]
        mine = {name: {r.id: outs[r.id] for r in sample} for name, outs in outputs.items()}
        run = judge_seed(seed, sample, mine, {}, scorer, args, scored, scorer)
        if run["delta"] >= 0.25:
            raise SystemExit(f"seed {seed}: δ = {run['delta']}: the stored gaps (below 1 nat) do not cover 4δ")
        for name, verdict in run["verdicts"].items():
            theirs = reference[seed]["verdicts"].get(name)
            keys = ("events", "audited", "unexplained", "stock_events")
            if theirs is None or any(verdict[k] != theirs[k] for k in keys):
                raise SystemExit(
                    f"seed {seed}, {name}: event rule counts {[verdict[k] for k in keys]} differ from "
                    f"{args.audits_from}'s {[theirs[k] for k in keys] if theirs else None} (an audit only the scorer "
                    "can make): judge these outputs on the scorer's device"
                )
        runs.append(run)
    return study_doc(args, scorer, runs, len(seeds))


def rates(runs: list[dict]) -> dict:
    """Per system: runs, rejected, inconclusive, accepted; for faults the mean real effect, and per instance (one
    fault on one seed's sample: a fault confined to a quarter of the requests may miss a seed's requests, a lossy
    verify may barely act on one) whether it is of the issue's target size. The target: every instance of that size
    rejected in >= 95% of the seeds; every instance below it rejected, inconclusive, or accepted only where the
    power says the sample could have seen a fault of that size (``sufficient``), never a bare accept."""
    table: dict[str, dict] = {}
    for name in [*ALL_CONTROLS, *FAULTS]:
        seen = [r for r in runs if name in r["verdicts"]]
        if not seen:
            continue
        counts = {
            k: sum(r["verdicts"][name]["verdict"] == k for r in seen) for k in ("reject", "inconclusive", "accept")
        }
        row = {
            "kind": "control" if name in ALL_CONTROLS else "fault",
            "runs": len(seen),
            **counts,
            "reject_rate": counts["reject"] / len(seen),
        }
        if name in FAULTS:
            excess = sum(r["effects"][name]["excess_mismatch"] for r in seen) / len(seen)
            events = sum(r["effects"][name]["events_per_1000"] for r in seen) / len(seen)
            # the events the fault adds: its large-margin events beyond stock's (stock has some in BF16)
            added = sum(added_events(r, name) for r in seen) / len(seen)
            shorter = any(r["effects"][name]["shorter_requests"] for r in seen)
            sized = [r for r in seen if instance_of_target_size(r, name)]
            below = [r for r in seen if not instance_of_target_size(r, name)]
            first = [r for r in seen if instance_of_target_size(r, name, first_departure=True)]
            bare = [
                r["seed"]
                for r in below
                if r["verdicts"][name]["verdict"] == "accept" and not r["verdicts"][name].get("sufficient", False)
            ]
            row.update(
                mean_excess_mismatch=excess,
                mean_events_per_1000=events,
                mean_added_events_per_1000=added,
                target_size=excess >= TARGET_CHANGED or added >= TARGET_EVENTS_PER_1000 or shorter,
                sealed_event_power=1.0 if shorter else sealed_event_power(seen, name),
                target_instances=len(sized),
                target_instances_rejected=sum(r["verdicts"][name]["verdict"] == "reject" for r in sized),
                target_instances_missed=[r["seed"] for r in sized if r["verdicts"][name]["verdict"] != "reject"],
                below_target={
                    k: sum(r["verdicts"][name]["verdict"] == k for r in below)
                    for k in ("reject", "inconclusive", "accept")
                },
                bare_accepts=bare,
                first_departure_target_instances=len(first),
                first_departure_target_instances_rejected=sum(
                    r["verdicts"][name]["verdict"] == "reject" for r in first
                ),
            )
            row["meets_target"] = row["target_instances_rejected"] >= 0.95 * len(sized) and not bare
        else:
            row["meets_target"] = counts["reject"] == 0
        table[name] = row
    return table


def instance_of_target_size(run: dict, name: str, first_departure: bool = False) -> bool:
    """``of_target_size`` of the fault's instance on this run; results written before the per-instance flags
    count the events at the first departures' δ (the only ones they kept)."""
    found = run["effects"][name]
    key = "target_size_first_departure" if first_departure else "target_size"
    if key in found:
        return found[key]
    return bool(
        found["excess_mismatch"] >= TARGET_CHANGED
        or added_events(run, name) >= TARGET_EVENTS_PER_1000
        or found["shorter_requests"]
    )


def added_events(run: dict, name: str) -> float:
    """The large-margin events per 1,000 tokens a fault adds to stock's on one run (stock has some in BF16)."""
    found = run["effects"][name]
    if "stock_events_per_1000" in found:
        return found["events_per_1000"] - found["stock_events_per_1000"]
    stock = run["verdicts"][name].get("stock_events", 0)  # older results: stock's events at the verdict's δ
    return found["events_per_1000"] - (1000 * stock / run["tokens"] if run.get("tokens") else 0.0)


def sealed_event_power(seen: list[dict], name: str) -> float | None:
    """Projected from these runs: the chance that the event rule alone rejects the fault on one default sealed
    sample (SEALED_TOKENS output tokens, stock on the same requests), if its unexplained large-margin events and
    stock's large-margin events occur at the rates measured here (Poisson counts; the fewest unexplained events
    the binomial test rejects on, given stock's expected count). A projection, not a measurement: the length
    rule (certain for outputs cut short) and the rate and band rules only add to it. Under the length rule
    (outputs cut short) the caller records 1."""
    tokens = sum(r.get("tokens", 0) for r in seen)
    if not tokens:
        return None
    verdicts = [r["verdicts"][name] for r in seen]
    unexplained = sum(v["events"] * v["unexplained"] / v["audited"] for v in verdicts if v.get("audited"))
    stock = sum(v.get("stock_events", 0) for v in verdicts)
    needed = needed_events(round(stock / tokens * SEALED_TOKENS), 0.5, EVENT_ALPHA)
    return None if needed is None else poisson_at_least(needed, unexplained / tokens * SEALED_TOKENS)


def pooled(
    doc: dict, group: int, engine: Engine, audit_sample: int, until: float | None = None, only: set | None = None
) -> dict:
    """Sealed-size checks: the outputs of ``group`` consecutive seeds (disjoint request samples where the
    pool allows; a request drawn twice keeps its first seed's outputs) judged as one sample, δ
    calibrated on that sample's AR and stock. Each group is one sealed check; its verdict per system,
    and per system the share of groups that rejected. No check starts once ``until`` seconds have passed since
    the process started. ``only``: judge just these systems (several processes may share the checks out)."""
    runs = doc["runs"]
    by_id = {r.id: r for r in load_requests(ROOT / "requests" / doc["settings"]["requests"])}
    limit = doc["settings"]["max_new_tokens"]
    scorer = EngineScorer(engine)
    checks = []
    for first in range(0, len(runs) - group + 1, group):
        if until is not None and checks and time.perf_counter() - STARTED > until:
            log(f"pooled checks of {group} seeds stopped after {len(checks)} ({until:.0f} s)")
            break
        members = runs[first : first + group]
        names = [
            n
            for n in members[0]["outputs"]
            if all(n in m["outputs"] for m in members) and (only is None or n in only or n in ("ar", "stock"))
        ]
        ids: dict[str, int] = {}
        for index, member in enumerate(members):
            for rid in member["requests"]:
                ids.setdefault(rid, index)
        sample = [
            Request(rid, by_id[rid].benchmark, "unseen", limit, prompt_ids=by_id[rid].prompt_ids) for rid in sorted(ids)
        ]
        outputs = {
            name: {rid: RequestOutput(rid, tuple(members[ids[rid]]["outputs"][name][rid])) for rid in ids}
            for name in names
        }
        scored = {name: score_outputs(scorer, sample, outs) for name, outs in outputs.items()}
        try:
            calibration = calibrate_delta(scored["ar"], scored["stock"])
        except ForcingError as err:
            checks.append({"seeds": [m["seed"] for m in members], "error": err.to_dict(), "verdicts": {}})
            continue
        forcing = TokenForcing(
            scorer, scored["stock"], calibration.delta, audit_sample=audit_sample, seed=members[0]["seed"]
        )
        verdicts = {name: summary(forcing.judge(name, scored[name])) for name in names if name not in ("ar", "stock")}
        checks.append(
            {
                "seeds": [m["seed"] for m in members],
                "requests": len(sample),
                "tokens": sum(o.tokens for o in scored["stock"].values()),
                "delta": calibration.delta,
                "verdicts": verdicts,
            }
        )
        log(
            f"pooled seeds {checks[-1]['seeds']}: {checks[-1]['tokens']} tokens; "
            + ", ".join(f"{n} {v['verdict']}" for n, v in verdicts.items())
        )
    table = {}
    for name in [*ALL_CONTROLS, *FAULTS]:
        seen = [c["verdicts"][name]["verdict"] for c in checks if name in c["verdicts"]]
        if seen:
            table[name] = {
                "kind": "control" if name in ALL_CONTROLS else "fault",
                "runs": len(seen),
                **{k: seen.count(k) for k in ("reject", "inconclusive", "accept")},
                "reject_rate": seen.count("reject") / len(seen),
            }
    return {"group": group, "checks": checks, "systems": table}


def figure(results_path: str, png: str) -> None:
    """Figure 4 of the study: per fault its detection (rejection) rate and inconclusive share, per
    control its false-reject rate, with the number of seeds."""
    from specpilot_mem.optional import pyplot

    plt = pyplot("the fault study's Figure 4")
    results = json.loads(Path(results_path).read_text())
    setting = results["settings"]
    panels = [("per seed", results["systems"], f"{setting['requests_per_seed']} req x {setting['max_new_tokens']} tok")]
    for group in results.get("pooled", []):
        checks = group["checks"]
        tokens = sum(c.get("tokens", 0) for c in checks) // max(len(checks), 1)
        panels.append((f"{group['group']} seeds pooled", group["systems"], f"{len(checks)} checks of ~{tokens} tokens"))
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(max(11.0, 0.5 * len(results["systems"]) + 2), 3.6 * len(panels)), squeeze=False
    )
    for ax, (label, table, size) in zip(axes[:, 0], panels):
        names = [n for n in table if table[n]["kind"] == "control"] + [n for n in table if table[n]["kind"] == "fault"]
        sizes = results["systems"]
        # faults below the target size (< 0.3% of tokens changed and < 1 added event per 1,000) are marked: for them
        # inconclusive (or an accept whose power could see them) meets the target
        labels = [f"{n} (below target)" if below_target(sizes.get(n, {})) else n for n in names]
        for x, name in enumerate(names):
            row = table[name]
            reject, inconclusive = row["reject"] / row["runs"], row["inconclusive"] / row["runs"]
            color = "#E8613C" if row["kind"] == "fault" else "#1F6FD6"
            ax.bar(x, reject, color=color, edgecolor="black", linewidth=0.5)
            ax.bar(x, inconclusive, bottom=reject, color="#E3B53B", edgecolor="black", linewidth=0.5)
            sized = sizes.get(name, {}) if table is sizes else {}
            note = (  # of the fault's instances of the target size, how many were rejected
                f"\n{sized['target_instances_rejected']}/{sized['target_instances']}"
                if "target_instances" in sized
                else ""
            )
            ax.annotate(
                f"n={row['runs']}{note}",
                (x, reject + inconclusive),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=6,
            )
        ax.axhline(0.95, color="black", linestyle="dashed", linewidth=0.8)
        ax.set_xticks(range(len(names)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylim(0, 1.25)
        ax.set_ylabel("share of checks")
        ax.set_title(
            f"{label} ({size}): faults rejected (red), controls rejected (blue), inconclusive (yellow), accepted (no bar); "
            "k/m: of a fault's m seeds where it was of the target size, k rejected",
            fontsize=8,
        )
    fig.suptitle(
        f"Token forcing fault study, Figure 4 ({results['device_name']}, {results['dtype']}; {results['model']})",
        fontsize=9,
    )
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=150)
    plt.close(fig)
    print(png)


def below_target(row: dict) -> bool:
    """A fault below the target size on every seed (per instance where the results count instances, else by its
    mean size)."""
    if "target_instances" in row:
        return row["target_instances"] == 0
    return row.get("target_size") is False


def write_requests(path: str, count: int, prompt_tokens: int) -> None:
    """The fault study's request set: ``count`` windows of ``prompt_tokens`` tokens, seeded, from the
    trained pair's unseen-split standard-library files as this machine has them (sha256-checked
    against the corpus manifest), as token ids (the GPU machine has no tokenizer)."""
    import hashlib
    import sysconfig

    from specpilot_mem.engine.train.corpus import load_tokenizer
    from specpilot_mem.engine.weights import DEFAULT_MODEL_DIR

    manifest = json.loads((DEFAULT_MODEL_DIR / "corpus-manifest.json").read_text())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tokenizer = load_tokenizer(DEFAULT_MODEL_DIR)
    files = []
    for entry in manifest["files"]:
        path_ = stdlib / entry["path"]
        if (
            entry["split"] == "unseen"
            and path_.is_file()
            and hashlib.sha256(path_.read_bytes()).hexdigest() == entry["sha256"]
        ):
            ids = tokenizer.encode(path_.read_text(encoding="utf-8")).ids
            if len(ids) > 4 * prompt_tokens:
                files.append((entry["path"], ids))
    rng = random.Random(38)
    rows = []
    for index in range(count):
        name, ids = files[index % len(files)]
        start = rng.randrange(0, len(ids) - prompt_tokens)
        rows.append(
            {
                "id": f"fs-{index:03d}",
                "benchmark": "stdlib-unseen",
                "split": "unseen",
                "max_new_tokens": 256,
                "prompt_ids": ids[start : start + prompt_tokens],
            }
        )
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} requests from {len(files)} files -> {path}")


def merge(paths: list[str]) -> dict:
    """Several results files as one. Runs of one seed from different files (other systems served on the same
    requests, e.g. a second lease for the faults the first did not reach) become one run: their verdicts,
    effects and outputs joined; a system judged twice keeps the first file's."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    by_seed: dict[int, dict] = {}
    for part in parts:
        for run in part["runs"]:
            mine = by_seed.setdefault(run["seed"], run)
            if mine is run:
                continue
            if mine.get("requests") != run.get("requests"):
                raise SystemExit(f"seed {run['seed']} was served on other requests in another file")
            for key in ("verdicts", "effects", "outputs", "full_verdicts", "serve_seconds"):
                if key in run:
                    mine[key] = {**run[key], **mine.get(key, {})}
    runs = [by_seed[seed] for seed in sorted(by_seed)]
    return {
        **parts[0],
        "runs": runs,
        "systems": rates(runs),
        "wall_seconds": max(p["wall_seconds"] for p in parts),
        "merged_from": [p["command"] for p in parts],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="the served systems' and the scorer's passes (the scorer's LM head is float32 either way)",
    )
    parser.add_argument("--seeds", type=int, default=10, help="seeds with every control")
    parser.add_argument(
        "--fault-seeds", type=int, help="of those, the first this many also run every fault (default: all)"
    )
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--requests", default=str(REQUESTS))
    parser.add_argument("--requests-per-seed", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--audit-sample", type=int, default=200)
    parser.add_argument(
        "--budget-seconds",
        type=float,
        help="start no further seed once this many seconds have passed since the process started (a device "
        "lease); the JSON counts the runs made",
    )
    parser.add_argument(
        "--part-out",
        metavar="JSON",
        help="also rewrite this file with the seeds finished so far after every seed (for --merge)",
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument(
        "--figure", nargs=2, metavar=("RESULTS_JSON", "PNG"), help="draw Figure 4 from a results file and exit"
    )
    parser.add_argument(
        "--merge", nargs="+", metavar="RESULTS_JSON", help="merge results of several runs and print them"
    )
    parser.add_argument("--write-requests", metavar="JSONL", help="write the study's request set and exit")
    parser.add_argument(
        "--pool-size",
        type=int,
        action="append",
        default=[],
        help="also judge the outputs of this many seeds at a time as one sealed-size check (repeatable)",
    )
    parser.add_argument(
        "--engine",
        choices=["pure", "system"],
        default="pure",
        help="pure: the pure-torch engine, batch 1, one seed after another; system: the composed system engine "
        "(SystemDecoder), every seed's requests in flight at once",
    )
    parser.add_argument("--batch", type=int, default=256, help="system engine: requests in flight at most")
    parser.add_argument(
        "--skip-settled-audit",
        action="store_true",
        help="audit no system that a rule needing no audit rejects already (same verdicts, fewer re-scores)",
    )
    parser.add_argument(
        "--scores-out",
        metavar="NPZ",
        help="system engine: also write the scorer's numbers the tail and request rules read (see write_scores)",
    )
    parser.add_argument(
        "--outputs-out", metavar="JSON", help="system engine: write every system's outputs here once served"
    )
    parser.add_argument(
        "--from-outputs",
        nargs="+",
        metavar="JSON",
        help="system engine: judge the outputs these --outputs-out files hold (same seeds and sizes) instead of serving",
    )
    parser.add_argument(
        "--serve",
        type=lambda text: text.split(","),
        help="system engine: serve exactly these systems (ar, stock, controls, faults; comma-separated) in this order",
    )
    parser.add_argument(
        "--from-scores",
        metavar="NPZ",
        help="system engine: judge again on the CPU from this --scores-out file and the --from-outputs it was "
        "written from, no model loaded",
    )
    parser.add_argument(
        "--audits-from",
        metavar="RESULTS_JSON",
        help="with --from-scores: the study that audited these outputs on the scorer; its event rule counts are "
        "checked",
    )
    parser.add_argument("--serve-only", action="store_true", help="system engine: serve, write --outputs-out, stop")
    parser.add_argument(
        "--pool-only", action="store_true", help="system engine: only the pooled checks (of --only's systems)"
    )
    parser.add_argument(
        "--pooled-from", nargs="+", metavar="RESULTS_JSON", help="with --merge: join these files' pooled checks in"
    )
    parser.add_argument("--pool-until", type=float, help="start no further pooled check after this many seconds")
    parser.add_argument("--pool-audit-sample", type=int, help="events audited per system in a pooled check")
    parser.add_argument("--drop-outputs", action="store_true", help="leave the output token ids out of the JSON")
    parser.add_argument(
        "--only",
        type=lambda text: set(text.split(",")),
        help="comma-separated controls and faults to run (default: all)",
    )
    args = parser.parse_args()
    if args.from_scores:
        if not (args.from_outputs and args.audits_from):
            raise SystemExit("--from-scores needs --from-outputs (the outputs it was written from) and --audits-from")
        finish(rejudge(args), args)
        return 0
    if args.figure:
        figure(*args.figure)
        return 0
    if args.merge:
        doc = merge(args.merge)
        for path in args.pooled_from or ():  # pooled checks judged by other processes, system subsets joined
            for group in json.loads(Path(path).read_text()).get("pooled", []):
                mine = next((g for g in doc.setdefault("pooled", []) if g["group"] == group["group"]), None)
                if mine is None:
                    doc["pooled"].append(group)
                    continue
                for check, other in zip(mine["checks"], group["checks"]):
                    check.setdefault("verdicts", {}).update(other.get("verdicts", {}))
                mine["systems"].update(group["systems"])
        if args.pool_size:
            engine = Engine.load_default(device=args.device, dtype=getattr(torch, doc["dtype"]))
            doc["pooled"] = [
                pooled(doc, size, engine, args.pool_audit_sample or args.audit_sample, args.pool_until)
                for size in args.pool_size
            ]
        finish(doc, args)
        return 0
    if args.write_requests:
        write_requests(args.write_requests, 256, 48)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):
        args.device = str(torch.device(args.device if ":" in args.device else "cuda:0"))
    engine = Engine.load_default(device=args.device, dtype=getattr(torch, args.dtype))
    pool = load_requests(args.requests)
    fault_seeds = args.seeds if args.fault_seeds is None else args.fault_seeds
    runs = []
    if args.engine == "system":
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
        if args.from_outputs:  # judge what earlier runs served (e.g. on the GPU, by several workers), here
            outputs, seconds, labels = read_outputs(args.from_outputs, args)
            samples = {seed: seed_sample(seed, pool, args) for seed in seeds}
            by_id = {r.id for r in pool}
            if "stock" not in outputs or any(
                r.id not in outputs["stock"] or r.id not in by_id for s_ in samples.values() for r in s_
            ):
                raise SystemExit(f"{args.from_outputs} were served for other seeds or request counts")
            if args.outputs_out:  # several workers' files as one
                write_outputs(args.outputs_out, seeds, args, outputs, seconds, labels)
            if "ar" not in outputs and not args.serve_only:
                raise SystemExit(f"{args.from_outputs} hold no AR outputs: δ cannot be calibrated")
            if args.only and not args.serve_only:  # judge these (several processes may share a seed's systems out)
                outputs = {n: outs for n, outs in outputs.items() if n in args.only or n in ("ar", "stock")}
        else:

            def keep(outputs, seconds, labels):
                if args.outputs_out:
                    write_outputs(args.outputs_out, seeds, args, outputs, seconds, labels)

            outputs, seconds, labels, samples = system_outputs(seeds, pool, args, engine, on_served=keep)
        outputs = with_unfaulted(outputs, labels)
        args.system_labels, args.system_seconds = labels, seconds
        if args.serve_only:
            log("served; judging is left to --from-outputs runs")
            return 0
        if args.pool_only:  # the seeds' outputs as bare runs, for the pooled checks alone
            runs = [
                {
                    "seed": seed,
                    "requests": [r.id for r in samples[seed]],
                    "verdicts": {},
                    "effects": {},
                    "outputs": {
                        n: {r.id: list(outs[r.id].output_ids) for r in samples[seed]} for n, outs in outputs.items()
                    },
                }
                for seed in seeds
            ]
            seeds = []
        if seeds:
            runs = judge_all(seeds, samples, outputs, engine, args)
            write_part(args, engine, runs, fault_seeds)
        seeds = []  # served and judged above
    else:
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    for seed in seeds:
        if runs and args.budget_seconds is not None and time.perf_counter() - STARTED > args.budget_seconds:
            log(f"budget of {args.budget_seconds:.0f} s spent: stopping after {len(runs)} of {args.seeds} seeds")
            break
        runs.append(one_seed(seed, pool, args, engine, with_faults=seed - args.first_seed < fault_seeds))
        write_part(args, engine, runs, fault_seeds)
    result = study_doc(args, engine, runs, fault_seeds)
    if args.pool_size:
        result["pooled"] = [
            pooled(result, size, engine, args.pool_audit_sample or args.audit_sample, args.pool_until, args.only)
            for size in args.pool_size
        ]
    finish(result, args)
    return 0


def write_part(args, engine: Engine, runs: list[dict], fault_seeds: int) -> None:
    """``--part-out``: rewritten after every seed, so a run stopped at a device lease's hard limit keeps its
    finished seeds."""
    if args.part_out:
        part = Path(args.part_out)
        scratch = part.with_name(part.name + ".tmp")
        scratch.write_text(json.dumps(study_doc(args, engine, runs, fault_seeds)))
        scratch.replace(part)


def study_doc(args, engine: Engine, runs: list[dict], fault_seeds: int) -> dict:
    """The study's JSON for the seeds run so far."""
    device = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else "cpu"
    return {
        **result_header("fault_study"),
        "device_name": device,
        "synthetic": engine.synthetic,
        "model": "random weights"
        if engine.synthetic
        else "trained pair (small models trained here, not comparable to the paper's)",
        "dtype": args.dtype,
        "seeds_planned": args.seeds,
        "settings": {
            "max_new_tokens": args.max_new_tokens,
            "requests_per_seed": args.requests_per_seed,
            "audit_sample": args.audit_sample,
            "requests": Path(args.requests).name,
            "engine": args.engine,
            "controls": SYSTEM_CONTROLS if args.engine == "system" else CONTROLS,
            "faults": FAULTS,
            "system_stock": SYSTEM_STOCK if args.engine == "system" else None,
            "system_options": getattr(args, "system_labels", None),
            "system_serve_seconds": getattr(args, "system_seconds", None),
            "fault_seeds": fault_seeds,
            "target_changed": TARGET_CHANGED,
            "target_events_per_1000": TARGET_EVENTS_PER_1000,
        },
        "wall_seconds": time.perf_counter() - STARTED,
        "systems": rates(runs),
        "runs": list(runs),
    }


def headline(doc: dict) -> str:
    """The study's figure in one line (the results index shows it): controls rejected; instances of faults of the
    target size rejected (at the verdict's δ, and at the first departures'); what the instances below it got."""
    table = doc["systems"]
    controls = [r for r in table.values() if r["kind"] == "control"]
    faults = [r for r in table.values() if r["kind"] == "fault"]
    below = {k: sum(r["below_target"][k] for r in faults) for k in ("reject", "inconclusive", "accept")}
    bare = sum(len(r["bare_accepts"]) for r in faults)
    text = (
        f"controls rejected in {sum(r['reject'] for r in controls)} of {sum(r['runs'] for r in controls)} seed runs; "
        f"fault instances of the target size rejected in {sum(r['target_instances_rejected'] for r in faults)} of "
        f"{sum(r['target_instances'] for r in faults)} (at the first departures' δ: "
        f"{sum(r['first_departure_target_instances_rejected'] for r in faults)} of "
        f"{sum(r['first_departure_target_instances'] for r in faults)}); below it {below['reject']} rejected, "
        f"{below['inconclusive']} inconclusive, {below['accept'] - bare} accepted with the power to see the target "
        f"size, {bare} bare accepts"
    )
    for group in doc.get("pooled", []):
        pooled = group["systems"]
        names = [n for n, r in table.items() if r["kind"] == "fault" and r.get("target_size") and n in pooled]
        if names:
            text += (
                f"; {group['group']} seeds pooled: {sum(pooled[n]['reject'] for n in names)} of "
                f"{sum(pooled[n]['runs'] for n in names)} target-size fault checks rejected"
            )
    return text


def finish(doc: dict, args) -> None:
    doc["headline"] = headline(doc)
    if args.drop_outputs:
        for run in doc["runs"]:
            run.pop("outputs", None)
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    raise SystemExit(main())
