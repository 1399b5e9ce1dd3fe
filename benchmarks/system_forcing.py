"""Token forcing of the system engine's outputs (``system_bench.py --sections forcing``, run on the GPU) on the CPU:
each system against stock, with the trained pair's FP32 scorer and δ calibrated from AR vs stock.

    PYTHONPATH=kernels:. python benchmarks/system_forcing.py OUTPUTS.json --out benchmarks/results/system-forcing.json

No lossless system may be rejected (accepted, or inconclusive where the sample is too small) and the injected §6.2
fault must be rejected.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.controller.requests import Request  # noqa: E402
from specpilot_mem.controller.system import RequestOutput  # noqa: E402
from specpilot_mem.engine.engine import Engine  # noqa: E402
from specpilot_mem.forcing.calibrate import calibrate_delta  # noqa: E402
from specpilot_mem.forcing.engine_adapter import EngineScorer  # noqa: E402
from specpilot_mem.forcing.scorer import score_outputs  # noqa: E402
from specpilot_mem.forcing.verdict import TokenForcing  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

LOSSY = ("fault",)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outputs", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    doc = json.loads(args.outputs.read_text())
    requests = [
        Request(r["id"], "stdlib", "unseen", doc["new_tokens"], prompt_ids=tuple(r["prompt_ids"]))
        for r in doc["requests"]
    ]
    scorer = EngineScorer(Engine.load_default())
    scored = {
        name: score_outputs(scorer, requests, {rid: RequestOutput(rid, tuple(ids)) for rid, ids in runs.items()})
        for name, runs in doc["systems"].items()
    }
    calibration = calibrate_delta(scored["ar"], scored["stock"])
    forcing = TokenForcing(scorer, scored["stock"], calibration.delta)
    verdicts = {
        name: forcing.judge(name, scored[name]).to_dict() for name in doc["systems"] if name not in ("ar", "stock")
    }
    # lossless systems must not be rejected (accepted, or inconclusive when the sample is too small to tell);
    # the fault must be rejected
    ok = {
        name: (v["verdict"] == "reject") if name in LOSSY else (v["verdict"] != "reject")
        for name, v in verdicts.items()
    }
    result = {
        **result_header("system_forcing"),
        "outputs": str(args.outputs),
        "outputs_commit": doc.get("git_commit"),
        "outputs_device": doc.get("device"),
        "dtype": doc["dtype"],
        "requests": len(requests),
        "calibration": calibration.to_dict(),
        "tau": doc.get("tau"),
        "verdicts": {name: v["verdict"] for name, v in verdicts.items()},
        "as_expected": all(ok.values()),
        "as_expected_by_system": ok,
        "details": verdicts,
    }
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
