"""User-facing errors. Every failure a user can cause says what went wrong, where, and how to fix it.

Commands raise these and change nothing; ``main`` prints them (or their JSON form) and exits 2.
"""

from __future__ import annotations


class SpecPilotError(Exception):
    """A failure caused by input or state the user can fix."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        super().__init__(what)
        self.what = what
        self.where = where
        self.fix = fix

    def to_dict(self) -> dict:
        return {"error": type(self).__name__, "what": self.what, "where": self.where, "fix": self.fix}

    def __str__(self) -> str:
        lines = [self.what]
        if self.where:
            lines.append(f"  where: {self.where}")
        if self.fix:
            lines.append(f"  fix:   {self.fix}")
        return "\n".join(lines)


class RecordError(SpecPilotError):
    """A malformed or invalid YAML record (entry, deployment, round file)."""


class UnknownEntryError(SpecPilotError):
    """An entry id that the memory does not hold."""


class RequirementError(SpecPilotError):
    """A missing requirement or a requirement cycle."""


class ConflictError(SpecPilotError):
    """Entries whose deltas do not apply together."""


class DeltaError(SpecPilotError):
    """A delta that is corrupt, truncated, or touches paths it must not."""


class ForkError(SpecPilotError):
    """The fork is missing, dirty, locked, or its stock does not match the pin."""


class ReproductionError(SpecPilotError):
    """An entry chain that does not reproduce its source system's tree."""


class RegistryError(SpecPilotError):
    """A registry query or SQL statement that cannot run."""


class RoundError(SpecPilotError):
    """A round that cannot start, resume or advance."""
