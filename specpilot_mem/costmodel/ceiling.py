"""The ceiling factorization (§3.1, Eq. 4) and S(N) = τ(N)/c(N) (Eq. 3).

ceiling = (τ_best/τ) · (T_prof/T_floor) · (T_step/T_prof): the τ factor (a better tree), the kernel
factor (kernels above their byte floors) and the overhead factor (time outside the profile).
The paper uses two settings, both available here:

* ``section-3.1``: τ_best from the best-first tree at its best node budget, floors at 60% of peak
  FLOP/s and 90% of peak bandwidth;
* ``appendix-b``: τ_best from the oracle, floors at full peak (Appendix B: 2.57 = 1.83 × 1.01 × 1.39).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from specpilot_mem.costmodel.floors import byte_floor_ms
from specpilot_mem.costmodel.profile import Profile, load_profile
from specpilot_mem.errors import SpecPilotError
from specpilot_mem.gpus import find_gpu
from specpilot_mem.costmodel.settings import SETTINGS, Setting

DEFAULT_NODES = (8, 16, 32, 64)


@dataclass(frozen=True)
class Ceiling:
    setting: Setting
    tau: float
    tau_best: float
    T_step_ms: float
    T_prof_ms: float
    T_floor_ms: float
    floors_ms: dict[str, float]

    @property
    def factors(self) -> dict[str, float]:
        return {
            "tau": self.tau_best / self.tau,
            "kernel": self.T_prof_ms / self.T_floor_ms,
            "overhead": self.T_step_ms / self.T_prof_ms,
        }

    @property
    def ceiling(self) -> float:
        f = self.factors
        return f["tau"] * f["kernel"] * f["overhead"]

    @property
    def leading(self) -> str:
        f = self.factors
        return max(f, key=f.get)

    def to_dict(self) -> dict:
        return {
            "setting": self.setting.name,
            "flop_fraction": self.setting.flop_fraction,
            "byte_fraction": self.setting.byte_fraction,
            "tau_from": self.setting.tau_from,
            "tau": self.tau,
            "tau_best": self.tau_best,
            "T_step_ms": self.T_step_ms,
            "T_prof_ms": self.T_prof_ms,
            "T_floor_ms": self.T_floor_ms,
            "floors_ms": self.floors_ms,
            "factors": self.factors,
            "ceiling": self.ceiling,
            "leading": self.leading,
        }


def factorize(profile: Profile, tau_best: float, setting: Setting) -> Ceiling:
    gpu = find_gpu(profile.gpu)
    floors = {
        name: byte_floor_ms(k, gpu, setting.flop_fraction, setting.byte_fraction) for name, k in profile.kernels.items()
    }
    return Ceiling(setting, profile.tau, tau_best, profile.T_step_ms, profile.T_prof_ms, sum(floors.values()), floors)


def speedups(profile: Profile, tau_by_nodes: dict[int, float]) -> list[dict]:
    """S(N) = τ(N)/c(N) with c(N) = T_step(N)/T_AR; T_step(N) from the profile's per-N step times, else
    its single T_step (then c is the same for every N and the row says so)."""
    rows = []
    for n, tau in sorted(tau_by_nodes.items()):
        measured = profile.step_times_ms.get(n)
        step = measured if measured is not None else profile.T_step_ms
        c = step / profile.T_AR_ms
        rows.append(
            {
                "nodes": n,
                "tau": tau,
                "T_step_ms": step,
                "c": c,
                "S": tau / c,
                "step_time": "measured" if measured is not None else "T_step",
            }
        )
    return rows


def ceiling_report(
    profile_path: str | os.PathLike,
    lattice_paths: Sequence[str | os.PathLike],
    setting: str = "section-3.1",
    nodes: Sequence[int] = DEFAULT_NODES,
    depth_cap: int | None = None,
    progress=None,
) -> dict:
    """Phase 0's numbers from a profile and the lattices of the same system: the factors, the leading
    one, τ_best (and where it came from), the oracle's τ and S(N) per node budget (JSON-ready)."""
    from specpilot_mem.replay.lattice import load_lattices
    from specpilot_mem.replay.replay import replay_set

    profile = load_profile(profile_path)
    chosen = SETTINGS[setting]
    lattices = load_lattices(lattice_paths)
    if len({lat.positions for lat in lattices}) != 1:
        raise SpecPilotError(
            "the lattices mix drafter block sizes",
            where="--lattices",
            fix="pass the lattices recorded from the profiled system only (one number of positions)",
        )
    positions = lattices[0].positions
    best_first = replay_set(lattices, ["best-first"], list(nodes), depth_cap, progress=progress)
    oracle = replay_set(lattices, ["oracle"], [positions], depth_cap, progress=progress)[0]
    tau_by_nodes = {r.nodes: r.tau for r in best_first}
    best_n = max(tau_by_nodes, key=tau_by_nodes.get)
    tau_best = oracle.tau if chosen.tau_from == "oracle" else tau_by_nodes[best_n]
    return {
        **factorize(profile, tau_best, chosen).to_dict(),
        "tau_best_nodes": None if chosen.tau_from == "oracle" else best_n,
        "oracle_tau": oracle.tau,
        "gpu": profile.gpu,
        "synthetic": profile.synthetic or any(lat.synthetic for lat in lattices),
        "speedup": speedups(profile, tau_by_nodes),
    }
