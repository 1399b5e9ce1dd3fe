"""The isolated controller: a separate process that measures systems and judges them.

The runner hands it a job file and reads back a result file; agents never run in this process and
cannot change what it runs: before every job it checks the content hashes of its own code and of the
request set against those recorded when the round started, and the bytes of every sealed system
folder against its tree id. It never imports a system's code but stock's: every timed system runs in
worker processes of the device pool (``specpilot_mem.controller.pool``), outputs come back as data,
and stock's scorer, AR decoder and tokenizer run here. Jobs:

- ``calibrate``: stock's AR and speculative outputs on the dev split give δ (token forcing) and the
  stock-vs-stock noise of a paired run;
- ``measure``: a paired run of a candidate against the current best on dev requests, the promotion
  rule, and token forcing of the candidate's outputs against stock's;
- ``sealed``: the sealed final, the round's system against stock on the unseen split.

A result carries the job's identity (what the runner keys it by) and ``complete: true`` only when
every run of it finished. Run as ``python -m specpilot_mem.rounds.controller JOB.json RESULT.json``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from specpilot_mem.controller.pool import RepetitionPolicy, open_devices, pool_paired_run, pool_stock_noise
from specpilot_mem.controller.promotion import PromotionRule
from specpilot_mem.controller.requests import Request, load_requests
from specpilot_mem.controller.sealed import judge_final
from specpilot_mem.controller.system import RequestOutput, load_outputs, write_outputs
from specpilot_mem.errors import RoundError, SpecPilotError
from specpilot_mem.forcing.calibrate import calibrate_delta
from specpilot_mem.forcing.scorer import long_output_requests, score_outputs
from specpilot_mem.forcing.verdict import TokenForcing
from specpilot_mem.home import Home
from specpilot_mem.rounds.sandbox import Sandbox
from specpilot_mem.rounds.seal import verify_sealed
from specpilot_mem.rounds.systems import open_system, system_spec

PACKAGE = Path(__file__).resolve().parents[1]
# The code that measures and judges: agents' changes to any of it would be reward hacking.
CONTROLLER_CODE = (
    "controller",
    "forcing",
    "rounds/controller.py",
    "rounds/systems.py",
    "rounds/sandbox.py",
    "rounds/seal.py",
)


def controller_files(requests: Path) -> list[Path]:
    files: list[Path] = [requests.resolve()]
    for item in CONTROLLER_CODE:
        path = PACKAGE / item
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def hash_files(files: list[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def code_hash(hashes: dict[str, str], requests: str) -> str:
    """One digest of the controller's code (every file but the request set), by path inside the package."""
    rows = sorted(
        (str(Path(path).relative_to(PACKAGE)), digest)
        for path, digest in hashes.items()
        if path != str(Path(requests).resolve())
    )
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def check_hashes(recorded: dict[str, str]) -> None:
    """Refuse to measure if any controller file changed since the round started."""
    changed = [
        path
        for path, digest in recorded.items()
        if not Path(path).is_file() or hashlib.sha256(Path(path).read_bytes()).hexdigest() != digest
    ]
    if changed:
        raise RoundError(
            f"controller files changed since the round started: {changed}",
            where="controller",
            fix="restore them (git checkout) and resume; measurements are not taken on changed code",
        )


def _requests(job: dict, split: str) -> list[Request]:
    requests = load_requests(job["requests"], split=split)
    limit = job.get("max_new_tokens")
    if limit:
        requests = [replace(r, max_new_tokens=int(limit)) for r in requests]
    return requests


def _spec(home: Home, job: dict, role: str) -> dict:
    """The pool's spec of the system on one side of a job: its sealed folder, checked byte for byte."""
    side = job[role]
    checkout = Path(side["checkout"])
    verify_sealed(checkout, side["tree"])
    spec = system_spec(checkout)
    if spec["adapter"] == "python":
        return {"name": role, "adapter": "python", "checkout": str(checkout), "module": spec.get("module", "system.py")}
    from specpilot_mem.sglang.export import cached_export

    return {
        "name": role,
        "adapter": "sglang",
        "export_dir": str(cached_export(home, side["commit"])),
        "server_args": spec.get("server_args", []),
    }


class Judge:
    """Stock, opened in this process only for what the verdict needs: its tokenizer, scorer and AR outputs."""

    def __init__(self, home: Home, job: dict):
        side = job["stock"]
        verify_sealed(Path(side["checkout"]), side["tree"])
        self.system = open_system(home, "stock", Path(side["checkout"]), side["commit"])
        self.device = job.get("judge_device") or job["devices"][0].split("#", 1)[0]

    def encoder(self, requests: list[Request]):
        if all(r.prompt_ids is not None for r in requests):
            return None
        return getattr(self.system.instance(self.device), "encode", None)

    def scorer(self):
        return self.system.scorer(self.device)


def _policy(job: dict, repeats: int) -> RepetitionPolicy:
    return RepetitionPolicy(repeats=repeats, batch_sizes=tuple(job["batch_sizes"]), **job.get("policy", {}))


def _devices(job: dict):
    return open_devices(
        job.get("pool", {"kind": "process"}), job["devices"], sandbox=Sandbox.from_dict(job.get("sandbox"))
    )


def _first(runs) -> dict[str, RequestOutput]:
    first = min(runs, key=lambda r: (r.batch_size, r.repeat))
    return {o.id: o for o in first.outputs}


def _forcing(job: dict, scorer, requests: list[Request]) -> TokenForcing:
    """Token forcing against stock's dev outputs, recorded by ``calibrate``."""
    stock_outputs = load_outputs(job["stock_outputs"])
    return TokenForcing(
        scorer, score_outputs(scorer, requests, {r.id: stock_outputs[r.id] for r in requests}), job["delta"]
    )


