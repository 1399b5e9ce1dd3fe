"""``init --wheel PATH`` checks the wheel even when the fork already exists, and says what it did."""

from __future__ import annotations

import json

import pytest

from specpilot_mem.errors import ForkError
from specpilot_mem.main import main
from specpilot_mem.store import init_memory
from specpilot_mem.store.stock import fetch_wheel


def test_a_wrong_wheel_is_refused_on_an_existing_fork(stock_home_copy, tmp_path):
    refs = (
        (stock_home_copy.fork / "packed-refs").read_bytes() if (stock_home_copy.fork / "packed-refs").exists() else b""
    )
    not_zip = tmp_path / "sglang-0.5.23-py3-none-any.whl"
    not_zip.write_bytes(b"not a wheel")
    with pytest.raises(ForkError, match="not the pinned .* and is not a zip archive"):
        init_memory(stock_home_copy, wheel=str(not_zip))
    with pytest.raises(Exception, match="no wheel at"):
        init_memory(stock_home_copy, wheel=str(tmp_path / "missing.whl"))
    with pytest.raises(ForkError, match="exclude each other"):
        init_memory(stock_home_copy, wheel=str(not_zip), fork_url=str(tmp_path), stock_rev="main")
    after = (
        (stock_home_copy.fork / "packed-refs").read_bytes() if (stock_home_copy.fork / "packed-refs").exists() else b""
    )
    assert after == refs


def test_the_right_wheel_is_checked_and_reported(stock_home_copy, capsys):
    wheel = fetch_wheel()  # the cached pinned wheel
    assert main(["init", "--wheel", str(wheel), "--no-checkout", "--json", "--home", str(stock_home_copy.root)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (
        data["built"] is False
        and data["wheel"] == f"{wheel}: sha256 matches the pin; the fork already exists, so nothing was rebuilt"
    )
