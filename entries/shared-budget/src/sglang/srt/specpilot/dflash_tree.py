"""Best-first draft trees for DFlash2 (``dflash-tree``): server-argument checks and the verify step's tensors.

With ``--specpilot-tree-nodes N`` a DFlash2 step drafts ``P`` positions, takes the selector lattice
(``CandidateSelector.compute_candidates`` top-K per position and ``build_lattice``'s pair scores
``score[b, e, p, c]`` of candidate c at position e given candidate p at e - 1), builds each request's
best-first tree of N nodes on the GPU (the vendored ``draft_tree`` kernel: log-softmax of the scores given
the node's parent, prefix-closed, depth <= ``--specpilot-tree-depth``), and verifies the root (the last
committed token) and the N nodes in one target pass through SGLang's tree path: a custom attention mask
(prefix + ancestors), positions root + depth, and the ``retrieve_next_token`` / ``retrieve_next_sibling``
lists the hybrid GDN backend turns into ``retrieve_parent_token`` (what ``gdn-tree`` consumes). Greedy
acceptance takes the longest matching root path plus the bonus; the accepted columns' KV slots move to the
front of the request's verify window in path order (their hidden states are what the draft KV gets) and the
rejected nodes' slots go back behind them, free for the next step.

Everything here is pure torch on SGLang's tensors; with the flags unset nothing of it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.srt.specpilot.kernels.draft_tree import (
    Acceptance,
    DraftTree,
    VerifyLayout,
    best_first_tree_layout,
    child_lists,
    greedy_accept,
    verify_layout,
)
from sglang.srt.specpilot.dflash_tree_args import DSPARK_TREE_CANDIDATES, TreeSettings

@dataclass
class TreeStep:
    """One verify step's trees for a batch: built from the lattice, laid out for the target's verify.

    tree: ``DraftTree`` [B, N]; tokens [B, N+1] int64 (column 0: the root/anchor token, padding columns carry
    the root token and are never accepted); layout: ``VerifyLayout`` (mask [B, N+1, N+1], positions, retrieve
    indices, parent columns).
    """

    tree: DraftTree
    tokens: torch.Tensor
    layout: VerifyLayout
    depth: int | None = None  # the deepest level the trees may have (bounds the acceptance walk)

    @classmethod
    def build(cls, settings: TreeSettings, candidate_ids: torch.Tensor, scores: torch.Tensor,
              anchor_tokens: torch.Tensor, prefix_lens: torch.Tensor, unary: torch.Tensor | None = None,
              kind: str = "selector") -> "TreeStep":
        """candidate_ids [B, P, K] and scores [B, P, K, K]: DFlash2's ``_selector_lattice`` (kind "selector"), or
        DSpark's ``markov_lattice`` pair with its unary [B, P, K] (kind "markov"); anchor_tokens [B]; prefix_lens
        [B] committed lengths (the anchor sits at position prefix_lens)."""
        tree, node_tokens, layout = best_first_tree_layout(scores, candidate_ids, settings.nodes, settings.depth,
                                                           unary=unary, kind=kind, root_positions=prefix_lens)
        return cls(tree, with_root(anchor_tokens, node_tokens), layout, settings.depth)

    @classmethod
    def from_tree(cls, tree: DraftTree, node_tokens: torch.Tensor, anchor_tokens: torch.Tensor,
                  prefix_lens: torch.Tensor) -> "TreeStep":
        """A step for a tree built elsewhere (a combined tree, a chain): ``tree`` [B, N] in topological order
        (parent < node), node_tokens [B, N] (-1 on padding)."""
        next_token, next_sibling = child_lists(tree.parents, tree.num_nodes)
        layout = verify_layout(tree, next_token, next_sibling, prefix_lens)
        return cls(tree, with_root(anchor_tokens, node_tokens), layout)

    def custom_mask(self, prefix_lens: torch.Tensor) -> torch.Tensor:
        """SGLang's flat target-verify mask (Triton / FlashInfer backends): per request, N+1 rows of
        [prefix_len True | the tree row], requests one after another."""
        b, cols, _ = self.layout.mask.shape
        prefix = prefix_lens.to(torch.int64)
        widths = prefix + cols  # per row
        row_start = torch.cumsum(torch.cat([prefix.new_zeros(1), (widths * cols)[:-1]]), 0)
        total = int((widths * cols).sum())
        out = torch.ones(total, dtype=torch.bool, device=self.layout.mask.device)
        rows = torch.arange(cols, device=out.device)
        starts = row_start[:, None] + rows[None, :] * widths[:, None] + prefix[:, None]  # [B, cols]
        index = starts[:, :, None] + rows[None, None, :]
        out[index.reshape(-1)] = self.layout.mask.reshape(-1)
        return out

    def accept(self, target_predict: torch.Tensor) -> Acceptance:
        """target_predict [B, N+1]: the target's argmax at each verify column. The acceptance carries the
        committed tokens (DFlash's ``_commit_accept`` form: accepted tokens, the bonus, zeros) and the column
        order the commit gathers the window's KV slots and hidden rows with."""
        return greedy_accept(self.tokens[:, 1:], self.tree.parents, self.tree.num_nodes, target_predict,
                             max_depth=self.depth)

    @staticmethod
    def commit_tokens(acceptance: Acceptance) -> tuple[torch.Tensor, torch.Tensor]:
        """(out_tokens [B, N+1], commit_lens [B] int32): the accepted tokens then the bonus, zeros after."""
        return acceptance.commit_tokens, (acceptance.accept_length + 1).to(torch.int32)

    @staticmethod
    def commit_order(acceptance: Acceptance) -> torch.Tensor:
        """[B, N+1] the verify columns, accepted path first (root first), the rest after in index order."""
        return acceptance.commit_order


def with_root(anchor_tokens: torch.Tensor, node_tokens: torch.Tensor) -> torch.Tensor:
    """[B, N+1] verify tokens: the anchor (root) then the nodes; padding columns carry the anchor's token."""
    anchor = anchor_tokens.to(torch.int64)[:, None]
    return torch.cat([anchor, torch.where(node_tokens >= 0, node_tokens, anchor)], dim=1)


def permute_window_slots(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                         order: torch.Tensor) -> torch.Tensor:
    """Reorder each request's verify-window slots in ``req_to_token`` by ``order`` [B, N+1] (in place) and
    return the window's slots in the new order [B, N+1]: committed tokens first, rejected slots behind."""
    b, cols = order.shape
    positions = prefix_lens.to(torch.int64)[:, None] + torch.arange(cols, device=order.device)[None, :]
    rows = req_pool_indices.to(torch.int64)[:, None].expand(b, cols)
    slots = req_to_token[rows, positions]
    reordered = torch.gather(slots, 1, order)
    req_to_token[rows, positions] = reordered
    return reordered


TREE_ATTENTION_BACKENDS = ("triton", "flashinfer")  # their target verify applies spec_info.custom_mask


class TreeDecoder:
    """The decode step of ``DFlashWorkerV2`` with draft trees (eager: no draft or verify CUDA graph).

    Draft a block of ``P + 1`` tokens (anchor + P masks) into the first slots of the request's verify
    window, take the selector lattice, build the trees, verify the window's ``N + 1`` columns with the tree
    mask, accept greedily, reorder the window's KV slots committed-path first, and write the committed
    columns' target hidden states into the draft KV at those slots.
    """

    def __init__(self, worker, settings: TreeSettings, window: int):
        self.worker = worker
        self.settings = settings
        self.window = int(window)  # the verify window the scheduler reserves per request and step
        self.draft_block = settings.drafted_positions + 1
        # SpecPilot shared-budget: one node budget shared by the batch (None with its flags unset).
        from sglang.srt.specpilot.shared_budget import SharedBudget

        self.shared = SharedBudget.from_worker(worker, settings)

    @classmethod
    def from_worker(cls, worker) -> "TreeDecoder | None":
        """None with the tree flags unset (stock); refuses, at start-up, settings the tree step does not cover."""
        from sglang.srt.specpilot import option_value
        from sglang.srt.specpilot.dflash_tree_args import tree_settings

        nodes = option_value("--specpilot-tree-nodes")
        if nodes is None:
            return None
        selector = getattr(worker, "selector", None)
        settings = tree_settings(nodes, option_value("--specpilot-tree-depth"),
                                 option_value("--specpilot-tree-drafted-positions"), algorithm="DFLASH",
                                 trained_block=getattr(worker.draft_model, "block_size", None),
                                 selector_top_k=0 if selector is None else int(selector.top_k))
        problems = []
        backend = str(worker.target_worker.model_runner.server_args.attention_backend)
        if backend not in TREE_ATTENTION_BACKENDS:
            problems.append(f"--attention-backend {backend}: tree verify needs one of {TREE_ATTENTION_BACKENDS}")
        if worker.use_compact_draft_cache:
            problems.append("--speculative-draft-window-size: the compact draft cache is not covered")
        if int(worker.block_size) < max(settings.verify_tokens, settings.drafted_positions + 1):
            problems.append(f"speculative_num_draft_tokens {worker.block_size} is below the tree's window")
        from sglang.srt.runtime_context import get_parallel

        if get_parallel().tp_size != 1:
            problems.append("tensor parallelism is not covered")
        if problems:
            raise ValueError("dflash-tree cannot serve this configuration: " + "; ".join(problems))
        return cls(worker, settings, worker.block_size)

    def decode(self, batch, draft_input, on_publish=None):
        from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
        from sglang.srt.managers.scheduler import GenerationBatchResult
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput

        w = self.worker
        sampling_info = batch.sampling_info
        if not (sampling_info is None or sampling_info.is_all_greedy) or batch.has_grammar or batch.return_logprob:
            raise ValueError("dflash-tree verifies greedy requests only (no sampling, grammar or log-probs); "
                             "serve those without --specpilot-tree-nodes")
        if batch.mamba_track_indices is not None:
            raise ValueError("dflash-tree does not cover mamba radix tracking; disable the radix cache for hybrid targets")
        bs, device, window = len(batch.seq_lens), w.device, self.window
        prefix_lens = batch.seq_lens
        req_to_token = w.model_runner.req_to_token_pool.req_to_token
        target_runner = w.target_worker.model_runner
        window_slots = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices, req_to_token=req_to_token, start_offset=prefix_lens,
            end_offset=prefix_lens + window, batch_size=bs, draft_token_num=window, device=device).view(bs, window)
        host_lens = None if batch.seq_lens_cpu is None else batch.seq_lens_cpu

        # 1) the draft block (anchor + P masks, into the window's first P + 1 slots), its lattice and the trees
        step = self.draft_trees(batch, draft_input, window_slots, host_lens)

        # 2) their verify
        ragged, verify_lens = None, window
        if self.shared is not None:  # shared-budget: the batch's shares, verified as one ragged pass
            from sglang.srt.specpilot.shared_budget import RaggedTreeVerify

            step = self.shared.share(step, step.tokens[:, 0], prefix_lens)
            ragged = RaggedTreeVerify.from_step(step, prefix_lens)
            verify_lens = ragged.verify_lens.to("cpu")
        verify_slots = window_slots.reshape(-1) if ragged is None else window_slots.reshape(-1)[ragged.columns]
        verify_plan = target_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens,
            seq_lens_cpu=None if host_lens is None else host_lens + window, write_virtual=verify_slots,
            read_extent=window)
        verify_input = DFlashVerifyInput(
            draft_token=step.tokens.reshape(-1) if ragged is None else ragged.tokens,
            positions=step.layout.positions.reshape(-1) if ragged is None else ragged.positions,
            draft_token_num=window, custom_mask=step.custom_mask(prefix_lens) if ragged is None else ragged.custom_mask,
            capture_hidden_mode=CaptureHiddenMode.FULL, kv_loc_plan=verify_plan,
            ragged_verify_layout=None if ragged is None else ragged.layout(device))
        # the tree's child lists, read by the hybrid GDN backend (parents for gdn-tree / stock tree verify)
        verify_input.retrieve_next_token = step.layout.retrieve_next_token
        verify_input.retrieve_next_sibling = step.layout.retrieve_next_sibling
        verify_input.specpilot_tree = True
        batch.out_cache_loc = verify_slots
        backup = batch.seq_lens_cpu, batch.seq_lens_sum
        if host_lens is not None:
            batch.seq_lens_cpu = host_lens + verify_lens
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        verify_batch, _ = verify_input.prepare_for_verify(batch, w.target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = backup
        verify_batch.can_run_decode_cuda_graph = False
        target_out = w.target_worker.forward_batch_generation(batch=None, forward_batch=verify_batch, is_verify=True,
                                                          skip_attn_backend_init=True)
        logits_output = target_out.logits_output
        target_predict = logits_output.next_token_logits.argmax(dim=-1)
        target_predict = target_predict.view(bs, window) if ragged is None else ragged.unpack(target_predict)

        # 3) accept, commit the recurrent state along the path, reorder the KV window, fill the draft KV
        acceptance = step.accept(target_predict)
        out_tokens, commit_lens = step.commit_tokens(acceptance)
        new_seq_lens = prefix_lens + commit_lens.to(prefix_lens.dtype)
        self.commit_recurrent_state(batch, acceptance)
        if on_publish is not None:
            on_publish(new_seq_lens)
        order = step.commit_order(acceptance)
        committed_slots = permute_window_slots(req_to_token, batch.req_pool_indices, prefix_lens, order)
        target_hidden = (logits_output.hidden_states.view(bs, window, -1) if ragged is None
                         else ragged.unpack(logits_output.hidden_states))
        ordered_hidden = torch.gather(target_hidden, 1, order[:, :, None].expand(-1, -1, target_hidden.shape[-1]))
        commit_plan = target_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens,
            seq_lens_cpu=None if host_lens is None else host_lens + window, write_virtual=committed_slots.reshape(-1), read_extent=window)
        positions = (prefix_lens[:, None].to(torch.int64) + torch.arange(window, device=device)[None, :]).reshape(-1)
        self.write_draft_kv(batch, commit_plan, ordered_hidden.reshape(-1, ordered_hidden.shape[-1]), positions,
                            commit_lens)
        logits_output.hidden_states = None
        return GenerationBatchResult(
            logits_output=logits_output, next_token_ids=out_tokens.reshape(-1), accept_lens=commit_lens,
            can_run_cuda_graph=False, next_draft_input=self.next_draft_input(acceptance.bonus, new_seq_lens),
            speculative_num_draft_tokens=window, new_seq_lens=new_seq_lens,
            routed_experts_output=target_out.routed_experts_output, indexer_topk_output=target_out.indexer_topk_output)

    # What differs between drafters: the draft forward and its lattice, the draft KV write, the next step's input.

    def draft_trees(self, batch, draft_input, window_slots, host_lens) -> TreeStep:
        """DFlash2: the block through the drafter, the CandidateSelector lattice of its hidden states, the trees."""
        from sglang.srt.speculative.dflash_worker_v2 import _resolve_dflash_embedding_module, _selector_lattice
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        w = self.worker
        target_runner = w.target_worker.model_runner
        block_ids = self.block_ids(draft_input)
        embed_module = _resolve_dflash_embedding_module(w.draft_model, target_runner.model)
        embeds = (torch.nn.functional.embedding(block_ids, w._full_embed_gpu) if w._full_embed_gpu is not None
                  else embed_module(block_ids))
        if w._noise_embed_scale != 1.0:
            embeds = embeds * w._noise_embed_scale
        draft_out = self.draft_forward(batch, block_ids, embeds, window_slots, host_lens, SpeculativeAlgorithm.DFLASH)
        hidden = draft_out.logits_output.hidden_states.view(len(block_ids), self.draft_block, -1)[:, 1:, :]
        if w.draft_model.lm_head is None:
            w.draft_model.lm_head = unwrap_head(target_runner.model)
        candidate_ids, scores = _selector_lattice(w.draft_model, hidden, block_ids[:, 0])
        return TreeStep.build(self.settings, candidate_ids, scores, block_ids[:, 0], batch.seq_lens)

    def block_ids(self, draft_input) -> torch.Tensor:
        """[B, P + 1] the draft block's ids: the anchor (last committed token), then P mask tokens."""
        bs = len(draft_input.bonus_tokens)
        ids = torch.full((bs, self.draft_block), int(self.worker._mask_token_id), dtype=torch.int64,
                         device=self.worker.device)
        ids[:, 0] = draft_input.bonus_tokens.view(-1)
        return ids

    def draft_forward(self, batch, block_ids, embeds, window_slots, host_lens, algorithm, **forward_fields):
        """The drafter over the block (one eager TARGET_VERIFY of P + 1 queries, its KV into the window's first
        P + 1 slots)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
        from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info

        w = self.worker
        bs, block, device = len(block_ids), self.draft_block, block_ids.device
        prefix_lens = batch.seq_lens
        positions = (prefix_lens[:, None].to(torch.int64) + torch.arange(block, device=device)[None, :]).reshape(-1)
        draft_slots = window_slots[:, :block].reshape(-1)
        lens_cpu = None if host_lens is None else host_lens + block
        plan = w.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens, seq_lens_cpu=lens_cpu,
            write_virtual=draft_slots, read_extent=block)
        draft_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices, seq_lens=prefix_lens, out_cache_loc=draft_slots,
            seq_lens_sum=int(lens_cpu.sum()) if lens_cpu is not None else int(prefix_lens.sum()) + bs * block,
            seq_lens_cpu=lens_cpu, positions=positions,
            input_embeds=None if embeds is None else embeds.view(-1, embeds.shape[-1]), spec_algorithm=algorithm,
            spec_info=make_draft_block_spec_info(draft_token_num=block, device=device),
            capture_hidden_mode=CaptureHiddenMode.NULL, can_run_decode_cuda_graph=False, **forward_fields)
        plan.bind(draft_batch, w.draft_model_runner.kv_index_translator)
        with torch.inference_mode():
            return w.draft_model_runner.forward(draft_batch)

    def commit_recurrent_state(self, batch, acceptance: Acceptance) -> None:
        """Hybrid targets: the recurrent state of the accepted path's deepest column becomes the request's."""
        w = self.worker
        if w._need_mamba_verify_commit:
            deepest = acceptance.accept_columns.gather(1, acceptance.accept_length[:, None])[:, 0]
            runner = w.target_worker.model_runner
            runner.attn_backend.update_mamba_state_after_mtp_verify(
                last_correct_step_indices=deepest, mamba_track_indices=None, mamba_steps_to_track=None,
                model=runner.model, req_pool_indices=batch.req_pool_indices[:len(batch.seq_lens)])

    def write_draft_kv(self, batch, commit_plan, hidden, positions, commit_lens) -> None:
        """The committed columns' target hidden states (committed path first) into the draft KV at their slots."""
        w = self.worker
        cache_loc = w._draft_write_ids(commit_plan)
        w._append_target_hidden_to_draft_kv_by_loc(target_hidden=hidden, cache_loc=cache_loc,
                                                   cache_loc_2d=cache_loc.view(len(batch.seq_lens), self.window),
                                                   positions=positions, commit_lens=commit_lens)

    def next_draft_input(self, bonus, new_seq_lens):
        return self.worker._make_next_draft_input_decode(bonus_tokens=bonus, new_seq_lens=new_seq_lens)


