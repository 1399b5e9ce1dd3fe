"""Prompt admission (``prompt-admission``): a middle chunk of SGLang's chunked prefill rides in dflash-tree's
shared-budget verify step, so one weight stream serves decoding and prefill.

SGLang splits a long prompt into chunks (``--chunked-prefill-size``) and runs each as a prefill batch of its own
before the next decode step: every request in flight waits for it. With ``--specpilot-prompt-admission`` the
scheduler hands a *middle* chunk of its chunked request to the decode step instead (``hand_off``; never the
prompt's last chunk, which samples the request's first token as stock does), when the chunk is at most the
segment (``--specpilot-prompt-segment``, default the chunked-prefill size) and riding is estimated to lose fewer
tokens than the prefill batch (``admits``). In the step the chunk is one more request of the ragged verify
(``MixedVerify``): its known prompt tokens as a chain (positions start + i; mask: its cached prefix and the
chunk's causal rows), after the decoding requests' trees. Its rows take the place of the shared budget's lowest
nodes (``make_room``), so the pass verifies the rows the budget gives and costs what it would have. Its
"acceptance" is the whole chunk: the verify wrote its keys and values into the slots the scheduler allocated for
it (the non-hybrid targets of shared-budget keep no recurrent state), and its hidden rows go into the drafter's
KV as a prefill's would.

Whether a chunk rides (``admits``) is the project's ``specpilot_mem.batching.admission.PromptAdmission.
admitted_prompts`` for one prompt in chain form, the rows taken from the budget's nodes (the step costs the same,
``dearer_ms = 0``), which the entry's tests compare with: riding, the chunk's request waits one step for its rows
(ceil(S / spare) slot-steps) and its S rows displace nodes worth ``row_value`` expected tokens each (the last
step's lowest kept nodes' path probabilities), in units of ``tau`` (tokens per request per step, a decaying
mean); prefilled, every request in flight and the chunk's own wait for the prefill pass (``prefill_ms /
step_ms`` steps: c(S) / c(R) on the shared budget's measured curve, 1 with a fixed budget and no curve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sglang.srt.specpilot.batching_checks.prompt_admission import ADMISSION_FLAG, SEGMENT_FLAG, admission_settings
from sglang.srt.specpilot.batching_checks.shared_budget import BudgetSettings
from sglang.srt.specpilot.dflash_tree import TreeStep
from sglang.srt.specpilot.shared_budget import RaggedTreeVerify, compact_step, shared_take

DECAY = 0.9  # of the tokens-per-request mean per step


def admits(rows: int, spare: int, requests: int, tau: float, row_value: float, step_ms: float,
           prefill_ms: float) -> bool:
    """Whether a chunk of ``rows`` prompt rows rides in the step rather than in a prefill batch (module docstring).

    Args:
        rows: the chunk's rows; spare: the rows the step can give it (the budget's nodes); requests: decoding
        requests in the step; tau: tokens per request per step; row_value: expected tokens of a displaced node;
        step_ms, prefill_ms: the step's verify pass and the chunk's own prefill pass.
    """
    if spare <= 0 or rows <= 0 or rows > spare:
        return False
    riding = math.ceil(rows / spare) + rows * row_value / max(tau, 1e-9)
    return riding < (requests + 1) * prefill_ms / step_ms


@dataclass
class Segment:
    """A prompt chunk riding in one verify step.

    pool_index: the request's ``req_to_token`` row; start: its prompt tokens already in the KV cache; tokens [S]
    int64: the chunk; slots [S] int64: the KV slots the scheduler allocated for it (``req_to_token[pool_index,
    start:start + S]``)."""

    pool_index: int
    start: int
    tokens: torch.Tensor
    slots: torch.Tensor

    @property
    def rows(self) -> int:
        return int(self.tokens.numel())


def make_room(step: TreeStep, anchor_tokens: torch.Tensor, prefix_lens: torch.Tensor, rows: int) -> TreeStep:
    """The step's trees without their ``rows`` globally lowest nodes (the shares stay best-first prefixes, so each is
    still a tree; every root stays)."""
    kept = int(step.tree.num_nodes.sum())
    return compact_step(step, shared_take(step.tree.scores, max(kept - rows, 0)), anchor_tokens, prefix_lens)


def segment_mask(start: int, rows: int, device) -> torch.Tensor:
    """[rows * (start + rows)] bool, SGLang's flat verify mask of a chunk: each row sees the cached prefix and the
    chunk's rows up to itself."""
    causal = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
    return torch.cat([torch.ones(rows, start, dtype=torch.bool, device=device), causal], dim=1).reshape(-1)


