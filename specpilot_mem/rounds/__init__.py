"""The round runner (§3, Fig. 3): phases 0-4 of one deployment's round, agents on worktrees, an
isolated controller, promotions recorded as merges, distillation into memory entries."""
