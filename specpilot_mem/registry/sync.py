"""Keeping ``registry.duckdb`` in step with the record files.

The records are the source of truth. A sync hashes every record file (sha256 of its content), compares
with the hashes the registry stored, and re-indexes only what was added, changed or removed. It never
writes the registry in place: under an exclusive lock it builds the new state in a temporary DuckDB file
(a copy of the current one for an incremental sync, an empty one for a rebuild) and renames it over
``registry.duckdb`` with ``os.replace``, so a reader that opens the file read-only sees either the old or
the new index, never half of one. A registry that cannot be opened or has another schema version is
rebuilt, not trusted. Every record is parsed before anything is written, so a bad record changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import yaml

from specpilot_mem.errors import RecordError, RegistryError, SpecPilotError
from specpilot_mem.gpus import GPUS, find_gpu
from specpilot_mem.gpus import name_key  # the GPU table's name matching, reused for models and drafters
from specpilot_mem.home import Home
from specpilot_mem.registry.schema import ENTRY_TABLES, SCHEMA_VERSION, TABLES
from specpilot_mem.file_lock import file_lock
from specpilot_mem.store.records import ENTRY_FILE, entry_path, load_entry, load_record_file

if TYPE_CHECKING:
    from specpilot_mem.models import DeploymentRecord, EntryRecord
    from specpilot_mem.rounds.models import PromotionLog, RoundState

DEPLOYMENT_FILE = "deployment.yaml"
ROUND_DIR = re.compile(r"^round-([0-9]+)$")
ROUND_FILE = "round.yaml"  # a folder is a round once it has this file (see specpilot_mem.rounds.files)
PROMOTIONS_FILE = "promotions.yaml"
# Readers need no extensions (and loading them costs start-up time).
READ_CONFIG = {"autoload_known_extensions": False, "autoinstall_known_extensions": False}


@dataclass(frozen=True)
class RecordFile:
    """One indexed record: an entry file, a deployment file, or a round folder (hash over round.yaml and promotions.yaml)."""

    path: str  # relative to the home, '/'-separated; a round folder's path ends with '/'
    kind: str  # entry | deployment | round
    key: str  # entry id, deployment name, or deployment/round-n
    sha256: str


@dataclass
class SyncReport:
    rebuilt: bool
    reason: str
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    records: int = 0
    seconds: float = 0.0

    @property
    def wrote(self) -> bool:
        return self.rebuilt or bool(self.added or self.changed or self.removed)


# ----------------------------------------------------------------------------------------------- scanning


class _HashCache:
    """sha256 of record files, reused while a file's (size, mtime, inode) is unchanged, as git's index does.

    Kept in ``.specpilot/registry-hashes.json`` (machine-local). A file modified within ``RACY_S`` of the
    cache being written is not cached, so an edit that keeps size and mtime tick is still rehashed.
    """

    RACY_S = 2.0

    def __init__(self, home: Home):
        self.path = home.state / "registry-hashes.json"
        try:
            self.known: dict[str, list] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.known = {}
        self.seen: dict[str, list] = {}

    def sha256(self, path: str) -> str | None:
        """The file's sha256, or None when there is no such file (one stat either way)."""
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        cached = self.known.get(path)
        if cached is not None and cached[:3] == stamp:
            digest = cached[3]
        else:
            with open(path, "rb") as handle:
                digest = hashlib.sha256(handle.read()).hexdigest()
        self.seen[path] = [*stamp, digest]
        return digest

    def save(self) -> None:
        settled_ns = time.time_ns() - int(self.RACY_S * 1e9)
        keep = {p: v for p, v in self.seen.items() if v[1] < settled_ns}
        if keep == self.known or not self.path.parent.is_dir():
            return
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps(keep))
            os.replace(tmp, self.path)
        except OSError:
            # Only a cache: a home this user may read but not write still answers queries, hashing every file.
            tmp.unlink(missing_ok=True)


def _subdirs(folder: str) -> list[os.DirEntry]:
    try:
        return [d for d in os.scandir(folder) if d.is_dir() and not d.name.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):  # no entries/ or rounds/ folder: no records there
        return []


