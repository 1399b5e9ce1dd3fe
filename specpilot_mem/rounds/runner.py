"""The round runner: a resumable state machine over phases 0-4 and distillation (§3, Fig. 3).

Phase 0 (cost-model): the cost-model report, δ for token forcing and the stock-vs-stock noise.
Phase 1 (explore): the master proposes directions; each gets a worktree and branch of the system's
repo and a sub-agent (in parallel, one per device); the controller then measures each patch on top
of the current best, in plan order, and promotes it as a ``--no-ff`` merge into the round's lineage.
Phase 2 (integrate): an integration agent stacks the patches that gained too little alone.
Phase 3 (kernel): a kernel-tuning direction.
Phase 4 (sealed): the final system against stock on the unseen split, with token forcing.
Distill: each promoted mechanism becomes a memory entry (``specpilot_mem.store.record_entry``).

Every step writes its result atomically before the next begins, and every step first looks for its
result: after a crash, ``resume`` skips what was done and never measures anything twice.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import ValidationError

from specpilot_mem.controller.requests import load_requests
from specpilot_mem.errors import RoundError
from specpilot_mem.git import Repo, Signature, commit_content
from specpilot_mem.home import Home
from specpilot_mem.models import DeploymentRecord
from specpilot_mem.rounds.agents.base import AgentBackend, AgentTask
from specpilot_mem.rounds.briefs import direction_brief, integration_brief, kernel_brief, master_brief
from specpilot_mem.rounds.controller import code_hash, controller_files, hash_files
from specpilot_mem.rounds.distill import DRAFT_FILE, distill_promotion
from specpilot_mem.rounds.files import RoundDir, latest_round, measurement_key
from specpilot_mem.rounds.phase0 import cost_model_report
from specpilot_mem.rounds.models import (
    MAX_GPU_MINUTES_TO_CLOSE_UNMEASURED,
    MIN_NET_HEADROOM,
    PHASES,
    DirectionKind,
    DirectionPlan,
    DirectionRecord,
    DirectionSpec,
    HeadroomCheck,
    Phase,
    PromotionRecord,
    RoundConfig,
    RoundState,
)
from specpilot_mem.rounds.sandbox import Sandbox
from specpilot_mem.rounds.seal import SealError, escaping_symlinks, seal_tree
from specpilot_mem.store.fork import STOCK_REF
from specpilot_mem.store.records import load_record_file, parse_record

AGENT_FOLDER = ".specpilot-agent"  # brief, dev requests and the agent's notes; never part of a patch


def deployment_record(home: Home, deployment: str) -> DeploymentRecord:
    return load_record_file(home.rounds / deployment / "deployment.yaml", DeploymentRecord)


class RoundRunner:
    def __init__(
        self,
        home: Home,
        round_dir: RoundDir,
        backend: AgentBackend,
        *,
        checkpoint: Callable[[str], None] | None = None,
        sandbox: Sandbox | None = None,
    ):
        self.home = home
        self.dir = round_dir
        self.backend = backend
        self.state = round_dir.load_state()
        self.repo = Repo(self.state.config.system_repo)
        self.checkpoint = checkpoint or (lambda name: None)
        hidden = [home.rounds, Path(self.state.config.requests).resolve().parent]
        self.sandbox = sandbox or Sandbox.for_machine(hidden)

    # -- starting ---------------------------------------------------------------------------------
    @classmethod
    def start(cls, home: Home, deployment: str, config: RoundConfig, backend: AgentBackend, **kwargs) -> "RoundRunner":
        record = deployment_record(home, deployment)
        repo = Repo(config.system_repo)
        number = latest_round(home, deployment) + 1
        start = repo.rev_parse(f"refs/heads/{record.branch}")
        if number > 1:
            previous = RoundDir.of(home, deployment, number - 1).load_state()
            if previous.finished is None:
                raise RoundError(
                    f"round {number - 1} of {deployment} has not finished",
                    where=str(RoundDir.of(home, deployment, number - 1).path),
                    fix=f"finish it with `specpilot-mem round resume {deployment}` first",
                )
            start = previous.best
        stock = repo.rev_parse(STOCK_REF)
        if start is None or stock is None:
            raise RoundError(
                f"the system repo has no branch {record.branch} or no stock",
                where=config.system_repo,
                fix=f"create the deployment with `specpilot-mem deploy new {deployment} ...`",
            )
        load_requests(config.requests)  # a malformed request set fails here, before anything is written
        lineage = f"round/{deployment}/{number}"
        state = RoundState(
            deployment=deployment,
            number=number,
            config=config,
            start=start,
            lineage=lineage,
            best=start,
            stock=stock,
            started=dt.datetime.now(dt.timezone.utc).replace(microsecond=0),
            controller_hashes=hash_files(controller_files(Path(config.requests))),
        )
        round_dir = RoundDir.of(home, deployment, number)
        repo.update_refs({f"refs/heads/{lineage}": (None, start)}, f"specpilot: start round {number} of {deployment}")
        round_dir.save_state(state)
        round_dir.log("round started", start=start, lineage=lineage)
        return cls(home, round_dir, backend, **kwargs)

    # -- the state machine ------------------------------------------------------------------------
    def run(self) -> RoundState:
        for phase in PHASES:
            if phase in self.state.done:
                continue
            self.checkpoint(f"{phase}:start")
            getattr(self, "_" + phase.replace("-", "_"))()
            self.state = self.state.model_copy(update={"done": [*self.state.done, phase]})
            if phase == PHASES[-1]:
                self.state = self.state.model_copy(
                    update={"finished": dt.datetime.now(dt.timezone.utc).replace(microsecond=0)}
                )
            self.dir.save_state(self.state)
            self.dir.log("phase done", phase=phase)
            self.checkpoint(f"{phase}:done")
        return self.state

    # -- phase 0 ----------------------------------------------------------------------------------
    def _cost_model(self) -> None:
        self._calibration()
        if not (self.dir.path / "cost-model.json").exists():
            start = self._checkout(f"start-{self.state.start[:12]}", self.state.start)
            self.dir.write_json("cost-model.json", cost_model_report(self.home, start, self.state, self.dir))
        self.checkpoint("cost-model:report")

    def _calibration(self) -> dict:
        job = self._job(
            "calibrate",
            stock=self._side("stock", self.state.stock),
            stock_outputs=str(self.dir.path / "controller" / "stock-dev-outputs.jsonl"),
        )
        return self._measured(job)[1]

    # -- phase 1 ----------------------------------------------------------------------------------
    def _explore(self) -> None:
        plan = self.dir.load_plan()
        if plan is None:
            plan = self._ask_master()
            self.checkpoint("explore:planned")
        devices = self.state.config.devices
        with ThreadPoolExecutor(max_workers=len(devices)) as pool:  # one direction per device at a time
            list(pool.map(lambda spec: self._build(spec, "explore"), plan.directions))
        self.checkpoint("explore:built")
        for spec in plan.directions:
            self._decide(spec.id)

    def _ask_master(self) -> DirectionPlan:
        workdir = self._scratch("master")
        brief = master_brief(
            self.home, self.state, json.loads((self.dir.path / "cost-model.json").read_text()), self._closed_elsewhere()
        )
        result = self._run_agent("master", "master", brief, workdir)
        plan_file = workdir / "directions.yaml"
        if not plan_file.is_file():
            raise RoundError(
                "the master agent wrote no directions.yaml",
                where=str(workdir),
                fix="resume to ask it again; its transcript is in the round's master/ folder",
            )
        plan = parse_record(plan_file.read_text(), DirectionPlan, "master: directions.yaml")
        ids = [d.id for d in plan.directions]
        if len(set(ids)) != len(ids):
            raise RoundError(
                f"the master proposed duplicate direction ids {ids}",
                where="directions.yaml",
                fix="resume to ask it again",
            )
        self.dir.save_plan(plan)
        self.dir.log("directions planned", directions=ids, summary=result.summary)
        return plan

    # -- a direction, from worktree to decision ---------------------------------------------------
    def _build(self, spec: DirectionSpec, kind: DirectionKind, brief: str | None = None) -> DirectionRecord:
        record = self.dir.load_direction(spec.id)
        if record is None:
            branch = f"direction/{self.state.deployment}/{self.state.number}/{spec.id}"
            base = self.state.best
            self.repo.update_refs({f"refs/heads/{branch}": (None, base)}, f"specpilot: direction {spec.id}")
            record = DirectionRecord(spec=spec, kind=kind, branch=branch, base=base)
            self.dir.save_direction(record)
        agent_file = self.dir.direction_dir(spec.id) / "agent.json"
        if agent_file.is_file():
            return record
        worktree = self._worktree(record)
        notes = worktree / AGENT_FOLDER
        notes.mkdir(exist_ok=True)
        (notes / "brief.md").write_text(brief or direction_brief(self.state, spec, AGENT_FOLDER))
        self._dev_requests(notes / "requests-dev.jsonl")
        (notes / "cost-model.json").write_text((self.dir.path / "cost-model.json").read_text())
        self._run_agent(
            kind if kind != "explore" else "sub",
            spec.id,
            (notes / "brief.md").read_text(),
            worktree,
            record_to=self.dir.direction_dir(spec.id),
        )
        record = self._commit_patch(record, worktree)
        self.checkpoint(f"direction:{spec.id}:built")
        return record

    def _commit_patch(self, record: DirectionRecord, worktree: Path) -> DirectionRecord:
        self.sandbox.take_back(worktree)
        wt = Repo(worktree)
        wt.git("add", "--all")  # the agent folder is excluded through info/exclude
        headroom_file = worktree / AGENT_FOLDER / "headroom.json"
        headroom = None
        if headroom_file.is_file():
            try:
                headroom = HeadroomCheck.model_validate_json(headroom_file.read_text())
            except ValidationError as err:  # treated as missing evidence; the reason stays in the trail
                self.dir.log("invalid headroom.json", direction=record.spec.id, error=str(err))
        draft = worktree / AGENT_FOLDER / "entry.yaml"
        if draft.is_file():
            (self.dir.direction_dir(record.spec.id) / DRAFT_FILE).write_text(draft.read_text())
        patch = None
        if wt.git("diff", "--cached", "--quiet", check=False).returncode == 1:
            tree = wt.out("write-tree")
            message = f"{record.spec.title}\n\nSpecPilot-Direction: {record.spec.id}\n"
            patch = self._commit(tree, [record.base], message, order=1)
            self.repo.update_refs(
                {f"refs/heads/{record.branch}": (record.base, patch)}, f"specpilot: patch {record.spec.id}"
            )
        changed = self.repo.out("diff", "--name-only", record.base, patch).splitlines() if patch else []
        record = record.model_copy(update={"patch": patch, "headroom": headroom, "changed_paths": changed})
        self.dir.save_direction(record)
        return record

    def _decide(self, direction_id: str) -> None:
        record = self.dir.load_direction(direction_id)
        if record.status != "planned":
            return
        verdict = self._rules(record)
        if verdict is not None:
            status, why = verdict
            self._close(record, status, why)
            return
        merged = self._merge_tree(self.state.best, record.patch)
        if merged is None:
            self._close(record, "not-promoted", "conflicts with the current best; left for integration")
            return
        tree, conflicts = merged
        if conflicts:
            self._close(record, "not-promoted", f"conflicts with the current best at {conflicts}; left for integration")
            return
        candidate = self._commit(tree, [self.state.best, record.patch], f"candidate {record.spec.id}", order=2)
        try:
            sides = {"best": self._side("best", self.state.best), "candidate": self._side("candidate", candidate)}
        except SealError as err:
            self._close(record, "rejected", f"cannot be sealed for measuring: {err.what}")
            return
        job = self._job(
            "measure",
            **sides,
            stock=self._side("stock", self.state.stock),
            stock_outputs=str(self.dir.path / "controller" / "stock-dev-outputs.jsonl"),
            stock_outputs_sha256=self._calibration().get("stock_outputs_sha256"),
            delta=self._calibration()["delta"],
            noise=self._calibration()["noise"]["noise"],
        )
        key, result = self._measured(job)
        record = record.model_copy(update={"measurements": [*record.measurements, key]})
        self.dir.save_direction(record)
        self.checkpoint(f"direction:{record.spec.id}:measured")
        if result["promote"]:
            self._promote(record, tree, result, key)
        else:
            reasons = [result["decision"]["reason"]]
            if result["token_forcing"]["verdict"] == "reject":
                reasons = ["token forcing rejected it: " + "; ".join(result["token_forcing"]["reasons"]), *reasons]
            self._close(
                record,
                "rejected" if result["token_forcing"]["verdict"] == "reject" else "not-promoted",
                "; ".join(reasons),
            )

    def _rules(self, record: DirectionRecord) -> tuple[str, str] | None:
        """The paper's rules for sub-agents; (status, why) when they stop a direction before measuring."""
        protected = [
            p
            for p in record.changed_paths
            if any(p == q.rstrip("/") or p.startswith(q) for q in self.state.config.protected_paths)
        ]
        if protected:
            return "rejected", f"touches controller, bench or request files: {protected}"
        escaping = escaping_symlinks(self.repo, record.patch) if record.patch else []
        if escaping:
            return "rejected", f"adds symlinks that point outside its tree: {escaping}"
        check = record.headroom
        if record.patch is None:
            if check is None:
                return "closed", "the agent proposed nothing"
            if check.net < MIN_NET_HEADROOM:
                return "closed", (
                    f"headroom {check.headroom:.1%} net of {check.overhead:.1%} overhead is "
                    f"{check.net:.1%} < {MIN_NET_HEADROOM:.0%} by {check.evidence}: not built"
                )
            if check.gpu_minutes_to_measure > MAX_GPU_MINUTES_TO_CLOSE_UNMEASURED:
                return "closed", (
                    f"not measured: measuring would take {check.gpu_minutes_to_measure:g} GPU-minutes "
                    f"> {MAX_GPU_MINUTES_TO_CLOSE_UNMEASURED:g}"
                )
            return "rejected", (
                f"net headroom {check.net:.1%} >= {MIN_NET_HEADROOM:.0%} but nothing was built: a "
                "direction is closed only after measuring it"
            )
        if check is None:
            return "rejected", "built without headroom evidence: the cheapest evidence must come first"
        if check.net < MIN_NET_HEADROOM:
            return "rejected", f"built although the net headroom {check.net:.1%} is below {MIN_NET_HEADROOM:.0%}"
        return None

    def _promote(self, record: DirectionRecord, tree: str, result: dict, key: str) -> None:
        measured_tree = result["identity"]["systems"]["candidate"]
        if measured_tree != tree:
            raise RoundError(
                f"the merge of {record.spec.id} would carry tree {tree}, not the measured {measured_tree}",
                where=str(self.dir.measurement_file(key)),
                fix="resume: the candidate is measured again",
            )
        audit = hashlib.sha256(self.dir.measurement_file(key).read_bytes()).hexdigest()
        gain, tf = result["gain"], result["token_forcing"]
        rate = tf["rate"]
        message = (
            f"Promote {record.spec.id}: {record.spec.title}\n\n"
            f"SpecPilot-Direction: {record.spec.id}\n"
            f"SpecPilot-Gain: {gain['gain']:.4f}\n"
            f"SpecPilot-CI: [{gain['low']:.4f}, {gain['high']:.4f}]\n"
            f"SpecPilot-Noise: {result['decision']['noise']:.4f}\n"
            f"SpecPilot-Threshold: {result['decision']['threshold']:.4f}\n"
            f"SpecPilot-Token-Forcing: {tf['verdict']} (mismatch {100 * rate['system_rate']:.2f}% vs stock "
            f"{100 * rate['stock_rate']:.2f}%)\n"
            + (f"SpecPilot-Token-Forcing-Power: {tf['power_statement']}\n" if tf.get("power_statement") else "")
            + f"SpecPilot-Requests: {result['requests']} dev\n"
            f"SpecPilot-Devices: {', '.join(result['devices'])}\n"
            f"SpecPilot-Tree: {tree}\n"
            f"SpecPilot-Audit: sha256:{audit} measurements/{key}.json\n"
        )
        log = self.dir.load_promotions()
        previous = self.state.best
        merge = self._commit(tree, [previous, record.patch], message, order=10 + len(log.promotions))
        lineage = f"refs/heads/{self.state.lineage}"
        self.repo.update_refs({lineage: (previous, merge)}, f"specpilot: promote {record.spec.id}")
        log.promotions.append(
            PromotionRecord(
                order=len(log.promotions) + 1,
                direction=record.spec.id,
                phase=self._phase_of(record.kind),
                candidate=record.patch,
                merge=merge,
                previous_best=previous,
                gain=gain["gain"],
                ci_low=gain["low"],
                ci_high=gain["high"],
                noise=result["decision"]["noise"],
                threshold=result["decision"]["threshold"],
                token_forcing=tf["verdict"],
                requests=result["requests"],
                devices=result["devices"],
                rate=result.get("candidate_rate"),
                measurement=key,
                audit_sha256=audit,
            )
        )
        self.dir.save_promotions(log)
        self.state = self.state.model_copy(update={"best": merge})
        self.dir.save_state(self.state)
        self._close(record, "promoted", result["decision"]["reason"])
        self.checkpoint(f"direction:{record.spec.id}:promoted")

    def _close(self, record: DirectionRecord, status: str, why: str) -> None:
        self.dir.save_direction(record.model_copy(update={"status": status, "decision": why}))
        self.dir.log("direction decided", direction=record.spec.id, status=status, why=why)

    @staticmethod
    def _phase_of(kind: DirectionKind) -> Phase:
        return {"explore": "explore", "integration": "integrate", "kernel": "kernel"}[kind]

    # -- phases 2 and 3 ---------------------------------------------------------------------------
    def _integrate(self) -> None:
        leftovers = [d for d in self.dir.directions() if d.kind == "explore" and d.status == "not-promoted" and d.patch]
        if not leftovers:
            self.dir.log("integration skipped", why="no patch was left unpromoted")
            return
        spec = DirectionSpec(
            id="integration",
            title="Stack the patches that gained too little alone",
            idea=", ".join(d.spec.id for d in leftovers),
            factor="other",
            headroom=0.0,
            cheapest_evidence="timing",
        )
        self._build(spec, "integration", integration_brief(self.state, leftovers, self.dir, AGENT_FOLDER))
        self._decide(spec.id)

    def _kernel(self) -> None:
        report = json.loads((self.dir.path / "cost-model.json").read_text())
        spec = DirectionSpec(
            id="kernel-tuning",
            title="Tune the kernels furthest from their byte floors",
            idea="profile the current best and tune its slowest kernel classes",
            factor="kernel",
            headroom=float(report.get("factors", {}).get("kernel", 1.0)) - 1.0,
            cheapest_evidence="microbenchmark",
        )
        self._build(spec, "kernel", kernel_brief(self.state, report, AGENT_FOLDER))
        self._decide(spec.id)

    # -- phase 4 and distillation -----------------------------------------------------------------
    def _sealed(self) -> None:
        if self.state.best == self.state.start:
            self.state = self.state.model_copy(
                update={"sealed": {"accepted": False, "skipped": True, "reasons": ["nothing was promoted this round"]}}
            )
            self.dir.save_state(self.state)
            return
        config = self.state.config
        long = config.sealed_max_new_tokens is None and config.sealed_long_outputs
        job = self._job(
            "sealed",
            candidate=self._side("candidate", self.state.best),
            stock=self._side("stock", self.state.stock),
            delta=self._calibration()["delta"],
            max_new_tokens=config.sealed_max_new_tokens or (None if long else config.max_new_tokens),
            long_outputs=long,
            require_conclusive=config.sealed_require_conclusive,
        )
        key, result = self._measured(job)
        self.state = self.state.model_copy(
            update={
                "sealed": {k: result[k] for k in ("accepted", "reasons", "gain")}
                | {
                    "verdict": result["verdict"]["verdict"],
                    # what the sample could see, and what would suffice when it could not
                    "power": result["verdict"].get("power_statement"),
                    "requests": result.get("requests"),
                    "tokens": sum(row["tokens"] for row in result["verdict"].get("per_request", ())),
                    "measurement": key,
                }
            }
        )
        self.dir.save_state(self.state)

    def _distill(self) -> None:
        if not (self.state.sealed or {}).get("accepted"):
            self.dir.log("distillation skipped", why="the sealed final was not accepted")
            return
        deployment = deployment_record(self.home, self.state.deployment)
        for promotion in self.dir.load_promotions().promotions:
            entry_id = distill_promotion(self.home, self.dir, self.state, deployment, promotion)
            if entry_id not in self.state.distilled:
                self.state = self.state.model_copy(update={"distilled": [*self.state.distilled, entry_id]})
                self.dir.save_state(self.state)
            self.checkpoint(f"distill:{entry_id}")

    # -- helpers ----------------------------------------------------------------------------------
    def _requests_digest(self) -> str:
        return self.state.controller_hashes[str(Path(self.state.config.requests).resolve())]

    def _dev_requests(self, path: Path) -> None:
        rows = [r.to_dict() for r in load_requests(self.state.config.requests, split="dev")]
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))

    def _side(self, role: str, commit: str) -> dict:
        """A system as the controller measures it: its commit's tree sealed into a read-only folder."""
        tree, folder = seal_tree(self.repo, commit, self.home.state / "sealed")
        return {"commit": commit, "tree": tree, "checkout": str(folder)}

    def _job(self, kind: str, **fields) -> dict:
        config = self.state.config
        job = {
            "kind": kind,
            "home": str(self.home.root),
            "requests": str(Path(config.requests).resolve()),
            "devices": config.devices,
            "batch_sizes": config.batch_sizes,
            "repeats": config.repeats,
            "noise_repeats": config.noise_repeats,
            "max_new_tokens": config.max_new_tokens,
            "pool": config.pool,
            "policy": {"fresh_workers": config.fresh_workers, "warmup_requests": config.warmup_requests},
            "sandbox": Sandbox(self.sandbox.user, [*self.sandbox.hidden, self.home.state / "worktrees"]).to_dict(),
            "judge_device": self._judge_device(),
            "controller_hashes": self.state.controller_hashes,
        } | fields
        return job | {"identity": self._identity(job)}

    def _judge_device(self) -> str | None:
        """Where stock's scorer runs: the first slot's device, or on a Ray pool this (driver) host's GPU."""
        pool = self.state.config.pool
        if pool.get("kind", "process") == "process":
            return None
        return pool.get("judge_device") or ("cpu" if pool.get("run_on") == "cpu" else "cuda:0")

    def _identity(self, job: dict) -> dict:
        """Everything a measurement depends on: the systems' tree ids, the controller's code, the request
        set, the options, the devices and the repetition policy. Its digest is the measurement's key."""
        config = self.state.config
        return {
            "kind": job["kind"],
            "systems": {role: job[role]["tree"] for role in ("stock", "best", "candidate") if role in job},
            "controller": code_hash(self.state.controller_hashes, job["requests"]),
            "requests": self._requests_digest(),
            "devices": job["devices"],
            "pool": job["pool"],
            "policy": {
                "repeats": job["noise_repeats"] if job["kind"] == "calibrate" else job["repeats"],
                "batch_sizes": job["batch_sizes"],
                "order": "ABBA",
                **job["policy"],
            },
            "options": {
                "max_new_tokens": job["max_new_tokens"],
                "delta": job.get("delta"),
                "noise": job.get("noise"),
                "rule": job.get("rule", {}),
                "sealed_max_new_tokens": config.sealed_max_new_tokens,
                "long_outputs": job.get("long_outputs", False),
                "require_conclusive": job.get("require_conclusive", True),
            },
        }

    def _measured(self, job: dict) -> tuple[str, dict]:
        key = measurement_key(job["kind"], identity=job["identity"])
        return key, self.dir.measured(key, lambda: self._controller(job), identity=job["identity"])

    def _controller(self, job: dict) -> dict:
        """Run one job in the controller's own process; its result file is the measurement."""
        folder = self.dir.path / "controller"
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as scratch:
            job_file, result_file = Path(scratch) / "job.json", Path(scratch) / "result.json"
            job_file.write_text(json.dumps(job))
            started = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "specpilot_mem.rounds.controller", str(job_file), str(result_file)],
                capture_output=True,
                text=True,
            )
            if not result_file.is_file():
                raise RoundError(
                    f"the controller crashed on a {job['kind']} job: {proc.stderr.strip()[-2000:]}",
                    where="controller process",
                    fix="fix the cause and `round resume`",
                )
            result = json.loads(result_file.read_text())
        if "error" in result:
            error = result["error"]
            raise RoundError(
                f"the controller refused a {job['kind']} job: {error['what']}",
                where=error.get("where"),
                fix=error.get("fix"),
            )
        result["device_seconds"] = round((time.monotonic() - started) * len(job["devices"]), 3)
        return result

    def _worktrees(self) -> Path:
        return self.home.state / "worktrees" / self.state.deployment / f"round-{self.state.number}"

    def _worktree(self, record: DirectionRecord) -> Path:
        path = self._worktrees() / record.spec.id
        if not (path / ".git").exists():
            self.repo.git("worktree", "prune")
            path.parent.mkdir(parents=True, exist_ok=True)
            self.repo.git("worktree", "add", "--force", str(path), record.branch)
            self.repo.git("-C", str(path), "reset", "--hard", record.base)
        self._exclude_agent_folder()
        self.sandbox.give(path)
        self.sandbox.give(Repo(path).git_dir)
        return path

    def _checkout(self, name: str, commit: str) -> Path:
        """A detached, read-only-by-convention worktree of ``commit`` for the controller."""
        path = self._worktrees() / "checkouts" / name
        if (path / ".git").exists():
            if Repo(path).rev_parse("HEAD") == commit:
                return path
            self.repo.git("worktree", "remove", "--force", str(path))
        self.repo.git("worktree", "prune")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.repo.git("worktree", "add", "--force", "--detach", str(path), commit)
        return path

    def _scratch(self, name: str) -> Path:
        path = self._worktrees() / name
        path.mkdir(parents=True, exist_ok=True)
        self.sandbox.give(path)
        return path

    def _exclude_agent_folder(self) -> None:
        exclude = self.repo.common_dir / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        text = exclude.read_text() if exclude.exists() else ""
        if f"/{AGENT_FOLDER}/" not in text.splitlines():
            exclude.write_text(text + f"/{AGENT_FOLDER}/\n")

    def _run_agent(self, role: str, name: str, brief: str, workdir: Path, record_to: Path | None = None):
        record_to = record_to or self.dir.path / name
        task = AgentTask(
            role=role,
            name=name,
            brief=brief,
            workdir=workdir,
            sandbox=self.sandbox,
            time_limit_s=self.state.config.agent_time_limit_s,
        )
        result = self.backend.run(task)
        record_to.mkdir(parents=True, exist_ok=True)
        (record_to / "transcript.jsonl").write_text(
            "".join(json.dumps(m, default=str) + "\n" for m in result.transcript)
        )
        self.dir.write_json(
            str((record_to / "agent.json").relative_to(self.dir.path)),
            {
                "backend": self.backend.name,
                "summary": result.summary,
                "usage": result.usage.model_dump(),
                "isolation": self.sandbox.isolation,
            },
        )
        if record_to != self.dir.path / name:
            record = self.dir.load_direction(name)
            self.dir.save_direction(record.model_copy(update={"usage": result.usage}))
        return result

    def _merge_tree(self, ours: str, theirs: str) -> tuple[str, list[str]] | None:
        proc = self.repo.git("merge-tree", "--write-tree", "--name-only", "--no-messages", ours, theirs, check=False)
        lines = proc.stdout.decode().splitlines()
        if proc.returncode not in (0, 1) or not lines:
            return None
        return lines[0], [line for line in lines[1:] if line]

    def _commit(self, tree: str, parents: list[str], message: str, order: int) -> str:
        """A commit with the tool's identity and a date derived from the round, so ids repeat on resume."""
        when = Signature(int(self.state.started.timestamp()) + order)
        return self.repo.write_object("commit", commit_content(tree, parents, message, when))

    def _closed_elsewhere(self) -> list[dict]:
        """Directions earlier rounds of this deployment closed or rejected, with why: not to retry blindly."""
        closed = []
        for number in range(1, self.state.number):
            earlier = RoundDir.of(self.home, self.state.deployment, number)
            closed.extend(
                {"round": number, "direction": d.spec.id, "status": d.status, "why": d.decision}
                for d in earlier.directions()
                if d.status in ("closed", "rejected", "not-promoted")
            )
        return closed