def _evidence(run) -> dict:
    """Where each run ran, what was re-run, and every per-request rate (the audit's raw numbers)."""
    return {
        "placement": run.placement,
        "reruns": run.reruns,
        "workers": run.workers,
        "runs": [
            {
                "system": r.system,
                "device": r.device,
                "repeat": r.repeat,
                "batch_size": r.batch_size,
                "rates": {o.id: o.rate for o in r.outputs},
            }
            for r in (*run.paired.runs_a, *run.paired.runs_b)
        ],
    }


def calibrate(home: Home, job: dict) -> dict:
    requests = _requests(job, "dev")
    judge = Judge(home, job)
    encode = judge.encoder(requests)
    noise, run = pool_stock_noise(
        _devices(job), _spec(home, job, "stock"), requests, _policy(job, job["noise_repeats"]), encode=encode
    )
    stock_outputs = _first(run.paired.runs_a)
    written = write_outputs(job["stock_outputs"], [stock_outputs[r.id] for r in requests])
    scorer = judge.scorer()
    ar = judge.system.ar_outputs(requests, judge.device)
    calibration = calibrate_delta(score_outputs(scorer, requests, ar), score_outputs(scorer, requests, stock_outputs))
    return {
        "kind": "calibrate",
        "noise": noise.to_dict(),
        "calibration": calibration.to_dict(),
        "delta": calibration.delta,
        "stock_outputs": job["stock_outputs"],
        "requests": len(requests),
        "stock_outputs_sha256": hashlib.sha256(written.read_bytes()).hexdigest(),
        "evidence": _evidence(run),
    }


def measure(home: Home, job: dict) -> dict:
    requests = _requests(job, "dev")
    judge = Judge(home, job)
    run = pool_paired_run(
        _devices(job),
        _spec(home, job, "best"),
        _spec(home, job, "candidate"),
        requests,
        _policy(job, job["repeats"]),
        encode=judge.encoder(requests),
    )
    paired = run.paired
    estimate = paired.gain(requests)
    divergent = paired.divergent()
    decision = PromotionRule(**job.get("rule", {})).decide(estimate, job["noise"], divergent)
    scorer = judge.scorer()
    verdict = _forcing(job, scorer, requests).judge("candidate", score_outputs(scorer, requests, _first(paired.runs_b)))
    rates = [o.rate for r in paired.runs_b for o in r.outputs]
    return {
        "kind": "measure",
        "gain": estimate.to_dict(),
        "divergent": divergent,
        "decision": decision.to_dict(),
        "token_forcing": verdict.to_dict(),
        "requests": len(requests),
        "devices": job["devices"],
        "candidate_rate": sum(rates) / len(rates),
        "promote": decision.promote and verdict.verdict != "reject",
        "evidence": _evidence(run),
    }


def sealed(home: Home, job: dict) -> dict:
    requests = _requests(job, "unseen")
    judge = Judge(home, job)
    scorer = judge.scorer()
    encode = judge.encoder(requests)
    if job.get("long_outputs"):
        requests = long_output_requests(
            requests, getattr(scorer, "max_len", None), encode or getattr(scorer, "encode", None)
        )
    run = pool_paired_run(
        _devices(job),
        _spec(home, job, "stock"),
        _spec(home, job, "candidate"),
        requests,
        _policy(job, job["repeats"]),
        encode=encode,
    )

    def forcing(candidate_outputs, stock_outputs):
        tokens = TokenForcing(scorer, score_outputs(scorer, requests, stock_outputs), job["delta"])
        return tokens.judge("final", score_outputs(scorer, requests, candidate_outputs))

    result = judge_final(
        run.paired, requests, forcing, require_conclusive=job.get("require_conclusive", True)
    ).to_dict()
    result.pop("paired")
    return {"kind": "sealed", **result, "requests": len(requests), "evidence": _evidence(run)}


JOBS = {"calibrate": calibrate, "measure": measure, "sealed": sealed}


def _check_identity(job: dict) -> None:
    """The identity the runner keys the result by must be what this process measures."""
    identity = job.get("identity") or {}
    trees = {role: job[role]["tree"] for role in ("stock", "best", "candidate") if role in job}
    digest = job["controller_hashes"].get(str(Path(job["requests"]).resolve()))
    if (
        identity.get("systems") != trees
        or identity.get("controller") != code_hash(job["controller_hashes"], job["requests"])
        or identity.get("requests") != digest
        or identity.get("devices") != job["devices"]
    ):
        raise RoundError(
            "the job's identity does not match the systems, code and requests it names",
            where="controller job",
            fix="the runner builds the identity; resume the round",
        )


def _check_stock_outputs(job: dict) -> None:
    """Token forcing compares with stock's outputs from calibration: they must be the bytes it wrote."""
    expected = job.get("stock_outputs_sha256")
    if job["kind"] == "measure" and expected is not None:
        path = Path(job["stock_outputs"])
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != expected:
            raise RoundError(
                f"the stock outputs {path} changed since calibration",
                where=str(path),
                fix="nothing is judged against changed outputs; remove the calibration measurement "
                "and resume to calibrate again",
            )


def run_job(job: dict[str, Any]) -> dict:
    check_hashes(job["controller_hashes"])
    _check_identity(job)
    _check_stock_outputs(job)
    home = Home(Path(job["home"]))
    result = JOBS[job["kind"]](home, job)
    for role in ("stock", "best", "candidate"):  # the bytes are what they were when measuring began
        if role in job:
            verify_sealed(Path(job[role]["checkout"]), job[role]["tree"])
    check_hashes(job["controller_hashes"])
    return {**result, "identity": job["identity"], "complete": True}


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
