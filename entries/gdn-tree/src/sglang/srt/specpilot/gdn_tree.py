"""GDN target-verify without per-node state inside SGLang's GDN backend (``--specpilot-gdn-tree-verify``).

Stock SGLang verifies a GDN layer's draft tokens with ``fused_sigmoid_gating_delta_rule_update``, which
stores every draft token's recurrent state in ``intermediate_ssm`` ([layers, rows, draft tokens, HV, V, K],
the dominant speculative scratch), and commits by copying the last accepted token's state into the pool.
With the flag on, the mamba pool leaves that buffer unallocated and

- verify: each GDN layer keeps its draft inputs (q, k, v, a, b: about 16 KB per token and layer at
  Qwen3-Next's shape, against 2 MB of state) and the vendored path kernel computes every node's output along
  its root path from the committed state; a chain draft is a tree of one branch;
- commit: the vendored commit kernel replays each request's accepted root path into its state slot (with
  mamba radix tracking, also the path up to the tracked step into the track slot). It runs the very kernel
  the verify ran, with the state store switched on.

Conv1d windows keep SGLang's own per-draft-token buffer and are scattered as stock does.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.runtime_context import get_context
from sglang.srt.specpilot import option_value
from sglang.srt.specpilot.kernels.gdn_tree import gdn_tree_commit, gdn_tree_path_verify, tree_schedule

FLAG = "--specpilot-gdn-tree-verify"


def enabled() -> bool:
    # Pools and backends built outside a server (tools, tests) have no published config: stock behaviour.
    return get_context().is_config_namespace_published("specpilot") and bool(option_value(FLAG))


def replaces_state_snapshots(cache_params) -> bool:
    """Whether the mamba pool leaves ``intermediate_ssm`` unallocated: the flag is on (GDN layers only)."""
    if not enabled():
        return False
    if cache_params.is_kda:
        raise ValueError(f"{FLAG} verifies GDN layers only, and this model's linear layers are KDA; leave it off")
    return True


def check_linear_backend(backend) -> None:
    """Refuse the flag for a target whose linear layers are not GDN (Mamba2, Lightning, short conv):
    the pool no longer keeps the per-draft states their verify needs."""
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    if enabled() and not getattr(backend, "is_draft_worker", False) and not isinstance(backend, GDNAttnBackend):
        raise ValueError(f"{FLAG} verifies GDN layers only, and this model's linear layers use "
                         f"{type(backend).__name__}; leave it off")


def root_paths(parents: torch.Tensor, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's root path ending at node ``last[b]``, root first.

    parents: [B, T] int (-1: child of the committed state, else a lower index); last: [B] int, >= 0.
    Returns (nodes [B, T] int32, the path in its first ``lengths[b]`` entries; lengths [B] int32).
    The ancestor relation is closed by squaring (log2 T small matrix products, no host sync); ancestors
    have lower indices, so sorting a path's nodes by index puts the root first.
    """
    B, T = parents.shape
    nodes = torch.arange(T, device=parents.device)
    reach = (parents[:, :, None] == nodes).float() + torch.eye(T, device=parents.device)
    for _ in range(max(T - 1, 1).bit_length()):
        reach = (reach @ reach).clamp_(max=1.0)
    on_path = reach[torch.arange(B, device=parents.device), last.long()] > 0
    ordered = torch.where(on_path, nodes, T).sort(dim=1).values
    return torch.where(ordered < T, ordered, 0).to(torch.int32), on_path.sum(1).to(torch.int32)


