"""The paper's two ceiling settings (kept free of heavy imports: the CLI reads them at start-up)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    flop_fraction: float
    byte_fraction: float
    tau_from: str  # "best-first" or "oracle"


SETTINGS = {
    "section-3.1": Setting("section-3.1", 0.6, 0.9, "best-first"),
    "appendix-b": Setting("appendix-b", 1.0, 1.0, "oracle"),
}
