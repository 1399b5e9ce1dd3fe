"""The promotion rule (§3.2).

Promote a patch only if the 95% lower bound of its gain over the current best exceeds
1 + (1% + 2 x stock-vs-stock noise); when its outputs diverge from the current best's, the bar is
at least ``divergent_min_gain`` (about 3%), because a change that alters tokens must pay for the
token-forcing risk it brings. "95% lower bound" is the lower end of the two-sided 95% interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from specpilot_mem.controller.gains import GainEstimate


@dataclass(frozen=True)
class Promotion:
    promote: bool
    gain: float
    low: float
    high: float
    threshold: float
    noise: float
    divergent_requests: int
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PromotionRule:
    min_gain: float = 0.01
    noise_factor: float = 2.0
    divergent_min_gain: float = 0.03

    def threshold(self, noise: float, diverges: bool) -> float:
        """The gain the lower bound must beat, as a fraction (0.012 means 1.2%)."""
        base = self.min_gain + self.noise_factor * noise
        return max(base, self.divergent_min_gain) if diverges else base

    def decide(self, estimate: GainEstimate, noise: float, divergent: Sequence[str] = ()) -> Promotion:
        threshold = self.threshold(noise, bool(divergent))
        promote = estimate.low > 1.0 + threshold
        why = "outputs diverge from the current best's, so the bar is raised; " if divergent else ""
        relation = "exceeds" if promote else "does not exceed"
        reason = (
            f"{why}95% lower bound {estimate.low:.4f} {relation} 1 + {threshold:.4f} "
            f"(gain {estimate.gain:.4f}, noise {noise:.4f})"
        )
        return Promotion(promote, estimate.gain, estimate.low, estimate.high, threshold, noise, len(divergent), reason)
