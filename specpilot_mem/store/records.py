"""YAML IO for records: canonical dumps that round-trip without churn, errors with file, line and field.

Loading composes the YAML node tree first, so a pydantic error location (``evidence.0.deployment.arch``)
maps back to the line it came from.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import yaml

from specpilot_mem.errors import RecordError, UnknownEntryError
from specpilot_mem.home import Home

ENTRY_FILE = "entry.yaml"
DELTA_FILE = "delta.patch"

if TYPE_CHECKING:
    from pydantic import BaseModel

    from specpilot_mem.models import EntryRecord

# pydantic and the record models are imported where a record is read or written, not with this module:
# `query` reaches it through the registry and must not pay for them when the registry is current
Model = TypeVar("Model", bound="BaseModel")
# libyaml when present (it is in PyYAML's wheels): loading 140 records must not cost seconds
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line strings as ``|`` blocks, and no aliases: stable, readable diffs."""

    def ignore_aliases(self, data) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(data) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100, default_flow_style=False)


def node_line(root: yaml.Node | None, loc: tuple) -> int | None:
    """The 1-based line of the YAML node at pydantic location ``loc`` (the deepest one that exists)."""
    node, line = root, (root.start_mark.line + 1 if root is not None else None)
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(key)), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line


def parse_record(text: str, model: type[Model], where: str) -> Model:
    """Validate YAML ``text`` as ``model``; every failure names ``where``, the line and the field."""
    try:
        data = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise RecordError(
            f"malformed YAML: {getattr(err, 'problem', None) or err}",
            where=f"{where}{line}",
            fix="fix the YAML syntax at that line",
        ) from None
    if not isinstance(data, dict):
        raise RecordError("the record must be a YAML mapping", where=f"{where}:1", fix="see `specpilot-mem schema`")
    return validate_data(data, model, where, text)


def validate_data(data: dict, model: type[Model], where: str, text: str | None = None) -> Model:
    """Validate ``data`` as ``model``; ``text`` (the YAML it came from) gives line numbers on errors."""
    import pydantic

    try:
        return model.model_validate(data)
    except pydantic.ValidationError as err:
        root = yaml.compose(text, Loader=_LOADER) if text else None
        problems = []
        for item in err.errors():
            loc = tuple(item["loc"])
            field = ".".join(str(p) for p in loc) or "(record)"
            line = node_line(root, loc)
            problems.append(f"{where}{f':{line}' if line else ''}: {field}: {item['msg']}")
        raise RecordError(
            f"invalid {model.__name__}: " + "; ".join(p.split(": ", 1)[1] for p in problems),
            where="\n         ".join(problems),
            fix="correct those fields (`specpilot-mem schema` prints the schema)",
        ) from None


def load_record_file(path: Path, model: type[Model]) -> Model:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecordError(
            f"no record at {path}",
            where=str(path),
            fix="check the path; `specpilot-mem schema` prints the fields such a record holds",
        ) from None
    return parse_record(text, model, str(path))


def dump_record(record: BaseModel) -> str:
    """Canonical YAML: schema field order, fields at their defaults left out (except ``format``)."""
    data = record.model_dump(mode="python", exclude_defaults=True)
    return dump_fields({"format": record.format, **data} if hasattr(record, "format") else data)


def dump_fields(data: dict) -> str:
    return dump_yaml(_plain(data))


def _plain(value):
    """Dates stay YAML dates; everything else becomes plain YAML types."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (dt.date, str, int, float, bool)) or value is None:
        return value
    return str(value)


def write_atomic(path: Path, data: bytes | str) -> bool:
    """Write through a temp file + ``os.replace``; returns False (and writes nothing) if unchanged."""
    payload = data.encode() if isinstance(data, str) else data
    if path.exists() and path.read_bytes() == payload:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def replace_folder(built: Path, dest: Path) -> None:
    """Move the folder ``built`` to ``dest``, replacing what was there in one rename (the old one is removed after)."""
    if dest.exists():
        retired = dest.parent / f".{dest.name}.retired-{os.getpid()}"
        os.replace(dest, retired)
        os.replace(built, dest)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(built, dest)


def entry_path(home: Home, entry_id: str) -> Path:
    return home.entry_dir(entry_id) / ENTRY_FILE


def delta_path(home: Home, entry_id: str) -> Path:
    return home.entry_dir(entry_id) / DELTA_FILE


def load_entry(home: Home, entry_id: str) -> EntryRecord:
    """``entries/<id>/entry.yaml``, validated; the id inside must match the folder."""
    from specpilot_mem.models import EntryRecord

    path = entry_path(home, entry_id)
    if not path.is_file():
        known = sorted(p.parent.name for p in home.entries.glob(f"*/{ENTRY_FILE}"))
        raise UnknownEntryError(
            f"unknown entry {entry_id!r}",
            where=str(home.entries),
            fix="known entries: " + (", ".join(known) or "(none yet)"),
        )
    record = load_record_file(path, EntryRecord)
    if record.id != entry_id:
        line = node_line(yaml.compose(path.read_text(), Loader=_LOADER), ("id",))
        raise RecordError(
            f"the record's id {record.id!r} does not match its folder {entry_id!r}",
            where=f"{path}:{line}",
            fix="rename the folder or correct the id",
        )
    return record


def load_entries(home: Home) -> dict[str, EntryRecord]:
    """Every recorded entry by id (folders without ``entry.yaml`` are drafts and are skipped)."""
    from specpilot_mem.models import ENTRY_ID

    records = {}
    for path in sorted(home.entries.glob(f"*/{ENTRY_FILE}")):
        entry_id = path.parent.name
        if not re.match(ENTRY_ID, entry_id):
            raise RecordError(
                f"entry folder {entry_id!r} is not a valid entry id",
                where=str(path.parent),
                fix="use lower-case words joined by '-', e.g. certified-head",
            )
        records[entry_id] = load_entry(home, entry_id)
    return records


def save_entry(home: Home, record: EntryRecord) -> bool:
    """Write ``entries/<id>/entry.yaml`` canonically; returns whether the file changed."""
    return write_atomic(entry_path(home, record.id), dump_record(record))
