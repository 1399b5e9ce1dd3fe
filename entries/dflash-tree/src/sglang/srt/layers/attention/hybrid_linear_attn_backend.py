from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional, Union

import torch

from sglang.kernels.ops.mamba.causal_conv1d_triton import PAD_SLOT_ID
from sglang.kernels.ops.mamba.mamba_state_indices_triton import (
    fused_replay_state_indices,
)
from sglang.kernels.ops.mamba.mamba_state_scatter_triton import (
    fused_conv_window_scatter_with_mask,
    fused_mamba_state_scatter_with_mask,
    scatter_mamba_states_after_mtp_verify,
    track_mamba_states_all_layers,
    track_mamba_states_if_needed,
)
from sglang.srt.environ import envs
from sglang.srt.layers.attention.base_attn_backend import (
    AttentionBackend,
    SharedReadEnds,
)
from sglang.srt.layers.attention.linear.utils import pp_spec_stable_rows_enabled
from sglang.srt.layers.attention.mamba.mamba import MambaMixer2
from sglang.srt.layers.attention.mamba.mamba2_metadata import (
    ForwardMetadata,
    Mamba2Metadata,
)
from sglang.srt.layers.attention.mamba.prefill_track_metadata import (
    build_prefill_track_plan,
)
from sglang.srt.layers.attention.mamba.replay_state_indices_validator import (
    validate_replay_state_indices_cpu,
)
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
from sglang.srt.model_executor.cuda_graph_config import (
    Backend,
    Phase,
    check_cuda_graph_backend,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.runtime_context import get_exec, get_memory, get_spec
from sglang.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput
from sglang.srt.speculative.spec_info import SpecInput
from sglang.srt.specpilot.gdn_tree import check_linear_backend as gdn_tree_check_linear_backend
from sglang.srt.utils import is_pin_memory_available

if TYPE_CHECKING:
    from sglang.srt.layers.attention.verify_mask import VerifyMask

logger = logging.getLogger(__name__)
_validate_mamba_replay_state_indices = (
    envs.SGLANG_VALIDATE_MAMBA_REPLAY_STATE_INDICES.get()
)


class MambaAttnBackendBase(AttentionBackend):
    supports_mis: bool = False

    @classmethod
    def validate_mis_support(cls, server_args) -> None:
        if server_args.enable_mis and not cls.supports_mis:
            raise ValueError(
                f"{cls.__name__} does not support multi-item scoring. "
                "Hybrid models require a linear-attention backend that explicitly "
                "declares MIS support."
            )

    # Per-slot accept lengths for the KDA fused-accept spec path; allocated only
    # by KDAAttnBackend where `_can_fuse_accept_state` holds. None everywhere
    # else — update_mamba_state_after_mtp_verify keys the fused branch on it.
    accept_lens_pool: Optional[torch.Tensor] = None

    # Most sequences the prefill graph tables hold (larger batches replay no
    # graph); set at init by backends whose supports_prefill_graph_extend holds.
    prefill_graph_max_seqs: int

    def __init__(self, model_runner: ModelRunner):
        self.validate_mis_support(model_runner.server_args)
        super().__init__()
        self.pad_slot_id = PAD_SLOT_ID
        self.device = model_runner.device
        self.topk = get_spec().speculative_eagle_topk or 0
        self.is_draft_worker = model_runner.is_draft_worker
        self.req_to_token_pool: HybridReqToTokenPool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.enable_unified_memory = get_memory().enable_unified_memory
        # model_config must not be touched here: backend selection reads the
        # linear_attn_backends stamp first, and that guard test constructs
        # backends on runners without a real model_config.
        self._model_runner = model_runner
        self._mamba_chunk_size: Optional[int] = None
        pool = self.req_to_token_pool
        self._fused_state_indices_ok = (
            torch.device(self.device).type == "cuda"
            and isinstance(pool, HybridReqToTokenPool)
            and pool.mamba_translate_is_fusable
        )
        self.forward_metadata: ForwardMetadata = None
        self.state_indices_list = []
        # Static (max_bs,) track-dest buffer captured by pointer, refreshed in-place
        # each replay; the captured track-save reads this, not the InputBuffer slot.
        self.mamba_track_indices_buf = None
        # Per-bs static write-cursor / force-flush buffers for cuda-graph; None
        # unless --enable-linear-replayssm is set.
        self.replayssm_write_pos_list = None
        self.replayssm_force_flush_list = None
        self.query_start_loc_list = []
        self.retrieve_next_token_list = []
        self.retrieve_next_sibling_list = []
        self.retrieve_parent_token_list = []
        self.cached_cuda_graph_decode_query_start_loc: torch.Tensor = None
        self.cached_cuda_graph_verify_query_start_loc: torch.Tensor = None
        self.conv_states_shape: tuple[int, int] = None
        # Constant (== 1) for mamba-like backends; hoisted so the replay path
        # skips the per-cycle method dispatch.
        self._graph_seq_len_fill_value = self.get_cuda_graph_seq_len_fill_value()

    def supports_prefill_graph_extend(self) -> bool:
        """Whether breakable prefill CUDA graphs can capture this backend's
        extend on static per-bucket tables instead of breaking at each layer."""
        return False

    def prefill_graph_extend_active(self) -> bool:
        """Whether the extend being captured or replayed runs on those tables."""
        return False

    def init_prefill_graph_metadata(self, forward_batch: ForwardBatch):
        raise NotImplementedError()

    def refresh_prefill_graph_metadata(self, meta, forward_batch: ForwardBatch):
        raise NotImplementedError()

    @property
    def mamba_chunk_size(self) -> int:
        if self._mamba_chunk_size is None:
            self._mamba_chunk_size = getattr(
                self._model_runner.model_config.hf_text_config, "mamba_chunk_size", 64
            )
        return self._mamba_chunk_size

    def _translate_mamba_indices(self, mamba_indices: torch.Tensor) -> torch.Tensor:
        """Virtual->physical mamba slot-id translate (identity for the non-unified
        pool). Must run everywhere mamba ids feed the SSM/conv kernels or mamba-pool
        state ops, incl. the cuda-graph replay-prep copy into ``state_indices_list``."""
        return self.req_to_token_pool.translate_mamba_indices(mamba_indices)

    @staticmethod
    def _has_cpu_prefill_track_metadata(forward_batch: ForwardBatch) -> bool:
        return (
            forward_batch.forward_mode.is_extend()
            and not forward_batch.forward_mode.is_target_verify()
            and all(
                values is not None and len(values) == forward_batch.batch_size
                for values in (
                    forward_batch.mamba_prefill_track_mask_cpu,
                    forward_batch.mamba_track_seqlens_cpu,
                    forward_batch.extend_seq_lens_cpu,
                    forward_batch.extend_prefix_lens_cpu,
                )
            )
        )

    def _forward_metadata(self, forward_batch: ForwardBatch):
        bs = forward_batch.batch_size

        logical_mode = forward_batch.logical_forward_mode

        retrieve_next_token = None
        retrieve_next_sibling = None
        retrieve_parent_token = None
        track_conv_indices = None
        track_ssm_h_src = None
        track_chunk_idx = None
        track_ssm_h_dst = None
        track_ssm_h_batch_src = None
        track_ssm_final_src = None
        track_ssm_final_dst = None
        track_ssm_seq_idx = None
        track_ssm_end_locs = None
        track_ssm_recompute_dst = None
        logical_num_tokens = None
        track_mask_indices = None

        # Padded rows carry req-pool row 0, which maps to the reserved mamba
        # padding slot 0 in both the static and the unified pool.
        mamba_cache_indices = self.req_to_token_pool.get_mamba_indices(
            forward_batch.req_pool_indices
        )
        mamba_cache_indices = self._translate_mamba_indices(mamba_cache_indices)
        if forward_batch.mamba_track_indices is not None:
            forward_batch.mamba_track_indices = self._translate_mamba_indices(
                forward_batch.mamba_track_indices
            )
        # Resolve the tracked-row selection once per forward
        cpu_track_metadata = self._has_cpu_prefill_track_metadata(forward_batch)
        if cpu_track_metadata:
            rows = [
                i
                for i, track in enumerate(forward_batch.mamba_prefill_track_mask_cpu)
                if track
            ]
            has_mamba_track_mask = bool(rows)
            track_mask_indices = self._track_indices_to_device(rows) if rows else None
        else:
            has_mamba_track_mask = bool(
                forward_batch.mamba_track_mask is not None
                and forward_batch.mamba_track_mask.any()
            )
        replayssm_write_pos = None
        replayssm_force_flush = None
        if logical_mode.is_decode_or_idle():
            query_start_loc = torch.arange(
                0, bs + 1, dtype=torch.int32, device=self.device
            )
            # The ring cursor is a per-slot decode counter shared by all GDN layers;
            # manage it once here (snapshot, hand to layers, advance mod L), not per-layer.
            # Gate on the linear_replayssm FLAG, not on cursor-tensor presence: the
            # spec-verify ring (--enable-linear-replayssm-spec) shares the write_pos
            # allocation but owns it exclusively via commit_gdn_replayssm_spec
            # (advance-by-accept-count once per verify step). Advancing it here as
            # well inserts one phantom/stale ring entry per step and cumulatively
            # poisons the reconstruction (degenerate repetition at 10k+ tokens).
            mamba_pool = getattr(self.req_to_token_pool, "mamba_pool", None)
            write_pos_buf = (
                mamba_pool.replayssm_write_pos
                if mamba_pool is not None and mamba_pool.enable_linear_replayssm
                else None
            )
            if write_pos_buf is not None:
                slots = mamba_cache_indices.to(torch.long)
                # Padded rows point at the reserved padding slot 0; the clamp keeps
                # a -1 sentinel in bounds (the kernel zeroes rows with state_idx < 0).
                safe_slots = slots.clamp(min=0)
                replayssm_write_pos = write_pos_buf[safe_slots].clone()
                L = mamba_pool.linear_replayssm_cache_len
                # KDA has no radix coordination: flush only on the natural write_pos
                # == L-1 wrap. GDN adds the radix-aligned force-flush below.
                is_kda = getattr(mamba_pool, "replayssm_is_kda", False)
                # Force-flush on the radix track's seq_lens % mamba_track_interval
                # == 0 boundary so the ring folds into temporal[slot] when read.
                if not is_kda:
                    force_flush_bool = self._replayssm_track_flush_mask(
                        forward_batch.seq_lens_cpu, bs
                    )
                    replayssm_force_flush = force_flush_bool.to(
                        device=self.device, dtype=torch.int32
                    )
                # Advance only valid slots, scattered over unique slots (dup-index
                # race; padded rows share slot 0); a forced flush -> next write_pos 0.
                valid_mask = slots >= 0
                valid_slots = slots[valid_mask]
                if valid_slots.numel() > 0:
                    flushed = replayssm_write_pos == (L - 1)
                    if replayssm_force_flush is not None:
                        flushed = flushed | (replayssm_force_flush != 0)
                    next_pos = torch.where(
                        flushed,
                        torch.zeros_like(replayssm_write_pos),
                        (replayssm_write_pos + 1) % L,
                    )
                    # Dedup: rows sharing a slot share write_pos/flush, so the
                    # scattered value is identical regardless of which row wins.
                    uniq_slots, inv = torch.unique(valid_slots, return_inverse=True)
                    next_for_valid = next_pos[valid_mask]
                    new_vals = torch.empty(
                        uniq_slots.shape[0],
                        dtype=write_pos_buf.dtype,
                        device=write_pos_buf.device,
                    )
                    new_vals[inv] = next_for_valid.to(write_pos_buf.dtype)
                    write_pos_buf[uniq_slots] = new_vals
        elif logical_mode.is_extend(include_draft_extend_v2=True):
            has_extend_meta = (
                forward_batch.extend_start_loc is not None
                and forward_batch.extend_seq_lens is not None
            )
            if forward_batch.forward_mode.is_draft_extend_v2() and not has_extend_meta:
                # Draft-extend-v2 may omit linear metadata when the draft runs only
                # full-attention layers.
                query_start_loc = None
            elif forward_batch.forward_mode.is_target_verify():
                ragged_layout = forward_batch.spec_info.ragged_verify_layout
                if ragged_layout is not None:
                    # Compact ragged verify: variable per-request verify lens.
                    query_start_loc = ragged_layout.qo_indptr_device
                else:
                    query_start_loc = torch.arange(
                        0,
                        forward_batch.input_ids.shape[0] + 1,
                        step=forward_batch.spec_info.draft_token_num,
                        dtype=torch.int32,
                        device=forward_batch.input_ids.device,
                    )

                # SpecPilot dflash-tree: a DFLASH draft tree carries its child lists too.
                if self.topk > 1 or getattr(forward_batch.spec_info, "specpilot_tree", False):
                    retrieve_next_token = forward_batch.spec_info.retrieve_next_token
                    retrieve_next_sibling = (
                        forward_batch.spec_info.retrieve_next_sibling
                    )
                    # None during dummy run
                    if retrieve_next_token is not None:
                        retrieve_parent_token = torch.empty_like(retrieve_next_token)
            else:
                query_start_loc = torch.empty(
                    (bs + 1,), dtype=torch.int32, device=self.device
                )
                query_start_loc[:bs] = forward_batch.extend_start_loc
                query_start_loc[bs] = (
                    forward_batch.extend_start_loc[-1]
                    + forward_batch.extend_seq_lens[-1]
                )
                if (
                    forward_batch.extend_seq_lens_cpu is not None
                    and len(forward_batch.extend_seq_lens_cpu) == bs
                    and forward_batch.tbo_parent_token_range is None
                ):
                    logical_num_tokens = sum(forward_batch.extend_seq_lens_cpu)
                else:
                    logical_num_tokens = int(query_start_loc[-1])
                if has_mamba_track_mask:
                    track_conv_indices = self._init_track_conv_indices(
                        query_start_loc, forward_batch, track_mask_indices
                    )

                    (
                        track_chunk_idx,
                        track_ssm_h_src,
                        track_ssm_h_dst,
                        track_ssm_h_batch_src,
                        track_ssm_final_src,
                        track_ssm_final_dst,
                        track_ssm_seq_idx,
                        track_ssm_end_locs,
                        track_ssm_recompute_dst,
                    ) = self._init_track_ssm_indices(mamba_cache_indices, forward_batch)
        else:
            raise ValueError(f"Invalid forward mode: {forward_batch.forward_mode=}")

        return ForwardMetadata(
            query_start_loc=query_start_loc,
            logical_num_tokens=logical_num_tokens,
            mamba_track_mask_indices=track_mask_indices,
            mamba_cache_indices=mamba_cache_indices,
            # Physical track destinations (None when tracking off); cuda-graph
            # supplies this via the static backend buffer in _replay_metadata.
            mamba_track_indices=getattr(forward_batch, "mamba_track_indices", None),
            retrieve_next_token=retrieve_next_token,
            retrieve_next_sibling=retrieve_next_sibling,
            retrieve_parent_token=retrieve_parent_token,
            track_conv_indices=track_conv_indices,
            track_ssm_h_src=track_ssm_h_src,
            track_ssm_h_dst=track_ssm_h_dst,
            track_ssm_h_batch_src=track_ssm_h_batch_src,
            track_ssm_final_src=track_ssm_final_src,
            track_ssm_final_dst=track_ssm_final_dst,
            track_chunk_idx=track_chunk_idx,
            track_ssm_seq_idx=track_ssm_seq_idx,
            track_ssm_end_locs=track_ssm_end_locs,
            track_ssm_recompute_dst=track_ssm_recompute_dst,
            has_mamba_track_mask=has_mamba_track_mask,
            replayssm_write_pos=replayssm_write_pos,
            replayssm_force_flush=replayssm_force_flush,
        )

    def init_forward_metadata_out_graph(
        self,
        forward_batch: ForwardBatch,
        in_capture: bool = False,
    ):
        self.forward_metadata = self._replay_metadata(
            forward_batch.batch_size,
            forward_batch.req_pool_indices,
            forward_batch.forward_mode,
            forward_batch.spec_info,
            forward_batch.seq_lens_cpu if not in_capture else None,
            num_padding=(
                0 if in_capture else getattr(forward_batch, "num_padding", None)
            ),
            in_capture=in_capture,
            mamba_track_indices=getattr(forward_batch, "mamba_track_indices", None),
        )

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        self.forward_metadata = self._forward_metadata(forward_batch)

    def update_verify_buffers_to_fill_after_draft(
        self, spec_info: SpecInput, cuda_graph_bs: Optional[int]
    ):
        # Plan-stream fixup: slot indices / static query_start_loc are
        # draft-independent, but tree verify (topk > 1) copies the
        # draft-produced tree links into the captured buffers on the plan
        # stream, racing the draft — re-copy after the stream join. Eager
        # verify reads the spec_info tensors directly; parent links are
        # derived from these buffers at execution time.
        if self.topk <= 1 or cuda_graph_bs is None:
            return
        if (
            not isinstance(spec_info, EagleVerifyInput)
            or spec_info.retrieve_next_token is None  # dummy / capture runs
        ):
            return
        bs_without_pad = spec_info.retrieve_next_token.shape[0]
        self.retrieve_next_token_list[cuda_graph_bs - 1][:bs_without_pad].copy_(
            spec_info.retrieve_next_token
        )
        self.retrieve_next_sibling_list[cuda_graph_bs - 1][:bs_without_pad].copy_(
            spec_info.retrieve_next_sibling
        )

    def _init_track_conv_indices(
        self,
        query_start_loc: torch.Tensor,
        forward_batch: ForwardBatch,
        track_mask_indices: Optional[torch.Tensor] = None,
    ):
        """Flattened input positions of conv states to track during extend (up to
        the last complete chunk boundary, mamba_track_mask rows only)."""
        conv_state_len = self.conv_states_shape[-1]

        # Shared with the Qwen4-Exp PLE side states so the boundary can never
        # drift between them.
        aligned_len = forward_batch.mamba_track_aligned_lens()
        assert aligned_len is not None, (
            "conv-state tracking requires mamba_track_seqlens and extend_prefix_lens; "
            "this path should only run when the track mask is set on an extend batch"
        )
        start_indices = query_start_loc[:-1] + aligned_len - conv_state_len
        start_indices = (
            start_indices.index_select(0, track_mask_indices)
            if track_mask_indices is not None
            else start_indices[forward_batch.mamba_track_mask]
        )

        indices = start_indices.unsqueeze(-1) + torch.arange(
            conv_state_len,
            device=self.device,
            dtype=start_indices.dtype,
        )

        return indices.clamp(0, query_start_loc[-1] - 1)

    def _init_track_ssm_indices(
        self, mamba_cache_indices: torch.Tensor, forward_batch: ForwardBatch
    ):
        """src/dst indices to track SSM states for prefix caching: aligned seqs
        cache last_recurrent_state, unaligned cache intermediate `h` at the last
        chunk boundary. Also returns ``track_ssm_h_batch_src``: the batch rows of
        the unaligned tracked seqs, used to integer-index the fp32 snapshot
        buffer on the KDA path so the copy stays free of GPU syncs."""
        if self._has_cpu_prefill_track_metadata(forward_batch):
            return self._init_track_ssm_indices_from_cpu(
                mamba_cache_indices, forward_batch
            )
        state_chunk_size = self.mamba_chunk_size
        # CPU to avoid kernel launches for the masking ops
        mamba_track_mask = forward_batch.mamba_track_mask.cpu()
        extend_seq_lens = forward_batch.extend_seq_lens.cpu()
        mamba_track_indices = forward_batch.mamba_track_indices.cpu()
        mamba_cache_indices = mamba_cache_indices.cpu()
        mamba_track_seqlens = forward_batch.mamba_track_seqlens.cpu()
        prefix_lens = forward_batch.extend_prefix_lens.cpu()

        lens_to_track = mamba_track_seqlens - prefix_lens
        lens_masked = lens_to_track[mamba_track_mask]
        dst_masked = mamba_track_indices[mamba_track_mask]

        is_aligned = (lens_masked % state_chunk_size) == 0

        # Aligned: last_recurrent_state from ssm_states.
        track_ssm_final_src = mamba_cache_indices[mamba_track_mask][is_aligned]
        track_ssm_final_dst = dst_masked[is_aligned]

        # Unaligned: intermediate state from h.
        not_aligned = ~is_aligned
        track_ssm_h_dst = dst_masked[not_aligned]
        track_ssm_seq_idx = None
        track_ssm_end_locs = None
        track_ssm_recompute_dst = None

        if isinstance(self, Mamba2AttnBackend):
            # `h` is one chunk grid over the whole flattened batch, so the wanted
            # state is in it only when query_start_loc[i] is chunk-aligned.
            query_start_loc = torch.zeros_like(extend_seq_lens)
            query_start_loc[1:] = torch.cumsum(extend_seq_lens[:-1], dim=0)
            aligned_len = (
                lens_masked[not_aligned] // state_chunk_size
            ) * state_chunk_size
            seq_idx_unaligned = torch.nonzero(mamba_track_mask, as_tuple=True)[0][
                not_aligned
            ]
            end_locs = query_start_loc[seq_idx_unaligned] + aligned_len
            on_grid = (end_locs % state_chunk_size) == 0

            track_ssm_h_src = end_locs[on_grid] // state_chunk_size
            track_ssm_h_dst = track_ssm_h_dst[on_grid]

            track_ssm_seq_idx = seq_idx_unaligned[~on_grid]
            track_ssm_end_locs = end_locs[~on_grid]
            track_ssm_recompute_dst = dst_masked[not_aligned][~on_grid]
        else:
            num_h_states = (extend_seq_lens - 1) // state_chunk_size + 1
            track_ssm_src_offset = torch.zeros_like(num_h_states)
            track_ssm_src_offset[1:] = torch.cumsum(num_h_states[:-1], dim=0)
            track_ssm_h_src = track_ssm_src_offset[mamba_track_mask][not_aligned] + (
                lens_masked[not_aligned] // state_chunk_size
            )

        def to_device(t):
            return None if t is None else t.to(self.device, non_blocking=True)

        track_chunk_idx = torch.full((lens_to_track.shape[0],), -1, dtype=torch.int32)
        tracked_seqs = mamba_track_mask.nonzero(as_tuple=True)[0][not_aligned]
        track_chunk_idx[tracked_seqs] = (
            lens_masked[not_aligned] // state_chunk_size
        ).to(torch.int32)

        return (
            to_device(track_chunk_idx),
            to_device(track_ssm_h_src),
            to_device(track_ssm_h_dst),
            to_device(tracked_seqs),
            to_device(track_ssm_final_src),
            to_device(track_ssm_final_dst),
            to_device(track_ssm_seq_idx),
            to_device(track_ssm_end_locs),
            to_device(track_ssm_recompute_dst),
        )

    def _track_indices_to_device(self, values, dtype=torch.int64):
        return torch.tensor(
            values, dtype=dtype, pin_memory=is_pin_memory_available(self.device)
        ).to(self.device, non_blocking=True)

    def _init_track_ssm_indices_from_cpu(self, mamba_cache_indices, forward_batch):
        is_mamba2 = isinstance(self, Mamba2AttnBackend)
        plan = build_prefill_track_plan(
            forward_batch.mamba_prefill_track_mask_cpu,
            forward_batch.mamba_track_seqlens_cpu,
            forward_batch.extend_seq_lens_cpu,
            forward_batch.extend_prefix_lens_cpu,
            self.mamba_chunk_size,
            mamba2=is_mamba2,
        )
        to_device = self._track_indices_to_device
        final_rows = to_device(plan.final_rows)
        h_rows = to_device(plan.h_rows)
        recompute_rows = to_device(plan.recompute_rows) if is_mamba2 else None
        destinations = forward_batch.mamba_track_indices
        return (
            to_device(plan.chunk_indices, torch.int32),
            to_device(plan.h_src),
            destinations.index_select(0, h_rows),
            to_device(plan.unaligned_rows),
            mamba_cache_indices.index_select(0, final_rows),
            destinations.index_select(0, final_rows),
            recompute_rows,
            to_device(plan.recompute_end_locs) if is_mamba2 else None,
            destinations.index_select(0, recompute_rows) if is_mamba2 else None,
        )

    def init_forward_metadata_capture_cpu_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        out_cache_loc: torch.Tensor,
        encoder_lens: Optional[torch.Tensor],
        forward_mode: ForwardMode,
        spec_info: Optional[Union[EagleDraftInput, EagleVerifyInput]],
    ):
        self.forward_metadata = self._capture_metadata(
            bs, req_pool_indices, forward_mode, spec_info
        )

    def _replayssm_enabled(self) -> bool:
        """True iff --enable-linear-replayssm is on for this pool.

        Gate on the FLAG, not on ``replayssm_write_pos is not None``: the
        spec-verify ring (--enable-linear-replayssm-spec) also allocates the
        cursor tensor but owns it exclusively via commit_gdn_replayssm_spec.
        The decode-ring metadata machinery gated here (per-bs static cursor
        buffers, the per-replay snapshot + advance-by-one in _replay_metadata,
        and the decode-kernel ring rerouting downstream) must stay fully
        dormant for the spec ring.
        """
        mamba_pool = getattr(self.req_to_token_pool, "mamba_pool", None)
        if mamba_pool is None:
            return False
        return bool(mamba_pool.enable_linear_replayssm)

    def _replayssm_track_flush_mask(
        self, seq_lens_cpu: torch.Tensor, bs: int
    ) -> torch.Tensor:
        """Per-row (length bs) bool flush mask = the radix track's seq_lens_cpu %
        mamba_track_interval == 0, so force-flush and snapshot fire on the same
        steps (no off-by-one)."""
        interval = get_exec().mamba.mamba_track_interval
        if seq_lens_cpu is None:
            # Should not happen for the supported config; stay safe and never flush.
            return torch.zeros((bs,), dtype=torch.bool)
        mask = (seq_lens_cpu[:bs].to(torch.int64) % interval) == 0
        if mask.shape[0] < bs:
            pad = torch.zeros((bs - mask.shape[0],), dtype=torch.bool)
            mask = torch.cat([mask, pad])
        return mask.cpu()

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        assert max_num_tokens % max_bs == 0, (
            f"max_num_tokens={max_num_tokens} must be divisible by max_bs={max_bs}"
        )
        draft_token_num = max_num_tokens // max_bs
        # Per-bs static write-cursor / force-flush buffers, captured by pointer +
        # refreshed in-place each replay; sized like state_indices_list. None when off.
        self.replayssm_write_pos_list = [] if self._replayssm_enabled() else None
        self.replayssm_force_flush_list = [] if self._replayssm_enabled() else None
        # int64 to match DecodeInputBuffers.mamba_track_indices + the track-save
        # kernel's int64 index load. Refreshed in-place by _replay_metadata.
        self.mamba_track_indices_buf = torch.zeros(
            (max_bs,), dtype=torch.int64, device=self.device
        )
        for i in range(max_bs):
            self.state_indices_list.append(
                torch.full(
                    (i + 1,), self.pad_slot_id, dtype=torch.int32, device=self.device
                )
            )
            if self.replayssm_write_pos_list is not None:
                self.replayssm_write_pos_list.append(
                    torch.zeros((i + 1,), dtype=torch.int32, device=self.device)
                )
            if self.replayssm_force_flush_list is not None:
                self.replayssm_force_flush_list.append(
                    torch.zeros((i + 1,), dtype=torch.int32, device=self.device)
                )
            self.query_start_loc_list.append(
                torch.zeros((i + 2,), dtype=torch.int32, device=self.device)
            )
            self.retrieve_next_token_list.append(
                torch.zeros(
                    (i + 1, draft_token_num), dtype=torch.int32, device=self.device
                )
            )
            self.retrieve_next_sibling_list.append(
                torch.zeros(
                    (i + 1, draft_token_num), dtype=torch.int32, device=self.device
                )
            )
            self.retrieve_parent_token_list.append(
                torch.zeros(
                    (i + 1, draft_token_num), dtype=torch.int32, device=self.device
                )
            )
        self.cached_cuda_graph_decode_query_start_loc = torch.arange(
            0, max_bs + 1, dtype=torch.int32, device=self.device
        )
        self.cached_cuda_graph_verify_query_start_loc = torch.arange(
            0,
            max_bs * draft_token_num + 1,
            step=draft_token_num,
            dtype=torch.int32,
            device=self.device,
        )

    def init_cpu_graph_state(self, max_bs: int, max_num_tokens: int):
        assert max_num_tokens % max_bs == 0, (
            f"max_num_tokens={max_num_tokens} must be divisible by max_bs={max_bs}"
        )
        for i in range(max_bs):
            self.state_indices_list.append(
                torch.full(
                    (i + 1,), self.pad_slot_id, dtype=torch.int32, device=self.device
                )
            )
            self.query_start_loc_list.append(
                torch.empty((i + 2,), dtype=torch.int32, device=self.device)
            )
        self.cached_cuda_graph_decode_query_start_loc = torch.arange(
            0, max_bs + 1, dtype=torch.int32, device=self.device
        )

    def _capture_metadata(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        forward_mode: ForwardMode,
        spec_info: Optional[Union[EagleDraftInput, EagleVerifyInput]],
    ):
        if forward_mode.is_decode_or_idle():
            self.query_start_loc_list[bs - 1].copy_(
                self.cached_cuda_graph_decode_query_start_loc[: bs + 1]
            )
        elif forward_mode.is_target_verify():
            ragged_layout = (
                spec_info.ragged_verify_layout if spec_info is not None else None
            )
            if ragged_layout is not None:
                # Ragged capture: qsl from the runner's synthetic layout.
                self.query_start_loc_list[bs - 1].copy_(ragged_layout.qo_indptr_device)
            else:
                self.query_start_loc_list[bs - 1].copy_(
                    self.cached_cuda_graph_verify_query_start_loc[: bs + 1]
                )
        else:
            raise ValueError(f"Invalid forward mode: {forward_mode=}")
        mamba_indices = self.req_to_token_pool.get_mamba_indices(req_pool_indices)
        # Captured Mamba kernels read state_indices_list as PHYSICAL ids; translate
        # before copying (no-op for non-unified pool).
        mamba_indices = self._translate_mamba_indices(mamba_indices)
        self.state_indices_list[bs - 1][: len(mamba_indices)].copy_(mamba_indices)

        # Capture records the pointer to the static per-bs buffers; their zeros are
        # overwritten in-place by _replay_metadata before each replay. None when off.
        replayssm_write_pos = (
            self.replayssm_write_pos_list[bs - 1]
            if self.replayssm_write_pos_list is not None
            else None
        )
        replayssm_force_flush = (
            self.replayssm_force_flush_list[bs - 1]
            if self.replayssm_force_flush_list is not None
            else None
        )

        if forward_mode.is_target_verify() and self.topk > 1:
            # retrieve_* are None during capture, so skip the copy.
            return ForwardMetadata(
                query_start_loc=self.query_start_loc_list[bs - 1],
                mamba_cache_indices=self.state_indices_list[bs - 1],
                retrieve_next_token=self.retrieve_next_token_list[bs - 1],
                retrieve_next_sibling=self.retrieve_next_sibling_list[bs - 1],
                retrieve_parent_token=self.retrieve_parent_token_list[bs - 1],
                replayssm_write_pos=replayssm_write_pos,
                replayssm_force_flush=replayssm_force_flush,
            )
        else:
            return ForwardMetadata(
                query_start_loc=self.query_start_loc_list[bs - 1],
                mamba_cache_indices=self.state_indices_list[bs - 1],
                replayssm_write_pos=replayssm_write_pos,
                replayssm_force_flush=replayssm_force_flush,
            )

    def _replay_metadata(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        forward_mode: ForwardMode,
        spec_info: Optional[SpecInput],
        seq_lens_cpu: Optional[torch.Tensor],
        num_padding: Optional[int] = None,
        in_capture: bool = False,
        mamba_track_indices: Optional[torch.Tensor] = None,
    ):
        if num_padding is None:
            if seq_lens_cpu is None:
                num_padding = 0
            else:
                num_padding = torch.count_nonzero(
                    seq_lens_cpu == self._graph_seq_len_fill_value
                )
        num_padding = int(num_padding)
        if self._fused_state_indices_ok and self.replayssm_write_pos_list is None:
            # Single-launch fast path: mapping gather + padding sentinel + store
            # into the static buffer, plus zeroing padded req_pool_indices rows —
            # bit-identical to the reference chain below.
            mamba_indices = fused_replay_state_indices(
                req_pool_indices=req_pool_indices,
                mamba_index_mapping=self.req_to_token_pool.req_index_to_mamba_index_mapping,
                out_state_indices=self.state_indices_list[bs - 1],
                valid_bs=bs - int(num_padding),
                total_bs=bs,
                v2p=self.req_to_token_pool.mamba_v2p_table,
            )
        else:
            # Make sure forward metadata is correctly handled for padding reqs
            req_pool_indices[bs - num_padding :] = 0
            mamba_indices = self.req_to_token_pool.get_mamba_indices(req_pool_indices)
            # Translate using the LIVE v2p table BEFORE the padding sentinel below;
            # captured Mamba kernels read state_indices_list as PHYSICAL ids.
            mamba_indices = self._translate_mamba_indices(mamba_indices)
            mamba_indices[bs - num_padding :] = -1
            self.state_indices_list[bs - 1][: len(mamba_indices)].copy_(mamba_indices)
        if _validate_mamba_replay_state_indices and not in_capture:
            # This pre-replay diagnostic intentionally syncs to reject malformed
            # live or padded indices before a captured state update uses them.
            valid_bs = bs - int(num_padding)
            validate_replay_state_indices_cpu(
                mamba_indices.detach().cpu(),
                valid_bs=valid_bs,
                total_bs=bs,
                num_state_slots=self.req_to_token_pool.mamba_pool.size + 1,
                pad_slot_id=self.pad_slot_id,
            )
        # Refresh the static track-dest buffer in-place (translated); the captured
        # track-save reads it, leaving the handed-in InputBuffer slot read-only.
        # Hand out only the refreshed [:bs] prefix — Mamba2's track-save slices
        # [-num_decodes:], which on the full max_bs buffer binds the stale tail.
        track_buf = None
        if mamba_track_indices is not None:
            assert len(mamba_track_indices) >= bs, (
                f"{len(mamba_track_indices)=} < {bs=}"
            )
            track_buf = self.mamba_track_indices_buf[:bs]
            track_buf.copy_(self._translate_mamba_indices(mamba_track_indices[:bs]))
        # Refresh the static write cursor in-place (mirrors the eager
        # snapshot-then-advance). Skip the advance during capture: dummy slots
        # would corrupt real ring positions.
        replayssm_write_pos = None
        replayssm_force_flush = None
        if self.replayssm_write_pos_list is not None:
            mamba_pool = self.req_to_token_pool.mamba_pool
            write_pos_buf = mamba_pool.replayssm_write_pos
            static_wp = self.replayssm_write_pos_list[bs - 1]
            static_ff = self.replayssm_force_flush_list[bs - 1]
            # Hand the full captured per-bs buffers to the kernel; it indexes per row.
            replayssm_write_pos = static_wp
            replayssm_force_flush = static_ff
            if write_pos_buf is not None:
                # this replay's per-row physical slots (padded rows == -1)
                slots = mamba_indices.to(torch.long)
                safe_slots = slots.clamp(min=0)
                # Snapshot this step's cursor into the captured buffer in-place
                # (copy_, never reassign the object).
                static_wp[: len(mamba_indices)].copy_(write_pos_buf[safe_slots])
                # Refresh the force-flush buffer in-place from this step's seq_lens
                # (same condition as the radix track). Zeroed during capture.
                force_flush_dev = None
                # KDA: no radix coordination -> leave zeroed so the advance is a pure wrap.
                is_kda = getattr(mamba_pool, "replayssm_is_kda", False)
                if (
                    not is_kda
                    and forward_mode.is_decode_or_idle()
                    and seq_lens_cpu is not None
                ):
                    ff_mask = self._replayssm_track_flush_mask(seq_lens_cpu, bs)
                    force_flush_dev = ff_mask.to(device=self.device, dtype=torch.int32)
                    static_ff.copy_(force_flush_dev)
                else:
                    static_ff.zero_()
                # Defense in depth: the decode-ring advance is only meaningful for
                # decode/idle forwards (mirrors the eager path's gating). A
                # TARGET_VERIFY replay must never advance the cursor.
                if not in_capture and forward_mode.is_decode_or_idle():
                    L = mamba_pool.linear_replayssm_cache_len
                    # Advance only valid (non-padded) slots; a forced flush empties
                    # the ring -> next write_pos 0, like the natural L-1 wrap.
                    valid_mask = slots >= 0
                    valid_slots = slots[valid_mask]
                    if valid_slots.numel() > 0:
                        cur_pos = write_pos_buf[safe_slots]
                        flushed = cur_pos == (L - 1)
                        if force_flush_dev is not None:
                            flushed = flushed | (force_flush_dev != 0)
                        next_pos = torch.where(
                            flushed,
                            torch.zeros_like(cur_pos),
                            (cur_pos + 1) % L,
                        )
                        # Dedup; rows sharing a slot share write_pos+flush.
                        uniq_slots, inv = torch.unique(valid_slots, return_inverse=True)
                        next_for_valid = next_pos[valid_mask]
                        new_vals = torch.empty(
                            uniq_slots.shape[0],
                            dtype=write_pos_buf.dtype,
                            device=write_pos_buf.device,
                        )
                        new_vals[inv] = next_for_valid.to(write_pos_buf.dtype)
                        write_pos_buf[uniq_slots] = new_vals
        is_target_verify = forward_mode.is_target_verify()
        if forward_mode.is_decode_or_idle():
            if num_padding == 0:
                self.query_start_loc_list[bs - 1].copy_(
                    self.cached_cuda_graph_decode_query_start_loc[: bs + 1]
                )
            else:
                self.query_start_loc_list[bs - 1][: bs - num_padding].copy_(
                    self.cached_cuda_graph_decode_query_start_loc[: bs - num_padding]
                )
                self.query_start_loc_list[bs - 1][bs - num_padding :].fill_(
                    bs - num_padding
                )
        elif forward_mode.is_target_verify():
            ragged_layout = (
                spec_info.ragged_verify_layout if spec_info is not None else None
            )
            if ragged_layout is not None:
                # Mamba kernels index dense [bs, N] scratch, so they need the
                # capped variant (see padded_to_bucket). Padding rows carry
                # mamba slot -1 and are skipped.
                if ragged_layout.bs != bs or ragged_layout.cap is None:
                    ragged_layout = ragged_layout.padded_to_bucket(
                        padded_bs=bs, cap=spec_info.draft_token_num
                    )
                self.query_start_loc_list[bs - 1].copy_(ragged_layout.qo_indptr_device)
            elif num_padding == 0:
                self.query_start_loc_list[bs - 1].copy_(
                    self.cached_cuda_graph_verify_query_start_loc[: bs + 1]
                )
            else:
                self.query_start_loc_list[bs - 1][: bs - num_padding].copy_(
                    self.cached_cuda_graph_verify_query_start_loc[: bs - num_padding]
                )
                self.query_start_loc_list[bs - 1][bs - num_padding :].fill_(
                    (bs - num_padding) * spec_info.draft_token_num
                )
        else:
            raise ValueError(f"Invalid forward mode: {forward_mode=}")
        qsl_buf = self.query_start_loc_list[bs - 1]

        if is_target_verify and self.topk > 1:
            if (
                spec_info is not None
                and getattr(spec_info, "retrieve_next_token", None) is not None
            ):
                bs_without_pad = spec_info.retrieve_next_token.shape[0]
                self.retrieve_next_token_list[bs - 1][:bs_without_pad].copy_(
                    spec_info.retrieve_next_token
                )
                self.retrieve_next_sibling_list[bs - 1][:bs_without_pad].copy_(
                    spec_info.retrieve_next_sibling
                )
            return ForwardMetadata(
                query_start_loc=qsl_buf,
                mamba_cache_indices=self.state_indices_list[bs - 1],
                mamba_track_indices=track_buf,
                retrieve_next_token=self.retrieve_next_token_list[bs - 1],
                retrieve_next_sibling=self.retrieve_next_sibling_list[bs - 1],
                retrieve_parent_token=self.retrieve_parent_token_list[bs - 1],
                replayssm_write_pos=replayssm_write_pos,
                replayssm_force_flush=replayssm_force_flush,
            )
        else:
            return ForwardMetadata(
                query_start_loc=qsl_buf,
                mamba_cache_indices=self.state_indices_list[bs - 1],
                mamba_track_indices=track_buf,
                replayssm_write_pos=replayssm_write_pos,
                replayssm_force_flush=replayssm_force_flush,
            )

    def get_cuda_graph_seq_len_fill_value(self):
        return 1  # Mamba attn does not use seq lens to index kv cache

    def get_cpu_graph_seq_len_fill_value(self):
        return 1

    def _track_pools(self):
        """Full [num_layers, pool_size, ...] conv/ssm pools plus the pool index
        of the last mamba layer, for the fused all-layers track launch. None if
        the pool shape is not the expected layout."""
        cached = getattr(self, "_track_pools_cache", False)
        if cached is False:
            pools = None
            try:
                mamba_cache = self.req_to_token_pool.mamba_pool.mamba_cache
                conv_pool = mamba_cache.conv[0]
                ssm_pool = mamba_cache.temporal
                last_pool_idx = max(self.req_to_token_pool.mamba_map.values())
                if (
                    conv_pool.dim() >= 3
                    and ssm_pool.dim() >= 3
                    and conv_pool.shape[0] == ssm_pool.shape[0] == last_pool_idx + 1
                ):
                    pools = (conv_pool, ssm_pool, last_pool_idx)
            except (AttributeError, IndexError):
                pools = None
            self._track_pools_cache = pools
            cached = pools
        return cached

    def _track_mamba_state_decode(
        self,
        forward_batch: ForwardBatch,
        conv_states: torch.Tensor,
        ssm_states: torch.Tensor,
        cache_indices: torch.Tensor,
        layer_id: Optional[int] = None,
    ):
        """Copy decode conv/SSM states to track slots for prefix caching. Track
        dests come from the metadata (under cuda-graph: the static buffer), so the
        InputBuffer registry slot is never mutated.

        With a known layer_id, the per-layer launches collapse into ONE
        all-layers launch fired at the last mamba layer: the mask/src/dst
        indices are shared across layers and every layer's state is final by
        then, so the result is identical."""
        if forward_batch.mamba_track_mask is None:
            return
        if layer_id is not None:
            pools = self._track_pools()
            if pools is not None:
                conv_pool, ssm_pool, last_pool_idx = pools
                if self.req_to_token_pool.mamba_map.get(layer_id) != last_pool_idx:
                    return
                track_mamba_states_all_layers(
                    conv_pool,
                    ssm_pool,
                    cache_indices,
                    forward_batch.mamba_track_mask,
                    self.forward_metadata.mamba_track_indices,
                    forward_batch.batch_size,
                    check_freed_slots=self.enable_unified_memory,
                )
                return
        track_mamba_states_if_needed(
            conv_states,
            ssm_states,
            cache_indices,
            forward_batch.mamba_track_mask,
            self.forward_metadata.mamba_track_indices,
            forward_batch.batch_size,
            check_freed_slots=self.enable_unified_memory,
        )

    def _track_mamba_state_extend(
        self,
        forward_batch: ForwardBatch,
        h: Optional[torch.Tensor],
        ssm_states: torch.Tensor,
        forward_metadata: ForwardMetadata,
        track_states: Optional[torch.Tensor] = None,
        *,
        h_track_buf: Optional[torch.Tensor] = None,
    ):
        """Copy extend SSM state at the last chunk boundary to track slots (source
        depends on chunk alignment; see `_init_track_ssm_indices`).

        Unaligned rows read the ``h_track_buf`` snapshot written in-kernel
        when given (in the kernel's native state dtype; its rows follow the batch,
        selected by the integer index
        ``track_ssm_h_batch_src`` — a boolean mask would nonzero() and sync the
        stream once per layer); otherwise they fall back to the per-chunk
        states ``h`` (already rounded to the activation dtype)."""
        if forward_metadata.has_mamba_track_mask:
            # Triton always returns h; FlashInfer returns it only when checkpoints
            # were requested. Aligned-only tracking reads the final state below.
            if forward_metadata.track_ssm_h_src.numel() > 0:
                if h_track_buf is not None:
                    ssm_states[forward_metadata.track_ssm_h_dst] = h_track_buf[
                        forward_metadata.track_ssm_h_batch_src
                    ].to(ssm_states.dtype, copy=False)
                else:
                    assert h is not None
                    h = h.squeeze(0)
                    ssm_states[forward_metadata.track_ssm_h_dst] = h[
                        forward_metadata.track_ssm_h_src
                    ].to(ssm_states.dtype, copy=False)
            if (
                forward_metadata.track_ssm_recompute_dst is not None
                and forward_metadata.track_ssm_recompute_dst.numel() > 0
            ):
                assert track_states is not None
                ssm_states[forward_metadata.track_ssm_recompute_dst] = (
                    track_states.squeeze(0).to(ssm_states.dtype, copy=False)
                )
            if forward_metadata.track_ssm_final_src.numel() > 0:
                ssm_states[forward_metadata.track_ssm_final_dst] = ssm_states[
                    forward_metadata.track_ssm_final_src
                ]


