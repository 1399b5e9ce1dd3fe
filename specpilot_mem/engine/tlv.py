"""Two-level verification (the paper's §4.3) on the engine: a Q pass over the W12 8-bit view proposes, one exact pass
decides.

One cycle from the pending token p (the last output token, its target state not computed yet):

1. the drafter drafts a tree T1 below p (the engine's own draft and tree builder, ``nodes`` nodes);
2. the **Q pass** runs T1 through the target with every block projection and the LM head read from the 8-bit view
   of their W12 encoding (the dropped mantissa bits at their midpoint, or truncated) and writes nothing: no KV-cache
   slot (attention reads the committed keys and the rows' own), no GDN state, no conv window, no drafter feature. It
   returns the chain C: the path of T1 that follows the Q pass's argmax, plus the Q pass's bonus token after it;
3. the drafter drafts again from the end of C, from the committed features and the Q pass's features along C, and its
   best-first subtree truncated to ``nodes - |C|`` nodes is attached below C;
4. one **exact pass** (the engine's verify, the W12 weights themselves) verifies the combined tree of ``nodes``
   nodes and accepts its longest path that matches the exact argmax, plus the exact bonus token.

Only the exact pass accepts tokens, so the output is the target's greedy decode whatever the Q pass says (a Q pass
that is wrong everywhere only shortens C). τ counts tokens per exact pass; a step's time is the whole cycle (both
drafts, both passes). ``accept_from_qpass`` is the lossy variant token forcing must reject: it commits C as the Q pass
proposed it and lets the exact pass only add its bonus.

Uses the engine's public pieces only (draft, verify, the cache's commit, the target's layers and the drafter), so it
runs on any engine with those.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call

from specpilot_mem.engine.drafter import Lattice
from specpilot_mem.engine.engine import Engine, Generation, Request, _as_request
from specpilot_mem.engine.model import Cache, HybridTarget, Rows, lm_head, make_rows
from specpilot_mem.engine.trees import build_tree
from specpilot_mem.errors import SpecPilotError


@dataclass(frozen=True)
class TlvOptions:
    nodes: int = 32  # N: nodes of the combined tree (and of T1), the root not counted
    positions: int = 8  # drafted positions a draft
    builder: str = "best-first"
    low_bits: str = "midpoint"  # the Q pass's dropped bits: "midpoint" (1000) or "truncated" (0000)
    accept_from_qpass: bool = False  # the lossy variant (token forcing's negative control)
    measure_agreement: bool = False  # also run the Q pass over the combined tree (outside the timed cycle)


@dataclass
class TlvGeneration(Generation):
    """A TLV request's result: ``accepted`` is tokens per exact pass; ``chain`` |C| per cycle; ``step_times`` each
    cycle's seconds; ``agree``/``compared``: Q-pass argmax equal to the exact one, over the nodes compared."""

    chain: list[int] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    agree: int = 0
    compared: int = 0
    chain_agree: int = 0
    chain_compared: int = 0
    untimed: float = 0.0  # seconds of agreement measurement inside the request, not in step_times


def qpass_weights(target: HybridTarget, low_bits: str = "midpoint") -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The Q pass's weights: every 2-D block weight (the projections the W12 method converts) and the LM head, each
    the value of its W12 8-bit view (``qpass_weight_reference``) in the engine's dtype. The engine keeps its weights
    as tensors on the CPU, so these are values beside them; on the GPU the Q pass reads the view in place
    (``specpilot_kernels.w12.qpass.w12_qpass_gemm``)."""
    from specpilot_kernels.w12 import encode
    from specpilot_kernels.w12.reference import qpass_weight_reference

    def view_of(weight: torch.Tensor) -> torch.Tensor:
        return qpass_weight_reference(encode(weight.detach().to(torch.bfloat16)), low_bits).to(weight.dtype)

    blocks = {
        f"blocks.{name}": view_of(p)
        for name, p in target.blocks.named_parameters()
        if p.dim() == 2 and name.endswith(".weight")
    }
    return blocks, view_of(target.lm_head_weight)


def matching_path(tokens: list[int], parents: list[int], best: list[int]) -> list[int]:
    """Rows from the root (row 0) down the tree, each child the token its parent's argmax ``best`` names."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    path = [0]
    while True:
        nxt = next((c for c in children.get(path[-1], []) if tokens[c] == best[path[-1]]), None)
        if nxt is None:
            return path
        path.append(nxt)