def scan_records(home: Home) -> dict[str, RecordFile]:
    """Every record file under the home, keyed by its relative path, with the sha256 of its content."""
    cache = _HashCache(home)
    found: dict[str, RecordFile] = {}
    for folder in _subdirs(str(home.entries)):
        digest = cache.sha256(os.path.join(folder.path, ENTRY_FILE))
        if digest is not None:
            rel = f"entries/{folder.name}/{ENTRY_FILE}"
            found[rel] = RecordFile(rel, "entry", folder.name, digest)
    for deployment in _subdirs(str(home.rounds)):
        digest = cache.sha256(os.path.join(deployment.path, DEPLOYMENT_FILE))
        if digest is not None:
            rel = f"rounds/{deployment.name}/{DEPLOYMENT_FILE}"
            found[rel] = RecordFile(rel, "deployment", deployment.name, digest)
        for round_dir in _subdirs(deployment.path):
            state = cache.sha256(os.path.join(round_dir.path, ROUND_FILE)) if ROUND_DIR.match(round_dir.name) else None
            if state is None:
                continue
            promotions = cache.sha256(os.path.join(round_dir.path, PROMOTIONS_FILE))
            combined = hashlib.sha256(f"{ROUND_FILE}\0{state}\n{PROMOTIONS_FILE}\0{promotions}\n".encode()).hexdigest()
            rel = f"rounds/{deployment.name}/{round_dir.name}/"
            found[rel] = RecordFile(rel, "round", f"{deployment.name}/{round_dir.name}", combined)
    cache.save()
    return found


# ------------------------------------------------------------------------------------------------ parsing


def read_entry(home: Home, entry_id: str) -> EntryRecord:
    """The store's ``load_entry``, with the YAML parsed by libyaml first.

    The store's loader composes the YAML node tree in pure Python (~15 ms a record) to name the line of
    every error; a rebuild of 1,000 entries cannot afford that, so it runs only for a record that fails.
    """
    from pydantic import ValidationError

    from specpilot_mem.models import EntryRecord

    try:
        data = yaml.load(entry_path(home, entry_id).read_bytes(), Loader=yaml.CSafeLoader)
        record = EntryRecord.model_validate(data)
        if record.id == entry_id:
            return record
    except (OSError, yaml.YAMLError, ValidationError):
        pass
    return load_entry(home, entry_id)  # raises the error with file, line and field


def read_deployment(home: Home, name: str) -> DeploymentRecord:
    from specpilot_mem.models import DeploymentRecord

    path = home.rounds / name / DEPLOYMENT_FILE
    record = load_record_file(path, DeploymentRecord)
    if record.name != name:
        raise RecordError(
            f"the deployment record's name {record.name!r} does not match its folder {name!r}",
            where=str(path),
            fix=f"rename the folder to rounds/{record.name}/ or set name: {name}",
        )
    return record


def read_round(home: Home, deployment: str, number: int) -> tuple[RoundState, PromotionLog]:
    from specpilot_mem.rounds.models import PromotionLog, RoundState

    folder = home.rounds / deployment / f"round-{number}"
    state = load_record_file(folder / ROUND_FILE, RoundState)
    if (state.deployment, state.number) != (deployment, number):
        raise RecordError(
            f"the round record says {state.deployment}/round-{state.number} but lives in {deployment}/round-{number}",
            where=str(folder / ROUND_FILE),
            fix="move the folder or correct deployment/number",
        )
    promotions = folder / PROMOTIONS_FILE
    return state, (load_record_file(promotions, PromotionLog) if promotions.is_file() else PromotionLog())


def is_validated(record: EntryRecord) -> bool:
    """Validated: timed end to end on real weights (non-synthetic paired run) and never rejected."""
    rejected = any((e.verdict or "").strip().lower().startswith("reject") for e in record.evidence)
    # evidence marked for re-validation (its base changed since) no longer validates the entry
    return not rejected and any(
        e.kind == "paired-run" and not e.synthetic and not e.revalidate for e in record.evidence
    )


