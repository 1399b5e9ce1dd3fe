"""A generated memory for registry tests and benchmarks: ``n`` entry records with the shape of the paper's
memory (requirement DAG up to 12 deep-wide, variants per arch, evidence across GPUs, drafters and regimes,
untested regimes, statuses and checks on other SGLang releases). Every generated record says it is
synthetic: ids start with ``syn-``, titles with "Synthetic:", and no figure in it was measured.
``results=True`` also writes results files in the shapes the memory browser plots (replay runs for τ(N),
token-forcing verdicts, row-count series), under ``benchmarks/results/synthetic/``, labelled synthetic.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
from pathlib import Path

from specpilot_mem.gpus import GPUS
from specpilot_mem.home import Home
from specpilot_mem.models import EntryRecord
from specpilot_mem.store.records import save_entry

MECHANISMS = (
    ("w12", "12-bit lossless weight format", "weight streaming"),
    ("lmhead", "certified INT8 LM head", "LM head"),
    ("tree", "best-first tree verification", "tree verification"),
    ("tlv", "two-level verification", "verification"),
    ("gdn", "GDN path-verify kernel", "recurrent state"),
    ("fuse", "fused norm and residual", "kernel fusion"),
    ("graph", "CUDA graph capture of the verify step", "launch overhead"),
    ("share", "shared node budget across requests", "batching"),
    ("kvsplit", "split-KV attention for verify", "attention"),
    ("fp8draft", "FP8 drafter weights", "drafter"),
)
DRAFTERS = ("DFlash2", "DSpark", "EAGLE-3")
TARGETS = ("Qwen3.8-27B", "Qwen3.5-4B", "Gemma-4-12B", "Muse-Glimmer-30B")
SYNTHETIC_COMMAND = "python benchmarks/registry_bench.py  # synthetic record, nothing was measured"
RELEASES = ("0.5.20", "0.5.22")
STOCK_RELEASE = "0.5.23"
RESULTS_DIR = "benchmarks/results/synthetic"


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def synthetic_entry(index: int, existing: list[str], rng: random.Random) -> EntryRecord:
    key, title, area = MECHANISMS[index % len(MECHANISMS)]
    entry_id = f"syn-{key}-{index:04d}"
    gpus = rng.sample(GPUS[:4], k=rng.randint(1, 2))  # H100, H200, RTX PRO 6000, B200
    evidence = []
    for n in range(rng.randint(1, 4)):
        gpu = rng.choice(gpus)
        regime = rng.choice(("single", "batch"))
        gain = round(rng.uniform(1.0, 1.2), 3)
        evidence.append(
            {
                "kind": rng.choice(("paired-run", "paired-run", "microbenchmark", "replay")),
                "deployment": {
                    "gpu": gpu.name,
                    "arch": gpu.arch,
                    "target": rng.choice(TARGETS),
                    "drafter": rng.choice(DRAFTERS),
                    "regime": regime,
                    "batch_sizes": [1] if regime == "single" else sorted(rng.sample([8, 16, 24, 32], k=2)),
                },
                "figures": [
                    {
                        "name": "gain",
                        "value": gain,
                        "unit": "x",
                        "ci_low": round(gain - 0.01, 3),
                        "ci_high": round(gain + 0.01, 3),
                    }
                ],
                "verdict": rng.choice(("accept", "accept", "accept", "reject")),
                "command": SYNTHETIC_COMMAND,
                "date": (dt.date(2026, 1, 1) + dt.timedelta(days=index % 300 + n)).isoformat(),
                "round": f"syn-deploy-{index % 7}/round-{1 + n % 3}",
                "synthetic": rng.random() < 0.2,
            }
        )
    arches = sorted(
        {g.arch for g in gpus} | ({rng.choice(("sm_90", "sm_120", "sm_100"))} if rng.random() < 0.5 else set())
    )
    option = f"--specpilot-{key}-{index:04d}"
    regime_untested = "batch" if all(e["deployment"]["regime"] == "single" for e in evidence) else None
    record = {
        "id": entry_id,
        "title": f"Synthetic: {title} #{index}",
        "summary": f"Generated record exercising the registry: {title}, aimed at {area}.",
        "requires": rng.sample(existing, k=min(len(existing), rng.choice((0, 0, 1, 1, 2, 3, 12)))),
        "options": [{"name": option, "type": "bool", "default": False, "help": f"enable {title}"}],
        "variants": [{"name": arch, "options": {option: True}, "hardware": [arch]} for arch in arches],
        "contract": {
            "level": rng.choice(("bit-exact", "reduction-order", "token-forcing")),
            "statement": f"{title} is lossless",
        },
        "evidence": evidence,
        "limits": [f"slower than stock below {rng.choice((2, 4, 8))} requests on {area}"],
        "untested": [{"note": "never timed with batching", "regime": regime_untested}] if regime_untested else [],
        "source": {"round": evidence[0]["round"], "commit": _sha1(f"{entry_id}-source")},
        "reproduces": _sha1(f"{entry_id}-tree"),
        **_status_fields(entry_id, evidence),
    }
    return EntryRecord.model_validate(record)


def _status_fields(entry_id: str, evidence: list[dict]) -> dict:
    """Status, scope and checks on other releases, from an RNG of their own (the rest of the record is unchanged by them)."""
    rng = random.Random(f"{entry_id}-status")
    status = rng.choices(("verified", "candidate", "superseded"), (6, 3, 1))[0]
    scope = {
        "sglang": STOCK_RELEASE,
        "arch": sorted({e["deployment"]["arch"] for e in evidence}),
        "target": sorted({e["deployment"]["target"] for e in evidence}),
        "drafter": sorted({e["deployment"]["drafter"] for e in evidence}),
        "regime": sorted({e["deployment"]["regime"] for e in evidence}),
    }
    checks = []
    for release in RELEASES:
        if rng.random() < 0.5:
            continue
        verdict = rng.choices(("clean", "drift", "conflict", "superseded", "blocked"), (5, 3, 2, 1, 1))[0]
        after = {"clean": status, "superseded": "superseded"}.get(verdict, "candidate")
        path = "sglang/srt/server_args.py"
        checks.append(
            {
                "release": release,
                "status": after,
                "verdict": verdict,
                "base": _sha1(f"release-{release}"),
                "checked": "2026-12-01",
                "changed": [path] if verdict in ("drift", "conflict") else [],
                "conflicts": [path] if verdict == "conflict" else [],
            }
        )
    return {"status": status, "scope": scope, "releases": checks}


def _results(root: Path, index: int, record: EntryRecord) -> EntryRecord:
    """Every tenth entry of each kind gets a results file in a shape the browser plots (synthetic)."""
    rng = random.Random(f"{record.id}-results")
    deployment = record.evidence[0].deployment.model_dump()
    base = {"command": SYNTHETIC_COMMAND, "date": dt.date(2026, 11, 30), "synthetic": True, "deployment": deployment}
    kind = index % 10
    if kind == 3:  # replay: τ(N) per tree builder
        runs = [
            {
                "builder": builder,
                "nodes": nodes,
                "batch": 1,
                "synthetic": True,
                "tau": round(scale * (1 + 2.2 * (1 - 0.8 ** (nodes / 4))) + rng.uniform(-0.05, 0.05), 3),
            }
            for builder, scale in (("chain", 0.9), ("best-first", 1.0), ("ddtree", 0.97))
            for nodes in (8, 16, 32, 64)
        ]
        name, doc = "replay", {"what": "synthetic replay", "synthetic": True, "replay": {"runs": runs}}
        evidence = {**base, "kind": "replay", "figures": [{"name": "tau, N=32", "value": runs[2]["tau"]}]}
    elif kind == 7:  # token forcing: stock and the systems judged against it
        stock_rate = rng.uniform(0.01, 0.03)
        verdicts = []
        for system, extra, verdict in (
            ("entry", rng.uniform(-0.002, 0.002), "accept"),
            ("injected-fault", 0.02, "reject"),
        ):
            rate = stock_rate + extra
            verdicts.append(
                {
                    "system": system,
                    "stock": "stock",
                    "verdict": verdict,
                    "rate": {
                        "stock_rate": stock_rate,
                        "stock_low": stock_rate - 0.004,
                        "stock_high": stock_rate + 0.004,
                        "system_rate": rate,
                        "system_low": rate - 0.004,
                        "system_high": rate + 0.004,
                        "limit": 0.005,
                    },
                }
            )
        name, doc = "token-forcing", {"what": "synthetic token forcing", "synthetic": True, "verdicts": verdicts}
        evidence = {
            **base,
            "kind": "token-forcing",
            "verdict": "accept",
            "figures": [
                {"name": "mismatch rate", "value": round(100 * verdicts[0]["rate"]["system_rate"], 3), "unit": "%"}
            ],
        }
    elif kind == 5:  # a microbenchmark by row count, in the record's figures only
        evidence = {
            **base,
            "kind": "microbenchmark",
            "figures": [
                {
                    "name": f"speedup over stock, {rows} rows",
                    "value": round(1.4 - 0.1 * n + rng.uniform(-0.03, 0.03), 3),
                    "unit": "x",
                }
                for n, rows in enumerate((1, 2, 4, 8, 16, 32))
            ],
        }
        return record.model_copy(
            update={"evidence": record.evidence + [type(record.evidence[0]).model_validate(evidence)]}
        )
    else:
        return record
    rel = f"{RESULTS_DIR}/{record.id}-{name}.json"
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    new = type(record.evidence[0]).model_validate({**evidence, "results": rel})
    return record.model_copy(update={"evidence": record.evidence + [new]})


def generate_memory(root: Path, n_entries: int, seed: int = 0, results: bool = False) -> list[EntryRecord]:
    """Write ``n_entries`` synthetic entry records under ``root/entries`` (and, with ``results``, results
    files the browser plots); returns them in order."""
    rng = random.Random(seed)
    home = Home(root)
    records: list[EntryRecord] = []
    for index in range(n_entries):
        record = synthetic_entry(index, [r.id for r in records], rng)
        if results:
            record = EntryRecord.model_validate(_results(root, index, record).model_dump())
        save_entry(home, record)
        records.append(record)
    return records
