"""Start-up time of the command line, in fresh processes; prints JSON.

Figures (target: each <= 0.5 s), medians over ``--repeats`` fresh interpreters, wall (``*_s``) and CPU
(``*_cpu_s``: this process's children, the cost on a shared machine) seconds:
- ``import_main_s``: ``python -c "import specpilot_mem.main"``;
- ``help_s``: ``python -m specpilot_mem --help`` (every verb's module imported to build the parser);
- ``console_script_help_s``: the installed ``specpilot-mem --help``, when it is on PATH (a version manager's shim
  in front of it adds its own start-up);
- ``python_s``: ``python -c pass``, the floor under all of them.
``heavy_imports`` lists the optional or heavy packages (anthropic, matplotlib, torch, triton) that building the
parser imported: none is expected, since they load only where a command uses them.

    python benchmarks/cli_startup_bench.py [--repeats 15] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specpilot_mem.bench.runs import checkout_environment, fresh_process_times  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

HEAVY = ("anthropic", "matplotlib", "torch", "triton")
TARGET_S = 0.5
LOADED = (
    "import json, sys\nimport specpilot_mem.main as main\nmain.build_parser()\n"
    f"print(json.dumps([name for name in {HEAVY!r} if name in sys.modules]))"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    python = sys.executable
    env = checkout_environment(ROOT)

    def timed_runs(command: list[str], repeats: int) -> dict:
        return fresh_process_times(command, repeats, env)

    runs = {
        "python": timed_runs([python, "-c", "pass"], args.repeats),
        "import_main": timed_runs([python, "-c", "import specpilot_mem.main"], args.repeats),
        "help": timed_runs([python, "-m", "specpilot_mem", "--help"], args.repeats),
    }
    console = shutil.which("specpilot-mem")
    if console:
        runs["console_script_help"] = timed_runs([console, "--help"], args.repeats)
    loaded = subprocess.run([python, "-c", LOADED], env=env, check=True, capture_output=True, text=True)
    heavy = json.loads(loaded.stdout)
    figures = {f"{name}_s": run["median_s"] for name, run in runs.items()}
    figures |= {f"{name}_cpu_s": run["median_cpu_s"] for name, run in runs.items()}
    figures["heavy_imports"] = heavy
    print_result(
        {
            **result_header("cli_startup_bench", argv=[__file__, *(argv if argv is not None else sys.argv[1:])]),
            "load_average": os.getloadavg(),
            "console_script": console,
            "runs": runs,
            "figures": figures,
            # on a shared machine the wall clock includes waiting for a core: the CPU seconds are what start-up costs
            "targets": {
                name: {"wall": figures[f"{name}_s"] <= TARGET_S, "cpu": figures[f"{name}_cpu_s"] <= TARGET_S}
                for name in ("import_main", "help")
            }
            | {"no_heavy_imports": not heavy},
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