def _canonical_gpu(name: str, arch: str, where: str) -> str | None:
    """The GPU table's name for ``name``; None for a GPU the table does not know. A known GPU on the wrong arch is an error."""
    known = {g.name for g in GPUS}
    try:
        gpu = find_gpu(name)
    except SpecPilotError:  # a GPU newer than the table: index it under the name the record gives
        return None
    if gpu.arch != arch:
        raise RecordError(
            f"{name} is {gpu.arch}, but the record says {arch}",
            where=where,
            fix=f"set arch: {gpu.arch} (known GPUs: {', '.join(sorted(known))})",
        )
    return gpu.name


def drafter_family(drafter: str | None) -> str | None:
    """The drafter's family: its leading letters, lower-cased (DFlash2 -> dflash, EAGLE-3 -> eagle)."""
    match = re.match(r"[a-z]+", (drafter or "").lower())
    return match[0] if match else None


def _key(text: str | None) -> str | None:
    return None if text is None else name_key(text)


def _entry_rows(record: EntryRecord, where: str) -> dict[str, list[tuple]]:
    rows: dict[str, list[tuple]] = {t: [] for t in ("entries", *ENTRY_TABLES)}
    evidence_cards = []
    for idx, ev in enumerate(record.evidence):
        dep = ev.deployment
        gpu_name = _canonical_gpu(dep.gpu, dep.arch, f"{where} field evidence.{idx}.deployment")
        rows["evidence"].append(
            (
                record.id,
                idx,
                ev.kind,
                dep.gpu,
                gpu_name,
                dep.arch,
                dep.target,
                dep.drafter,
                _key(dep.target),
                _key(dep.drafter),
                drafter_family(dep.drafter),
                dep.regime,
                dep.batch_sizes,
                ev.verdict,
                ev.command,
                ev.date,
                ev.round,
                ev.results,
                ev.synthetic,
            )
        )
        for position, fig in enumerate(ev.figures):
            rows["figures"].append((record.id, idx, position, fig.name, fig.value, fig.unit, fig.ci_low, fig.ci_high))
        evidence_cards.append(
            {
                "idx": idx,
                "kind": ev.kind,
                "gpu": gpu_name or dep.gpu,
                "gpu_name": gpu_name,
                "arch": dep.arch,
                "target": dep.target,
                "drafter": dep.drafter,
                "regime": dep.regime,
                "batch_sizes": dep.batch_sizes,
                "verdict": ev.verdict,
                "synthetic": ev.synthetic,
                "date": ev.date.isoformat(),
                "figure": ev.figures[0].model_dump(mode="json") if ev.figures else None,
            }
        )
    card = {
        "requires": record.requires,
        "variants": [{"name": v.name, "hardware": v.hardware} for v in record.variants],
        "evidence": evidence_cards,
        "untested": [u.model_dump(mode="json") for u in record.untested],
        "status": record.status,
        "scope": record.scope.model_dump(mode="json"),
        "releases": [
            {"release": r.release, "status": r.status, "verdict": r.verdict, "ported": r.port is not None}
            for r in record.releases
        ],
    }
    search_text = "\n".join([record.title, record.summary, *record.limits]).lower()
    rows["entries"].append(
        (
            record.id,
            record.title,
            record.summary,
            record.contract.level,
            record.contract.statement,
            record.contract.commands,
            record.limits,
            record.reproduces,
            record.source.round,
            record.source.commit,
            json.dumps(record.kernels, sort_keys=True),
            is_validated(record),
            record.status,
            record.scope.sglang,
            json.dumps(record.scope.model_dump(mode="json")),
            search_text,
            json.dumps(card),
            json.dumps(record.model_dump(mode="json", exclude_defaults=True)),
        )
    )
    for check in record.releases:
        rows["releases"].append(
            (
                record.id,
                check.release,
                check.status,
                check.verdict,
                check.port is not None,
                check.base,
                check.checked,
                check.changed,
                check.conflicts,
            )
        )
    for position, required in enumerate(record.requires):
        rows["requirements"].append((record.id, required, position))
    for option in record.options:
        rows["options"].append(
            (
                record.id,
                option.name,
                option.type,
                json.dumps(option.default),
                option.help,
                None if option.choices is None else json.dumps(option.choices),
            )
        )
    for variant in record.variants:
        rows["variants"].append(
            (record.id, variant.name, json.dumps(variant.options, sort_keys=True), variant.hardware, variant.notes)
        )
    for item in record.untested:
        rows["untested"].append((record.id, item.note, item.regime, item.arch, item.gpu, item.drafter, item.model))
    return rows


