"""The isolated controller: a separate process that measures systems and judges them.

The runner hands it a job file and reads back a result file; agents never run in this process and
cannot change what it runs: before every job it checks the content hashes of its own code and of the
request set against those recorded when the round started. Jobs:

- ``calibrate``: stock's AR and speculative outputs on the dev split give δ (token forcing) and the
  stock-vs-stock noise of a paired run;
- ``measure``: a paired run of a candidate against the current best on dev requests, the promotion
  rule, and token forcing of the candidate's outputs against stock's;
- ``sealed``: the sealed final, the round's system against stock on the unseen split.

Run as ``python -m specpilot_mem.rounds.controller JOB.json RESULT.json``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from specpilot_mem.controller.paired import paired_run, stock_noise
from specpilot_mem.controller.promotion import PromotionRule
from specpilot_mem.controller.requests import Request, load_requests
from specpilot_mem.controller.sealed import sealed_final
from specpilot_mem.controller.system import RequestOutput, load_outputs, write_outputs
from specpilot_mem.errors import RoundError, SpecPilotError
from specpilot_mem.forcing.calibrate import calibrate_delta
from specpilot_mem.forcing.scorer import score_outputs
from specpilot_mem.forcing.verdict import TokenForcing
from specpilot_mem.home import Home
from specpilot_mem.rounds.systems import open_system

PACKAGE = Path(__file__).resolve().parents[1]
# The code that measures and judges: agents' changes to any of it would be reward hacking.
CONTROLLER_CODE = ("controller", "forcing", "rounds/controller.py", "rounds/systems.py")


def controller_files(requests: Path) -> list[Path]:
    files: list[Path] = [requests.resolve()]
    for item in CONTROLLER_CODE:
        path = PACKAGE / item
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def hash_files(files: list[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def check_hashes(recorded: dict[str, str]) -> None:
    """Refuse to measure if any controller file changed since the round started."""
    changed = [path for path, digest in recorded.items()
               if not Path(path).is_file() or hashlib.sha256(Path(path).read_bytes()).hexdigest() != digest]
    if changed:
        raise RoundError(f"controller files changed since the round started: {changed}", where="controller",
                         fix="restore them (git checkout) and resume; measurements are not taken on changed code")


def _requests(job: dict, split: str) -> list[Request]:
    requests = load_requests(job["requests"], split=split)
    limit = job.get("max_new_tokens")
    if limit:
        requests = [replace(r, max_new_tokens=int(limit)) for r in requests]
    return requests


def _system(home: Home, job: dict, role: str, warm: list[Request] | None = None):
    """The system on one side of a job, warmed up on one request per device when ``warm`` is given
    (the first pass pays for lazy initialization, which must not count against either side)."""
    side = job[role]
    system = open_system(home, role, Path(side["checkout"]), side["commit"])
    if warm:
        for device in job["devices"]:
            system.run(warm[:1], batch_size=1, device=device)
    return system


def _first(runs) -> dict[str, RequestOutput]:
    first = min(runs, key=lambda r: (r.batch_size, r.repeat))
    return {o.id: o for o in first.outputs}


def _forcing(job: dict, scorer, requests: list[Request]) -> TokenForcing:
    """Token forcing against stock's dev outputs, recorded by ``calibrate``."""
    stock_outputs = load_outputs(job["stock_outputs"])
    return TokenForcing(scorer, score_outputs(scorer, requests, {r.id: stock_outputs[r.id] for r in requests}), job["delta"])


def calibrate(home: Home, job: dict) -> dict:
    requests = _requests(job, "dev")
    stock = _system(home, job, "stock", warm=requests)
    device = job["devices"][0]
    runs = []
    noise = stock_noise(stock, requests, stock_b=_system(home, job, "stock", warm=requests), batch_sizes=job["batch_sizes"],
                        repeats=job["noise_repeats"], devices=job["devices"], on_run=runs.append)
    stock_outputs = _first(runs)
    write_outputs(job["stock_outputs"], [stock_outputs[r.id] for r in requests])
    scorer = stock.scorer(device)
    ar = stock.ar_outputs(requests, device)
    calibration = calibrate_delta(score_outputs(scorer, requests, ar), score_outputs(scorer, requests, stock_outputs))
    return {"kind": "calibrate", "noise": noise.to_dict(), "calibration": calibration.to_dict(),
            "delta": calibration.delta, "stock_outputs": job["stock_outputs"], "requests": len(requests)}


def measure(home: Home, job: dict) -> dict:
    requests = _requests(job, "dev")
    best, candidate = _system(home, job, "best", warm=requests), _system(home, job, "candidate", warm=requests)
    paired = paired_run(best, candidate, requests, batch_sizes=job["batch_sizes"], repeats=job["repeats"],
                        devices=job["devices"])
    estimate = paired.gain(requests)
    divergent = paired.divergent()
    decision = PromotionRule(**job.get("rule", {})).decide(estimate, job["noise"], divergent)
    scorer = _system(home, job, "stock").scorer(job["devices"][0])
    verdict = _forcing(job, scorer, requests).judge("candidate", score_outputs(scorer, requests, _first(paired.runs_b)))
    rates = [o.rate for run in paired.runs_b for o in run.outputs]
    return {"kind": "measure", "gain": estimate.to_dict(), "divergent": divergent, "decision": decision.to_dict(),
            "token_forcing": verdict.to_dict(), "requests": len(requests), "devices": job["devices"],
            "candidate_rate": sum(rates) / len(rates), "promote": decision.promote and verdict.verdict == "accept"}


def sealed(home: Home, job: dict) -> dict:
    requests = _requests(job, "unseen")
    stock = _system(home, job, "stock", warm=requests)
    scorer = stock.scorer(job["devices"][0])

    def judge(candidate_outputs, stock_outputs):
        forcing = TokenForcing(scorer, score_outputs(scorer, requests, stock_outputs), job["delta"])
        return forcing.judge("final", score_outputs(scorer, requests, candidate_outputs))

    final = sealed_final(_system(home, job, "candidate", warm=requests), stock, requests, forcing=judge,
                         batch_sizes=job["batch_sizes"], repeats=job["repeats"], devices=job["devices"])
    result = final.to_dict()
    result.pop("paired")
    return {"kind": "sealed", **result, "requests": len(requests)}


JOBS = {"calibrate": calibrate, "measure": measure, "sealed": sealed}


def run_job(job: dict[str, Any]) -> dict:
    check_hashes(job["controller_hashes"])
    return JOBS[job["kind"]](Home(Path(job["home"])), job)


def main(argv: list[str] | None = None) -> int:
    job_file, result_file = (argv or sys.argv[1:])[:2]
    job = json.loads(Path(job_file).read_text())
    try:
        result = run_job(job)
    except SpecPilotError as err:
        result = {"error": err.to_dict()}
    Path(result_file).write_text(json.dumps(result, indent=2, sort_keys=True, default=str))
    return 0 if "error" not in result else 2


if __name__ == "__main__":
    raise SystemExit(main())
