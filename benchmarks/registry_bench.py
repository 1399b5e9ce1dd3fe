"""Registry timings on a generated memory of 1,000 entries (synthetic records); prints JSON.

Figures, each the median (and max) over repeats:
- typical queries in-process (``--gpu sm_120``, ``--text``, ``--regime batch --drafter DSpark``): the query
  on an open connection, and ``connect`` + query (hashing every record file to check freshness, opening);
- the whole ``specpilot-mem query`` command as a subprocess;
- an incremental sync after editing one record (saved through the store); and a full rebuild.

Targets (issue 3): query <= 50 ms in-process, the command <= 1 s, incremental sync <= 200 ms.

    python benchmarks/registry_bench.py [--entries 1000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specpilot_mem.home import Home
from specpilot_mem.provenance import print_result, result_header
from specpilot_mem.registry.query import QueryFilters, query_entries
from specpilot_mem.registry.sync import connect, sync
from specpilot_mem.registry.synthetic import generate_memory
from specpilot_mem.store.records import save_entry

QUERIES = {
    "--gpu sm_120": QueryFilters(gpu="sm_120"),
    "--text 'lossless weight'": QueryFilters(text="lossless weight"),
    "--regime batch --drafter DSpark": QueryFilters(regime="batch", drafter="DSpark"),
}


def timed(fn, repeats: int) -> dict:
    """Wall time, and this process's CPU time (threads included): on a shared, loaded machine the CPU time
    is the closer estimate of the wall time on an idle one."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {
        "median_ms": round(statistics.median(wall) * 1000, 2),
        "max_ms": round(max(wall) * 1000, 2),
        "median_cpu_ms": round(statistics.median(cpu) * 1000, 2),
        "repeats": repeats,
    }


def timed_command(command: list[str], repeats: int) -> dict:
    """Wall time and the child's CPU time (user + system) of a whole command."""
    wall, cpu = [], []
    for _ in range(repeats):
        before = os.times()
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        wall.append(time.perf_counter() - start)
        after = os.times()
        cpu.append((after.children_user - before.children_user) + (after.children_system - before.children_system))
    return {
        "median_ms": round(statistics.median(wall) * 1000, 2),
        "max_ms": round(max(wall) * 1000, 2),
        "median_cpu_ms": round(statistics.median(cpu) * 1000, 2),
        "repeats": repeats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="registry-bench-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        records = generate_memory(root, args.entries, seed=0)
        generate_s = time.perf_counter() - start
        home = Home(root)
        rebuild = sync(home, rebuild=True)

        figures: dict = {"generate_s": round(generate_s, 2), "rebuild_s": round(rebuild.seconds, 2), "queries": {}}
        con = connect(home)
        try:
            for name, filters in QUERIES.items():
                matches = len(query_entries(con, filters))
                figures["queries"][name] = {
                    "matches": matches,
                    "query_on_open_connection": timed(lambda f=filters: query_entries(con, f), args.repeats),
                }
        finally:
            con.close()

        def connect_and_query(filters):
            c = connect(home)
            try:
                query_entries(c, filters)
            finally:
                c.close()

        for name, filters in QUERIES.items():
            figures["queries"][name]["connect_check_freshness_and_query"] = timed(
                lambda f=filters: connect_and_query(f), args.repeats
            )

        command = [sys.executable, "-m", "specpilot_mem", "query", "--home", str(root), "--gpu", "sm_120", "--json"]
        figures["cli_query_gpu_sm_120"] = timed_command(command, max(5, args.repeats // 3))
        figures["cli_command"] = " ".join(["specpilot-mem", *command[3:]])

        edits = iter(range(10**6))

        def edit_one_and_sync():
            record = records[next(edits) % len(records)]
            save_entry(home, record.model_copy(update={"summary": f"{record.summary} (edited {time.time_ns()})"}))
            report = sync(home)
            assert len(report.changed) == 1 and not report.rebuilt

        figures["incremental_sync_one_record"] = timed(edit_one_and_sync, args.repeats)
        figures["registry_bytes"] = home.registry.stat().st_size

    worst_query = max(q["query_on_open_connection"]["median_ms"] for q in figures["queries"].values())
    worst_query_cpu = max(q["query_on_open_connection"]["median_cpu_ms"] for q in figures["queries"].values())
    print_result(
        {
            **result_header("registry_bench"),
            "synthetic": True,
            "data": f"{args.entries} generated entry records (specpilot_mem.registry.synthetic, seed 0); nothing in them "
            "was measured",
            "load_average": {
                "before": [round(x, 2) for x in load_before],
                "after": [round(x, 2) for x in os.getloadavg()],
            },
            "figures": figures,
            "targets": {
                "query_in_process_le_50ms": {"wall": worst_query <= 50, "cpu": worst_query_cpu <= 50},
                "cli_query_le_1s": {
                    "wall": figures["cli_query_gpu_sm_120"]["median_ms"] <= 1000,
                    "cpu": figures["cli_query_gpu_sm_120"]["median_cpu_ms"] <= 1000,
                },
                "incremental_sync_le_200ms": {
                    "wall": figures["incremental_sync_one_record"]["median_ms"] <= 200,
                    "cpu": figures["incremental_sync_one_record"]["median_cpu_ms"] <= 200,
                },
            },
        },
        args.out,
    )


if __name__ == "__main__":
    main()