def _deployment_row(record: DeploymentRecord) -> tuple:
    return (
        record.name,
        record.gpu,
        record.arch,
        record.model,
        record.drafter,
        record.regime,
        record.batch_sizes,
        record.entries,
        json.dumps(record.suggested, sort_keys=True),
        record.base,
        record.branch,
        record.tree,
        record.created,
    )


def _round_rows(home: Home, rec: RecordFile) -> tuple[tuple, list[tuple]]:
    deployment, folder = rec.key.split("/")
    state, log = read_round(home, deployment, int(ROUND_DIR.match(folder)[1]))
    round_row = (
        deployment,
        state.number,
        rec.path.rstrip("/"),
        state.start,
        state.lineage,
        state.best,
        state.stock,
        list(state.done),
        state.started,
        state.finished,
        None if state.sealed is None else json.dumps(state.sealed, default=str),
        state.distilled,
    )
    promotion_rows = [
        (
            deployment,
            state.number,
            p.order,
            p.direction,
            p.phase,
            p.candidate,
            p.merge,
            p.previous_best,
            p.gain,
            p.ci_low,
            p.ci_high,
            p.noise,
            p.threshold,
            p.token_forcing,
            p.requests,
            p.devices,
            p.rate,
        )
        for p in log.promotions
    ]
    return round_row, promotion_rows


def _parse(home: Home, records: list[RecordFile], advance: Callable[[], None]) -> dict[str, list[tuple]]:
    """Rows for ``records``, per table; raises RecordError (before anything is written) on a bad record."""
    rows: dict[str, list[tuple]] = {name: [] for name in TABLES if name != "meta"}
    for rec in records:
        if rec.kind == "entry":
            for table, table_rows in _entry_rows(read_entry(home, rec.key), str(home.root / rec.path)).items():
                rows[table].extend(table_rows)
        elif rec.kind == "deployment":
            rows["deployments"].append(_deployment_row(read_deployment(home, rec.key)))
        else:
            round_row, promotion_rows = _round_rows(home, rec)
            rows["rounds"].append(round_row)
            rows["promotions"].extend(promotion_rows)
        rows["files"].append((rec.path, rec.kind, rec.key, rec.sha256))
        advance()
    return rows


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[tuple]) -> None:
    """Column-wise insert (one statement per table): executemany costs ~1 ms a row in DuckDB."""
    if not rows:
        return
    columns = list(zip(*rows))
    placeholders = ", ".join("unnest(?)" for _ in columns)
    con.execute(f"INSERT INTO {table} SELECT {placeholders}", [list(c) for c in columns])


# --------------------------------------------------------------------------------------------- the file
#
# Every access goes through an in-memory DuckDB instance that ATTACHes the file, never through
# ``duckdb.connect(path)``: DuckDB caches databases by path within a process, so after a sync renamed a
# new file into place, a process still holding a connection would be handed the old file again. One
# instance serves a whole call (reading the stored hashes, writing, reading again), because creating
# an instance costs more CPU than a query.


def _instance() -> duckdb.DuckDBPyConnection:
    return duckdb.connect(":memory:", config=READ_CONFIG)


def _attach_read_only(con: duckdb.DuckDBPyConnection, db: Path) -> bool:
    """ATTACH ``db`` read-only as the connection's default database; False if it cannot be opened."""
    if not db.is_file():
        return False
    try:
        con.execute("ATTACH ? AS registry (READ_ONLY)", [str(db)])
    except duckdb.Error:
        return False
    con.execute("USE registry")
    return True


def _detach(con: duckdb.DuckDBPyConnection, alias: str = "registry") -> None:
    con.execute("USE memory")
    con.execute(f"DETACH {alias}")


