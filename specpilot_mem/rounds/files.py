"""A round's folder: state, directions, measurements and events, each written atomically as it happens.

A measurement is keyed by its whole identity (the systems' tree ids, the controller's code hash, the
request set's hash, the options, the devices, the repetition policy); once its file exists it is never
measured again, so ``round resume`` after a crash neither loses nor repeats a result. Only a complete
measurement whose recorded identity is the one asked for is ever used: anything else (a cancelled
run's leftovers, a file from other code or other systems) is set aside and measured anew.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specpilot_mem.errors import RoundError
from specpilot_mem.home import Home
from specpilot_mem.rounds.models import DirectionPlan, DirectionRecord, PromotionLog, RoundState
from specpilot_mem.store.records import dump_record, load_record_file, write_atomic


def measurement_key(kind: str, **parts: Any) -> str:
    """A stable file name for a measurement: its kind plus a digest of everything that defines it."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{kind}-{digest}"


class RoundDir:
    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def of(cls, home: Home, deployment: str, number: int) -> "RoundDir":
        return cls(home.rounds / deployment / f"round-{number}")

    # -- state ------------------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.path / "round.yaml"

    def exists(self) -> bool:
        return self.state_file.is_file()

    def load_state(self) -> RoundState:
        if not self.exists():
            raise RoundError(
                f"no round at {self.path}",
                where=str(self.path),
                fix="start one with `specpilot-mem round start DEPLOYMENT`",
            )
        return load_record_file(self.state_file, RoundState)

    def save_state(self, state: RoundState) -> None:
        write_atomic(self.state_file, dump_record(state))

    # -- directions -------------------------------------------------------------------------------
    @property
    def plan_file(self) -> Path:
        return self.path / "directions.yaml"

    def load_plan(self) -> DirectionPlan | None:
        return load_record_file(self.plan_file, DirectionPlan) if self.plan_file.is_file() else None

    def save_plan(self, plan: DirectionPlan) -> None:
        write_atomic(self.plan_file, dump_record(plan))

    def direction_dir(self, direction_id: str) -> Path:
        return self.path / "directions" / direction_id

    def load_direction(self, direction_id: str) -> DirectionRecord | None:
        path = self.direction_dir(direction_id) / "direction.yaml"
        return load_record_file(path, DirectionRecord) if path.is_file() else None

    def save_direction(self, record: DirectionRecord) -> None:
        write_atomic(self.direction_dir(record.spec.id) / "direction.yaml", dump_record(record))

    def directions(self) -> list[DirectionRecord]:
        folder = self.path / "directions"
        if not folder.is_dir():
            return []
        return [
            load_record_file(p / "direction.yaml", DirectionRecord)
            for p in sorted(folder.iterdir())
            if (p / "direction.yaml").is_file()
        ]

    # -- promotions -------------------------------------------------------------------------------
    @property
    def promotions_file(self) -> Path:
        return self.path / "promotions.yaml"

    def load_promotions(self) -> PromotionLog:
        if not self.promotions_file.is_file():
            return PromotionLog()
        return load_record_file(self.promotions_file, PromotionLog)

    def save_promotions(self, log: PromotionLog) -> None:
        write_atomic(self.promotions_file, dump_record(log))

    # -- measurements -----------------------------------------------------------------------------
    def measurement_file(self, key: str) -> Path:
        return self.path / "measurements" / f"{key}.json"

    def measured(self, key: str, measure: Callable[[], dict], identity: dict | None = None) -> dict:
        """The measurement ``key``: read back if it was taken before, else taken now and written at once.

        With ``identity``, a stored measurement is used only if it is complete and records exactly that
        identity; one that is not is renamed ``<key>.json.discarded-<n>`` and measured again.
        """
        path = self.measurement_file(key)
        if path.is_file():
            try:
                stored = json.loads(path.read_text())
            except json.JSONDecodeError:
                stored = None
            if identity is None or (
                isinstance(stored, dict) and stored.get("complete") is True and stored.get("identity") == identity
            ):
                return stored
            n = len(list(path.parent.glob(f"{path.name}.discarded-*"))) + 1
            path.rename(path.with_name(f"{path.name}.discarded-{n}"))
            self.log("measurement discarded", key=key, why="incomplete or of another identity")
        result = measure()
        if identity is not None and (result.get("complete") is not True or result.get("identity") != identity):
            raise RoundError(
                f"measurement {key} came back incomplete or for another identity; it is not used",
                where=str(path),
                fix="resume the round to measure it again",
            )
        write_atomic(path, json.dumps(result, indent=2, sort_keys=True))
        self.log("measured", key=key)
        return result

    def write_json(self, relative: str, payload: Any) -> Path:
        path = self.path / relative
        write_atomic(path, json.dumps(payload, indent=2, sort_keys=True, default=str))
        return path

    # -- events -----------------------------------------------------------------------------------
    def log(self, event: str, **fields: Any) -> None:
        """Append one line to ``events.jsonl`` (a human-readable trail; the state files are authoritative)."""
        self.path.mkdir(parents=True, exist_ok=True)
        line = json.dumps(
            {"time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "event": event, **fields},
            default=str,
        )
        with open(self.path / "events.jsonl", "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def latest_round(home: Home, deployment: str) -> int:
    folder = home.rounds / deployment
    numbers = [int(p.name.split("-", 1)[1]) for p in folder.glob("round-*") if p.name.split("-", 1)[1].isdigit()]
    return max(numbers, default=0)