class Mamba2AttnBackend(MambaAttnBackendBase):
    """Attention backend wrapper for Mamba2Mixer kernels."""

    needs_cpu_seq_lens: bool = False

    def __init__(self, model_runner: ModelRunner):
        super().__init__(model_runner)
        self.conv_states_shape = (
            model_runner.req_to_token_pool.mamba_pool.mamba_cache.conv[0].shape
        )

        if get_exec().mamba.enable_mamba_extra_buffer:
            assert self.conv_states_shape[-1] < self.mamba_chunk_size, (
                f"{self.conv_states_shape[-1]=} should be less than {self.mamba_chunk_size}"
            )
            assert get_exec().mamba.mamba_track_interval >= self.mamba_chunk_size, (
                f"mamba_track_interval ({get_exec().mamba.mamba_track_interval}) must be >= mamba_chunk_size ({self.mamba_chunk_size})"
            )

    def init_forward_metadata_out_graph(
        self,
        forward_batch: ForwardBatch,
        in_capture: bool = False,
    ):
        metadata = self._replay_metadata(
            forward_batch.batch_size,
            forward_batch.req_pool_indices,
            forward_batch.forward_mode,
            forward_batch.spec_info,
            forward_batch.seq_lens_cpu if not in_capture else None,
            num_padding=(
                0 if in_capture else getattr(forward_batch, "num_padding", None)
            ),
            in_capture=in_capture,
            mamba_track_indices=getattr(forward_batch, "mamba_track_indices", None),
        )
        spec_info = forward_batch.spec_info
        draft_token_num = spec_info.draft_token_num if spec_info is not None else 1
        self.forward_metadata = Mamba2Metadata.prepare_decode(
            metadata,
            forward_batch.seq_lens,
            is_target_verify=forward_batch.forward_mode.is_target_verify(),
            draft_token_num=draft_token_num,
        )
        # `forward` slices the track destinations from ([-num_decodes:])
        assert self.forward_metadata.num_decodes == forward_batch.batch_size, (
            f"{self.forward_metadata.num_decodes=} != {forward_batch.batch_size=}"
        )

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        metadata = self._forward_metadata(forward_batch)
        self.forward_metadata = Mamba2Metadata.prepare_mixed(
            metadata,
            self.mamba_chunk_size,
            forward_batch,
        )

    def forward(
        self,
        mixer: MambaMixer2,
        hidden_states: torch.Tensor,
        output: Optional[torch.Tensor],
        layer_id: int,
        forward_batch: ForwardBatch,
        mup_vector: Optional[torch.Tensor] = None,
        use_triton_causal_conv: bool = False,
    ):
        assert isinstance(self.forward_metadata, Mamba2Metadata)
        # Page-major stores state strided; only the stride-aware Triton causal-conv
        # reads it (CUDA causal_conv1d garbles it). A model may also force Triton.
        use_triton_causal_conv = (
            use_triton_causal_conv or get_memory().enable_page_major_kv_layout
        )
        layer_cache = self.req_to_token_pool.mamba2_layer_cache(layer_id)
        mixer_out, intermediate_states, track_states = mixer.forward(
            hidden_states=hidden_states,
            output=output,
            layer_cache=layer_cache,
            metadata=self.forward_metadata,
            mup_vector=mup_vector,
            use_triton_causal_conv=use_triton_causal_conv,
        )

        if forward_batch.mamba_track_mask is not None:
            if intermediate_states is not None:
                self._track_mamba_state_extend(
                    forward_batch,
                    intermediate_states,
                    layer_cache.temporal,
                    self.forward_metadata,
                    track_states=track_states,
                )

            if self.forward_metadata.num_decodes > 0:
                num_decodes = self.forward_metadata.num_decodes
                track_mamba_states_if_needed(
                    layer_cache.conv[0],
                    layer_cache.temporal,
                    self.forward_metadata.mamba_cache_indices[-num_decodes:],
                    forward_batch.mamba_track_mask[-num_decodes:],
                    self.forward_metadata.mamba_track_indices[-num_decodes:],
                    num_decodes,
                    check_freed_slots=self.enable_unified_memory,
                )

        return mixer_out

    def forward_decode(self, *args, **kwargs):
        raise NotImplementedError(
            "Mamba2AttnBackend's forward is called directly instead of through HybridLinearAttnBackend, as it supports mixed prefill and decode"
        )

    def forward_extend(self, *args, **kwargs):
        raise NotImplementedError(
            "Mamba2AttnBackend's forward is called directly instead of through HybridLinearAttnBackend, as it supports mixed prefill and decode"
        )


