"""The stock import's checks, on small hand-made wheels (the real one is covered by stock_fork_home)."""

from __future__ import annotations

import base64
import hashlib
import zipfile

import pytest

from specpilot_mem.errors import ForkError
from specpilot_mem.git import init_repo
from specpilot_mem.store import stock


def digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(path, files: dict[str, tuple[bytes, int]], record_override: dict[str, bytes] | None = None):
    """files: name -> (content, unix mode); RECORD hashes ``record_override`` content where given."""
    rows = []
    with zipfile.ZipFile(path, "w") as wheel:
        for name, (content, mode) in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            wheel.writestr(info, content)
            listed = (record_override or {}).get(name, content)
            rows.append(f"{name},{digest(listed)},{len(listed)}")
        rows.append("sglang-0.5.23.dist-info/RECORD,,")
        wheel.writestr("sglang-0.5.23.dist-info/RECORD", "\n".join(rows) + "\n")
    return path


FILES = {
    "sglang/__init__.py": (b"VERSION = 1\r\n", 0o100644),
    "sglang/launch.py": (b"#!/usr/bin/env python\n", 0o100755),
    "sglang/srt/fast.cpython-311-x86_64-linux-gnu.so": (b"\x7fELF", 0o100755),
    "sglang-0.5.23.dist-info/METADATA": (b"Name: sglang\n", 0o100644),
}


def test_import_checks_record_modes_exclusions_and_fails_on_the_pin(tmp_path):
    wheel = make_wheel(tmp_path / "w.whl", FILES)
    repo = init_repo(tmp_path / "fork")
    with pytest.raises(ForkError, match="not the pinned") as err:
        stock.import_stock(repo, wheel)
    assert "nothing was kept" in err.value.fix
    assert repo.rev_parse(stock.IMPORT_REF) is None  # the scratch ref is gone
    # the tree it built (still in the object store) has what the design says
    repo.fast_import(stock.import_stream(wheel))
    listing = {row[3]: row[0] for row in repo.ls_tree(stock.IMPORT_REF) if row[1] == "blob"}
    assert listing == {
        ".gitattributes": "100644",
        stock.WHEEL_EXCLUDED: "100644",
        "sglang/__init__.py": "100644",
        "sglang/launch.py": "100755",
    }
    assert repo.git("cat-file", "blob", f"{stock.IMPORT_REF}:sglang/__init__.py").stdout == b"VERSION = 1\r\n"
    excluded = stock.excluded_files(repo, stock.IMPORT_REF)
    assert [r.path for r in excluded] == [
        "sglang-0.5.23.dist-info/METADATA",
        "sglang/srt/fast.cpython-311-x86_64-linux-gnu.so",
    ]
    assert excluded[1].sha256 == hashlib.sha256(b"\x7fELF").hexdigest()


def test_a_file_that_differs_from_record_is_refused(tmp_path):
    wheel = make_wheel(tmp_path / "w.whl", FILES, record_override={"sglang/launch.py": b"#!/bin/sh\n"})
    with pytest.raises(ForkError, match="sglang/launch.py does not match the wheel's RECORD"):
        list(stock.import_stream(wheel))


def test_a_wheel_with_the_wrong_hash_is_refused(tmp_path):
    wheel = make_wheel(tmp_path / stock.WHEEL_NAME, FILES)
    with pytest.raises(ForkError, match="not the pinned"):
        stock.fetch_wheel(wheel)
