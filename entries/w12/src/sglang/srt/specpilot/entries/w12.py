"""The ``w12`` entry: lossless 12-bit weights for every decoder linear layer (``--quantization w12``)."""

from sglang.srt.specpilot import EntrySpec, Option

ENTRY = EntrySpec(
    id="w12",
    options=(
        Option(
            "--specpilot-w12-lm-head",
            "bool",
            False,
            "With --quantization w12: convert the (untied) LM head to W12 as well.",
        ),
    ),
    quantization={"w12": "sglang.srt.specpilot.w12_method:W12Config"},
)