class DSparkTreeDecoder(TreeDecoder):
    """The decode step of ``DSparkWorkerV2`` with draft trees: the same verify, acceptance and KV commit as
    DFlash2's; the lattice is DSpark's Eq. (1) (``markov_lattice``: the block's base logits plus the first-order
    Markov head's bias with each node's parent as x_{s-1}), scored by the same kernel (``kind="markov"``)."""

    @classmethod
    def from_worker(cls, worker) -> "DSparkTreeDecoder | None":
        """None with the tree flags unset (stock); refuses, at start-up, what the tree step does not cover."""
        from sglang.srt.models.dspark import GatedMarkovHead, VanillaMarkov
        from sglang.srt.specpilot import option_value
        from sglang.srt.specpilot.dflash_tree_args import tree_settings
        from sglang.srt.speculative.dspark_components.dspark_config import parse_dspark_draft_config

        nodes = option_value("--specpilot-tree-nodes")
        if nodes is None:
            return None
        head = worker.draft_model.markov_head
        config = parse_dspark_draft_config(draft_hf_config=worker.draft_model_runner.model_config.hf_config)
        gamma = config.resolve_gamma(default=None)
        settings = tree_settings(nodes, option_value("--specpilot-tree-depth"),
                                 option_value("--specpilot-tree-drafted-positions"), algorithm="DSPARK",
                                 trained_block=None if gamma is None else int(gamma) + 1,
                                 selector_top_k=DSPARK_TREE_CANDIDATES if type(head) in (VanillaMarkov, GatedMarkovHead)
                                 else 0)
        problems = []
        backend = str(worker.target_worker.model_runner.server_args.attention_backend)
        if backend not in TREE_ATTENTION_BACKENDS:
            problems.append(f"--attention-backend {backend}: tree verify needs one of {TREE_ATTENTION_BACKENDS}")
        if worker.sample_from_anchor:
            problems.append("a drafter that samples from the anchor (no anchor row in its block) is not covered")
        if worker._target_is_mambaish:
            problems.append("hybrid (recurrent-state) targets are not covered under DSpark trees")
        if worker._deferred_commit() is not None:
            problems.append("SGLANG_DSPARK_DEFER_CONTEXT_KV: the deferred draft-KV commit is not covered")
        if head.vocab_shard is not None or worker._draft_is_moe:
            problems.append("a vocab-sharded Markov head or a MoE drafter is not covered")
        if int(worker.verify_num_draft_tokens) < max(settings.verify_tokens, settings.drafted_positions + 1):
            problems.append(f"speculative_num_draft_tokens {worker.verify_num_draft_tokens} is below the tree's window")
        from sglang.srt.runtime_context import get_parallel

        if get_parallel().tp_size != 1 or get_parallel().attn_dp_enabled:
            problems.append("tensor and data parallelism are not covered")
        if problems:
            raise ValueError("dflash-tree (DSpark) cannot serve this configuration: " + "; ".join(problems))
        return cls(worker, settings, worker.verify_num_draft_tokens)

    def draft_trees(self, batch, draft_input, window_slots, host_lens) -> TreeStep:
        """The block through the DSpark drafter, its base logits, the Markov lattice of Eq. (1), the trees."""
        from sglang.srt.lora.layers import unwrap_lora_layer
        from sglang.srt.speculative.dspark_components.dspark_draft import _make_num_token_non_padded
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        w = self.worker
        bs, positions = len(batch.seq_lens), self.settings.drafted_positions
        block_ids = self.block_ids(draft_input)
        embeds = unwrap_lora_layer(w.draft_model.embed_tokens)(block_ids)
        tokens = bs * self.draft_block
        draft_out = self.draft_forward(
            batch, block_ids, embeds, window_slots, host_lens, SpeculativeAlgorithm.DSPARK,
            global_num_token_non_padded=_make_num_token_non_padded(tokens, w.device),
            global_num_token_non_padded_cpu=tokens)
        hidden = draft_out.logits_output.hidden_states.view(bs, self.draft_block, -1)[:, 1:, :].contiguous()
        with w._proposer._base_logits_context():
            base_logits, _ = w.draft_model.compute_base_logits(hidden.view(bs * positions, -1))
        cand, unary, pair = markov_lattice(w.draft_model.markov_head, base_logits.view(bs, positions, -1),
                                           block_ids[:, 0], hidden, self.settings.candidates)
        return TreeStep.build(self.settings, cand, pair, block_ids[:, 0], batch.seq_lens, unary=unary, kind="markov")

    def commit_recurrent_state(self, batch, acceptance: Acceptance) -> None:
        """No recurrent target state: hybrid targets are refused at start-up."""

    def write_draft_kv(self, batch, commit_plan, hidden, positions, commit_lens) -> None:
        """DSpark's own injection of target hidden states into the draft KV, committed path first."""
        injector = self.worker._kv_injector
        cache_loc = injector.ids_for(commit_plan)
        bs = len(batch.seq_lens)
        state_slot = (None if injector.swa_ring_size is None
                      else batch.req_pool_indices[:bs].view(-1, 1).expand(bs, self.window).reshape(-1))
        injector.inject_target_hidden(target_hidden=hidden, cache_loc=cache_loc,
                                      cache_loc_2d=cache_loc.view(bs, self.window), positions=positions,
                                      commit_lens=commit_lens, state_slot=state_slot)

    def next_draft_input(self, bonus, new_seq_lens):
        from sglang.srt.speculative.dspark_components.dspark_draft import make_next_draft_input

        return make_next_draft_input(bonus_tokens=bonus, new_seq_lens=new_seq_lens)