def stored_hashes(db: Path, con: duckdb.DuckDBPyConnection | None = None) -> dict[str, str] | None:
    """Path -> sha256 as the registry stored them; None when the file is missing, unreadable or of another schema."""
    own = con is None
    con = _instance() if own else con
    try:
        if not _attach_read_only(con, db):
            return None
        try:
            return _hashes_if_current(con)
        finally:
            _detach(con)
    finally:
        if own:
            con.close()


_SHAPE_SQL = (
    "SELECT table_name, column_index, column_name, data_type, is_nullable FROM duckdb_columns() "
    "WHERE database_name = ? AND schema_name = 'main' ORDER BY table_name, column_index"
)
_EXPECTED_SHAPE: list[tuple] = []


def _expected_shape() -> list[tuple]:
    """The tables and columns ``TABLES`` creates (built once per process in an empty in-memory database)."""
    if not _EXPECTED_SHAPE:
        con = duckdb.connect(":memory:")
        try:
            _create_schema(con)
            _EXPECTED_SHAPE.extend(con.execute(_SHAPE_SQL, ["memory"]).fetchall())
        finally:
            con.close()
    return _EXPECTED_SHAPE


def _hashes_if_current(con: duckdb.DuckDBPyConnection, alias: str = "registry") -> dict[str, str] | None:
    """The stored hashes, or None when the file is of another schema version or, at this version, of
    another shape (a table or column missing, added or retyped), so it is rebuilt, not trusted."""
    try:
        version = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if version is None or version[0] != str(SCHEMA_VERSION):
            return None
        if con.execute(_SHAPE_SQL, [alias]).fetchall() != _expected_shape():
            return None
        return dict(con.execute("SELECT path, sha256 FROM files").fetchall())
    except duckdb.Error:
        return None


def _content_digest(con: duckdb.DuckDBPyConnection, alias: str) -> str:
    """A digest of every table's shape and rows (in a canonical order): equal digests, equal registries."""
    digest = hashlib.sha256(repr(con.execute(_SHAPE_SQL, [alias]).fetchall()).encode())
    for table in sorted(TABLES):
        rows = con.execute(
            f"SELECT md5(coalesce(string_agg(CAST(t AS VARCHAR), chr(10) ORDER BY CAST(t AS VARCHAR)), ''))"
            f" FROM {alias}.main.{table} AS t"
        ).fetchone()[0]
        digest.update(f"{table}:{rows}".encode())
    return digest.hexdigest()


_HEADER_SIZE = 4096  # DuckDB's main file header: an 8-byte checksum, then the header fields
_ID_OFFSET, _ID_SIZE = 124, 16  # the random database identifier DuckDB writes into every new file
_CHECKSUM_MULTIPLIER = 0xBF58476D1CE4E5B9


def _header_checksum(header: bytes) -> int:
    """DuckDB's block checksum over the header after its checksum field (whole 8-byte words)."""
    result = 5381
    for (word,) in struct.iter_unpack("<Q", header[8:]):
        result ^= (word * _CHECKSUM_MULTIPLIER) & 0xFFFFFFFFFFFFFFFF
    return result


def _normalize_header(path: Path, digest: str) -> None:
    """Replace the random database identifier by one derived from the content, so that equal registries are
    equal files wherever they were built. Only a header this code understands (magic and checksum check
    out) is touched; any other is left as DuckDB wrote it."""
    with open(path, "r+b") as handle:
        header = bytearray(handle.read(_HEADER_SIZE))
        if (
            len(header) != _HEADER_SIZE
            or header[8:12] != b"DUCK"
            or struct.unpack_from("<Q", header)[0] != _header_checksum(bytes(header))
        ):
            return
        header[_ID_OFFSET : _ID_OFFSET + _ID_SIZE] = hashlib.sha256(digest.encode()).digest()[:_ID_SIZE]
        struct.pack_into("<Q", header, 0, _header_checksum(bytes(header)))
        handle.seek(0)
        handle.write(header)


