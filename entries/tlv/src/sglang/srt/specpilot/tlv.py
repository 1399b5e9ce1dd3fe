"""Two-level verification (``tlv``) in DFlash's tree step: a Q pass over the W12 8-bit view, one exact pass.

With ``--specpilot-tlv`` (and ``--quantization w12``, ``--specpilot-tree-nodes N``) a decode step is a cycle:

1. draft a block from the pending token, build each request's best-first tree T1 (dflash-tree's ``TreeStep``);
2. the **Q pass**: the target verifies T1 with every W12 layer reading the 8-bit view of its own record (no copy:
   ``w12_fp8_qpass_gemm`` feeds the ``W12MmaTensor`` the exact GEMM reads to the FP8 tensor cores, or the Triton
   ``w12_qpass_gemm`` reads it into BF16 MMAs; ``--specpilot-tlv-qpass``) and RadixAttention storing no key or value; no
   recurrent state is committed (the GDN verify scratch it fills is rewritten by the exact pass before the commit
   reads it). Its argmax accepted along T1 gives the chain C (the path and the Q bonus);
3. the Q pass's hidden states along C go into the *draft* KV at C's window slots, and the drafter drafts a second
   block from C's end; its best-first subtree, truncated to N - |C| nodes, hangs below C;
4. the **exact pass** verifies the combined N-node tree and accepts its longest matching path plus the bonus,
   committing as dflash-tree does (recurrent state along the path, KV window reordered, draft KV of the committed
   columns). Only this pass accepts tokens, so the output is the target's greedy decode whatever the Q pass says.

Eager only (no CUDA graphs), greedy requests only, as dflash-tree; never run end to end (no SGLang runtime on the
GPU machine here): its parts are tested on the CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang.srt.specpilot.dflash_tree import TreeDecoder, TreeStep, permute_window_slots, unwrap_head
from sglang.srt.specpilot.kernels.draft_tree import DraftTree, best_first_tree, verify_layout
from sglang.srt.specpilot.kernels.w12 import W12MmaTensor, W12Tensor, qpass_linear
from sglang.srt.specpilot.kernels.w12.int8_copy import Int8Copy, int8_qpass_gemm, int8_weight_reference
from sglang.srt.specpilot.kernels.w12.format import CONVERT_COMMAND, SUPPORTED_VERSIONS
from sglang.srt.specpilot.tlv_state import qpass_low_bits, qpass_mode

# Record versions whose 8-bit view reads as E4M3 times the row's window (the Q pass's weights).
QPASS_VIEW_VERSIONS = frozenset(SUPPORTED_VERSIONS)


QPASS_PRODUCTS = ("fp8", "bf16", "int8")  # --specpilot-tlv-qpass


def qpass_product(choice: str, on_cuda: bool, capability: tuple[int, int] | None, fragment_layout: bool) -> str:
    """The product a W12 layer's Q pass runs for ``--specpilot-tlv-qpass`` ``choice``: "int8" (its INT8 copy, the
    Triton INT8 GEMM), "fp8" (the 8-bit view on the FP8 tensor cores: CUDA sm_89+, the fragment layout), "bf16" (the
    view through the Triton BF16-MMA Q GEMM, also where "fp8" cannot run), or off the GPU "int8-reference" /
    "view-reference" (the copy's or the view's weights, decoded per call, nothing kept)."""
    if choice not in QPASS_PRODUCTS:
        raise ValueError(f"--specpilot-tlv-qpass {choice!r}: use one of {QPASS_PRODUCTS}")
    if not on_cuda:
        return "int8-reference" if choice == "int8" else "view-reference"
    if choice == "fp8" and not (fragment_layout and capability is not None and capability >= (8, 9)):
        return "bf16"
    return choice


def qpass_apply(w12: W12Tensor | W12MmaTensor, x: torch.Tensor, bias: torch.Tensor | None, low_bits: str,
                choice: str = "fp8", int8: Int8Copy | None = None) -> torch.Tensor:
    """A W12 layer's Q-pass product (``qpass_product``): from its own record's 8-bit view (no copy), or from its
    INT8 copy (``int8``, made at load with --specpilot-tlv-qpass int8)."""
    if choice == "int8" and int8 is None:
        raise ValueError("--specpilot-tlv-qpass int8: this W12 layer has no INT8 copy (it is made at load time)")
    capability = torch.cuda.get_device_capability(x.device) if x.is_cuda else None
    product = qpass_product(choice, x.is_cuda, capability, isinstance(w12, W12MmaTensor))
    flat = x.reshape(-1, x.shape[-1])
    flat = flat if flat.stride(-1) == 1 else flat.contiguous()
    if product == "int8":
        y = int8_qpass_gemm(flat, int8)
    elif product == "int8-reference":
        y = F.linear(flat, int8_weight_reference(int8).to(x.dtype))
    elif product == "fp8":
        from sglang.srt.specpilot.kernels.w12.qpass_fp8 import fp8_qpass_available, w12_fp8_qpass_gemm

        y = (w12_fp8_qpass_gemm if fp8_qpass_available(x.device) else _triton_view_gemm)(flat, w12, low_bits)
    elif product == "bf16" and isinstance(w12, W12MmaTensor):
        y = _triton_view_gemm(flat, w12, low_bits)
    else:
        y = qpass_linear(flat, w12, low_bits)
    y = y.reshape(*x.shape[:-1], w12.shape[0])
    return y if bias is None else y + bias


def _triton_view_gemm(flat: torch.Tensor, w12: W12MmaTensor, low_bits: str) -> torch.Tensor:
    from sglang.srt.specpilot.kernels.w12.qpass import w12_qpass_gemm

    return w12_qpass_gemm(flat, w12, low_bits)


def check_readable_views(model: torch.nn.Module) -> int:
    """Refuse, naming the layer and the conversion command, a W12 layer whose record predates a readable 8-bit
    view; returns the W12 layers checked."""
    checked = 0
    for name, module in model.named_modules():
        if getattr(module, "w12_layout", None) is None:
            continue
        version = getattr(module, "w12_version", None)
        if version not in QPASS_VIEW_VERSIONS:
            raise ValueError(f"--specpilot-tlv: W12 layer {name} holds a format-version {version} record, whose 8-bit "
                             f"view the Q pass cannot read (readable: versions {sorted(QPASS_VIEW_VERSIONS)}). Fix: "
                             f"re-convert the BF16 checkpoint: {CONVERT_COMMAND}")
        checked += 1
    return checked


def child_lists(parents: torch.Tensor, num_nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's retrieve_next_token / retrieve_next_sibling [B, N+1] (column 0 the root, node i at i + 1) of trees
    given by parents [B, N] (-1: child of the root), children linked in node order."""
    b, n = parents.shape
    dev = parents.device
    next_token = torch.full((b, n + 1), -1, dtype=torch.int64, device=dev)
    next_sibling = torch.full((b, n + 1), -1, dtype=torch.int64, device=dev)
    rows = torch.arange(b, device=dev)
    for i in range(n - 1, -1, -1):  # from the last node: each parent's list ends up in increasing order
        valid = i < num_nodes
        parent_col = torch.where(valid, parents[:, i] + 1, 0)
        first = next_token[rows, parent_col]
        next_sibling[:, i + 1] = torch.where(valid, first, next_sibling[:, i + 1])
        next_token[rows, parent_col] = torch.where(valid, i + 1, first)
    return next_token, next_sibling


