"""Distillation after an accepted sealed final: each promoted mechanism becomes a memory entry."""

from __future__ import annotations

import datetime as dt

import yaml

from specpilot_mem.git import Repo
from specpilot_mem.home import Home
from specpilot_mem.models import DeploymentRecord
from specpilot_mem.rounds.files import RoundDir
from specpilot_mem.rounds.models import PromotionRecord, RoundState
from specpilot_mem.store import load_entries, record_entry

DRAFT_FILE = "entry-draft.yaml"  # the agent's description of its mechanism, kept from its worktree


def _entry_id(direction: str, state: RoundState, taken: dict) -> str:
    if direction not in taken:
        return direction
    return f"{direction}-{state.deployment.replace('.', '-').replace('_', '-')}-r{state.number}"


def distill_promotion(
    home: Home, round_dir: RoundDir, state: RoundState, deployment: DeploymentRecord, promotion: PromotionRecord
) -> str:
    """Record ``promotion`` as an entry (idempotent: a resumed distillation finds it recorded)."""
    direction = round_dir.load_direction(promotion.direction)
    entries = load_entries(home)
    for entry in entries.values():
        if entry.source.commit == direction.patch:
            return entry.id
    entry_id = _entry_id(direction.spec.id, state, entries)
    repo = Repo(state.config.system_repo)
    earlier = [p for p in round_dir.load_promotions().promotions if p.order < promotion.order]
    requires = list(deployment.entries)
    for other in earlier:
        if repo.git("merge-base", "--is-ancestor", other.merge, direction.base, check=False).returncode == 0:
            other_id = next(
                (
                    e.id
                    for e in load_entries(home).values()
                    if e.source.commit == round_dir.load_direction(other.direction).patch
                ),
                None,
            )
            if other_id:
                requires.append(other_id)
    draft_file = round_dir.direction_dir(direction.spec.id) / DRAFT_FILE
    draft = yaml.safe_load(draft_file.read_text()) if draft_file.is_file() else {}
    sealed = state.sealed or {}
    measured = {
        "gpu": deployment.gpu,
        "arch": deployment.arch,
        "target": deployment.model,
        "drafter": deployment.drafter,
        "regime": deployment.regime,
        "batch_sizes": state.config.batch_sizes,
    }
    where = f"{state.deployment}/round-{state.number}"
    meta = {
        "title": draft.get("title", direction.spec.title),
        "summary": draft.get("summary", direction.spec.idea),
        "contract": draft.get(
            "contract",
            {
                "level": "token-forcing",
                "statement": "outputs pass token forcing against stock",
                "commands": [f"specpilot-mem round report {state.deployment} --round {state.number}"],
            },
        ),
        "options": draft.get("options", []),
        "limits": draft.get("limits", []),
        "untested": draft.get("untested", []),
        "evidence": [
            {
                "kind": "paired-run",
                "deployment": measured,
                "command": f"specpilot-mem round report {state.deployment}",
                "date": dt.date.today(),
                "round": where,
                "verdict": promotion.token_forcing,
                "figures": [
                    {
                        "name": "gain over previous best",
                        "value": promotion.gain,
                        "unit": "x",
                        "ci_low": promotion.ci_low,
                        "ci_high": promotion.ci_high,
                    }
                ],
            },
            {
                "kind": "token-forcing",
                "deployment": measured,
                "command": f"specpilot-mem round report {state.deployment}",
                "date": dt.date.today(),
                "round": where,
                "verdict": sealed.get("verdict", promotion.token_forcing),
                "figures": [
                    {
                        "name": "sealed final gain over stock",
                        "value": sealed.get("gain", {}).get("gain", 0.0),
                        "unit": "x",
                        "ci_low": sealed.get("gain", {}).get("low"),
                        "ci_high": sealed.get("gain", {}).get("high"),
                    }
                ],
            },
        ],
        "source": {"round": where, "commit": direction.patch},
    }
    record_entry(home, entry_id, direction.patch, requires=requires, meta=meta)
    round_dir.log("distilled", direction=direction.spec.id, entry=entry_id)
    return entry_id