class HybridLinearAttnBackend(AttentionBackend):
    """Manages a full and linear attention backend"""

    def __init__(
        self,
        full_attn_backend: AttentionBackend,
        linear_attn_backend: MambaAttnBackendBase,
        full_attn_layers: list[int],
    ):
        gdn_tree_check_linear_backend(linear_attn_backend)  # --specpilot-gdn-tree-verify: GDN only
        self.full_attn_layers = full_attn_layers
        self.full_attn_backend = full_attn_backend
        self.linear_attn_backend = linear_attn_backend
        self.attn_backend_list = [full_attn_backend, linear_attn_backend]
        self.token_to_kv_pool = full_attn_backend.token_to_kv_pool
        self.req_to_token_pool = full_attn_backend.req_to_token_pool
        self.kv_index_translator = full_attn_backend.kv_index_translator
        self.max_context_len = getattr(full_attn_backend, "max_context_len", None)
        self.needs_cpu_seq_lens = (
            full_attn_backend.needs_cpu_seq_lens
            or linear_attn_backend.needs_cpu_seq_lens
        )
        self.extend_dummy_seqs_capped_by_req_pool = getattr(
            full_attn_backend, "extend_dummy_seqs_capped_by_req_pool", False
        ) or getattr(linear_attn_backend, "extend_dummy_seqs_capped_by_req_pool", False)
        # Breakable prefill CUDA graphs capture the linear extend when the linear
        # backend can run it on static tables (linear/kda_prefill_graph.py);
        # those tables follow the runner's captured-metadata contract.
        self.use_captured_forward_metadata_for_breakable_cuda_graph = (
            check_cuda_graph_backend(Phase.PREFILL, Backend.BREAKABLE)
            and linear_attn_backend.supports_prefill_graph_extend()
            and not full_attn_backend.use_captured_forward_metadata_for_breakable_cuda_graph
        )
        if self.use_captured_forward_metadata_for_breakable_cuda_graph:
            self.prefill_cuda_graph_max_batch_size = (
                linear_attn_backend.prefill_graph_max_seqs
            )
            logger.info(
                "Breakable prefill CUDA graphs capture the %s extend.",
                type(linear_attn_backend).__name__,
            )

    @property
    def data_type(self):
        # KV-cache dtype readers (e.g. the trtllm_mla fused-rope check) reach the
        # wrapper since split backends are wrapped once (#31439); the full-attn
        # side owns the KV cache, so its dtype is authoritative.
        return self.full_attn_backend.data_type

    @property
    def supports_ragged_verify_graph(self) -> bool:
        return (
            self.full_attn_backend.supports_ragged_verify_graph
            and self.linear_attn_backend.supports_ragged_verify_graph
        )

    @property
    def use_mha(self) -> bool:
        return getattr(self.full_attn_backend, "use_mha", False)

    @property
    def kv_cache_dtype(self):
        # Expose the full-attention backend's cache dtype because fused DSA/NSA RoPE
        # reads it from this wrapper.
        return getattr(self.full_attn_backend, "kv_cache_dtype", None)

    def _is_full_attn(
        self, layer: Optional[RadixAttention], layer_id: Optional[int] = None
    ) -> bool:
        if layer is not None:
            layer_id = layer.layer_id
        assert layer_id is not None, "either layer or layer_id must be provided"
        return layer_id in self.full_attn_layers

    def init_forward_metadata_out_graph(
        self,
        forward_batch: ForwardBatch,
        in_capture: bool = False,
    ):
        for attn_backend in self.attn_backend_list:
            attn_backend.init_forward_metadata_out_graph(
                forward_batch, in_capture=in_capture
            )

    def shared_read_ends(self, fm: ForwardMode) -> SharedReadEnds:
        return SharedReadEnds.max_of(
            b.shared_read_ends(fm) for b in self.attn_backend_list
        )

    def init_forward_metadata_in_graph(self, forward_batch: ForwardBatch):
        for attn_backend in self.attn_backend_list:
            attn_backend.init_forward_metadata_in_graph(forward_batch)

    @staticmethod
    def _is_plain_extend(forward_batch: ForwardBatch) -> bool:
        mode = forward_batch.forward_mode
        return (
            mode.is_extend()
            and not mode.is_target_verify()
            and not mode.is_draft_extend_v2()
        )

    def linear_extend_in_graph(self) -> bool:
        """Whether the linear layers of the prefill being captured run inside
        the graph (no eager break)."""
        return self.linear_attn_backend.prefill_graph_extend_active()

    def init_forward_metadata_for_breakable_cuda_graph_capture(
        self, forward_batch: ForwardBatch
    ):
        self.full_attn_backend.init_forward_metadata(forward_batch)
        if not self._is_plain_extend(forward_batch):
            if not forward_batch.forward_mode.is_draft_extend_v2():
                self.linear_attn_backend.init_forward_metadata(forward_batch)
            return None
        return self.linear_attn_backend.init_prefill_graph_metadata(forward_batch)

    def prepare_forward_metadata_for_breakable_cuda_graph_replay(
        self,
        capture_metadata,
        forward_batch: ForwardBatch,
        *,
        static_forward_batch: Optional[ForwardBatch] = None,
    ) -> None:
        self.full_attn_backend.init_forward_metadata(forward_batch)
        if capture_metadata is not None:
            self.linear_attn_backend.refresh_prefill_graph_metadata(
                capture_metadata, forward_batch
            )
        elif not forward_batch.forward_mode.is_draft_extend_v2():
            self.linear_attn_backend.init_forward_metadata(forward_batch)

    def get_indexer_metadata(self, layer_id: int, forward_batch: ForwardBatch):
        if layer_id in self.full_attn_layers:
            return self.full_attn_backend.get_indexer_metadata(layer_id, forward_batch)
        return None

    def on_after_cuda_graph_warmup(self):
        for attn_backend in self.attn_backend_list:
            attn_backend.on_after_cuda_graph_warmup()

    @property
    def verify_mask(self) -> Optional[VerifyMask]:
        # The mask lives on the full-attn child; the linear side reads none.
        return self.full_attn_backend.verify_mask

    def update_verify_buffers_to_fill_after_draft(
        self, spec_info: SpecInput, cuda_graph_bs: Optional[int]
    ):
        # Plan-stream fixup after draft completes: forward to both children.
        # Sub-backends that cannot run under the plan stream keep the fail-loud
        # NotImplementedError base behavior.
        for attn_backend in self.attn_backend_list:
            attn_backend.update_verify_buffers_to_fill_after_draft(
                spec_info=spec_info, cuda_graph_bs=cuda_graph_bs
            )

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        if forward_batch.forward_mode.is_draft_extend_v2():
            # DRAFT_EXTEND_V2 runs only full-attn layers in the draft model; skip
            # linear/mamba metadata (it requires query_start_loc).
            self.full_attn_backend.init_forward_metadata(forward_batch)
            return
        for attn_backend in self.attn_backend_list:
            attn_backend.init_forward_metadata(forward_batch)

    def init_mha_chunk_metadata(
        self, forward_batch: ForwardBatch, disable_flashinfer_ragged: bool = False
    ):
        # Hybrid MLA models resolve get_attn_backend() to this wrapper; delegate
        # so the full-attn backend plans its chunked-prefill metadata.
        init = getattr(self.full_attn_backend, "init_mha_chunk_metadata", None)
        if init is not None:
            init(forward_batch, disable_flashinfer_ragged)

    def get_indexer_metadata(self, layer_id, forward_batch):
        return self.full_attn_backend.get_indexer_metadata(layer_id, forward_batch)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        for attn_backend in self.attn_backend_list:
            attn_backend.init_cuda_graph_state(max_bs, max_num_tokens)

    def init_cpu_graph_state(self, max_bs: int, max_num_tokens: int):
        for attn_backend in self.attn_backend_list:
            attn_backend.init_cpu_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata_capture_cpu_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        out_cache_loc: torch.Tensor,
        encoder_lens: Optional[torch.Tensor],
        forward_mode: ForwardMode,
        spec_info: Optional[Union[EagleDraftInput, EagleVerifyInput]],
    ):
        for attn_backend in self.attn_backend_list:
            attn_backend.init_forward_metadata_capture_cpu_graph(
                bs,
                num_tokens,
                req_pool_indices,
                seq_lens,
                out_cache_loc,
                encoder_lens,
                forward_mode,
                spec_info,
            )

    def get_cuda_graph_seq_len_fill_value(self):
        return self.full_attn_backend.get_cuda_graph_seq_len_fill_value()

    def get_cpu_graph_seq_len_fill_value(self):
        return self.full_attn_backend.get_cpu_graph_seq_len_fill_value()

    def forward_decode(
        self,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        q: Optional[torch.Tensor] = None,  # For full attention
        k: Optional[torch.Tensor] = None,  # For full attention
        v: Optional[torch.Tensor] = None,  # For full attention
        mixed_qkv: Optional[torch.Tensor] = None,  # For linear attention
        a: Optional[torch.Tensor] = None,  # For GDN linear attention
        b: Optional[torch.Tensor] = None,  # For GDN linear attention
        **kwargs,
    ):
        if self._is_full_attn(layer, kwargs.get("layer_id")):
            return self.full_attn_backend.forward_decode(
                q, k, v, layer, forward_batch, save_kv_cache, **kwargs
            )
        return self.linear_attn_backend.forward_decode(
            q=q,
            k=k,
            v=v,
            layer=layer,
            forward_batch=forward_batch,
            save_kv_cache=save_kv_cache,
            mixed_qkv=mixed_qkv,
            a=a,
            b=b,
            **kwargs,
        )

    def forward_extend(
        self,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        q: Optional[torch.Tensor] = None,  # For full attention
        k: Optional[torch.Tensor] = None,  # For full attention
        v: Optional[torch.Tensor] = None,  # For full attention
        mixed_qkv: Optional[torch.Tensor] = None,  # For linear attention
        a: Optional[torch.Tensor] = None,  # For GDN linear attention
        b: Optional[torch.Tensor] = None,  # For GDN linear attention
        **kwargs,
    ):
        if self._is_full_attn(layer, kwargs.get("layer_id")):
            return self.full_attn_backend.forward_extend(
                q, k, v, layer, forward_batch, save_kv_cache, **kwargs
            )
        return self.linear_attn_backend.forward_extend(
            q=q,
            k=k,
            v=v,
            layer=layer,
            forward_batch=forward_batch,
            save_kv_cache=save_kv_cache,
            mixed_qkv=mixed_qkv,
            a=a,
            b=b,
            **kwargs,
        )

    def forward(
        self,
        q: Optional[torch.Tensor] = None,  # For full attention
        k: Optional[torch.Tensor] = None,  # For full attention
        v: Optional[torch.Tensor] = None,  # For full attention
        layer: RadixAttention = None,
        forward_batch: ForwardBatch = None,
        save_kv_cache: bool = True,
        mixed_qkv: Optional[torch.Tensor] = None,  # For linear attention
        a: Optional[torch.Tensor] = None,  # For linear attention
        b: Optional[torch.Tensor] = None,  # For linear attention
        **kwargs,
    ):
        is_linear_attn = not self._is_full_attn(layer, kwargs.get("layer_id"))

        # For linear attention, dispatch on the logical mode to match the
        # built metadata.
        dispatch_mode = (
            forward_batch.logical_forward_mode
            if is_linear_attn
            else forward_batch.forward_mode
        )

        if forward_batch.forward_mode.is_idle():
            if is_linear_attn:
                return mixed_qkv.new_empty(
                    mixed_qkv.shape[0], layer.num_v_heads, layer.head_v_dim
                )
            return q.new_empty(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)
        elif dispatch_mode.is_decode():
            return self.forward_decode(
                layer,
                forward_batch,
                save_kv_cache,
                q,
                k,
                v,
                mixed_qkv,
                a,
                b,
                **kwargs,
            )
        else:
            return self.forward_extend(
                layer,
                forward_batch,
                save_kv_cache,
                q,
                k,
                v,
                mixed_qkv,
                a,
                b,
                **kwargs,
            )

    def update_mamba_state_after_mtp_verify(
        self,
        last_correct_step_indices: torch.Tensor,
        mamba_track_indices: Optional[torch.Tensor],
        mamba_steps_to_track: Optional[torch.Tensor],
        model,
        req_pool_indices: Optional[torch.Tensor] = None,
    ):
        """Commit accepted Mamba states; PP rows identify the delayed batch."""
        request_number = last_correct_step_indices.shape[0]
        src_indices_raw = None
        if pp_spec_stable_rows_enabled() and req_pool_indices is not None:
            src_indices_raw = req_pool_indices[:request_number]

        # `mamba_track_indices` is VIRTUAL; the scatter writes physical views.
        if mamba_track_indices is not None:
            mamba_track_indices = self.linear_attn_backend._translate_mamba_indices(
                mamba_track_indices
            )

        if src_indices_raw is not None:
            state_indices_tensor = self.linear_attn_backend._translate_mamba_indices(
                self.linear_attn_backend.req_to_token_pool.get_mamba_indices(
                    req_pool_indices[:request_number]
                )
            )
        else:
            state_indices_tensor = (
                self.linear_attn_backend.forward_metadata.mamba_cache_indices[
                    :request_number
                ]
            )

        req_pool = self.linear_attn_backend.req_to_token_pool
        mamba_caches = req_pool.get_speculative_mamba2_params_all_layers()

        # ReplaySSM-KDA: the accepted drafts live in the per-slot ring (written
        # during verify); no intermediate_ssm is allocated. Replay the accepted
        # prefix into `temporal` instead of scattering an intermediate state.
        # dspark/dflash call this method directly; the generic spec_utils commit
        # handles replayssm before reaching here (returns early), so this branch is
        # only hit by the direct callers. Chain layout only (topk <= 1), so
        # accept_lens == last_correct_step_indices + 1.
        mamba_pool = req_pool.mamba_pool
        if getattr(mamba_pool, "replayssm_is_kda", False):
            from sglang.kernels.ops.attention.linear.kda_replayssm_spec_decode import (
                commit_kda_replayssm_after_verify,
            )

            commit_kda_replayssm_after_verify(
                spec_state=mamba_caches,
                state_batch_indices=state_indices_tensor,
                accept_lens=last_correct_step_indices + 1,
                last_correct_step_indices=last_correct_step_indices,
                mamba_track_indices=mamba_track_indices,
                mamba_steps_to_track=mamba_steps_to_track,
                src_indices_raw=src_indices_raw,
                null_block_id=-1,
            )
            return

        # KDA fused-accept: the next verify seeds itself in-kernel from the
        # accepted checkpoint slot (recurrent_kda's num_accepted_tokens), so the
        # SSM state never round-trips through `temporal` and only the conv
        # windows still need the accept rollback. Recording this round's accept
        # length is what selects that seed next round; chain layout only (see
        # above), so accept_lens == last_correct_step_indices + 1. The pool
        # exists only where KDAAttnBackend found the contract satisfied, which
        # includes mamba radix tracking being off.
        accept_lens_pool = self.linear_attn_backend.accept_lens_pool
        if accept_lens_pool is not None:
            assert mamba_track_indices is None, "fused-accept runs with radix off"
            for conv_states, intermediate_conv_window in zip(
                mamba_caches.conv, mamba_caches.intermediate_conv_window
            ):
                fused_conv_window_scatter_with_mask(
                    conv_states,
                    intermediate_conv_window,
                    state_indices_tensor,
                    last_correct_step_indices,
                    src_indices_raw,
                )
            accept_lens_pool[state_indices_tensor.to(torch.int64)] = (
                last_correct_step_indices.to(torch.int32) + 1
            )
            return

        # --specpilot-gdn-tree-verify: no per-draft states exist; replay the accepted paths
        gdn_tree = getattr(self.linear_attn_backend, "specpilot_gdn_tree", None)
        if gdn_tree is not None:
            gdn_tree.commit(
                mamba_caches,
                state_indices_tensor,
                last_correct_step_indices,
                mamba_track_indices,
                mamba_steps_to_track,
            )
        else:
            scatter_mamba_states_after_mtp_verify(
                mamba_caches,
                state_indices_tensor,
                last_correct_step_indices,
                mamba_track_indices,
                mamba_steps_to_track,
                src_indices_raw=src_indices_raw,
            )

        self._update_ple_state_after_mtp_verify(
            state_indices_tensor,
            last_correct_step_indices,
            mamba_track_indices,
            mamba_steps_to_track,
            src_indices_raw,
        )

    @staticmethod
    def _scatter_speculative_state_with_mask(
        dst: torch.Tensor,
        src: torch.Tensor,
        dst_indices_raw: torch.Tensor,
        step_indices_raw: torch.Tensor,
        src_indices_raw: Optional[torch.Tensor] = None,
    ):
        if dst is None or src is None or step_indices_raw.numel() == 0:
            return
        if dst.is_cuda and src.is_cuda:
            fused_mamba_state_scatter_with_mask(
                dst,
                src,
                dst_indices_raw,
                step_indices_raw,
                src_indices_raw,
            )
            return

        device = dst.device
        dst_indices = dst_indices_raw.to(device=device, dtype=torch.long)
        steps = step_indices_raw.to(device=device, dtype=torch.long)
        src_indices = (
            torch.arange(steps.shape[0], device=device, dtype=torch.long)
            if src_indices_raw is None
            else src_indices_raw.to(device=device, dtype=torch.long)
        )
        valid = (
            (steps >= 0)
            & (steps < src.shape[2])
            & (dst_indices >= 0)
            & (dst_indices < dst.shape[1])
            & (src_indices < src.shape[1])
        )
        valid_indices = valid.nonzero(as_tuple=True)[0]
        if valid_indices.numel() == 0:
            return
        dst[:, dst_indices[valid_indices]] = src[
            :, src_indices[valid_indices], steps[valid_indices]
        ]

    def _update_ple_state_after_mtp_verify(
        self,
        state_indices_tensor: torch.Tensor,
        last_correct_step_indices: torch.Tensor,
        mamba_track_indices: Optional[torch.Tensor],
        mamba_steps_to_track: Optional[torch.Tensor],
        src_indices_raw: Optional[torch.Tensor] = None,
    ):
        """Roll the accepted per-step PLE side states into their main slots."""
        req_to_token_pool = self.linear_attn_backend.req_to_token_pool
        if mamba_track_indices is not None:
            assert mamba_steps_to_track is not None

        state_pairs = []
        short_conv_pool = req_to_token_pool.short_conv_pool
        if (
            short_conv_pool.conv_state is not None
            and short_conv_pool.intermediate_conv_state is not None
        ):
            state_pairs.append(
                (
                    short_conv_pool.conv_state,
                    short_conv_pool.intermediate_conv_state,
                )
            )

        ngram_pool = req_to_token_pool.ngram_pool
        if (
            ngram_pool.context is not None
            and ngram_pool.intermediate_context is not None
        ):
            state_pairs.append(
                (
                    ngram_pool.context.unsqueeze(0),
                    ngram_pool.intermediate_context.unsqueeze(0),
                )
            )

        for state, intermediate_state in state_pairs:
            self._scatter_speculative_state_with_mask(
                state,
                intermediate_state,
                state_indices_tensor,
                last_correct_step_indices,
                src_indices_raw,
            )
            if mamba_track_indices is not None:
                self._scatter_speculative_state_with_mask(
                    state,
                    intermediate_state,
                    mamba_track_indices,
                    mamba_steps_to_track,
                    src_indices_raw,
                )