def combined_tree(chain_tokens: torch.Tensor, chain_len: torch.Tensor, sub: DraftTree, sub_tokens: torch.Tensor,
                  nodes: int) -> tuple[DraftTree, torch.Tensor]:
    """C (chain_tokens [B, Dc], chain_len [B] >= 1) with the subtree ``sub`` (rooted at C's last token) below it,
    truncated to ``nodes`` nodes in all: (DraftTree [B, nodes], node tokens [B, nodes], -1 on padding). The subtree
    keeps its best-first order, so any prefix of it is a tree."""
    b, dc = chain_tokens.shape
    dev = chain_tokens.device
    node = torch.arange(nodes, device=dev)[None, :].expand(b, nodes)
    c = chain_len.to(torch.int64)[:, None]
    in_chain = node < c
    j = (node - c).clamp(min=0)
    ns = sub.parents.shape[1]
    jj = j.clamp(max=ns - 1)
    in_sub = (node >= c) & (j < sub.num_nodes[:, None]) & (j < ns)
    sub_parent = torch.gather(sub.parents, 1, jj)
    parents = torch.where(in_chain, node - 1, torch.where(sub_parent < 0, c - 1, c + sub_parent))
    depths = torch.where(in_chain, node + 1, c + torch.gather(sub.depths, 1, jj))
    tokens = torch.where(in_chain, torch.gather(chain_tokens, 1, node.clamp(max=dc - 1)), torch.gather(sub_tokens, 1, jj))
    valid = in_chain | in_sub
    tree = DraftTree(
        parents=torch.where(valid, parents, -1), depths=torch.where(valid, depths, 0),
        ranks=torch.where(in_sub, torch.gather(sub.ranks, 1, jj), -1),
        scores=torch.where(in_sub, torch.gather(sub.scores, 1, jj), torch.where(in_chain, 0.0, float("-inf"))),
        num_nodes=valid.sum(1))
    return tree, torch.where(valid, tokens, -1)


