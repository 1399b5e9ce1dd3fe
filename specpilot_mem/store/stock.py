"""The deterministic stock import: the pinned SGLang wheel as one git commit.

Every file under ``sglang/`` is checked against the wheel's RECORD (sha256 and size) and streamed
straight from the zip into ``git fast-import``. The compiled ``.so`` files and ``*.dist-info`` stay
out of the tree; ``WHEEL_EXCLUDED`` lists them with their RECORD hashes (the SGLang export restores
them from the wheel). ``.gitattributes`` says ``* -text`` (13 files have CRLF), modes come from the
zip's ``external_attr``, and author, committer, dates and message are fixed, so two imports on any
two machines give the same tree and commit ids — the pins below, checked on every import.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from specpilot_mem.errors import ForkError, SpecPilotError
from specpilot_mem.git import IDENTITY_EMAIL, IDENTITY_NAME, Repo

SGLANG_VERSION = "0.5.23"
WHEEL_NAME = "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
WHEEL_SHA256 = "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"
# What the import must give; a mismatch means the wheel, git or this code changed.
STOCK_TREE = "6dfff0af547a335654ae47ef80df3e1847160ae4"
STOCK_COMMIT = "da4dd56c15ed3f4adf9672df2245147124c54a84"
STOCK_TIMESTAMP = 1767139200  # 2025-12-31T00:00:00Z, fixed so the commit id never depends on the clock
STOCK_MESSAGE = f"stock: SGLang {SGLANG_VERSION} from PyPI ({WHEEL_NAME}, sha256 {WHEEL_SHA256})\n"
WHEEL_EXCLUDED = "WHEEL-EXCLUDED.tsv"
GITATTRIBUTES = b"* -text\n"
IMPORT_REF = "refs/specpilot/stock-import"
PACKAGE = "sglang/"


@dataclass(frozen=True)
class RecordRow:
    path: str
    sha256: str  # hex
    size: int


def cache_dir() -> Path:
    base = os.environ.get("SPECPILOT_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "specpilot") / "wheels"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(version: str, wheel_name: str) -> Path:
    """``sglang==version``'s wheel from the cache, else ``pip download --no-deps`` into it (not hash-checked here)."""
    folder = cache_dir()
    path = folder / wheel_name
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                "--platform",
                "manylinux_2_34_x86_64",
                "--python-version",
                "3.11",
                "--implementation",
                "cp",
                "--abi",
                "cp311",
                "--dest",
                str(folder),
                f"sglang=={version}",
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not path.is_file():
            raise SpecPilotError(
                f"could not download sglang=={version}: {proc.stderr.strip()[-400:]}",
                where=str(folder),
                fix="check the network, or download the wheel elsewhere and pass its path",
            )
    return path


def fetch_wheel(explicit: str | os.PathLike | None = None) -> Path:
    """The pinned wheel: ``explicit`` if given, else the cache, else ``pip download --no-deps`` into it."""
    if explicit is not None:
        path = Path(explicit).expanduser().resolve()
        if not path.is_file():
            raise SpecPilotError(f"no wheel at {path}", where="--wheel", fix=f"pass the path of {WHEEL_NAME}")
    else:
        path = download_wheel(SGLANG_VERSION, WHEEL_NAME)
    digest = sha256_file(path)
    if digest != WHEEL_SHA256:
        kind = "" if zipfile.is_zipfile(path) else " and is not a zip archive (so not a wheel at all)"
        raise ForkError(
            f"{path.name} has sha256 {digest}, not the pinned {WHEEL_SHA256}{kind}",
            where=str(path),
            fix=f"delete it and run `specpilot-mem init` again (it is re-downloaded), or pass the real {WHEEL_NAME}",
        )
    return path


def read_record(wheel: zipfile.ZipFile) -> dict[str, RecordRow]:
    names = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
    if len(names) != 1:
        raise ForkError("the wheel has no single .dist-info/RECORD", where=wheel.filename)
    rows: dict[str, RecordRow] = {}
    for path, digest, size in csv.reader(io.StringIO(wheel.read(names[0]).decode())):
        if not digest:  # RECORD lists itself without a hash
            continue
        algo, _, b64 = digest.partition("=")
        if algo != "sha256":
            raise ForkError(f"RECORD hashes {path} with {algo}, expected sha256", where=wheel.filename)
        rows[path] = RecordRow(path, base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex(), int(size))
    return rows


