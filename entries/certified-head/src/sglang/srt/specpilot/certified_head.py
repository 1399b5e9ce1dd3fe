"""The certified LM head inside SGLang's logits processor.

With ``--specpilot-certified-head``, a target forward whose batch only needs the argmax of the LM
head (every request greedy, no log-probs, no logit bias, grammar or penalty; plain decode or
speculative verify, never a draft model) skips the BF16 head GEMM: the vendored certified head reads
an INT8 copy of the head, discards every vocabulary row whose Cauchy-Schwarz upper bound is below the
best lower bound, rescores the survivors exactly and falls back to the full head when too many
survive. The logits processor then carries one-hot logits (0 at the argmax, -inf elsewhere), so the
sampler's argmax, and everything after it, sees the same token.

The token is the argmax of the exact FP32-accumulated head (lowest index on ties). Stock SGLang
takes the argmax of BF16-rounded logits, so the two can differ only where the top logits round to
the same BF16 value: lossless at the token-forcing level, not bit-identical to stock.

It runs in eager forwards only: under CUDA-graph capture (and with a vocabulary-sharded head, an
FP32 head, an embedding bias or a hidden size that is not a multiple of 256) the stock head runs, because a captured graph is replayed for
batches whose sampling needs full logits.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.specpilot import option_value
from sglang.srt.specpilot.kernels.certified_head import CertifiedHead, certified_argmax, quantize_head
from sglang.srt.specpilot.kernels.certified_head.head import MAX_ROWS

FLAG = "--specpilot-certified-head"
# The INT8 pass's default K tile; the kernels do not mask a partial tile, so the hidden size must be a
# multiple of it (5120, 4096, 3584, 2048 are; 896 is not and keeps the stock head).
K_TILE = 256


def argmax_only(forward_batch) -> bool:
    """Whether this forward's logits are read only through their argmax (decided once per batch)."""
    mode = forward_batch.forward_mode
    if not (mode.is_target_verify() or (mode.is_decode() and getattr(forward_batch, "spec_info", None) is None)):
        return False  # prefill, draft models and anything else keep full logits
    info = getattr(forward_batch, "sampling_info", None)
    if forward_batch.return_logprob or info is None or not info.is_all_greedy:
        return False
    if info.logit_bias is not None or any(g is not None for g in (info.grammars or ())):
        return False
    orchestrator = info.penalizer_orchestrator
    return orchestrator is None or not orchestrator.is_required


def certified_copy(lm_head: torch.nn.Module, vocab_size: int) -> CertifiedHead:
    """The head's INT8 copy, built on first use and rebuilt if the weight is replaced or updated."""
    weight = lm_head.weight
    key = (weight.data_ptr(), weight._version, vocab_size)
    cached = getattr(lm_head, "_specpilot_certified", None)
    if cached is None or cached[0] != key:
        # Only the real vocabulary: padded rows are zero and must never win the argmax.
        cached = (key, quantize_head(weight.data[:vocab_size]))
        lm_head._specpilot_certified = cached
    return cached[1]


def certified_argmax_logits(head: CertifiedHead, hidden_states: torch.Tensor, width: int) -> torch.Tensor:
    """One-hot FP32 logits [M, width]: 0 at each row's certified argmax, -inf elsewhere."""
    x = hidden_states.to(torch.bfloat16)
    tokens = torch.cat([certified_argmax(x[i:i + MAX_ROWS].contiguous(), head)[0]
                        for i in range(0, x.shape[0], MAX_ROWS)])
    logits = torch.full((x.shape[0], width), float("-inf"), dtype=torch.float32, device=x.device)
    return logits.scatter_(1, tokens[:, None], 0.0)


def certified_logits(processor, hidden_states: torch.Tensor, lm_head: torch.nn.Module, logits_metadata,
                     embedding_bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The certified head's logits for this forward, or None where the stock head must run."""
    if not logits_metadata.specpilot_argmax_only or hidden_states.shape[0] == 0:
        return None
    if not option_value(FLAG):
        return None
    weight = getattr(lm_head, "weight", None)
    if (
        embedding_bias is not None
        or weight is None
        or weight.dtype != torch.bfloat16
        or weight.shape[1] % K_TILE
        or not hidden_states.is_cuda
        or torch.cuda.is_current_stream_capturing()
        or processor.do_tensor_parallel_all_gather
        or processor.use_fp32_lm_head
        or hasattr(lm_head, "set_lora")
    ):
        return None
    return certified_argmax_logits(certified_copy(lm_head, processor.vocab_size), hidden_states, weight.shape[0])
