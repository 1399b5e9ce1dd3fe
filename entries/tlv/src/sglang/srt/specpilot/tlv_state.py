"""Whether the running forward is ``tlv``'s Q pass (read by the W12 method and RadixAttention; no heavy imports)."""

from __future__ import annotations

import threading
from contextlib import contextmanager

_STATE = threading.local()


def qpass_low_bits() -> str | None:
    """The Q pass's low bits ("midpoint" / "truncated") while a Q pass runs on this thread, else None."""
    return getattr(_STATE, "low_bits", None)


@contextmanager
def qpass_mode(low_bits: str):
    """Run the forward inside as the Q pass: W12 layers read their 8-bit view, attention stores no KV."""
    if low_bits not in ("midpoint", "truncated"):
        raise ValueError(f"Q-pass low bits {low_bits!r}: use 'midpoint' or 'truncated'")
    before = qpass_low_bits()
    _STATE.low_bits = low_bits
    try:
        yield
    finally:
        _STATE.low_bits = before