def _excluded(name: str) -> bool:
    return not name.startswith(PACKAGE) or name.endswith(".so")


def _data(payload: bytes) -> bytes:
    return b"data %d\n" % len(payload) + payload + b"\n"


def import_stream(
    wheel_path: Path,
    progress: Callable[[int, int], None] | None = None,
    message: str = STOCK_MESSAGE,
    ref: str = IMPORT_REF,
) -> Iterator[bytes]:
    """``git fast-import`` commands for the stock commit (or, with another ``message``, another release's),
    each file checked against RECORD on the way; ``progress(done, total)`` is called per wheel file."""
    with zipfile.ZipFile(wheel_path) as wheel:
        record = read_record(wheel)
        members = [info for info in wheel.infolist() if not info.is_dir()]
        unlisted = [
            info.filename
            for info in members
            if info.filename not in record and not info.filename.endswith(".dist-info/RECORD")
        ]
        missing = sorted(set(record) - {info.filename for info in members})
        if unlisted or missing:
            raise ForkError(
                f"the wheel's RECORD does not match its files (unlisted: {unlisted[:3]}, missing: {missing[:3]})",
                where=str(wheel_path),
                fix="the wheel is damaged: delete it and download it again",
            )
        when = f"{IDENTITY_NAME} <{IDENTITY_EMAIL}> {STOCK_TIMESTAMP} +0000"
        yield (f"commit {ref}\nauthor {when}\ncommitter {when}\n").encode() + _data(message.encode())
        yield b"M 100644 inline .gitattributes\n" + _data(GITATTRIBUTES)
        excluded_lines = ["path\tsha256\tsize"]
        for done, info in enumerate(sorted(members, key=lambda i: i.filename), 1):
            if progress:
                progress(done, len(members))
            row = record.get(info.filename)
            if _excluded(info.filename):
                if row is not None:
                    excluded_lines.append(f"{row.path}\t{row.sha256}\t{row.size}")
                continue
            payload = wheel.read(info)
            if hashlib.sha256(payload).hexdigest() != row.sha256 or len(payload) != row.size:
                raise ForkError(
                    f"{info.filename} does not match the wheel's RECORD",
                    where=str(wheel_path),
                    fix="the wheel is damaged: delete it and download it again",
                )
            mode = "100755" if (info.external_attr >> 16) & 0o111 else "100644"
            yield f"M {mode} inline {info.filename}\n".encode() + _data(payload)
        yield f"M 100644 inline {WHEEL_EXCLUDED}\n".encode() + _data(("\n".join(excluded_lines) + "\n").encode())
        yield b"\ndone\n"


def import_stock(repo: Repo, wheel_path: Path, progress: Callable[[int, int], None] | None = None) -> tuple[str, str]:
    """Import the wheel into ``repo`` under a scratch ref; returns (commit, tree), checked against the pins."""
    repo.fast_import(import_stream(wheel_path, progress))
    commit = repo.rev_parse(IMPORT_REF)
    tree = repo.rev_parse(f"{IMPORT_REF}^{{tree}}")
    repo.update_refs({IMPORT_REF: (commit, None)}, "specpilot: drop the import scratch ref")
    if (tree, commit) != (STOCK_TREE, STOCK_COMMIT):
        raise ForkError(
            f"the stock import gave tree {tree} / commit {commit}, not the pinned {STOCK_TREE} / {STOCK_COMMIT}",
            where=str(wheel_path),
            fix="the import is no longer deterministic (different wheel, git or code): report it; nothing was kept",
        )
    return commit, tree


def excluded_files(repo: Repo, stock: str) -> list[RecordRow]:
    """The wheel files left out of the stock tree (compiled files, dist-info), with their RECORD hashes."""
    text = repo.git("cat-file", "blob", f"{stock}:{WHEEL_EXCLUDED}").stdout.decode()
    rows = []
    for line in text.splitlines()[1:]:
        path, digest, size = line.split("\t")
        rows.append(RecordRow(path, digest, int(size)))
    return rows