@dataclass
class MixedVerify:
    """A step's ragged trees with a prompt chunk as one more request after them (SGLang's ``RaggedVerifyLayout``
    order): the verify batch's tensors, and the split of its outputs.

    decode: the trees' ``RaggedTreeVerify``; slots [T] int64: every packed row's KV slot (the trees' window slots,
    then the chunk's); verify_lens [B + 1]; tokens, positions [T]; custom_mask: the flat mask;
    req_pool_indices, seq_lens [B + 1] (the chunk's prefix is its cached tokens); read_extent: how far past
    ``seq_lens`` the verify reads (the window, or the chunk's rows)."""

    decode: RaggedTreeVerify
    segment: Segment
    slots: torch.Tensor
    verify_lens: torch.Tensor
    tokens: torch.Tensor
    positions: torch.Tensor
    custom_mask: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    read_extent: int

    @classmethod
    def build(cls, decode: RaggedTreeVerify, decode_slots: torch.Tensor, req_pool_indices: torch.Tensor,
              prefix_lens: torch.Tensor, segment: Segment, window: int) -> "MixedVerify":
        dev, rows = decode.tokens.device, segment.rows
        tokens = segment.tokens.to(device=dev, dtype=decode.tokens.dtype)
        positions = segment.start + torch.arange(rows, device=dev, dtype=decode.positions.dtype)
        lens = torch.cat([decode.verify_lens, decode.verify_lens.new_tensor([rows])])
        return cls(decode, segment, torch.cat([decode_slots, segment.slots.to(dev, decode_slots.dtype)]), lens,
                   torch.cat([decode.tokens, tokens]), torch.cat([decode.positions, positions]),
                   torch.cat([decode.custom_mask, segment_mask(segment.start, rows, dev)]),
                   torch.cat([req_pool_indices, req_pool_indices.new_tensor([segment.pool_index])]),
                   torch.cat([prefix_lens, prefix_lens.new_tensor([segment.start])]), max(int(window), rows))

    @property
    def decode_rows(self) -> int:
        return int(self.decode.verify_lens.sum())

    def split(self, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the trees' packed rows, the chunk's rows) of the verify's [T, ...] outputs."""
        return packed[: self.decode_rows], packed[self.decode_rows :]

    def unpack(self, packed: torch.Tensor, fill=0) -> torch.Tensor:
        """[B, N + 1, ...] of the trees' rows (``RaggedTreeVerify.unpack``); the chunk's rows are dropped."""
        return self.decode.unpack(self.split(packed)[0], fill)

    def layout(self, device):
        """SGLang's ``RaggedVerifyLayout`` of the B + 1 lengths."""
        from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

        lens = self.verify_lens.tolist()
        return RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=lens, device=device, grid=[sum(lens)])

    def enter(self, batch) -> None:
        """Put the chunk into the batch as its last request for the verify forward (``leave`` restores it)."""
        self._saved = (batch.req_pool_indices, batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum)
        batch.req_pool_indices, batch.seq_lens = self.req_pool_indices, self.seq_lens
        if batch.seq_lens_cpu is not None:
            batch.seq_lens_cpu = self.seq_lens.to("cpu")
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())

    def leave(self, batch) -> None:
        batch.req_pool_indices, batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = self._saved


