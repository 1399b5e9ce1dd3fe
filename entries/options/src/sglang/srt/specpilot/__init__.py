"""SpecPilot entries inside SGLang: each entry declares its own server flags and weight formats.

Every SpecPilot entry adds one module ``sglang/srt/specpilot/entries/<entry_id>.py`` (dashes in the
id become underscores) that defines ``ENTRY = EntrySpec(...)``. This package discovers those
modules, so entries never edit the same lines of SGLang and any set of them applies together:

- ``arg_groups/fields/specpilot.py`` turns the declared options into the ``specpilot`` namespace of
  ``ServerArgs`` (flags ``--specpilot-*``); every option's default reproduces stock SGLang;
- ``layers/quantization/__init__.py`` registers the declared quantization methods (a
  ``QuantizationConfig`` subclass named by a dotted path) next to SGLang's own.

Discovery imports only the entry modules, which import nothing heavy, so ``server_args`` stays light.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

FLAG_PREFIX = "--specpilot-"
OPTION_TYPES = ("bool", "int", "float", "str", "choice")
_PYTHON_TYPES = {"bool": bool, "int": int, "float": (int, float), "str": str}


@dataclasses.dataclass(frozen=True)
class Option:
    """One server flag an entry adds; ``default`` must reproduce stock behaviour."""

    name: str
    type: str
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if not self.name.startswith(FLAG_PREFIX) or self.name != self.name.lower():
            raise ValueError(f"option {self.name!r}: SpecPilot flags are lower-case and start with {FLAG_PREFIX}")
        if self.type not in OPTION_TYPES:
            raise ValueError(f"option {self.name}: type {self.type!r} is not one of {OPTION_TYPES}")
        if self.type == "choice":
            if not self.choices or self.default not in self.choices:
                raise ValueError(f"option {self.name}: a choice option needs choices that include its default")
        elif self.type == "bool":
            # argparse exposes bools as store_true: only a False default can be left unset.
            if self.default is not False:
                raise ValueError(f"option {self.name}: a bool option must default to False")
        elif self.default is not None and (
            isinstance(self.default, bool) or not isinstance(self.default, _PYTHON_TYPES[self.type])
        ):
            raise ValueError(f"option {self.name}: default {self.default!r} is not a {self.type}")

    @property
    def field(self) -> str:
        """The ``ServerArgs`` attribute argparse stores the flag under."""
        return self.name[2:].replace("-", "_")

    def as_record(self) -> dict[str, Any]:
        """The option as an entry record's ``options`` item (``specpilot_mem.models.Option``)."""
        record = {"name": self.name, "type": self.type, "default": self.default, "help": self.help}
        if self.choices is not None:
            record["choices"] = list(self.choices)
        return record


@dataclasses.dataclass(frozen=True)
class EntrySpec:
    """What one entry contributes: its flags and the quantization methods it registers."""

    id: str
    options: tuple[Option, ...] = ()
    # quantization method name -> "module.path:ConfigClass"
    quantization: Mapping[str, str] = dataclasses.field(default_factory=dict)


def module_name(entry_id: str) -> str:
    return entry_id.replace("-", "_")


@functools.cache
def discover() -> dict[str, EntrySpec]:
    """Every entry module under ``sglang.srt.specpilot.entries``, by entry id, checked for clashes."""
    from sglang.srt.specpilot import entries

    specs: dict[str, EntrySpec] = {}
    owner_of_flag: dict[str, str] = {}
    owner_of_method: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(entries.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{entries.__name__}.{info.name}")
        spec = getattr(module, "ENTRY", None)
        if not isinstance(spec, EntrySpec):
            raise TypeError(f"{module.__name__} must define ENTRY = EntrySpec(...)")
        if module_name(spec.id) != info.name:
            raise ValueError(f"{module.__name__} declares entry {spec.id!r}; its module must be named {module_name(spec.id)}.py")
        for option in spec.options:
            if option.name in owner_of_flag:
                raise ValueError(f"flag {option.name} is declared by both {owner_of_flag[option.name]} and {spec.id}")
            owner_of_flag[option.name] = spec.id
        for method in spec.quantization:
            if method in owner_of_method:
                raise ValueError(f"quantization method {method!r} is declared by both {owner_of_method[method]} and {spec.id}")
            owner_of_method[method] = spec.id
        specs[spec.id] = spec
    return specs


def all_options() -> list[Option]:
    return [option for spec in discover().values() for option in spec.options]


def quantization_methods() -> dict[str, str]:
    """Quantization method name -> dotted path of its ``QuantizationConfig`` class."""
    return {name: path for spec in discover().values() for name, path in spec.quantization.items()}


def register_quantization_methods(*registries: dict) -> None:
    """Add every entry's quantization config class to SGLang's method registries (in place)."""
    for name, path in quantization_methods().items():
        module_path, _, class_name = path.partition(":")
        config_class = getattr(importlib.import_module(module_path), class_name)
        for registry in registries:
            if name in registry and registry[name] is not config_class:
                raise ValueError(f"quantization method {name!r} already names {registry[name].__name__} in SGLang")
            registry[name] = config_class


def option_value(flag: str) -> Any:
    """The value a running server resolved for one SpecPilot flag (read from the published config)."""
    from sglang.srt.runtime_context import get_context

    option = next((o for o in all_options() if o.name == flag), None)
    if option is None:
        raise KeyError(f"no SpecPilot entry declares the flag {flag}")
    return getattr(get_context().config_bag("specpilot"), option.field)
