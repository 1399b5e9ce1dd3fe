"""``specpilot-mem tf``: token forcing of one or more systems against stock (§3.3).

    specpilot-mem tf --requests requests/specpilot-v1.jsonl --split unseen \\
        --ar ar.jsonl --stock stock.jsonl --system final=final.jsonl \\
        --scorer specpilot_mem.forcing.engine_adapter:load_scorer --scorer-arg model=default --plot fig4.png

Outputs files are JSONL ``{"id": ..., "output_ids": [...]}`` (``specpilot_mem.controller.system``).
δ is calibrated from the AR and stock outputs (``--ar``) or given (``--delta``). Outputs of any length
up to the scorer's context are scored, one batched whole-sequence pass each (a sealed final's long
outputs: up to 4,096 tokens or the pair's context). Every verdict carries its power: ``inconclusive``
(exit 3) when the sample could not have seen a 0.5-point rate excess or a doubling of large-margin
events, with the sample that would suffice.
"""

from __future__ import annotations

from pathlib import Path

from specpilot_mem.output import assemble, console, emit, progress, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "tf",
        parents=[common],
        help="token forcing: judge systems' outputs against stock's",
        description="Score each system's outputs with the teacher-forced scorer, apply the rate and event rules "
        "against stock, audit large-margin events and print the verdicts (Figure 4 with --plot).",
    )
    parser.add_argument("--requests", required=True, metavar="JSONL", help="the request set the outputs answer")
    parser.add_argument("--split", choices=["dev", "unseen"], help="use only this split of the request set")
    parser.add_argument("--stock", required=True, metavar="JSONL", help="stock's outputs")
    parser.add_argument(
        "--system",
        required=True,
        action="append",
        metavar="NAME=JSONL",
        help="a system's outputs (repeat for several systems)",
    )
    delta = parser.add_mutually_exclusive_group(required=True)
    delta.add_argument(
        "--ar", metavar="JSONL", help="AR decoding's outputs, to calibrate δ from stock's first departures"
    )
    delta.add_argument("--delta", type=float, help="δ from an earlier calibration (nats)")
    parser.add_argument(
        "--stock-path",
        action="append",
        default=[],
        metavar="JSONL",
        help="more stock outputs (other runs or batch sizes) the audit may find an event on",
    )
    parser.add_argument("--scorer", required=True, metavar="MODULE:FACTORY", help="teacher-forced scorer backend")
    parser.add_argument(
        "--scorer-arg", action="append", default=[], metavar="KEY=VALUE", help="argument for the scorer factory"
    )
    parser.add_argument(
        "--stock-engine", metavar="MODULE:FACTORY", help="scorer giving the stock engine's own logits (audit)"
    )
    parser.add_argument("--stock-engine-arg", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--audit-sample", type=int, help="events audited per system (default: 200, as in the paper)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the audit sample")
    parser.add_argument(
        "--long-outputs",
        action="store_true",
        help="the outputs come from the sealed final's long-output pass: each must run to 4,096 tokens or "
        "what the scorer's context leaves after its prompt (the length rule's limit)",
    )
    parser.add_argument(
        "--synthetic", action="store_true", help="label results synthetic (random weights, generated data)"
    )
    parser.add_argument("--plot", metavar="PNG", help="write the paper's Figure 4 for these verdicts")
    parser.add_argument("--title", help="title of the plot")
    parser.set_defaults(func=run)


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    from specpilot_mem.forcing.scorer import ForcingError

    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ForcingError(f"{flag} {item!r} is not KEY=VALUE", where=flag, fix=f"write {flag} name=value")
        if key in pairs:
            raise ForcingError(f"{flag} gives {key!r} twice", where=flag, fix="give each name once")
        pairs[key] = value
    return pairs


def run(args) -> int:
    # Imported here, not at module level: every CLI call discovers this module, few run it.
    from specpilot_mem.controller.requests import load_requests
    from specpilot_mem.controller.system import load_outputs
    from specpilot_mem.forcing.audit import AUDIT_SAMPLE
    from specpilot_mem.forcing.calibrate import calibrate_delta
    from specpilot_mem.forcing.scorer import ForcingError, load_scorer, long_output_requests, score_outputs
    from specpilot_mem.forcing.verdict import TokenForcing, Verdict

    if args.delta is not None and not args.delta > 0:  # also NaN
        raise ForcingError(
            f"--delta must be a positive number of nats, got {args.delta:g}",
            where="--delta",
            fix="pass the δ an earlier calibration printed, or calibrate it with --ar JSONL",
        )
    if args.audit_sample is None:
        args.audit_sample = AUDIT_SAMPLE
    if args.audit_sample < 1:
        raise ForcingError(
            f"--audit-sample must be positive, got {args.audit_sample}", where="--audit-sample", fix="e.g. 200"
        )
    systems = _pairs(args.system, "--system")
    requests = load_requests(args.requests, split=args.split)
    stock_outputs = load_outputs(args.stock)
    system_outputs = {name: load_outputs(path) for name, path in systems.items()}
    ar_outputs = load_outputs(args.ar) if args.ar else None
    extra_paths = [load_outputs(path) for path in args.stock_path]
    scorer = load_scorer(args.scorer, _pairs(args.scorer_arg, "--scorer-arg"))
    if args.long_outputs:
        requests = long_output_requests(requests, getattr(scorer, "max_len", None), getattr(scorer, "encode", None))
    stock_engine = (
        load_scorer(args.stock_engine, _pairs(args.stock_engine_arg, "--stock-engine-arg"))
        if args.stock_engine
        else None
    )

    to_score = 1 + len(systems) + (1 if ar_outputs else 0)
    with progress("scoring outputs", total=to_score * len(requests), enabled=not args.json) as bar:
        stock = score_outputs(scorer, requests, stock_outputs, on_request=bar.advance)
        scored = {
            name: score_outputs(scorer, requests, outs, on_request=bar.advance) for name, outs in system_outputs.items()
        }
        ar = score_outputs(scorer, requests, ar_outputs, on_request=bar.advance) if ar_outputs else None
    calibration = calibrate_delta(ar, stock) if ar is not None else None
    delta = calibration.delta if calibration is not None else args.delta
    paths = {r.id: [stock[r.id].output_ids, *(p[r.id].output_ids for p in extra_paths if r.id in p)] for r in requests}
    forcing = TokenForcing(
        scorer,
        stock,
        delta,
        stock_paths=paths,
        stock_engine=stock_engine,
        audit_sample=args.audit_sample,
        seed=args.seed,
    )
    verdicts: list[Verdict] = []
    with progress("auditing events", total=None, enabled=not args.json) as bar:
        for name, system in scored.items():
            verdicts.append(forcing.judge(name, system, synthetic=args.synthetic, on_event=bar.advance))
    plot = None
    if args.plot:
        from specpilot_mem.forcing.plot import plot_figure4

        plot = str(plot_figure4(verdicts, args.plot, title=args.title))
    payload = {
        "delta": delta,
        "calibration": calibration.to_dict() if calibration is not None else None,
        "requests": len(requests),
        "synthetic": args.synthetic,
        "verdicts": [v.to_dict() for v in verdicts],
        "plot": plot,
    }
    emit(args, payload, _render)
    if any(v.verdict == "reject" for v in verdicts):
        return 1
    return 3 if any(v.verdict == "inconclusive" for v in verdicts) else 0


def _pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def _render(payload: dict) -> None:
    calibration = payload["calibration"]
    source = calibration["basis"] if calibration else "given"
    label = " (synthetic)" if payload["synthetic"] else ""
    console.print(f"δ = {payload['delta']:g} nats ({source}); {payload['requests']} requests{label}")
    rows = []
    for v in payload["verdicts"]:
        rate, events = v["rate"], v["events"]
        rows.append(
            [
                v["system"],
                v["verdict"].upper(),
                _pct(rate["system_rate"]),
                f"{_pct(rate['system_low'])}-{_pct(rate['system_high'])}",
                _pct(rate["stock_rate"]),
                f"{100 * rate['difference_low']:+.2f}",
                events["system_events"],
                f"{events['unexplained']}/{events['audited']}",
                f"{events['p_value']:.2g}",
            ]
        )
    limit = 100 * payload["verdicts"][0]["rate"]["limit"] if payload["verdicts"] else 0.0
    console.print(
        table(
            f"token forcing (diff low: 95% lower bound of the rate difference, points; limit +{limit:.2f})",
            ["system", "verdict", "mismatch", "95% CI", "stock", "diff low", "events", "unexpl.", "p"],
            rows,
        )
    )
    for v in payload["verdicts"]:
        for reason in v["reasons"]:
            console.print(assemble((v["system"], "bold"), f": {reason}"))
        if v["verdict"] != "inconclusive" and v.get("power_statement"):
            console.print(assemble((v["system"], "bold"), f" power: {v['power_statement']}"))
        flagged = [r["id"] for r in v.get("per_request", ()) if r["flagged"]]
        if flagged:
            console.print(
                assemble(
                    (v["system"], "bold"),
                    f": {len(flagged)} request(s) mismatch far more than stock's pooled rate: {', '.join(flagged[:8])}",
                )
            )
    if payload["plot"]:
        console.print(f"Figure 4 written to {Path(payload['plot'])}")
