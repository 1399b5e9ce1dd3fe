"""``round report``: the round's promotions (the paper's Table A3), throughput over promotions
(Figure 8, PNG) and its cost (Table A4)."""

from __future__ import annotations

import json
from pathlib import Path

from specpilot_mem.optional import pyplot
from specpilot_mem.rounds.files import RoundDir


def round_report(round_dir: RoundDir) -> dict:
    state = round_dir.load_state()
    promotions = round_dir.load_promotions().promotions
    directions = round_dir.directions()
    device_seconds = 0.0
    for path in sorted((round_dir.path / "measurements").glob("*.json")):
        device_seconds += json.loads(path.read_text()).get("device_seconds", 0.0)
    usage = {"input_tokens": 0, "output_tokens": 0}
    for folder in [round_dir.path / "master", *(round_dir.direction_dir(d.spec.id) for d in directions)]:
        agent = folder / "agent.json"
        if agent.is_file():
            data = json.loads(agent.read_text())["usage"]
            usage = {k: usage[k] + data.get(k, 0) for k in usage}
    end = state.finished
    wall_hours = ((end - state.started).total_seconds() / 3600) if end else None
    calibration = next(
        (json.loads(p.read_text()) for p in (round_dir.path / "measurements").glob("calibrate-*.json")), None
    )
    return {
        "deployment": state.deployment,
        "round": state.number,
        "phases_done": state.done,
        "promotions": [p.model_dump(mode="json") for p in promotions],
        "directions": [
            {
                "id": d.spec.id,
                "kind": d.kind,
                "status": d.status,
                "decision": d.decision,
                "headroom": d.headroom.net if d.headroom else None,
            }
            for d in directions
        ],
        "sealed": state.sealed,
        "cost": {
            "wall_hours": wall_hours,
            "gpu_hours": device_seconds / 3600,
            "code_changes": sum(1 for d in directions if d.patch),
            "promotions": len(promotions),
            "agent_tokens": usage,
        },
        "delta": calibration["delta"] if calibration else None,
        "noise": calibration["noise"]["noise"] if calibration else None,
    }


def plot_progress(report: dict, path: Path) -> Path:
    """Figure 8: throughput after each promotion, from the first measured best to the final."""
    plt = pyplot("Figure 8 (round report --plot)")

    promotions = report["promotions"]
    rates = [p["rate"] for p in promotions if p.get("rate")]
    labels = [p["direction"] for p in promotions if p.get("rate")]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(rates) + 2), 3.5))
    if rates:
        start = rates[0] / promotions[0]["gain"]
        ax.plot(range(len(rates) + 1), [start, *rates], marker="o", color="#1F6FD6")
        ax.set_xticks(range(len(rates) + 1), ["start", *labels], rotation=30, ha="right")
    else:
        ax.text(0.5, 0.5, "no promotions this round", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("output tokens/s per request")
    ax.set_title(f"{report['deployment']} round {report['round']}: throughput over promotions")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
