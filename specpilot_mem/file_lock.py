"""Advisory locks for every specpilot-mem process on one memory: many readers, or one writer.

Modelled on pre-commit's ``file_lock``, with a shared mode: a reader (``show``, ``verify``, ``query``,
``apply`` without a target) takes the lock shared, so read-only commands run side by side; a writer
takes it exclusive and writes who it is into the lock file. Both wait for the lock (up to
``$SPECPILOT_LOCK_TIMEOUT`` seconds, default 60), and when the wait runs out the error names the holder.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specpilot_mem.errors import LockTimeout, SpecPilotError

DEFAULT_TIMEOUT_S = 60.0
_POLL_S = 0.05


def lock_timeout() -> float:
    raw = os.environ.get("SPECPILOT_LOCK_TIMEOUT")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise SpecPilotError(
            f"SPECPILOT_LOCK_TIMEOUT={raw!r} is not a number of seconds",
            where="environment",
            fix="set it to a number >= 0 (0: fail at once), or unset it for 60 s",
        )
    return value


def _holder(handle) -> str:
    handle.seek(0)
    text = handle.read().strip()
    return text or "read-only specpilot-mem commands (show, verify, query, apply without a target)"


@contextmanager
def file_lock(
    path: Path, *, shared: bool = False, timeout_s: float | None = None, what: str = "the memory"
) -> Iterator[None]:
    """Hold ``path`` shared (a reader) or exclusive (a writer) for the block; ``LockTimeout`` naming the
    holder if it is not free within ``timeout_s`` (default ``lock_timeout()``)."""
    timeout_s = lock_timeout() if timeout_s is None else timeout_s
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")
    except OSError as err:
        raise SpecPilotError(
            f"cannot open the lock of {what}: {err}", where=str(path), fix=f"make {path.parent} a writable folder"
        ) from None
    with handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(
                        f"{what} is in use by {_holder(handle)}; waited {timeout_s:g} s",
                        where=str(path),
                        fix="wait for it to finish and run the command again, end that process if it hung, "
                        "or wait longer with SPECPILOT_LOCK_TIMEOUT=SECONDS",
                    ) from None
                time.sleep(_POLL_S)
        try:
            if not shared:
                handle.seek(0)
                handle.truncate()
                since = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
                handle.write(f"pid {os.getpid()} (specpilot-mem {' '.join(sys.argv[1:])[:200]}) since {since}")
                handle.flush()
            yield
        finally:
            if not shared:
                handle.seek(0)
                handle.truncate()
                handle.flush()
            fcntl.flock(handle, fcntl.LOCK_UN)
