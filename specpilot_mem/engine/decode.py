"""Batched greedy decoding through the system engine with the trained pair: a closed-loop client keeps up to
``batch`` requests in flight, each with its own cache slot (KV, GDN state, conv window, drafter features);
every step drafts for all of them, builds each one's chain or tree, and verifies all trees in one pass.

    from specpilot_mem.engine import Engine
    from specpilot_mem.engine.decode import SystemDecoder
    decoder = SystemDecoder(Engine.load_default(), SystemOptions(gdn_verify="path"), batch=4)
    runs = decoder.generate(prompts, mode="spec", max_new_tokens=64)     # list[Generation]

AR, stock and SpecPilot decoders over the same weights run the same requests (``with_options``).
"""

from __future__ import annotations

import time
import zlib

import numpy as np
import torch

from specpilot_mem.engine.drafter import Lattice
from specpilot_mem.engine.engine import Engine, Generation
from specpilot_mem.engine.options import OptionsError, SystemOptions
from specpilot_mem.engine.system import Caches, StepBuffers, SystemModel, Weights, pack_trees
from specpilot_mem.engine.trees import build_tree

PREFILL_CHUNK = 64  # prompt rows per prefill pass (path verify and its schedule take at most 64)


class SystemDecoder:
    def __init__(
        self,
        engine: Engine,
        options: SystemOptions | None = None,
        batch: int = 1,
        max_len: int = 1024,
        weights: Weights | None = None,
    ):
        if engine.drafter is None:
            raise OptionsError("the system decoder needs the pair's drafter", where="engine", fix="load the pair")
        self.engine, self.batch, self.max_len = engine, batch, max_len
        self.options = options or SystemOptions()
        if weights is None:
            _, weights = Weights.from_target(engine.target)
        self.weights = weights
        cfg = engine.target.cfg
        opts = self.options.validate(weights.shape, engine.drafter.cfg.block_size)
        verify = (
            weights
            if opts.verify_weights == "none"
            else weights.quantized(opts.verify_weights, opts.verify_weight_scope)
        )
        self.model = SystemModel(verify, opts, feature_layers=tuple(cfg.feature_layers))
        # the prompt goes in the way stock does it (SGLang's GDN, BF16 head, stock's weights, none of the fault
        # study's verify faults): options change decoding only
        self.prefill_model = SystemModel(
            weights,
            opts.replace(
                gdn_verify="snapshot",
                tree="chain",
                lm_head="bf16",
                verify_weights="none",
                flip_rate=0.0,
                rope_offset=0,
                attn_window=0,
            ),
            feature_layers=tuple(cfg.feature_layers),
        )
        self.device, self.dtype = weights.device, weights.dtype
        self.caches = Caches(weights.shape, batch, max_len, self.device, self.dtype, feature_dim=cfg.feature_dim)
        # the flip fault's table, per slot and output index (static: the captured step reads it)
        self.flips = torch.zeros(batch, max_len, dtype=torch.bool, device=self.device) if opts.flip_rate > 0 else None
        self._buffers: dict = {}

    def with_options(self, options: SystemOptions, batch: int | None = None) -> "SystemDecoder":
        return SystemDecoder(self.engine, options, batch or self.batch, self.max_len, self.weights)

    def _buffer(self, B: int, T: int) -> StepBuffers:
        if (B, T) not in self._buffers:
            self._buffers[B, T] = StepBuffers.empty(B, T, self.weights.shape.conv_size, self.device)
        return self._buffers[B, T]

    def _draw_flips(self, slot: int, prompt: list[int]) -> None:
        """The request's flip positions, drawn as the pure-torch engine draws them (the same prompt and flip_seed
        flip the same output indices)."""
        key = zlib.crc32(np.asarray(prompt, dtype=np.int64).tobytes())
        draws = np.random.default_rng([self.options.flip_seed, key]).random(self.max_len)
        self.flips[slot].copy_(torch.as_tensor(draws < self.options.flip_rate))

    @torch.no_grad()
    def prefill(self, slot: int, prompt: list[int], start: int = 0, chunks: list[tuple[int, int]] | None = None) -> int:
        """Commit ``prompt[start:]`` into ``slot`` (reset first when ``start`` is 0); returns the target's first output
        token. ``chunks``: (rows, buffer width) of each pass (default ``PREFILL_CHUNK`` rows each, unpadded); prompt
        admission's reference passes its segments' shapes."""
        if start == 0:
            self.caches.reset(slot)
        view = self.caches.view(slot)
        if chunks is None:
            left = len(prompt) - start
            chunks = [
                (min(PREFILL_CHUNK, left - i), min(PREFILL_CHUNK, left - i)) for i in range(0, left, PREFILL_CHUNK)
            ]
        token = None
        for rows, width in chunks:
            out, accepted = self.prefill_model.step(self.prompt_segment(prompt, start, rows, width), view)
            token, start = out[0, rows - 1], start + rows
        return int(token)

    def prompt_segment(self, prompt: list[int], start: int, rows: int, width: int) -> StepBuffers:
        """Buffers [1, width] of ``prompt[start : start + rows]`` as one chain forced to be accepted whole (padding
        after it computed and never kept); its last row predicts output 0 when it ends the prompt."""
        piece = prompt[start : start + rows]
        buf = StepBuffers.empty(1, width, self.weights.shape.conv_size, self.device)
        buf.fill(pack_trees([(piece, list(range(-1, len(piece) - 1)))], width, self.weights.shape.conv_size))
        buf.forced.fill_(len(piece) - 1)
        buf.out_len.fill_(start - (len(prompt) - 1))  # the prompt's last row predicts output 0
        return buf

    @torch.no_grad()
    def prefill_batch(self, prompts: list[list[int]]) -> list[int]:
        """Commit equal-length ``prompts`` into slots 0 .. len(prompts) - 1 (reset first), all of them in each
        chunk's pass (what a server does when a full batch arrives at once); returns each one's first output token."""
        n, length, conv = len(prompts), len(prompts[0]), self.weights.shape.conv_size
        if any(len(p) != length for p in prompts) or n > self.batch:
            raise OptionsError(
                "a batched prefill takes at most `batch` prompts of one length",
                where="prefill_batch",
                fix="prefill them one by one (prefill)",
            )
        for slot in range(n):
            self.caches.reset(slot)
        view = self.caches.view(0, n)
        tokens = None
        for start in range(0, length, PREFILL_CHUNK):
            pieces = [p[start : start + PREFILL_CHUNK] for p in prompts]
            T = len(pieces[0])
            buf = StepBuffers.empty(n, T, conv, self.device)
            buf.fill(pack_trees([(piece, list(range(-1, T - 1))) for piece in pieces], T, conv))
            buf.forced.fill_(T - 1)
            buf.out_len.fill_(start - (length - 1))  # the prompt's last row predicts output 0
            out, accepted = self.prefill_model.step(buf, view)
            tokens = out[:, T - 1]
        return [int(t) for t in tokens.tolist()]

    def step_rows(self, live: list[int]) -> tuple[int, bool]:
        """The next speculative step's verify rows per request (its [B, T] bucket) and whether it is an AR step
        (T = 1, no draft): the options' rows here; a batching policy may choose per step."""
        return self.options.rows, False

    def step_done(self, live: list[int], committed: list[int], ar: bool) -> None:
        """After each step: the tokens each live slot committed (accepted + bonus, read back to the host for the
        outputs anyway). Nothing here; a batching policy learns from them."""

    @torch.no_grad()
    def draft_trees(self, anchors: list[int], slots: list[int]) -> list[tuple[list[int], list[int]]]:
        """Each request's verify rows: its pending token (the root) and the drafted chain or tree below it."""
        opts, drafter = self.options, self.engine.drafter
        W = drafter.cfg.context_window
        lengths = self.caches.lengths[slots]
        ctx = lengths[:, None] - W + torch.arange(W, device=self.device)
        rows = torch.tensor(slots, device=self.device)[:, None]
        feats = self.caches.features[rows, ctx.clamp(min=0)]
        anchor_t = torch.tensor(anchors, device=self.device)
        hidden = drafter(self.engine.target.embed, feats, ctx >= 0, anchor_t, lengths)
        base = hidden @ self.engine.target.lm_head_weight.t()
        cand, unary, pair = (x.cpu() for x in drafter.lattice_batch(hidden, base, anchor_t, opts.positions))
        trees = []
        for b, anchor in enumerate(anchors):
            lattice = Lattice(cand[b], unary[b], pair[b])
            if opts.tree == "chain":
                chain = lattice.chain()
                trees.append(([anchor] + chain, list(range(-1, len(chain)))))
            else:
                tokens, parents = build_tree(opts.tree, lattice, opts.nodes, opts.positions)
                trees.append(([anchor] + tokens, [-1] + [p + 1 for p in parents]))
        return trees

    def check_admission(self, mode: str, admission) -> None:
        """Prompt admission's rows ride in verify steps and must be computed as the prefill pass computes them."""
        opts = self.options
        problem = (
            "AR steps advance every slot's GDN state in place (a waiting prompt's too)"
            if mode == "ar"
            else "the prompt rows would run through the fault study's verify weights"
            if opts.verify_weights != "none"
            else "the flip fault's table is laid out per slot of the step"
            if opts.flip_rate > 0
            else None
        )
        if problem:
            raise OptionsError(
                f"prompt admission needs speculative steps on the prefill pass's weights: {problem}",
                where="admission",
                fix="decode with mode='spec', verify_weights=none and flip_rate=0, or without admission",
            )
        limit = self.max_len - self.options.rows
        if admission.segment is not None and admission.segment > limit:
            raise OptionsError(
                f"{admission.FLAG}={admission.segment} rows do not fit the decoder's {self.max_len}-slot caches"
                f" (at most {limit} rows beside a step's {self.options.rows})",
                where=admission.FLAG,
                fix=f"use a segment of at most {limit} rows, or a larger max_len",
            )

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        mode: str = "spec",
        max_new_tokens: int = 64,
        batched_prefill: bool = False,
        admission=None,
    ) -> list[Generation]:
        """Greedy decoding of every prompt, ``batch`` in flight (closed loop: a finished request's slot takes
        the next prompt). ``mode``: "ar" (one row per request, SGLang's decode step) or "spec".
        ``batched_prefill``: the first batch's prompts, when they have one length, go in together
        (``prefill_batch``); later admissions one by one. ``admission``: prompt admission
        (``batching.admission.PromptAdmission``): a new request's prompt enters in the rows its ``plan`` gives per
        verify step (segments in the step's forward, ``SystemModel.step_with_segments``) instead of prefill passes
        that every request in flight waits for; when it plans no rows (no spare rows on the plateau, or nothing is
        decoding) the waiting prompts are prefilled as stock does. ``self.admitted`` then lists, per request,
        the (rows, buffer width) its prompt entered in: what a prefill pass reproduces bit for bit
        (``prefill(chunks=...)``)."""
        if mode not in ("ar", "spec"):
            raise OptionsError(f"unknown mode {mode!r}", where="mode", fix="use 'ar' or 'spec'")
        if admission is not None:
            self.check_admission(mode, admission)
        # a request may overshoot max_new_tokens by one step, and a finished slot's rows are still written
        longest = max(len(p) for p in prompts) + max_new_tokens + 2 * self.options.rows + 1
        if admission is not None and admission.segment is not None:
            longest += admission.segment  # a last segment's padding is written past its prompt
        if longest > self.max_len:
            raise OptionsError(
                f"prompt + output need {longest} cache slots, the decoder has {self.max_len}",
                where="max_len",
                fix=f"use max_len >= {longest}",
            )
        B = self.batch
        limit = max_new_tokens if self.options.stop_after < 0 else min(max_new_tokens, self.options.stop_after)
        queue = list(range(len(prompts)))
        slot_req = [-1] * B
        outputs = [[] for _ in prompts]
        started, finished, steps, accepted = (
            [0.0] * len(prompts),
            [0.0] * len(prompts),
            [0] * len(prompts),
            [[] for _ in prompts],
        )
        entering: dict[int, int] = {}  # slot -> prompt rows already in, while its prompt enters through verify steps
        self.admitted = {str(r): [] for r in range(len(prompts))}

        def admit(slot: int) -> None:
            if not queue:
                slot_req[slot] = -1
                return
            r = queue.pop(0)
            slot_req[slot] = r
            started[r] = time.perf_counter()
            if self.flips is not None:
                self._draw_flips(slot, prompts[r])
            if admission is None:
                outputs[r].append(self.prefill(slot, prompts[r]))
            else:
                self.start_request(slot)
                entering[slot] = 0

        first = queue[:B]
        if batched_prefill and first and len({len(prompts[r]) for r in first}) == 1:
            for slot, r in enumerate(first):
                slot_req[slot] = queue.pop(0)
                started[r] = time.perf_counter()
                if self.flips is not None:
                    self._draw_flips(slot, prompts[r])
            for r, token in zip(first, self.prefill_batch([prompts[r] for r in first])):
                outputs[r].append(token)
        for slot in range(B):
            if slot_req[slot] < 0:
                admit(slot)
        while any(r >= 0 for r in slot_req):
            for slot, r in enumerate(slot_req):
                if r >= 0 and slot not in entering and len(outputs[r]) >= limit:
                    finished[r] = time.perf_counter()
                    admit(slot)
            # admission plans against the fixed [B, 1 + nodes] step (the planner's buckets are not combined with it)
            rows = B * self.options.rows
            segments = self._plan_segments(admission, entering, slot_req, prompts, outputs, rows) if entering else []
            live = [s for s in range(B) if slot_req[s] >= 0 and s not in entering]
            if not live:
                break
            anchors = {s: outputs[slot_req[s]][-1] for s in live}
            T, ar = (1, True) if mode == "ar" else self.step_rows(live)
            buf = self._buffer(B, T)
            if ar:
                trees = {s: ([anchors[s]], [-1]) for s in live}
            else:
                trees = dict(zip(live, self.draft_trees([anchors[s] for s in live], live)))
            packed = pack_trees([trees.get(s, ([0], [-1])) for s in range(B)], T, self.weights.shape.conv_size)
            buf.fill(packed)
            buf.active.copy_(torch.tensor([s in trees for s in range(B)]))
            buf.forced.fill_(-1)
            buf.out_len.copy_(torch.tensor([len(outputs[slot_req[s]]) if s in trees else 0 for s in range(B)]))
            if segments:
                out, lens, seg_out = self.model.step_with_segments(
                    buf, self.caches, [(seg, self.caches.view(slot)) for slot, seg, _ in segments]
                )
                self._commit_segments(segments, seg_out, entering, slot_req, prompts, outputs)
            else:
                out, lens = self.model.graphed(
                    ("decode", B, T, ar),
                    lambda buf=buf, ar=ar: self.model.step(buf, self.caches, ar=ar, flips=self.flips),
                )
            out, lens = out.cpu(), lens.cpu()
            self.step_done(live, lens[live].tolist(), ar)
            for s in live:
                r, n = slot_req[s], int(lens[s])
                outputs[r].extend(out[s, :n].tolist())
                steps[r] += 1
                accepted[r].append(n)
        runs = []
        for r, prompt in enumerate(prompts):
            total = finished[r] - started[r]
            n = limit
            runs.append(
                Generation(
                    str(r),
                    list(prompt),
                    outputs[r][:n],
                    [total] * min(n, len(outputs[r])),
                    total,
                    steps[r],
                    accepted[r],
                )
            )
        return runs

    def start_request(self, slot: int) -> None:
        """A new request takes ``slot`` and its prompt enters through verify steps: its caches start empty."""
        self.caches.reset(slot)

    def _plan_segments(self, admission, entering, slot_req, prompts, outputs, rows: int):
        """This step's prompt segments: [(slot, buffers [1, width], rows)], the rows ``admission`` plans for each
        entering prompt beside the step's ``rows`` verify rows (a prompt's rows of one step are one chain, in whole
        segments' width). With no rows planned (compute does not idle), or nothing decoding beside them, the
        entering prompts are prefilled now, as stock does."""
        slots = list(entering)
        left = torch.tensor([len(prompts[slot_req[s]]) - entering[s] for s in slots])
        decoding = any(r >= 0 and s not in entering for s, r in enumerate(slot_req))
        planned = admission.plan(rows, left)[0].tolist() if decoding else [0] * len(slots)
        if not any(planned):
            for s in slots:
                r, start = slot_req[s], entering.pop(s)
                outputs[r].append(self.prefill(s, prompts[r], start=start))
                self.admitted[str(r)].append((len(prompts[r]) - start, -1))  # -1: a prefill pass of its own
            return []
        segments = []
        for s, n in zip(slots, planned):
            if n:
                r, unit = slot_req[s], admission.segment or n
                width = -(-n // unit) * unit
                segments.append((s, self.prompt_segment(prompts[r], entering[s], n, width), n))
                self.admitted[str(r)].append((n, width))
        return segments

    def _commit_segments(self, segments, seg_out, entering, slot_req, prompts, outputs) -> None:
        """Advance each segment's prompt; one that ends its prompt gives the request its first output token."""
        for (s, _, n), tokens in zip(segments, seg_out):
            entering[s] += n
            r = slot_req[s]
            if entering[s] == len(prompts[r]):
                del entering[s]
                outputs[r].append(int(tokens[0, n - 1]))