class _ReadOnlyRows(nn.Module):
    """The target over tree rows against the cache, writing nothing: attention takes the committed keys and values
    and the rows' own (never stored), the GDN layers return their end states without keeping them."""

    def __init__(self, target: HybridTarget):
        super().__init__()
        self.target = target

    def forward(self, rows: Rows, cache: Cache):
        target, length = self.target, cache.length
        x = target.embed(rows.tokens)
        feats = []
        for i, block in enumerate(target.blocks):
            h = block.norm_mixer(x)
            if block.kind == "gdn":
                out, _, _ = block.mixer.forward_rows(h, rows, cache.state[i], cache.conv[i], "wy")
            else:
                mixer = block.mixer
                q, k, v, gate = mixer._project(h, cache.length_t + rows.depth)
                keys = torch.cat([cache.keys[i][:, :length], k.to(cache.keys[i].dtype)], dim=1)
                values = torch.cat([cache.values[i][:, :length], v.to(cache.values[i].dtype)], dim=1)
                committed = torch.ones(rows.count, length, dtype=torch.bool, device=x.device)
                out = mixer._attend(q, keys, values, gate, torch.cat([committed, rows.anc], dim=1))
            x = x + out
            x = x + block.mlp(block.norm_mlp(x))
            if i in target.cfg.feature_layers:
                feats.append(x)
        return target.norm(x), torch.cat(feats, dim=-1)


