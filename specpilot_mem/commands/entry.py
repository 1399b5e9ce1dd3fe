"""``specpilot-mem entry``: update an entry — add a variant, add evidence, re-record its delta, set its status.

Every update re-verifies the entries that require it, and changes nothing if one would break.
"""

from __future__ import annotations

from specpilot_mem.home import find_home
from specpilot_mem.output import console, emit


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "entry", parents=[common], help="update an entry (variant, evidence, delta)", description=__doc__
    )
    verbs = parser.add_subparsers(dest="entry_command", metavar="ACTION", required=True)
    variant = verbs.add_parser("add-variant", parents=[common], help="add or replace a named variant")
    variant.add_argument("id", metavar="ID")
    variant.add_argument("file", metavar="variant.yaml", help="one Variant record (see `specpilot-mem schema variant`)")
    variant.set_defaults(func=run_variant)
    evidence = verbs.add_parser(
        "add-evidence", parents=[common], help="add evidence, e.g. the entry re-timed on a new deployment"
    )
    evidence.add_argument("id", metavar="ID")
    evidence.add_argument(
        "file", metavar="evidence.yaml", help="one Evidence record (see `specpilot-mem schema evidence`)"
    )
    evidence.set_defaults(func=run_evidence)
    rerecord = verbs.add_parser("rerecord", parents=[common], help="re-record the delta from a new source")
    rerecord.add_argument("id", metavar="ID")
    rerecord.add_argument("--from", dest="source", required=True, metavar="REV_OR_WORKTREE")
    rerecord.add_argument("--meta", metavar="draft.yaml", help="fields to change at the same time")
    rerecord.set_defaults(func=run_rerecord)
    status = verbs.add_parser(
        "set-status", parents=[common], help="set an entry's status (verified once re-measured, candidate, superseded)"
    )
    status.add_argument("id", metavar="ID")
    status.add_argument("status", choices=("verified", "candidate", "superseded"))
    status.add_argument("--release", metavar="X", help="on this SGLang release (default: the release of its scope)")
    status.set_defaults(func=run_status)


def _report(args, record, what: str) -> int:
    emit(
        args,
        record.model_dump(mode="json"),
        lambda data: console.print(
            f"{data['id']}: {what}; {len(data['variants'])} variants, "
            f"{len(data['evidence'])} evidence items; dependents re-verified"
        ),
    )
    return 0


def run_variant(args) -> int:
    from specpilot_mem.store import add_variant

    return _report(args, add_variant(find_home(args.home), args.id, args.file), "variant added")


def run_evidence(args) -> int:
    from specpilot_mem.store import add_evidence

    return _report(args, add_evidence(find_home(args.home), args.id, args.file), "evidence added")


def run_rerecord(args) -> int:
    from specpilot_mem.store import load_entry, record_entry

    home = find_home(args.home)
    load_entry(home, args.id)  # re-recording needs an existing entry
    return _report(args, record_entry(home, args.id, args.source, meta=args.meta), "delta re-recorded")


def run_status(args) -> int:
    from specpilot_mem.store.port import set_status

    record = set_status(find_home(args.home), args.id, args.status, args.release)
    release = args.release or record.scope.sglang
    emit(
        args,
        record.model_dump(mode="json"),
        lambda data: console.print(f"{data['id']}: {args.status} on SGLang {release or '(no release in its scope)'}"),
    )
    return 0