def q_chain(step: TreeStep, q_predict: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chain C of each request from the Q pass's argmax q_predict [B, N+1] over T1: (tokens [B, D+1] — the
    accepted path's tokens then the Q bonus, padding after —, lengths [B] = accepted + 1, the Q acceptance's
    accept_columns [B, D+1])."""
    acceptance = step.accept(q_predict)
    tokens, lengths = step.commit_tokens(acceptance)
    depth = acceptance.accept_columns.shape[1]
    return tokens[:, :depth], lengths.to(torch.int64), acceptance.accept_columns


class TlvDecoder(TreeDecoder):
    """dflash-tree's decode step as a TLV cycle (``decode``); built by ``DFlashWorkerV2`` when --specpilot-tlv."""

    @classmethod
    def from_worker(cls, worker) -> "TlvDecoder | None":
        from sglang.srt.specpilot import option_value

        if not option_value("--specpilot-tlv"):
            return None
        tree = TreeDecoder.from_worker(worker)  # the tree settings and dflash-tree's start-up refusals
        if tree is None:
            raise ValueError("--specpilot-tlv needs --specpilot-tree-nodes N (the combined tree's budget)")
        settings = tree.settings
        need = settings.depth + settings.drafted_positions + 2
        if int(worker.block_size) < need:
            raise ValueError(f"--specpilot-tlv: the verify window ({worker.block_size} tokens) cannot hold C and the "
                             f"second draft block ({need}); SGLang's resolution should have widened it")
        check_readable_views(worker.target_worker.model_runner.model)
        decoder = cls(worker, settings)
        decoder.low_bits = option_value("--specpilot-tlv-low-bits")
        return decoder

    # -- the pieces of the cycle -------------------------------------------------------------------------

    def _draft_lattice(self, batch, block_ids, seq_lens, host_lens, slots):
        """The drafter's lattice for blocks ``block_ids`` [B, block] whose anchors sit at ``seq_lens`` [B], written
        into draft-KV ``slots`` [B, block]."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
        from sglang.srt.speculative.dflash_worker_v2 import _resolve_dflash_embedding_module, _selector_lattice
        from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        w = self.worker
        bs, block = block_ids.shape
        target_runner = w.target_worker.model_runner
        positions = (seq_lens[:, None].to(torch.int64) + torch.arange(block, device=w.device)[None, :]).reshape(-1)
        embed_module = _resolve_dflash_embedding_module(w.draft_model, target_runner.model)
        embeds = (torch.nn.functional.embedding(block_ids, w._full_embed_gpu) if w._full_embed_gpu is not None
                  else embed_module(block_ids))
        if w._noise_embed_scale != 1.0:
            embeds = embeds * w._noise_embed_scale
        flat_slots = slots.reshape(-1)
        plan = target_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices, seq_lens=seq_lens,
            seq_lens_cpu=None if host_lens is None else host_lens + block, write_virtual=flat_slots, read_extent=block)
        draft_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices, seq_lens=seq_lens, out_cache_loc=flat_slots,
            seq_lens_sum=int((host_lens + block).sum()) if host_lens is not None else int(seq_lens.sum()) + bs * block,
            seq_lens_cpu=None if host_lens is None else host_lens + block, positions=positions,
            input_embeds=embeds.view(-1, embeds.shape[-1]), spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=make_draft_block_spec_info(draft_token_num=block, device=w.device),
            capture_hidden_mode=CaptureHiddenMode.NULL, can_run_decode_cuda_graph=False)
        plan.bind(draft_batch, w.draft_model_runner.kv_index_translator)
        with torch.inference_mode():
            out = w.draft_model_runner.forward(draft_batch)
        hidden = out.logits_output.hidden_states.view(bs, block, -1)[:, 1:, :]
        if w.draft_model.lm_head is None:
            w.draft_model.lm_head = unwrap_head(target_runner.model)
        return _selector_lattice(w.draft_model, hidden, block_ids[:, 0])

    def _verify(self, batch, step: TreeStep, window_slots, prefix_lens, host_lens):
        """One target verify of ``step``'s columns over the window (the Q pass when run inside ``qpass_mode``)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput

        w, window = self.worker, self.window
        target_runner = w.target_worker.model_runner
        plan = target_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens,
            seq_lens_cpu=None if host_lens is None else host_lens + window, write_virtual=window_slots.reshape(-1),
            read_extent=window)
        verify_input = DFlashVerifyInput(
            draft_token=step.tokens.reshape(-1), positions=step.layout.positions.reshape(-1), draft_token_num=window,
            custom_mask=step.custom_mask(prefix_lens), capture_hidden_mode=CaptureHiddenMode.FULL, kv_loc_plan=plan)
        verify_input.retrieve_next_token = step.layout.retrieve_next_token
        verify_input.retrieve_next_sibling = step.layout.retrieve_next_sibling
        verify_input.specpilot_tree = True
        batch.out_cache_loc = window_slots.reshape(-1)
        backup = batch.seq_lens_cpu, batch.seq_lens_sum
        if host_lens is not None:
            batch.seq_lens_cpu = host_lens + window
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        verify_batch, _ = verify_input.prepare_for_verify(batch, w.target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = backup
        verify_batch.can_run_decode_cuda_graph = False
        return w.target_worker.forward_batch_generation(batch=None, forward_batch=verify_batch, is_verify=True,
                                                    skip_attn_backend_init=True)

    def _padded_step(self, tree: DraftTree, node_tokens: torch.Tensor, anchor: torch.Tensor, prefix_lens) -> TreeStep:
        """A TreeStep over the window's N + 1 columns from a tree given by its nodes."""
        next_token, next_sibling = child_lists(tree.parents, tree.num_nodes)
        tokens = torch.cat([anchor[:, None], torch.where(node_tokens >= 0, node_tokens, anchor[:, None])], dim=1)
        return TreeStep(tree, tokens, verify_layout(tree, next_token, next_sibling, prefix_lens.to(torch.int64)))

    # -- the cycle -----------------------------------------------------------------------------------------

    def decode(self, batch, draft_input, on_publish=None):
        from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
        from sglang.srt.managers.scheduler import GenerationBatchResult

        w, settings = self.worker, self.settings
        sampling_info = batch.sampling_info
        if not (sampling_info is None or sampling_info.is_all_greedy) or batch.has_grammar or batch.return_logprob:
            raise ValueError("tlv verifies greedy requests only (no sampling, grammar or log-probs); serve those "
                             "without --specpilot-tlv")
        if batch.mamba_track_indices is not None:
            raise ValueError("tlv does not cover mamba radix tracking; disable the radix cache for hybrid targets")
        bs, device, window, block = len(batch.seq_lens), w.device, self.window, self.draft_block
        prefix_lens = batch.seq_lens
        req_to_token = w.model_runner.req_to_token_pool.req_to_token
        target_runner = w.target_worker.model_runner
        window_slots = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices, req_to_token=req_to_token, start_offset=prefix_lens,
            end_offset=prefix_lens + window, batch_size=bs, draft_token_num=window, device=device).view(bs, window)
        host_lens = None if batch.seq_lens_cpu is None else batch.seq_lens_cpu
        anchor = draft_input.bonus_tokens.to(torch.int64)

        # 1) the first draft and its tree T1
        block_ids = torch.full((bs, block), int(w._mask_token_id), dtype=torch.int64, device=device)
        block_ids[:, 0] = anchor
        cand, scores = self._draft_lattice(batch, block_ids, prefix_lens, host_lens, window_slots[:, :block])
        first = TreeStep.build(settings, cand, scores, anchor, prefix_lens)

        # 2) the Q pass over T1: no KV stored, no state committed; its argmax gives C
        with qpass_mode(self.low_bits):
            q_out = self._verify(batch, first, window_slots, prefix_lens, host_lens)
        q_logits = q_out.logits_output
        chain_tokens, chain_len, q_columns = q_chain(first, q_logits.next_token_logits.argmax(dim=-1).view(bs, window))

        # 3) C's Q hidden states into the draft KV at C's window slots, the second draft from C's end
        q_hidden = q_logits.hidden_states.view(bs, window, -1)
        path = torch.where(q_columns >= 0, q_columns, 0)
        along = torch.gather(q_hidden, 1, path[:, :, None].expand(-1, -1, q_hidden.shape[-1]))
        c_slots = window_slots[:, : along.shape[1]]
        c_plan = target_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens,
            seq_lens_cpu=None if host_lens is None else host_lens + along.shape[1], write_virtual=c_slots.reshape(-1),
            read_extent=along.shape[1])
        c_loc = w._draft_write_ids(c_plan)
        w._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=along.reshape(-1, along.shape[-1]), cache_loc=c_loc, cache_loc_2d=c_loc.view(bs, -1),
            positions=(prefix_lens[:, None].to(torch.int64) + torch.arange(along.shape[1], device=device)[None, :]).reshape(-1),
            commit_lens=chain_len.to(torch.int32))
        anchor_at = prefix_lens + chain_len.to(prefix_lens.dtype)  # C's last token (the Q bonus) sits here
        second_ids = torch.full((bs, block), int(w._mask_token_id), dtype=torch.int64, device=device)
        second_ids[:, 0] = torch.gather(chain_tokens, 1, (chain_len - 1)[:, None])[:, 0]
        offsets = chain_len[:, None] + torch.arange(block, device=device)[None, :]
        second_slots = torch.gather(window_slots, 1, offsets)
        second_host = None if host_lens is None else host_lens + chain_len.cpu().to(host_lens.dtype)
        cand2, scores2 = self._draft_lattice(batch, second_ids, anchor_at, second_host, second_slots)
        sub, sub_tokens, _, _ = best_first_tree(scores2, cand2, max(1, settings.nodes - 1), settings.depth)

        # 4) the exact pass over C + the subtree, then dflash-tree's commit
        tree, node_tokens = combined_tree(chain_tokens, chain_len, sub, sub_tokens, settings.nodes)
        step = self._padded_step(tree, node_tokens, anchor, prefix_lens)
        target_out = self._verify(batch, step, window_slots, prefix_lens, host_lens)
        logits_output = target_out.logits_output
        acceptance = step.accept(logits_output.next_token_logits.argmax(dim=-1).view(bs, window))
        out_tokens, commit_lens = step.commit_tokens(acceptance)
        new_seq_lens = prefix_lens + commit_lens.to(prefix_lens.dtype)
        if w._need_mamba_verify_commit:
            deepest = acceptance.accept_columns.gather(1, acceptance.accept_length[:, None])[:, 0]
            target_runner.attn_backend.update_mamba_state_after_mtp_verify(
                last_correct_step_indices=deepest, mamba_track_indices=None, mamba_steps_to_track=None,
                model=target_runner.model, req_pool_indices=batch.req_pool_indices[:bs])
        if on_publish is not None:
            on_publish(new_seq_lens)
        order = step.commit_order(acceptance)
        committed_slots = permute_window_slots(req_to_token, batch.req_pool_indices, prefix_lens, order)
        target_hidden = logits_output.hidden_states.view(bs, window, -1)
        ordered_hidden = torch.gather(target_hidden, 1, order[:, :, None].expand(-1, -1, target_hidden.shape[-1]))
        commit_plan = target_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens,
            seq_lens_cpu=None if host_lens is None else host_lens + window, write_virtual=committed_slots.reshape(-1),
            read_extent=window)
        cache_loc = w._draft_write_ids(commit_plan)
        w._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=ordered_hidden.reshape(-1, ordered_hidden.shape[-1]), cache_loc=cache_loc,
            cache_loc_2d=cache_loc.view(bs, window),
            positions=(prefix_lens[:, None].to(torch.int64) + torch.arange(window, device=device)[None, :]).reshape(-1),
            commit_lens=commit_lens)
        logits_output.hidden_states = None
        return GenerationBatchResult(
            logits_output=logits_output, next_token_ids=out_tokens.reshape(-1), accept_lens=commit_lens,
            can_run_cuda_graph=False,
            next_draft_input=w._make_next_draft_input_decode(bonus_tokens=acceptance.bonus, new_seq_lens=new_seq_lens),
            speculative_num_draft_tokens=window, new_seq_lens=new_seq_lens,
            routed_experts_output=target_out.routed_experts_output, indexer_topk_output=target_out.indexer_topk_output)


__all__ = ["QPASS_PRODUCTS", "QPASS_VIEW_VERSIONS", "TlvDecoder", "check_readable_views", "child_lists",
           "combined_tree", "q_chain", "qpass_apply", "qpass_low_bits", "qpass_mode", "qpass_product"]
