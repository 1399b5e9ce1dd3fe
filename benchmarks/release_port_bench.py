"""Port check of this project's entries onto other SGLang releases, from the cached wheels; prints JSON.

For each release (default 0.5.20, 0.5.21, 0.5.22) a fresh fork (stock imported from its wheel, outside the
timing, so no object of the release is there yet) gets the release imported from the wheel cache
and every entry's verdict computed: ``seconds`` is that whole call (import included; target <= 30 s),
beside ``import_s`` and ``check_s`` for the two parts. Needs ``specpilot-mem init`` run once (the stock
fork) and the wheels cached (``pip download --no-deps`` into ~/.cache/specpilot/wheels, or a first run).

    python benchmarks/release_port_bench.py [--releases 0.5.20,0.5.21,0.5.22] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from specpilot_mem.home import Home, find_home
from specpilot_mem.provenance import result_header, write_result
from specpilot_mem.store import stock
from specpilot_mem.store.fork import build_pinned_fork, open_fork
from specpilot_mem.store.port import check_entries, release_resolver
from specpilot_mem.store.records import load_entries
from specpilot_mem.store.releases import PINS, import_release, locate_wheel
from specpilot_mem.store.resolver import Resolver


def private_home(project: Home, root: Path) -> Home:
    """The project's entries on a new fork built from the stock wheel alone: no release's objects in it yet."""
    (root / "entries").mkdir(parents=True)
    for record in sorted(project.entries.glob("*/entry.yaml")):
        shutil.copytree(record.parent, root / "entries" / record.parent.name)
    home = Home(root)
    build_pinned_fork(home, None, checkout=False)
    return home


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--releases", default="0.5.20,0.5.21,0.5.22")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    project = find_home()
    doc = result_header("release_port_bench")
    doc.update(target_s=30.0, entries=sorted(load_entries(project)), releases={})
    for version in args.releases.split(","):
        spec = f"sglang=={version}"
        locate_wheel(spec)  # downloads into the cache if needed, outside the timing
        with tempfile.TemporaryDirectory(prefix="port-bench-") as tmp:
            home = private_home(project, Path(tmp) / "home")
            started = time.perf_counter()
            records = load_entries(home)
            fork = open_fork(home)
            with fork.lock():
                order = Resolver(fork, records).chain(records)
                base = import_release(fork, spec)
                imported = time.perf_counter()
                verdicts = check_entries(fork, release_resolver(fork, records, base), base, order)
            done = time.perf_counter()
        doc["releases"][version] = {
            "wheel": PINS[version].wheel,
            "sha256": PINS[version].sha256,
            "commit": base.commit,
            "tree": base.tree,
            "seconds": round(done - started, 3),
            "import_s": round(imported - started, 3),
            "check_s": round(done - imported, 3),
            "within_target": done - started <= 30.0,
            "verdicts": {v.id: v.verdict for v in verdicts},
            "entries": [v.to_dict() for v in verdicts],
        }
        print(f"{version}: {done - started:.2f} s, {doc['releases'][version]['verdicts']}", file=sys.stderr)
    doc["stock"] = {"version": stock.SGLANG_VERSION, "commit": stock.STOCK_COMMIT}
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        write_result(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
