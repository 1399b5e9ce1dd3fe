"""Server-argument checks of ``tlv``: ``--specpilot-tlv`` without what it needs is refused while SGLang parses its
arguments (``handle_speculative_decoding``), naming the missing flag and the fix. Imports nothing heavy."""

from __future__ import annotations


class TlvArgumentError(ValueError):
    """A two-level verification setting SGLang cannot serve; the message names the flag and the fix."""

    def __init__(self, flag: str, problem: str, fix: str):
        super().__init__(f"{flag}: {problem}. Fix: {fix}.")
        self.flag, self.problem, self.fix = flag, problem, fix


def check_server_args(server_args, tree_settings) -> bool:
    """True when two-level verification is on (and servable); False with ``--specpilot-tlv`` unset (stock).

    ``tree_settings``: dflash-tree's checked settings (None: no ``--specpilot-tree-nodes``)."""
    if not getattr(server_args, "specpilot_tlv", False):
        return False
    quantization = getattr(server_args, "quantization", None)
    if quantization != "w12":
        raise TlvArgumentError("--quantization", f"--specpilot-tlv reads the Q pass from the W12 8-bit view, but "
                               f"--quantization is {quantization!r}", "add --quantization w12 (or drop --specpilot-tlv)")
    if tree_settings is None:
        raise TlvArgumentError("--specpilot-tree-nodes", "--specpilot-tlv verifies a combined tree of N nodes and no "
                               "tree budget is given", "add --specpilot-tree-nodes N (e.g. 32)")
    backend = getattr(server_args, "attention_backend", None)
    if backend != "triton":
        raise TlvArgumentError("--attention-backend", f"the Q pass attends without storing keys, which the Triton "
                               f"backend's tree verify supports, not {backend!r}", "add --attention-backend triton")
    return True


def declare_tlv_resolution(server_args, tree_settings) -> None:
    """The verify window must also hold the second draft block after the longest Q chain: C (at most depth + 1
    tokens) then the drafted positions' block."""
    from sglang.srt.arg_groups.overrides import declare_resolution

    window = max(tree_settings.verify_tokens, tree_settings.depth + tree_settings.drafted_positions + 2)
    declare_resolution(server_args, "specpilot.tlv", speculative_num_draft_tokens=window)
