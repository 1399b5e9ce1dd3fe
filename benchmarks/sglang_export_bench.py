"""Export and import costs of the SGLang side, printed as JSON.

On a memory home with an initialized fork (``specpilot-mem init``): apply every SGLang entry onto
stock and export it into a fresh folder, then the time a fresh process takes to import ``sglang.srt.server_args`` and parse the SpecPilot flags from
the export, first with an empty bytecode cache and then warm. Wall and CPU seconds are both given:
the machines this runs on are shared.

    python benchmarks/sglang_export_bench.py [--home DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specpilot_mem.home import find_home
from specpilot_mem.provenance import print_result, result_header
from specpilot_mem.sglang.cpu_import import import_environment, write_torchvision_standin
from specpilot_mem.sglang.entry_src import sglang_entry_ids
from specpilot_mem.store.resolver import apply_entries

PARSE = (
    "from sglang.srt.server_args import prepare_server_args\n"
    "args = prepare_server_args(['--model-path', 'm', '--quantization', 'w12'])\n"
)


def timed(fn):
    cpu0, wall0 = time.process_time(), time.perf_counter()
    value = fn()
    return value, {"wall_s": round(time.perf_counter() - wall0, 3), "cpu_s": round(time.process_time() - cpu0, 3)}


def child_run(argv, env) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(time.perf_counter() - wall0, 3), "cpu_s": round(cpu, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home")
    parser.add_argument("--out")
    args = parser.parse_args()
    home = find_home(args.home)
    ids = sglang_entry_ids(home)
    with tempfile.TemporaryDirectory() as scratch:
        dest = Path(scratch) / "export"
        result, export_cold = timed(lambda: apply_entries(home, ids, export=str(dest)))
        standin = write_torchvision_standin(Path(scratch) / "standin")
        env = import_environment(dest, standin)
        import_cold = child_run([sys.executable, "-c", PARSE], env)
        import_warm = child_run([sys.executable, "-c", PARSE], env)
    report = {
        **result_header("sglang_export_bench"),
        "entries": result.order,
        "tree": result.tree,
        "source_files": result.export["source_files"],
        "compiled_files": len(result.export["compiled_files"]),
        "apply_and_export_cold": export_cold,
        "import_server_args_cold_bytecode": import_cold,
        "import_server_args_warm_bytecode": import_warm,
    }
    print_result(report, args.out)


if __name__ == "__main__":
    main()