class ShortConvHybridAttnBackend(HybridLinearAttnBackend):
    """HybridLinearAttnBackend variant for short-conv hybrid models (ZAYA1 CCA,
    LFM2 short conv).

    The linear sidecar is a :class:`ShortConvAttnBackend
    <sglang.srt.layers.attention.linear.short_conv_backend.ShortConvAttnBackend>`
    that owns the per-request conv-state plumbing. The model's conv module
    reaches it via :meth:`conv_state_metadata` (``get_attn_backend()`` returns
    this wrapper) and runs its own conv kernel against the returned handle, so
    the model definition holds no pool access. The sidecar is never reached
    through the full-vs-linear ``forward_decode`` / ``forward_extend`` dispatch.
    """

    def __init__(
        self,
        full_attn_backend: AttentionBackend,
        short_conv_backend: MambaAttnBackendBase,
        full_attn_layers: list,
    ):
        # Register short_conv_backend as the linear sidecar so it rides in
        # attn_backend_list and inherits the metadata / cuda-graph fan-out.
        super().__init__(full_attn_backend, short_conv_backend, full_attn_layers)
        self.short_conv_backend = short_conv_backend

    def conv_state_metadata(self, layer_id: int, forward_batch: ForwardBatch):
        return self.short_conv_backend.conv_state_metadata(layer_id, forward_batch)