class GDNTreeVerifier:
    """One GDN backend's verify and commit; holds each layer's draft inputs from the verify to the commit.

    The input buffers are allocated once, outside any CUDA graph, and rows follow SGLang's verify scratch
    rows (``verify_intermediate_state_indices``), so a captured verify writes where the eager commit reads.
    """

    def __init__(self, layer_ids: list[int], rows: torch.Tensor, max_draft_tokens: int, num_k_heads: int,
                 state_shape: tuple[int, int, int], dtype: torch.dtype, device):
        num_v_heads, head_v_dim, head_k_dim = state_shape
        layers, slots = len(layer_ids), int(rows.max()) + 1
        self.layer_index = {layer_id: i for i, layer_id in enumerate(layer_ids)}
        self.first_layer = layer_ids[0]
        self.rows = rows.long()  # index_copy_ takes int64 indices
        T = max_draft_tokens
        self.q = torch.zeros(layers, slots, T, num_k_heads, head_k_dim, dtype=dtype, device=device)
        self.k = torch.zeros_like(self.q)
        self.v = torch.zeros(layers, slots, T, num_v_heads, head_v_dim, dtype=dtype, device=device)
        # the gate inputs stay FP32 so any activation dtype is kept exactly (the kernel reads FP32)
        self.a = torch.zeros(layers, slots, T, num_v_heads, dtype=torch.float32, device=device)
        self.b = torch.zeros_like(self.a)
        self.parents = torch.full((slots, T), -1, dtype=torch.int32, device=device)
        self.chain = (torch.arange(T, dtype=torch.int32, device=device) - 1)[None, :]
        self.gates: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.schedule = None

    @classmethod
    def for_backend(cls, backend) -> Optional["GDNTreeVerifier"]:
        """The verifier of a target GDN backend when the flag is on; refuses settings it does not cover."""
        if backend.is_draft_worker or not enabled():
            return None
        pool = backend.req_to_token_pool
        mamba_pool = pool.mamba_pool
        cache = mamba_pool.mamba_cache
        if not hasattr(cache, "intermediate_ssm"):
            return None  # no speculative decoding: nothing is verified
        from sglang.srt.layers.attention.linear.utils import pp_spec_stable_rows_enabled

        problems = []
        if cache.intermediate_ssm is not None:
            problems.append(f"this mamba pool ({type(mamba_pool).__name__}) allocated intermediate_ssm anyway")
        rings = ("enable_linear_replayssm", "enable_linear_replayssm_spec")
        if any(getattr(mamba_pool, ring, False) for ring in rings):
            problems.append("--enable-linear-replayssm(-spec) keeps states in rings of its own")
        if not cache.temporal.is_contiguous():
            problems.append("the state pool is strided (envelope / unified memory layout)")
        max_draft_tokens = cache.intermediate_conv_window[0].shape[2]
        if max_draft_tokens > 64:
            problems.append(f"{max_draft_tokens} draft tokens (the path kernel takes trees of up to 64 nodes)")
        if pp_spec_stable_rows_enabled():
            problems.append("pipeline-parallel stable speculative rows (SGLANG_ENABLE_PP_SPEC)")
        device = torch.device(backend.device)
        if device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
            problems.append("the GPU is older than sm_90")
        if problems:
            raise ValueError(f"{FLAG} cannot run here: " + "; ".join(problems) + f". Leave {FLAG} off.")
        num_v_heads, head_v_dim, head_k_dim = cache.temporal.shape[2:]
        conv_dim = cache.conv[0].shape[2]  # cat([q, k, v]) channels: 2 * H * K + HV * V
        num_k_heads = (conv_dim - num_v_heads * head_v_dim) // (2 * head_k_dim)
        return cls(list(mamba_pool.mamba_layer_ids), backend.verify_intermediate_state_indices, max_draft_tokens,
                   num_k_heads, (num_v_heads, head_v_dim, head_k_dim), cache.conv[0].dtype, backend.device)

    def verify(self, layer, draft_tokens: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               a: torch.Tensor, b: torch.Tensor, ssm_states: torch.Tensor, cache_indices: torch.Tensor,
               retrieve_parent_token: Optional[torch.Tensor]) -> torch.Tensor:
        """Every draft token's GDN output [B, T, HV, V]; keeps this layer's inputs for the commit.

        query, key: B*T tokens of [H, K] (any view); value: B*T of [HV, V]; a, b: [B*T, HV];
        ssm_states: [slots, HV, V, K] committed states (read only); cache_indices: [>= B] state slots;
        retrieve_parent_token: [B, T] parents in the draft block (entry 0 unused), or None for chains.
        """
        T = draft_tokens
        B = a.shape[0] // T
        index = self.layer_index[layer.layer_id]
        rows = self.rows[:B]
        q = query.reshape(B, T, -1, layer.head_k_dim).contiguous()
        k = key.reshape(B, T, -1, layer.head_k_dim).contiguous()
        v = value.reshape(B, T, -1, layer.head_v_dim).contiguous()
        a = a.reshape(B, T, -1).contiguous()
        b = b.reshape(B, T, -1).contiguous()
        if q.dtype != self.q.dtype:
            raise ValueError(f"{FLAG}: GDN activations are {q.dtype}, the kept draft inputs {self.q.dtype}")
        if layer.layer_id == self.first_layer:  # one schedule per verify step, shared by every GDN layer
            if retrieve_parent_token is None:
                parents = self.chain[:, :T].expand(B, T).contiguous()
            else:
                parents = retrieve_parent_token[:B].to(torch.int32, copy=True)
                parents[:, 0] = -1  # the first draft token follows the committed state
            self.parents[:, :T].index_copy_(0, rows, parents)
            self.schedule = tree_schedule(parents)
        for kept, now in ((self.q, q), (self.k, k), (self.v, v), (self.a, a), (self.b, b)):
            kept[index, :, :T].index_copy_(0, rows, now.to(kept.dtype))
        self.gates[layer.layer_id] = (layer.A_log, layer.dt_bias)
        slots = cache_indices[:B].clamp(min=0)  # padded rows (-1) read the reserved padding slot 0
        return gdn_tree_path_verify(q, k, v, a, b, layer.A_log, layer.dt_bias, ssm_states, slots, self.schedule)

    def commit(self, caches, state_indices: torch.Tensor, last_steps: torch.Tensor,
               track_slots: Optional[torch.Tensor], track_steps: Optional[torch.Tensor]) -> None:
        """Advance each request's GDN states (all layers) and conv windows past its accepted tokens.

        caches: the pool's ``SpeculativeState`` (temporal [layers, slots, HV, V, K], updated in place);
        state_indices: [B] slots; last_steps: [B] last accepted draft-block index (< 0: leave the row);
        track_slots / track_steps: mamba radix tracking's [B] slots and draft steps to snapshot (or None).
        """
        rows = self.rows[: state_indices.shape[0]]
        # full-width rows: a root path only visits this step's nodes, so columns past a shorter draft are never read
        parents = self.parents[rows]
        if track_slots is not None:
            # the tracked state starts from the pre-commit state, so it is replayed first
            valid = (track_steps >= 0) & (track_slots >= 0) & (state_indices >= 0)
            source = torch.where(valid, state_indices, 0).long()
            target = torch.where(valid, track_slots, 0).long()
            caches.temporal[:, target] = caches.temporal[:, source]
            self._replay(caches.temporal, rows, parents, target, torch.where(valid, track_steps, -1))
            _scatter_conv_windows(caches, track_slots, track_steps)
        self._replay(caches.temporal, rows, parents, state_indices, last_steps)
        _scatter_conv_windows(caches, state_indices, last_steps)

    def _replay(self, temporal: torch.Tensor, rows: torch.Tensor, parents: torch.Tensor, slots: torch.Tensor,
                last_steps: torch.Tensor) -> None:
        valid = (last_steps >= 0) & (slots >= 0)
        nodes, lengths = root_paths(parents, last_steps.clamp(min=0))
        # rows left alone replay nothing on the reserved padding slot 0 (its values are rewritten unchanged)
        lengths = torch.where(valid, lengths, 0)
        slots = torch.where(valid, slots, 0)
        for layer_id, index in self.layer_index.items():
            A_log, dt_bias = self.gates[layer_id]
            q, k, v, a, b = (kept[index, rows] for kept in (self.q, self.k, self.v, self.a, self.b))
            gdn_tree_commit(q, k, v, a, b, A_log, dt_bias, temporal[index], slots, nodes, lengths)


def _scatter_conv_windows(caches, slots: torch.Tensor, steps: torch.Tensor) -> None:
    """Each conv state becomes its draft row's window after ``steps[i]`` (stock's commit; rows < 0 skipped)."""
    from sglang.kernels.ops.mamba.mamba_state_scatter_triton import fused_conv_window_scatter_with_mask

    for conv, window in zip(caches.conv, caches.intermediate_conv_window):
        if conv.numel() == 0:
            continue
        if conv.is_cuda:
            fused_conv_window_scatter_with_mask(conv, window, slots, steps)
        else:  # stock's fused scatter needs CUDA; plain indexing does the same elsewhere
            valid = ((steps >= 0) & (slots >= 0)).nonzero(as_tuple=True)[0]
            conv[:, slots[valid].long()] = window[:, valid, steps[valid].long()]