def unwrap_head(target_model):
    from sglang.srt.lora.layers import unwrap_lora_layer

    return unwrap_lora_layer(getattr(target_model, "lm_head", None))


def markov_lattice(markov_head, base_logits: torch.Tensor, anchor_tokens: torch.Tensor,
                   draft_hidden: torch.Tensor | None, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DSpark's lattice for the same builder (``best_first_tree(..., kind="markov")``): Eq. (1) with the node's
    parent as x_{s-1}, score(child c at s | parent p) = base_s(c) + bias(p)[c].

    Args:
        markov_head: a first-order DSpark head whose bias is ``markov_w2`` of a latent of the previous token
            (``VanillaMarkov``: its embedding; ``GatedMarkovHead``: gated by the position's hidden state).
            Heads with a recurrent state (``RNNHead``) depend on the whole path and are refused.
        base_logits: [B, P, V] the drafter's base logits per drafted position.
        anchor_tokens: [B] the last committed token (x_{s-1} of position 0).
        draft_hidden: [B, P, H] the drafted positions' hidden states (the gated head reads them), or None.
        top_k: candidates per position (the top-K of the base logits).

    Returns:
        cand [B, P, K] int64, unary [B, P, K] float32 (base logits), pair [B, P, K, K] float32 (the bias of each
        candidate given each candidate of the position before; rows of position 0 all the anchor's).
    """
    from sglang.srt.models.dspark import GatedMarkovHead, VanillaMarkov

    if type(markov_head) not in (VanillaMarkov, GatedMarkovHead):
        raise ValueError(f"dflash-tree builds DSpark trees for first-order Markov heads (VanillaMarkov, "
                         f"GatedMarkovHead), not {type(markov_head).__name__}")
    b, p, _ = base_logits.shape
    unary, cand = base_logits.float().topk(top_k, dim=-1)
    parents = torch.cat([anchor_tokens.long()[:, None, None].expand(b, 1, top_k), cand[:, :-1]], dim=1)
    latent = markov_head.get_prev_embeddings(parents)  # [B, P, K, r]
    if isinstance(markov_head, GatedMarkovHead):
        hidden = draft_hidden[:, :, None, :].expand(b, p, top_k, draft_hidden.shape[-1])
        latent = markov_head.compute_gate(parents, hidden).to(latent.dtype) * latent
    children = markov_head.markov_w2.weight[cand]  # [B, P, K, r]
    pair = torch.einsum("bspr,bscr->bspc", latent.float(), children.float())
    return cand, unary, pair