def _unchanged(con: duckdb.DuckDBPyConnection, built_digest: str, registry: Path) -> bool:
    """Whether the registry file already holds exactly what was built (then it is left byte-identical:
    DuckDB writes a random database id into every new file)."""
    if not registry.is_file():
        return False
    try:
        con.execute("ATTACH ? AS current_registry (READ_ONLY)", [str(registry)])
    except duckdb.Error:
        return False
    try:
        return _content_digest(con, "current_registry") == built_digest
    except duckdb.Error:
        return False
    finally:
        _detach(con, "current_registry")


def _diff(current: dict[str, RecordFile], stored: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    added = sorted(p for p in current if p not in stored)
    changed = sorted(p for p, rec in current.items() if p in stored and stored[p] != rec.sha256)
    removed = sorted(p for p in stored if p not in current)
    return added, changed, removed


@contextmanager
def writer_lock(home: Home, timeout_s: float | None = None):
    """One registry writer at a time per home (``specpilot_mem.file_lock`` on .specpilot/registry.lock)."""
    try:
        home.state.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RegistryError(
            f"cannot take the registry's writer lock: {err}",
            where=str(home.state / "registry.lock"),
            fix=f"make {home.state} a writable folder (it holds machine-local state)",
        ) from err
    with file_lock(home.state / "registry.lock", timeout_s=timeout_s, what="the registry"):
        yield


def _create_schema(con: duckdb.DuckDBPyConnection) -> None:
    for ddl in TABLES.values():
        con.execute(ddl)
    con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])


def _delete_records(con: duckdb.DuckDBPyConnection, records: list[tuple[str, str]]) -> None:
    """Remove every row derived from the (kind, key) records."""
    for kind, key in records:
        if kind == "entry":
            con.execute("DELETE FROM entries WHERE id = ?", [key])
            for table in ENTRY_TABLES:
                con.execute(f"DELETE FROM {table} WHERE entry_id = ?", [key])
        elif kind == "deployment":
            con.execute("DELETE FROM deployments WHERE name = ?", [key])
        else:
            deployment, folder = key.split("/")
            for table in ("rounds", "promotions"):
                con.execute(
                    f"DELETE FROM {table} WHERE deployment = ? AND round = ?",
                    [deployment, int(ROUND_DIR.match(folder)[1])],
                )


def _file_identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def sync(home: Home, *, rebuild: bool = False, show_progress: bool = False) -> SyncReport:
    """Bring ``home.registry`` up to date with the records; ``rebuild`` starts from an empty database."""
    started = time.perf_counter()
    current = scan_records(home)
    seen_file = _file_identity(home.registry)
    con = _instance()
    try:
        stored = None if rebuild else stored_hashes(home.registry, con)
        return _sync(
            home, con, current, stored, seen_file, rebuild=rebuild, show_progress=show_progress, started=started
        )
    finally:
        con.close()


def _sync(
    home: Home,
    con: duckdb.DuckDBPyConnection,
    current: dict[str, RecordFile],
    stored: dict[str, str] | None,
    seen_file,
    *,
    rebuild: bool,
    show_progress: bool,
    started: float,
) -> SyncReport:
    """Sync given the scanned records and the hashes read from the registry file whose identity was ``seen_file``."""
    if stored is not None and not any(_diff(current, stored)):
        return SyncReport(False, "up to date", records=len(current), seconds=time.perf_counter() - started)
    with writer_lock(home):
        if not rebuild and _file_identity(home.registry) != seen_file:
            # Another writer replaced the registry while this one waited: diff against what is there now.
            stored = stored_hashes(home.registry, con)
        if stored is None:
            reason = (
                "rebuild requested"
                if rebuild
                else (
                    "no registry yet"
                    if not home.registry.exists()
                    else "registry unreadable or of another schema version"
                )
            )
            report = SyncReport(True, reason, added=sorted(current))
            _write(home, con, list(current.values()), stale=[], fresh=True, show_progress=show_progress)
        else:
            added, changed, removed = _diff(current, stored)
            report = SyncReport(
                False, "records changed" if added or changed or removed else "up to date", added, changed, removed
            )
            if report.wrote:
                _write(
                    home,
                    con,
                    [current[p] for p in added + changed],
                    stale=changed + removed,
                    fresh=False,
                    show_progress=show_progress,
                )
    report.records = len(current)
    report.seconds = time.perf_counter() - started
    return report


