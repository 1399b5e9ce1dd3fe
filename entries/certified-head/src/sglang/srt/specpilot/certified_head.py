"""The certified LM head inside SGLang's logits processor, eager and under CUDA graphs.

With ``--specpilot-certified-head``, a target forward whose batch only needs the argmax of the LM
head (every request greedy, no log-probs, no logit bias, grammar or penalty; plain decode or
speculative verify, never a draft model) skips the BF16 head GEMM: the vendored certified head reads
an INT8 copy of the head, discards every vocabulary row whose Cauchy-Schwarz upper bound is below the
best lower bound, rescores the survivors exactly and, for a row whose survivors overflow their
fixed-size list, recomputes the full exact head in the same launches (``certified_argmax_in_graph``).
The logits processor then carries one-hot logits (0 at the argmax, -inf elsewhere), so the sampler's
argmax, and everything after it, sees the same token.

No step synchronises with the host or has a data-dependent shape, so the target's decode and verify
graphs are captured with it: the decode graph runner marks its capture batch as argmax-only
(:func:`certified_graphs`) and replays those graphs only for batches that read the argmax alone
(:func:`replay_allowed`); any other target batch runs eager with the stock head. The INT8 copy and the
fallback's scratch are built at the first eligible forward (the capture's eager warm-up at the latest)
and shared by every captured size, whose graphs replay one at a time on one stream.

Forwards of more than 32 rows (a decode batch of more than 32 requests, a verify of more than 32 tokens
in all) keep the stock head: each 32-row call streams the whole INT8 copy, so two calls already read as
many bytes as the BF16 head.

The token is the argmax of the exact FP32-accumulated head (lowest index on ties). Stock SGLang
takes the argmax of BF16-rounded logits, so the two can differ only where the top logits round to
the same BF16 value: lossless at the token-forcing level, not bit-identical to stock. With a
vocabulary-sharded head, an FP32 head, LoRA on the head, an embedding bias or a hidden size that is
not a multiple of 256, the stock head runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang.srt.specpilot import option_value
from sglang.srt.specpilot.kernels.certified_head import CertifiedHead, certified_argmax_in_graph, quantize_head
from sglang.srt.specpilot.kernels.certified_head.head import MAX_ROWS

FLAG = "--specpilot-certified-head"
# The INT8 pass's default K tile; the kernels do not mask a partial tile, so the hidden size must be a
# multiple of it (5120, 4096, 3584, 2048 are; 896 is not and keeps the stock head).
K_TILE = 256
# Survivor-list capacity per row: a row with more survivors takes the in-graph full exact head.
MAX_SURVIVORS = 4096


def argmax_only(forward_batch) -> bool:
    """Whether this forward's logits are read only through their argmax (decided once per batch)."""
    if getattr(forward_batch, "specpilot_capture_argmax_only", False):
        return True  # a target graph's capture batch: replayed only where this holds (replay_allowed)
    mode = forward_batch.forward_mode
    if not (mode.is_target_verify() or (mode.is_decode() and getattr(forward_batch, "spec_info", None) is None)):
        return False  # prefill, draft models and anything else keep full logits
    info = getattr(forward_batch, "sampling_info", None)
    # A draft worker's block forward in TARGET_VERIFY mode (DFlash, DSpark, UNO) is built without sampling_info
    # and so stops here (its models' heads do not run through a LogitsProcessor either); its graph runner never
    # captures the certified head (certified_graphs).
    if forward_batch.return_logprob or info is None or not info.is_all_greedy:
        return False
    if info.logit_bias is not None or any(g is not None for g in (info.grammars or ())):
        return False
    orchestrator = info.penalizer_orchestrator
    return orchestrator is None or not orchestrator.is_required


def head_eligible(processor, lm_head: torch.nn.Module, embedding_bias: Optional[torch.Tensor] = None) -> bool:
    """Whether the certified head can stand in for this model's LM head (else the stock head runs)."""
    weight = getattr(lm_head, "weight", None)
    return not (
        embedding_bias is not None
        or weight is None
        or weight.dtype != torch.bfloat16
        or weight.shape[1] % K_TILE
        or processor.do_tensor_parallel_all_gather
        or processor.use_fp32_lm_head
        or hasattr(lm_head, "set_lora")
    )


