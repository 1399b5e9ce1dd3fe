"""The ``tlv`` entry: two-level verification in DFlash's tree step (a Q pass over the W12 8-bit view, one exact pass)."""

from sglang.srt.specpilot import EntrySpec, Option

ENTRY = EntrySpec(
    id="tlv",
    options=(
        Option(
            "--specpilot-tlv",
            "bool",
            False,
            "Two-level verification: a Q pass over the W12 8-bit view checks the draft tree (writing no KV cache "
            "or recurrent state) and yields the chain C, the drafter drafts again from C's end, and one exact pass "
            "verifies C and the new subtree (N nodes in all). Needs --quantization w12 and --specpilot-tree-nodes.",
        ),
        Option(
            "--specpilot-tlv-low-bits",
            "choice",
            "midpoint",
            "With --specpilot-tlv: the Q pass's 4 dropped mantissa bits, 'midpoint' (1000) or 'truncated' (0000).",
            choices=("midpoint", "truncated"),
        ),
        Option(
            "--specpilot-tlv-qpass",
            "choice",
            "fp8",
            "With --specpilot-tlv: the Q pass's product. 'fp8': the W12 8-bit view fed in place to the FP8 tensor "
            "cores, activations in E4M3 per token row (sm_89+; elsewhere 'bf16'); 'bf16': the view through the "
            "Triton BF16-MMA Q GEMM, activations as they are; 'int8': a per-channel INT8 copy of each W12 layer made "
            "at load (for GPUs where the view cannot feed the tensor cores well; costs 8 more bits a weight).",
            choices=("fp8", "bf16", "int8"),
        ),
    ),
)
