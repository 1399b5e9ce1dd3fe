"""Two-level verification (the paper's §4.3) on the system engine: the TLV cycle over ``SystemModel`` and
``SystemDecoder`` (one request in flight), the pass the paper's shapes are timed with.

One cycle from the pending token p (the last output token, its target state not computed yet):

1. the pair's drafter drafts a tree T1 of ``nodes`` nodes below p (``SystemDecoder.draft_trees``, best-first);
2. the **Q pass**: ``SystemModel.forward(write_cache=False)`` with every target linear and the LM head read from the
   8-bit view of its W12 record — on a GPU the same records the exact pass reads, no copy: with ``activations="fp8"``
   (the default) on the FP8 tensor cores (``linear_mode="fp8_midpoint"``, ``w12_fp8_qpass_gemm``: activations in
   E4M3 per token row), with ``"bf16"`` through the W12 kernel's BF16 Q mode (``"q8_midpoint"``); on a CPU (the fp32
   correctness runs) the view's values beside the weights, the FP8 activations emulated
   (``fp8_qpass_linear_reference``). It writes no KV slot, GDN state, conv window or feature. The chain C is the
   path of T1 that follows the Q pass's argmax, plus its bonus token;
3. the drafter drafts again from the end of C, from the committed features and the Q pass's features along C; its
   best-first subtree, truncated to ``nodes - |C|`` nodes, is attached below C;
4. one exact ``SystemModel`` step (W12 weights, GDN path verify) verifies the combined tree, accepts its longest
   matching path plus the bonus, and commits it. Only this pass accepts tokens.

``accept_from_qpass`` is the lossy variant token forcing must reject: it forces the exact step's accepted path to C
as the Q pass proposed it (``StepBuffers.forced``), so the exact pass only adds its bonus.

    decoder = SystemDecoder(Engine.load_default(), SystemOptions(linears="w12", lm_head="w12", gdn_verify="path",
                            tree="best-first", nodes=32, positions=8))
    runs = SystemTwoLevel(decoder).generate(prompts, max_new_tokens=96)      # list[TlvGeneration]
"""

from __future__ import annotations

import copy
import dataclasses
import time

import torch

from specpilot_mem.engine.decode import SystemDecoder
from specpilot_mem.engine.drafter import Lattice
from specpilot_mem.engine.engine import Generation
from specpilot_mem.engine.options import OptionsError
from specpilot_mem.engine.system import Linear, StepBuffers, SystemModel, Weights, pack_trees
from specpilot_mem.engine.tlv import TlvGeneration, matching_path
from specpilot_mem.engine.trees import build_tree

LOW_BITS = ("midpoint", "truncated")
ACTIVATIONS = ("fp8", "bf16")  # the Q pass's activations: E4M3 per token row (FP8 tensor cores) or as they are


class Fp8EmulatedLinear(Linear):
    """A Q-pass linear on the CPU as the FP8 Q pass computes it: E4M3 activations per row times the view's values
    (``fp8_qpass_linear_reference``), whatever the mode asked."""

    def __call__(self, x, mode: str = "bf16"):
        from specpilot_kernels.w12.qpass_fp8 import fp8_qpass_linear_reference

        return fp8_qpass_linear_reference(x, self.weight)


def qpass_view_weights(weights: Weights, low_bits: str = "midpoint", activations: str = "fp8") -> Weights:
    """The weights as the Q pass reads them off the GPU: every linear and the LM head (``head_linear``) replaced by
    the value of its W12 8-bit view (``qpass_weight_reference``) in the weights' dtype, every other tensor shared;
    with ``activations="fp8"`` each such linear quantizes its input to E4M3 per row first. On a GPU the Q pass reads
    the view in place instead (``linear_mode``), so this is the CPU's stand-in."""
    from specpilot_kernels.w12 import encode
    from specpilot_kernels.w12.reference import qpass_weight_reference

    def view_of(weight: torch.Tensor) -> torch.Tensor:
        return qpass_weight_reference(encode(weight.to(torch.bfloat16).contiguous()), low_bits).to(weight.dtype)

    kind = Fp8EmulatedLinear if activations == "fp8" else Linear
    view = copy.copy(weights)
    view.t = dict(weights.t)
    view.t["head"] = view_of(weights.head)  # the embedding stays exact: only the head is a linear
    view.shape = dataclasses.replace(weights.shape, tied_head=False)
    view.linears = {name: kind(view_of(lin.weight)) for name, lin in weights.linears.items() if name != "head.w"}
    view.linears["head.w"] = kind(view.t["head"])
    view._certified = None
    return view