def _write(
    home: Home,
    con: duckdb.DuckDBPyConnection,
    records: list[RecordFile],
    *,
    stale: list[str],
    fresh: bool,
    show_progress: bool,
) -> None:
    """Index ``records`` (replacing the rows of the ``stale`` record paths) into a temp file, then rename it into place.

    Runs under the writer lock.
    """
    from specpilot_mem.output import progress

    with progress("indexing records", total=len(records), enabled=show_progress and len(records) > 50) as bar:
        rows = _parse(home, records, bar.advance)  # raises on a bad record, before anything is written
    try:
        _build_and_replace(home, con, rows, stale=stale, fresh=fresh)
    except (OSError, duckdb.IOException) as err:
        raise RegistryError(
            f"cannot write the registry: {err}",
            where=str(home.registry),
            fix=f"make {home.root} and {home.state} writable, or free disk space",
        ) from err


def _build_and_replace(
    home: Home, con: duckdb.DuckDBPyConnection, rows: dict[str, list[tuple]], *, stale: list[str], fresh: bool
) -> None:
    home.state.mkdir(parents=True, exist_ok=True)
    for leftover in home.state.glob("registry-build-*"):
        leftover.unlink(missing_ok=True)  # a crashed writer's: this one holds the writer lock, so none is in use
    tmp = home.state / f"registry-build-{os.getpid()}-{threading.get_ident()}.duckdb"
    wal = tmp.with_name(tmp.name + ".wal")
    try:
        if not fresh:
            shutil.copyfile(home.registry, tmp)
        # Small blocks: the committed registry holds few rows, and DuckDB's default 256 KiB blocks
        # would make even an empty registry megabytes of binary churn in git.
        con.execute(f"ATTACH ? AS build {'(BLOCK_SIZE 16384)' if fresh else ''}", [str(tmp)])
        # Uncompressed columns: a checkpoint re-analyses the compression of every column it rewrites,
        # which on 1,000 entries cost an incremental sync 4x the rest of its work (the file grows ~1.6x).
        con.execute("SET force_compression = 'uncompressed'")
        open_transaction = False
        try:
            con.execute("USE build")
            con.execute("BEGIN TRANSACTION")
            open_transaction = True
            if fresh:
                _create_schema(con)
            else:
                stale_keys = con.execute(
                    "SELECT kind, record_key FROM files WHERE list_contains(?, path)", [stale]
                ).fetchall()
                _delete_records(con, stale_keys)
                con.execute("DELETE FROM files WHERE list_contains(?, path)", [stale])
            for table, table_rows in rows.items():
                _insert(con, table, table_rows)
            con.execute("COMMIT")
            open_transaction = False
            con.execute("CHECKPOINT build")
            built = _content_digest(con, "build")
        finally:
            if open_transaction:
                con.execute("ROLLBACK")
            _detach(con, "build")
        if not _unchanged(con, built, home.registry):
            _normalize_header(tmp, built)
            os.replace(tmp, home.registry)
    finally:
        tmp.unlink(missing_ok=True)
        wal.unlink(missing_ok=True)


def connect(home: Home) -> duckdb.DuckDBPyConnection:
    """A read-only connection to an up-to-date registry, syncing it first when a record changed."""
    started = time.perf_counter()
    current = scan_records(home)
    seen_file = _file_identity(home.registry)
    con = _instance()
    try:
        attached = _attach_read_only(con, home.registry)
        stored = _hashes_if_current(con) if attached else None
        if stored is not None and not any(_diff(current, stored)):
            return con
        if attached:
            _detach(con)
        _sync(home, con, current, stored, seen_file, rebuild=False, show_progress=False, started=started)
        if not _attach_read_only(con, home.registry):
            raise RegistryError(
                "cannot open the registry after syncing it",
                where=str(home.registry),
                fix="run `specpilot-mem registry rebuild`",
            )
        return con
    except BaseException:
        con.close()
        raise


def seal(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Switch off file access and lock the configuration: statements can read the registry and nothing else."""
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con