class PromptAdmission:
    """The server's admission state: the settings, the step's budget (``BudgetSettings``), a decaying mean of
    tokens per request per step and the last step's lowest kept node probability (both 0-dim device tensors,
    read on the host only when the scheduler decides, after the step's results are on the host anyway)."""

    def __init__(self, settings, budget: BudgetSettings):
        self.settings, self.budget = settings, budget
        self.tau = self.tail = None

    @classmethod
    def from_worker(cls, worker, tree_settings, budget: BudgetSettings | None) -> "PromptAdmission | None":
        """None with the flags unset (stock prefill batches)."""
        from sglang.srt.specpilot import option_value

        server_args = worker.target_worker.model_runner.server_args
        settings = admission_settings(option_value(ADMISSION_FLAG), option_value(SEGMENT_FLAG), budget=budget,
                                      nodes=tree_settings.nodes,
                                      max_running_requests=getattr(server_args, "max_running_requests", None))
        return None if settings is None else cls(settings, budget)

    def segment_limit(self, chunked_prefill_size) -> int:
        """The most rows one chunk may have to ride."""
        return self.settings.segment if self.settings.segment is not None else int(chunked_prefill_size)

    def observe(self, commit_lens: torch.Tensor, step: TreeStep) -> None:
        """After a verify: the tokens the decoding requests committed, and the step's kept nodes' scores."""
        tau = commit_lens.float().mean()
        self.tau = tau if self.tau is None else DECAY * self.tau + (1 - DECAY) * tau
        scores = step.tree.scores[torch.isfinite(step.tree.scores)]
        self.tail = scores.min().exp() if scores.numel() else torch.zeros((), device=commit_lens.device)

    def write_draft_kv(self, worker, target_runner, segment: Segment, hidden: torch.Tensor) -> None:
        """The chunk's target hidden rows [S, H] into the drafter's KV at its slots (DFlash's prefill write)."""
        dev = hidden.device
        plan = target_runner.kv_index_translator.plan(
            req_pool_indices=torch.tensor([segment.pool_index], device=dev),
            seq_lens=torch.tensor([segment.start], device=dev), seq_lens_cpu=None,
            write_virtual=segment.slots.to(dev), read_extent=segment.rows)
        worker._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden, cache_loc=worker._draft_write_ids(plan),
            positions=segment.start + torch.arange(segment.rows, device=dev),
            extend_lens=torch.tensor([segment.rows], dtype=torch.int32, device=dev))

    def decide(self, rows: int, requests: int) -> bool:
        """Whether a chunk of ``rows`` rows rides in the next step of ``requests`` decoding requests (host)."""
        if self.tau is None or requests < 1:
            return False  # no step yet: nothing decodes beside the prompt
        budget_rows = self.budget.rows_for(requests)
        curve = self.budget.curve
        step_ms, prefill_ms = (1.0, 1.0) if curve is None else (_at(curve, budget_rows), _at(curve, rows))
        return admits(rows, budget_rows - requests, requests, float(self.tau), float(self.tail), step_ms, prefill_ms)


def _at(curve, rows: int) -> float:
    """c(rows) of a measured curve (what the next measured count costs; past the last, in proportion)."""
    env = curve.envelope
    for count, ms in zip(curve.rows, env):
        if count >= rows:
            return ms
    return env[-1] * rows / curve.rows[-1]


def hand_off(scheduler, new_batch, running_batch):
    """The scheduler's choice between a prefill batch and the decode step (``Scheduler.get_next_batch_to_run``):
    returns the batch to run instead of ``new_batch`` — None where ``new_batch`` is a middle chunk of the chunked
    request that rides in the running decode batch (set as ``running_batch.specpilot_segment``), else
    ``new_batch`` unchanged (stock)."""
    tree = getattr(getattr(scheduler, "draft_worker", None), "_specpilot_tree", None)
    admission = getattr(tree, "admission", None)
    if admission is None or running_batch is None:
        return new_batch  # flag unset: stock, nothing touched
    running_batch.specpilot_segment = None
    if new_batch is None or running_batch.is_empty():
        return new_batch
    req = scheduler.chunked_req
    if req is None or len(new_batch.reqs) != 1 or new_batch.reqs[0] is not req:
        return new_batch  # only the chunked request's own chunk rides; new prompts and last chunks prefill
    start, end = int(req.prefix_len), int(req.extend_end)
    rows = end - start
    if rows <= 0 or end >= len(req.origin_input_ids):
        return new_batch  # the last chunk samples the first token: a prefill batch, as stock
    if rows > admission.segment_limit(scheduler.chunked_prefill_size):
        return new_batch
    if not admission.decide(rows, running_batch.batch_size()):
        return new_batch
    slot = int(req.kv.req_pool_idx)
    pool = scheduler.req_to_token_pool.req_to_token
    running_batch.specpilot_segment = Segment(slot, start, new_batch.input_ids.to(torch.int64),
                                              pool[slot, start:end].to(torch.int64))
    req.inflight_middle_chunks -= 1  # what the prefill result of a middle chunk would have done
    return None
