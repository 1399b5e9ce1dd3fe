"""``specpilot-mem schema [entry|variant|evidence|deployment]``: the JSON schema of a record."""

from __future__ import annotations

import json
import sys

from specpilot_mem import models

MODELS = {"entry": models.EntryRecord, "variant": models.Variant, "evidence": models.Evidence,
          "deployment": models.DeploymentRecord}


def register(subparsers, common) -> None:
    parser = subparsers.add_parser("schema", parents=[common], help="print a record's JSON schema", description=__doc__)
    parser.add_argument("model", nargs="?", default="entry", choices=sorted(MODELS))
    parser.set_defaults(func=run)


def run(args) -> int:
    sys.stdout.write(json.dumps(MODELS[args.model].model_json_schema(), indent=2) + "\n")
    return 0
