"""`specpilot-mem query` as a user runs it: whole commands in fresh processes, on this project's memory; prints JSON.

Figures (medians over ``--repeats`` fresh interpreters; wall ``*_s`` and CPU ``*_cpu_s`` of the child):
- ``gpu_sm120``: ``query --gpu sm_120`` printing its table to a pipe (target: wall <= 1 s under the load the
  machine carries, recorded as ``load_average``);
- ``gpu_sm120_json``: the same with ``--json``;
- ``text_words_1000`` / ``text_words_4000``: ``--text`` with that many distinct words, and
  ``model_chars_10000`` / ``model_chars_40000``: a ``--model`` value that long; ``scaling`` gives the
  4x-input / 1x-input CPU ratio of each pair (linear or better: <= 4; the start-up is a floor under both).

    python benchmarks/query_bench.py [--repeats 9] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specpilot_mem.bench.runs import checkout_environment, fresh_process_times  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

TARGET_S = 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    env = checkout_environment(ROOT, SPECPILOT_HOME=str(ROOT))

    def timed_runs(query_args: list[str], repeats: int) -> dict:
        return fresh_process_times([sys.executable, "-m", "specpilot_mem", "query", *query_args], repeats, env)

    load_before = os.getloadavg()
    runs = {
        "gpu_sm120": timed_runs(["--gpu", "sm_120"], args.repeats),
        "gpu_sm120_json": timed_runs(["--gpu", "sm_120", "--json"], args.repeats),
    }
    for n in (1000, 4000):
        runs[f"text_words_{n}"] = timed_runs(["--text", " ".join(f"word{i}" for i in range(n))], args.repeats)
    for n in (10_000, 40_000):
        runs[f"model_chars_{n}"] = timed_runs(["--model", "x" * n], args.repeats)
    scaling = {
        "text_words_4000_over_1000_cpu": round(
            runs["text_words_4000"]["median_cpu_s"] / runs["text_words_1000"]["median_cpu_s"], 2
        ),
        "model_chars_40000_over_10000_cpu": round(
            runs["model_chars_40000"]["median_cpu_s"] / runs["model_chars_10000"]["median_cpu_s"], 2
        ),
    }
    print_result(
        {
            **result_header("query_bench", argv=[__file__, *(argv if argv is not None else sys.argv[1:])]),
            "load_average": {"before": load_before, "after": os.getloadavg()},
            "cpus": os.cpu_count(),
            "runs": runs,
            "figures": {f"{name}_s": run["median_s"] for name, run in runs.items()}
            | {f"{name}_cpu_s": run["median_cpu_s"] for name, run in runs.items()},
            "scaling": scaling,
            "targets": {
                "gpu_sm120_wall_le_1s": runs["gpu_sm120"]["median_s"] <= TARGET_S,
                "linear_in_input": all(ratio <= 4 for ratio in scaling.values()),
            },
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
