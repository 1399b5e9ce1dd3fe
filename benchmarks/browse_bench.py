"""Memory-browser benchmark on a 1,000-entry synthetic memory; prints JSON.

Figures (targets from issue 34):
- ``build_s``: ``build_site`` of every page (index, graph, releases and one page per entry), wall clock with
  the registry already synced (target <= 10 s); ``build_cpu_s`` the process's CPU time for it, and
  ``registry_sync_s`` the first sync before it (what a first ``browse`` of a never-indexed memory adds);
- ``load_s``: each page opened in headless chromium (Debian's chromium + chromium-driver) from disk, its
  Navigation Timing duration (request start to the load event), the median of ``--repeats`` loads, for every
  page (target <= 1 s each): max, p95, median per page kind (the release matrix's pages are one kind);
  ``painted_s`` the same for the later of that and the first contentful paint (a page drawn after its load
  event is not loaded for its reader; both figures must meet the target); ``first_load_s`` over first loads,
  and ``load_average`` the machine's load (1, 5, 15 min) before and after the loads, which on a shared 2-core
  machine dominates the spread. The memory is synthetic (``registry.synthetic``, results files included).

    python benchmarks/browse_bench.py [--entries 1000] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from specpilot_mem.browse.headless import chromium_driver, missing_browser
from specpilot_mem.browse.site import build_site
from specpilot_mem.home import Home
from specpilot_mem.provenance import result_header, write_result
from specpilot_mem.registry.sync import sync
from specpilot_mem.registry.synthetic import generate_memory


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "pages": len(values),
        "max_s": round(ordered[-1], 4),
        "p95_s": round(ordered[int(0.95 * (len(ordered) - 1))], 4),
        "median_s": round(statistics.median(ordered), 4),
    }


# the load (request start to the end of the load event) and the first contentful paint, in ms from navigation start
TIMING = (
    "const nav = performance.getEntriesByType('navigation')[0];"
    "const paint = performance.getEntriesByName('first-contentful-paint');"
    "return [nav.duration, paint.length ? paint[0].startTime : 0];"
)


def page_kind(page: str) -> str:
    """entries/<id>.html -> entries; releases-<n>.html -> releases (one kind for the matrix's pages)."""
    if "/" in page:
        return page.split("/")[0]
    return "releases.html" if page.startswith("releases") else page


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3, help="loads per page; its figure is their median")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    reason = missing_browser()
    if reason:
        parser.error(reason)
    doc = result_header("browse_bench")
    doc.update(synthetic=True, entries=args.entries, targets={"build_s": 10.0, "load_s": 1.0})
    with tempfile.TemporaryDirectory(prefix="browse-bench-") as tmp:
        root = Path(tmp) / "home"
        generate_memory(root, args.entries, seed=0, results=True)
        home = Home(root)
        started = time.perf_counter()
        sync(home)
        doc["registry_sync_s"] = round(time.perf_counter() - started, 3)
        cpu, started = time.process_time(), time.perf_counter()
        report = build_site(home, Path(tmp) / "site")
        doc.update(
            build_s=round(time.perf_counter() - started, 3),
            build_cpu_s=round(time.process_time() - cpu, 3),
            pages=len(report.pages),
            plots=report.plots,
        )
        print(f"built {len(report.pages)} pages in {doc['build_s']} s", file=sys.stderr)
        driver = chromium_driver(Path(tmp) / "profile")
        loads: dict[str, list[float]] = {}
        painted: dict[str, list[float]] = {}
        first: list[float] = []
        slowest = ("", 0.0)
        doc["load_average_before"] = list(os.getloadavg())
        try:
            driver.get("about:blank")  # the browser's own start-up is not a page's load
            for page in report.pages:
                runs, paints = [], []
                for _ in range(args.repeats):
                    driver.get((report.out / page).as_uri())
                    load, paint = driver.execute_script(TIMING)
                    runs.append(load / 1000)
                    paints.append(max(load, paint) / 1000)
                duration = statistics.median(runs)
                first.append(runs[0])
                kind = page_kind(page)
                loads.setdefault(kind, []).append(duration)
                painted.setdefault(kind, []).append(statistics.median(paints))
                slowest = max(slowest, (page, max(duration, statistics.median(paints))), key=lambda x: x[1])
            doc["console_errors"] = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        finally:
            driver.quit()
    doc["load_s"] = {kind: summary(values) for kind, values in loads.items()}
    doc["painted_s"] = {kind: summary(values) for kind, values in painted.items()}
    doc["first_load_s"] = summary(first)
    doc["load_average"] = list(os.getloadavg())
    doc["slowest_page"] = {"page": slowest[0], "s": round(slowest[1], 4)}
    doc["within_targets"] = doc["build_s"] <= 10.0 and slowest[1] <= 1.0  # slowest: load or paint
    big = max(doc["painted_s"][k]["max_s"] for k in ("index.html", "graph.html", "releases.html"))
    doc["headline"] = (
        f"{args.entries:,} synthetic entries: build {doc['build_s']:.1f} s; index/graph/releases load "
        f"<= {big:.2f} s, entry pages p95 {doc['painted_s']['entries']['p95_s']:.2f} s "
        f"(slowest page {slowest[1]:.2f} s) at load average {doc['load_average'][0]:.0f}"
    )
    print(json.dumps(doc, indent=1))
    if args.out:
        write_result(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