class TwoLevelEngine:
    """An :class:`Engine` decoding with the TLV cycle; ``generate(requests)`` as the engine's (EngineSystem runs it)."""

    def __init__(self, engine: Engine, options: TlvOptions | None = None):
        if engine.drafter is None:
            raise SpecPilotError(
                "two-level verification needs a drafter",
                where="TwoLevelEngine(engine)",
                fix="load the pair with its drafter (Engine.load_default())",
            )
        self.engine = engine
        self.options = options or TlvOptions()
        opts = self.options
        if not 1 <= opts.positions <= engine.drafter.cfg.block_size:
            raise SpecPilotError(
                f"positions={opts.positions}: the drafter drafts 1..{engine.drafter.cfg.block_size}",
                where="TlvOptions.positions",
                fix="draft at most the drafter's block size",
            )
        if opts.nodes < 1 or opts.low_bits not in ("midpoint", "truncated"):
            raise SpecPilotError(
                f"nodes={opts.nodes}, low_bits={opts.low_bits!r}",
                where="TlvOptions",
                fix="use nodes >= 1 and low_bits 'midpoint' or 'truncated'",
            )
        self._rows_module = _ReadOnlyRows(engine.target)
        blocks, self._q_head = qpass_weights(engine.target, opts.low_bits)
        self._q_params = {f"target.{name}": w for name, w in blocks.items()}

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def synthetic(self) -> bool:
        return self.engine.synthetic

    # -- the two passes ---------------------------------------------------------------------------------

    @torch.no_grad()
    def qpass(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [R, V], drafter features [R, F]) of the rows from the 8-bit view; the cache is left as it was."""
        hidden, feats = functional_call(self._rows_module, self._q_params, (rows, self.engine.cache))
        return lm_head(hidden[0], self._q_head), feats[0]

    def _draft_from(self, features: torch.Tensor, anchor: int, anchor_pos: int) -> Lattice:
        """The drafter's lattice after ``anchor`` at ``anchor_pos`` from ``features`` [anchor_pos, F]."""
        engine = self.engine
        window = engine.drafter.cfg.context_window
        idx = anchor_pos - window + torch.arange(window, device=engine.device)
        feats = features[idx.clamp(min=0)][None]
        hidden = engine.drafter(
            engine.target.embed,
            feats,
            (idx >= 0)[None],
            torch.tensor([anchor], device=engine.device),
            torch.tensor([anchor_pos], device=engine.device),
        )[0]
        base = lm_head(hidden, engine.target.lm_head_weight)
        return engine.drafter.lattice(hidden, base, anchor, self.options.positions)

    def cycle(self, pending_token: int, generation: TlvGeneration, produced: int) -> list[int]:
        """One TLV cycle: the tokens it commits (the exact pass's accepted path and bonus)."""
        engine, opts, cache = self.engine, self.options, self.engine.cache
        conv = engine.target.cfg.conv_size
        first = engine.draft(pending_token, opts.positions).to("cpu")
        t1_tokens, t1_parents = build_tree(opts.builder, first, opts.nodes)
        t1_tokens, t1_parents = [pending_token] + t1_tokens, [-1] + [p + 1 for p in t1_parents]
        q_logits, q_feats = self.qpass(make_rows(t1_tokens, t1_parents, conv, engine.device))
        q_best = q_logits.argmax(-1).tolist()
        q_path = matching_path(t1_tokens, t1_parents, q_best)
        chain = [t1_tokens[i] for i in q_path[1:]] + [q_best[q_path[-1]]]  # C: the Q pass's path and its bonus
        chain = chain[: opts.nodes]
        budget = opts.nodes - len(chain)
        tokens, parents = [pending_token] + chain, list(range(-1, len(chain)))
        if budget > 0:
            context = torch.cat([cache.features[: cache.length], q_feats[q_path]], dim=0)
            second = self._draft_from(context, chain[-1], cache.length + len(chain)).to("cpu")
            sub_tokens, sub_parents = build_tree(opts.builder, second, budget)
            tokens += sub_tokens
            parents += [len(chain) if p < 0 else p + len(chain) + 1 for p in sub_parents]
        rows = make_rows(tokens, parents, conv, engine.device)
        logits, pending = engine.verify(rows)
        logits = engine._fault(logits, produced + rows.depth)
        best = logits.argmax(-1).tolist()
        path = list(range(len(chain) + 1)) if opts.accept_from_qpass else matching_path(tokens, parents, best)
        # the Q pass's argmax against the exact one along C (the same rows, the same ancestors, in both trees)
        along = [i for i in range(len(q_path)) if i <= len(chain)]
        generation.chain_agree += sum(q_best[q_path[i]] == best[i] for i in along)
        generation.chain_compared += len(along)
        if opts.measure_agreement:  # an extra Q pass over the combined tree, kept out of the cycle's time
            measured = time.perf_counter()
            q_all = self.qpass(rows)[0].argmax(-1).tolist()
            generation.agree += sum(a == b for a, b in zip(q_all, best))
            generation.compared += len(best)
            engine._sync()
            generation.untimed += time.perf_counter() - measured
        cache.commit(pending, path)
        generation.chain.append(len(chain))
        return [tokens[i] for i in path[1:]] + [best[path[-1]]]

    # -- decoding ---------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, requests, mode: str = "tlv", max_new_tokens: int = 128) -> list[TlvGeneration]:
        """Greedy decoding of each request with the TLV cycle (``mode`` "tlv"; requests as for Engine.generate)."""
        if mode != "tlv":
            raise SpecPilotError(
                f"unknown mode {mode!r} for the two-level engine",
                where="TwoLevelEngine.generate",
                fix="use mode='tlv' (the wrapped engine serves 'ar' and 'spec')",
            )
        return [self._generate_one(_as_request(r, i, max_new_tokens)) for i, r in enumerate(requests)]

    def _generate_one(self, request: Request) -> TlvGeneration:
        engine = self.engine
        prompt = request.prompt_ids
        if not prompt:
            raise SpecPilotError(
                f"request {request.id!r} has an empty prompt",
                where="TwoLevelEngine.generate",
                fix="give every request at least one prompt token",
            )
        if len(prompt) + request.max_new_tokens + self.options.nodes + 2 > engine.max_len:
            raise SpecPilotError(
                f"request {request.id!r}: prompt + output exceed the engine's max_len {engine.max_len}",
                where="TwoLevelEngine.generate",
                fix="build the engine with a larger max_len",
            )
        engine._sync()
        start = time.perf_counter()
        engine.cache.reset()
        hidden = engine.prefill(prompt)
        last = lm_head(hidden[-1:], engine.target.lm_head_weight, engine.options.lm_head, engine.options.splitk_chunks)
        outputs = [int(engine._fault(last, torch.zeros(1, device=engine.device)).argmax(-1))]
        times = [time.perf_counter() - start]
        generation = TlvGeneration(request.id, list(prompt), outputs, times, 0.0, 0)
        while len(outputs) < request.max_new_tokens:
            step_start, untimed = time.perf_counter(), generation.untimed
            new = self.cycle(outputs[-1], generation, len(outputs))
            engine._sync()
            now = time.perf_counter()
            generation.step_times.append(now - step_start - (generation.untimed - untimed))
            outputs.extend(new)
            times.extend([now - start] * len(new))
            generation.accepted.append(len(new))
        n = request.max_new_tokens
        generation.output_ids, generation.token_times = outputs[:n], times[:n]
        generation.total_time, generation.steps = time.perf_counter() - start, len(generation.accepted)
        return generation