def certified_graphs(model_runner, capture_forward_mode) -> bool:
    """Whether a decode graph runner captures its graphs with the certified head: the flag is on, the
    runner serves the target model's decode or verify (never a draft worker) and the model's head is
    eligible (a model whose head or logits processor is not where SGLang's models keep them is assumed
    eligible: its full-logit batches then run eager, which is always correct)."""
    if getattr(model_runner, "is_draft_worker", False):
        return False
    if not (capture_forward_mode.is_decode() or capture_forward_mode.is_target_verify()):
        return False
    if not option_value(FLAG):
        return False
    model = getattr(model_runner, "model", None)
    processor, lm_head = getattr(model, "logits_processor", None), getattr(model, "lm_head", None)
    return processor is None or lm_head is None or head_eligible(processor, lm_head)


def replay_allowed(certified: bool, forward_batch) -> bool:
    """Whether a batch may replay a graph; graphs captured with the certified head carry one-hot logits,
    so only batches that read the argmax alone may replay them."""
    return not certified or argmax_only(forward_batch)


@dataclass
class CertifiedState:
    """What the certified head reads besides the hidden states, built once per head weight."""

    key: tuple
    head: CertifiedHead
    fallback: torch.Tensor  # [MAX_ROWS, vocab] fp32: the in-graph exact head's logits for overflowing rows


def certified_copy(lm_head: torch.nn.Module, vocab_size: int) -> CertifiedState:
    """The head's INT8 copy and fallback scratch, built on first use and rebuilt if the weight is
    replaced or updated (never inside a CUDA-graph capture: the capture's warm-up builds them)."""
    weight = lm_head.weight
    key = (weight.data_ptr(), weight._version, vocab_size)
    cached = getattr(lm_head, "_specpilot_certified", None)
    if cached is None or cached.key != key:
        if weight.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "certified head: the INT8 copy of the LM head is built outside CUDA-graph capture; run one eager "
                "forward (SGLang's capture warm-up does) before capturing, or unset --specpilot-certified-head"
            )
        # Only the real vocabulary: padded rows are zero and must never win the argmax. The in-graph
        # fallback is the Triton exact head, which sums over all of K: the radius must cover that depth.
        real = weight.data[:vocab_size]
        cached = CertifiedState(
            key=key,
            head=quantize_head(real, exact_depth=real.shape[1]),
            fallback=torch.empty((MAX_ROWS, vocab_size), dtype=torch.float32, device=weight.device),
        )
        lm_head._specpilot_certified = cached
    return cached


def certified_argmax_logits(
    state: CertifiedState, hidden_states: torch.Tensor, width: int, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """One-hot FP32 logits [M, width]: 0 at each row's certified argmax, -inf elsewhere; written into
    ``out`` (the runner's shared logits buffer) where it is FP32 [M, width]. No host synchronisation."""
    x = hidden_states.to(torch.bfloat16).contiguous()
    tokens = torch.cat(
        [
            certified_argmax_in_graph(x[i : i + MAX_ROWS], state.head, state.fallback, max_survivors=MAX_SURVIVORS)
            for i in range(0, x.shape[0], MAX_ROWS)
        ]
    )
    if out is None or out.shape != (x.shape[0], width) or out.dtype != torch.float32:
        out = torch.empty((x.shape[0], width), dtype=torch.float32, device=x.device)
    return out.fill_(float("-inf")).scatter_(1, tokens[:, None], 0.0)


def certified_logits(
    processor,
    hidden_states: torch.Tensor,
    lm_head: torch.nn.Module,
    logits_metadata,
    embedding_bias: Optional[torch.Tensor],
    out: Optional[torch.Tensor] = None,
) -> Optional[torch.Tensor]:
    """The certified head's logits for this forward, or None where the stock head must run."""
    # Beyond one kernel call's rows each call streams the INT8 copy again: the BF16 head is cheaper.
    if not logits_metadata.specpilot_argmax_only or not 0 < hidden_states.shape[0] <= MAX_ROWS:
        return None
    if not option_value(FLAG):
        return None
    if not hidden_states.is_cuda or not head_eligible(processor, lm_head, embedding_bias):
        return None
    state = certified_copy(lm_head, processor.vocab_size)
    return certified_argmax_logits(state, hidden_states, lm_head.weight.shape[0], out=out)
