"""Config fields of the ``specpilot`` namespace: the flags SpecPilot entries declare.

The fields are not written here: each entry declares its options in its own module under
``sglang/srt/specpilot/entries/`` and this namespace is built from them at import, so two entries
never touch the same lines. With no flag given, every field keeps the default that reproduces stock.
"""

from __future__ import annotations

from typing import Literal, Optional

import msgspec

from sglang.srt.arg_groups.arg_utils import A, Arg
from sglang.srt.arg_groups.choices import (
    QUANTIZATION_CHOICES,
    add_quantization_method_choices,
)
from sglang.srt.specpilot import Option, all_options, quantization_methods

_SCALAR_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def _annotation(option: Option):
    if option.type == "choice":
        value_type = Literal[tuple(option.choices)]
    else:
        value_type = _SCALAR_TYPES[option.type]
    if option.default is None:
        value_type = Optional[value_type]
    return A[value_type, Arg(help=option.help)]


SpecPilot = msgspec.defstruct(
    "SpecPilot",
    [(option.field, _annotation(option), option.default) for option in all_options()],
    namespace={"_NS_PATH": "specpilot", "__doc__": "Namespace ``specpilot``."},
    module=__name__,
)

# ``--quantization`` lists the weight formats entries register (the registry itself is filled
# where SGLang builds it, in ``layers/quantization/__init__.py``).
add_quantization_method_choices(
    [name for name in quantization_methods() if name not in QUANTIZATION_CHOICES]
)