class SystemTwoLevel:
    """The TLV cycle over a one-request ``SystemDecoder`` whose options give the exact pass (W12 linears and head, a
    tree of ``nodes`` nodes); ``generate(prompts)`` as the decoder's, returning :class:`TlvGeneration`."""

    def __init__(
        self,
        decoder: SystemDecoder,
        low_bits: str = "midpoint",
        accept_from_qpass: bool = False,
        activations: str = "fp8",
    ):
        opts = decoder.options
        if decoder.batch != 1:
            raise OptionsError(
                f"two-level verification decodes one request at a time, the decoder has batch={decoder.batch}",
                where="SystemTwoLevel(decoder)",
                fix="use SystemDecoder(..., batch=1): TLV is a single-request mechanism (docs/tlv.md)",
            )
        if opts.tree == "chain" or opts.linears != "w12" or opts.lm_head != "w12":
            raise OptionsError(
                f"TLV needs a tree and W12 weights, got tree={opts.tree!r} linears={opts.linears!r} "
                f"lm_head={opts.lm_head!r}",
                where="SystemTwoLevel(decoder.options)",
                fix="use SystemOptions(linears='w12', lm_head='w12', tree='best-first', nodes=N)",
            )
        if low_bits not in LOW_BITS:
            raise OptionsError(f"unknown Q-pass low bits {low_bits!r}", where="low_bits", fix=f"use one of {LOW_BITS}")
        if activations not in ACTIVATIONS:
            raise OptionsError(
                f"unknown Q-pass activations {activations!r}", where="activations", fix=f"use one of {ACTIVATIONS}"
            )
        self.decoder, self.low_bits, self.accept_from_qpass = decoder, low_bits, accept_from_qpass
        self.activations = activations
        self.model = decoder.model
        if decoder.device.type == "cuda" and decoder.dtype == torch.bfloat16:
            if activations == "fp8":
                from specpilot_kernels.w12.qpass_fp8 import fp8_qpass_available

                if not fp8_qpass_available(decoder.device):
                    raise OptionsError(
                        f"the FP8 Q pass needs FP8 tensor cores (sm_89+), {torch.cuda.get_device_name(decoder.device)}"
                        " has none (or the kernel did not build)",
                        where="SystemTwoLevel(activations)",
                        fix="use activations='bf16' (the W12 kernel's BF16 Q mode)",
                    )
            # the exact pass's own records, read as Q
            self.qmodel, self.linear_mode = self.model, f"{'fp8' if activations == 'fp8' else 'q8'}_{low_bits}"
        else:
            self.qmodel = SystemModel(
                qpass_view_weights(decoder.weights, low_bits, activations),
                opts.replace(linears="bf16", lm_head="bf16"),
                feature_layers=self.model.feature_layers,
            )
            self.linear_mode = None
        self.buf = StepBuffers.empty(1, opts.rows, decoder.weights.shape.conv_size, decoder.device)

    # -- the pieces of a cycle --------------------------------------------------------------------------------

    def _fill(self, tree: tuple[list[int], list[int]], produced: int, forced: int = -1) -> None:
        buf = self.buf
        buf.fill(pack_trees([tree], buf.shape[1], self.decoder.weights.shape.conv_size))
        buf.active.fill_(True)
        buf.forced.fill_(forced)
        buf.out_len.fill_(produced)

    @torch.no_grad()
    def qpass(self, tree, produced: int) -> tuple[list[int], torch.Tensor]:
        """The Q pass over ``tree``: (its argmax per row, its drafter features [T, F]); caches left as they were."""
        self._fill(tree, produced)
        caches = self.decoder.caches
        hidden, feats, _ = self.qmodel.forward(self.buf, caches, write_cache=False, linear_mode=self.linear_mode)
        best = self.qmodel.w.head_linear()(hidden, self.linear_mode or "bf16").argmax(-1)
        return best.tolist(), feats[0]

    @torch.no_grad()
    def draft_from(self, features: torch.Tensor, anchor: int, anchor_pos: int, budget: int):
        """The drafter's best-first tree of ``budget`` nodes after ``anchor`` at ``anchor_pos``, conditioned on
        ``features`` [anchor_pos, F] (the committed ones, then the Q pass's along C)."""
        engine, opts = self.decoder.engine, self.decoder.options
        drafter, device = engine.drafter, self.decoder.device
        window = drafter.cfg.context_window
        idx = anchor_pos - window + torch.arange(window, device=device)
        feats = features[idx.clamp(min=0)][None]
        anchor_t = torch.tensor([anchor], device=device)
        hidden = drafter(
            engine.target.embed, feats, (idx >= 0)[None], anchor_t, torch.tensor([anchor_pos], device=device)
        )
        base = hidden @ engine.target.lm_head_weight.t()
        cand, unary, pair = (x.cpu() for x in drafter.lattice_batch(hidden, base, anchor_t, opts.positions))
        return build_tree(opts.tree, Lattice(cand[0], unary[0], pair[0]), budget, opts.positions)

    @torch.no_grad()
    def exact_step(self, tree, produced: int, forced: int) -> tuple[list[int], list[int]]:
        """The exact pass over the combined tree, accepted and committed: (the tokens it commits, its argmax)."""
        self._fill(tree, produced, forced)
        model, buf, caches = self.model, self.buf, self.decoder.caches
        B, T = buf.shape
        hidden, feats, saved = model.forward(buf, caches)
        pred = model.head_argmax(hidden, predicted_index=(buf.out_len[:, None] + buf.depth).view(-1)).view(B, T)
        accepted, accept_len, deepest, out = model.accept(buf, pred)
        model.commit(buf, caches, saved, feats, accepted, accept_len, deepest)
        return out[0, : int(accept_len[0])].tolist(), pred[0].tolist()

    def cycle(self, pending: int, generation: TlvGeneration, produced: int) -> list[int]:
        """One TLV cycle; the tokens the exact pass commits."""
        decoder, nodes = self.decoder, self.decoder.options.nodes
        t1_tokens, t1_parents = decoder.draft_trees([pending], [0])[0]
        q_best, q_feats = self.qpass((t1_tokens, t1_parents), produced)
        q_path = matching_path(t1_tokens, t1_parents, q_best)
        chain = ([t1_tokens[i] for i in q_path[1:]] + [q_best[q_path[-1]]])[:nodes]
        tokens, parents = [pending] + chain, list(range(-1, len(chain)))
        budget = nodes - len(chain)
        if budget > 0:
            length = int(decoder.caches.lengths[0])
            context = torch.cat([decoder.caches.features[0, :length], q_feats[q_path]], dim=0)
            sub_tokens, sub_parents = self.draft_from(context, chain[-1], length + len(chain), budget)
            tokens += sub_tokens
            parents += [len(chain) if p < 0 else p + len(chain) + 1 for p in sub_parents]
        new, best = self.exact_step((tokens, parents), produced, len(chain) if self.accept_from_qpass else -1)
        # the Q pass's argmax against the exact one along C (rows 0 .. |C| - 1 of both trees hold the same path)
        along = range(min(len(q_path), len(chain)))
        generation.chain_agree += sum(q_best[q_path[i]] == best[i] for i in along)
        generation.chain_compared += len(along)
        generation.chain.append(len(chain))
        return new

    # -- decoding -------------------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], max_new_tokens: int = 64) -> list[TlvGeneration]:
        """Greedy decoding of each prompt with the TLV cycle, one request at a time."""
        decoder = self.decoder
        longest = max(len(p) for p in prompts) + max_new_tokens + 3 * decoder.options.rows + 1
        if longest > decoder.max_len:
            raise OptionsError(
                f"prompt + output + the Q pass's scratch rows need {longest} cache slots, the decoder has "
                f"{decoder.max_len}",
                where="SystemDecoder.max_len",
                fix=f"use max_len >= {longest}",
            )
        runs = []
        for r, prompt in enumerate(prompts):
            start = time.perf_counter()
            outputs = [decoder.prefill(0, list(prompt))]
            times = [time.perf_counter() - start]
            generation = TlvGeneration(str(r), list(prompt), outputs, times, 0.0, 0)
            while len(outputs) < max_new_tokens:
                step_start = time.perf_counter()
                new = self.cycle(outputs[-1], generation, len(outputs))
                now = time.perf_counter()
                generation.step_times.append(now - step_start)
                outputs.extend(new)
                times.extend([now - start] * len(new))
                generation.accepted.append(len(new))
            generation.output_ids, generation.token_times = outputs[:max_new_tokens], times[:max_new_tokens]
            generation.total_time, generation.steps = time.perf_counter() - start, len(generation.accepted)
            runs.append(generation)
        return runs


def tokens_per_pass(runs: list[Generation]) -> float:
    """τ: tokens committed per exact pass over all requests' steps."""
    steps = [n for run in runs for n in run.accepted]
    return sum(steps) / max(1, len(steps))
