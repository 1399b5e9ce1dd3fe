"""``specpilot-mem schema [entry|variant|evidence|deployment]``: the JSON schema of a record."""

from __future__ import annotations

import json
import sys

# Record name -> model class in specpilot_mem.models (imported when the command runs: pydantic is slow
# to import and every CLI call discovers this module).
MODELS = {"entry": "EntryRecord", "variant": "Variant", "evidence": "Evidence", "deployment": "DeploymentRecord"}


def register(subparsers, common) -> None:
    parser = subparsers.add_parser("schema", parents=[common], help="print a record's JSON schema", description=__doc__)
    parser.add_argument("model", nargs="?", default="entry", choices=sorted(MODELS))
    parser.set_defaults(func=run)


def run(args) -> int:
    from specpilot_mem import models

    schema = getattr(models, MODELS[args.model]).model_json_schema()
    sys.stdout.write(json.dumps(schema, indent=2) + "\n")
    return 0
