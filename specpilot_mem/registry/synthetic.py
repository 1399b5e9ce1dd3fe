"""A generated memory for registry tests and benchmarks: ``n`` entry records with the shape of the paper's
memory (requirement DAG up to 12 deep-wide, variants per arch, evidence across GPUs, drafters and regimes,
untested regimes). Every generated record says it is synthetic: ids start with ``syn-``, titles with
"Synthetic:", and no figure in it was measured.
"""

from __future__ import annotations

import datetime as dt
import hashlib
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
        evidence.append({
            "kind": rng.choice(("paired-run", "paired-run", "microbenchmark", "replay")),
            "deployment": {
                "gpu": gpu.name, "arch": gpu.arch, "target": rng.choice(TARGETS), "drafter": rng.choice(DRAFTERS),
                "regime": regime, "batch_sizes": [1] if regime == "single" else sorted(rng.sample([8, 16, 24, 32], k=2)),
            },
            "figures": [{"name": "gain", "value": gain, "unit": "x", "ci_low": round(gain - 0.01, 3), "ci_high": round(gain + 0.01, 3)}],
            "verdict": rng.choice(("accept", "accept", "accept", "reject")),
            "command": SYNTHETIC_COMMAND,
            "date": (dt.date(2026, 1, 1) + dt.timedelta(days=index % 300 + n)).isoformat(),
            "round": f"syn-deploy-{index % 7}/round-{1 + n % 3}",
            "synthetic": rng.random() < 0.2,
        })
    arches = sorted({g.arch for g in gpus} | ({rng.choice(("sm_90", "sm_120", "sm_100"))} if rng.random() < 0.5 else set()))
    option = f"--specpilot-{key}-{index:04d}"
    regime_untested = "batch" if all(e["deployment"]["regime"] == "single" for e in evidence) else None
    record = {
        "id": entry_id,
        "title": f"Synthetic: {title} #{index}",
        "summary": f"Generated record exercising the registry: {title}, aimed at {area}.",
        "requires": rng.sample(existing, k=min(len(existing), rng.choice((0, 0, 1, 1, 2, 3, 12)))),
        "options": [{"name": option, "type": "bool", "default": False, "help": f"enable {title}"}],
        "variants": [{"name": arch, "options": {option: True}, "hardware": [arch]} for arch in arches],
        "contract": {"level": rng.choice(("bit-exact", "reduction-order", "token-forcing")), "statement": f"{title} is lossless"},
        "evidence": evidence,
        "limits": [f"slower than stock below {rng.choice((2, 4, 8))} requests on {area}"],
        "untested": [{"note": "never timed with batching", "regime": regime_untested}] if regime_untested else [],
        "source": {"round": evidence[0]["round"], "commit": _sha1(f"{entry_id}-source")},
        "reproduces": _sha1(f"{entry_id}-tree"),
    }
    return EntryRecord.model_validate(record)


def generate_memory(root: Path, n_entries: int, seed: int = 0) -> list[EntryRecord]:
    """Write ``n_entries`` synthetic entry records under ``root/entries``; returns them in order."""
    rng = random.Random(seed)
    home = Home(root)
    records: list[EntryRecord] = []
    for index in range(n_entries):
        record = synthetic_entry(index, [r.id for r in records], rng)
        save_entry(home, record)
        records.append(record)
    return records
