"""Hints name only commands and options that exist: every `specpilot-mem VERB ... --option` quoted in the
package's messages and docstrings is checked against the parser."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from specpilot_mem.main import build_parser

PACKAGE = Path(__file__).resolve().parents[1] / "specpilot_mem"
COMMAND = re.compile(r"`specpilot-mem ([a-z][a-z-]*(?: [a-z][a-z-]*)?)([^`]*)`")  # hints quote commands in backticks


def _verbs() -> dict[str, set[str]]:
    """'verb' and 'verb sub' -> the options it accepts."""
    found: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        options = {o for action in parser._actions for o in action.option_strings}
        found[name] = options
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(child, f"{name} {sub}".strip())

    walk(build_parser(), "")
    return found


def test_every_hint_names_a_real_verb_and_real_options():
    verbs = _verbs()
    problems, checked = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        for match in COMMAND.finditer(path.read_text()):
            checked += 1
            words, rest = match.group(1).split(), match.group(2)
            name = " ".join(words) if " ".join(words) in verbs else words[0]
            if name not in verbs:
                problems.append(f"{path.name}: unknown verb in {match.group(0)!r}")
                continue
            if name != " ".join(words):
                rest = " " + " ".join(words[1:]) + rest
            for option in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
                if option not in verbs[name]:
                    problems.append(f"{path.name}: {name} has no {option} ({match.group(0)!r})")
    assert checked > 50 and not problems, "\n".join(problems)
