"""The engine: greedy AR and speculative decoding (chain or tree verify), a teacher-forced scorer,
lattice recording and per-request timing, on CPU or CUDA (static shapes, CUDA graphs).

Requests run one at a time (batch size 1): each gets the engine's cache, reset. Output ids are the
target's greedy decode up to floating-point reduction order (the verify pass, the LM head mode and
the GDN verify method change rounding only), unless the injected fault is switched on.
"""

from __future__ import annotations

import functools
import threading
import zlib
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from specpilot_mem.engine.config import DrafterConfig, EngineOptions, TargetConfig
from specpilot_mem.engine.drafter import BlockDrafter, Lattice
from specpilot_mem.engine.model import (
    WEIGHT_FORMATS,
    Cache,
    HybridTarget,
    Rows,
    chain_rows,
    lm_head,
    make_rows,
    quantize_weight,
    quantized_copy,
)
from specpilot_mem.engine import weights


@dataclass
class Request:
    prompt_ids: list[int]
    max_new_tokens: int = 128
    id: str = ""


@dataclass
class Generation:
    """One request's result. token_times[i]: seconds from the request's start to output token i."""

    id: str
    prompt_ids: list[int]
    output_ids: list[int]
    token_times: list[float]
    total_time: float
    steps: int
    accepted: list[int] = field(default_factory=list)  # tokens committed per target pass (tau per step)

    @property
    def output_rate(self) -> float:
        """Output tokens per second over the whole request (prefill included)."""
        return len(self.output_ids) / self.total_time if self.total_time > 0 else 0.0

    @property
    def tau(self) -> float:
        return sum(self.accepted) / len(self.accepted) if self.accepted else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(output_rate=self.output_rate, tau=self.tau)
        return out


@dataclass
class Score:
    """Teacher-forced scoring of output tokens, one entry per output token.

    logprob: log-prob of the given token; argmax: the scorer's argmax; margin: log-prob gap from the
    argmax to the given token (0 where they match); top2_margin: gap between the scorer's two best.
    """

    logprob: list[float]
    argmax: list[int]
    margin: list[float]
    top2_margin: list[float]

    def to_dict(self) -> dict:
        return asdict(self)


# torch supports one CUDA graph capture at a time per process; engines on several GPUs driven from
# several threads (a paired run over a device pool) take turns capturing.
_CAPTURE_LOCK = threading.Lock()


def _on_own_device(method):
    """Run ``method`` with the engine's GPU as the current CUDA device: streams, synchronisation, graph
    replay and Triton launches follow the current device, which is cuda:0 in a fresh thread whatever
    device the engine's tensors are on."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.device.type != "cuda":
            return method(self, *args, **kwargs)
        with torch.cuda.device(self.device):
            return method(self, *args, **kwargs)

    return wrapper


def _as_request(item, index: int, max_new_tokens: int) -> Request:
    if isinstance(item, Request):
        return item
    if isinstance(item, dict):
        return Request(
            prompt_ids=list(item["prompt_ids"]),
            max_new_tokens=int(item.get("max_new_tokens", max_new_tokens)),
            id=str(item.get("id", index)),
        )
    return Request(prompt_ids=list(item), max_new_tokens=max_new_tokens, id=str(index))


class Engine:
    def __init__(
        self,
        target: HybridTarget,
        drafter: BlockDrafter | None,
        options: EngineOptions | None = None,
        max_len: int = 2048,
        synthetic: bool = False,
    ):
        self.target = target.eval()
        self.drafter = drafter.eval() if drafter is not None else None
        self.options = options or EngineOptions()
        if drafter is not None and not 1 <= self.options.positions <= drafter.cfg.block_size:
            raise ValueError(
                f"positions={self.options.positions}: the drafter drafts 1..{drafter.cfg.block_size} positions"
            )
        if self.options.lm_head not in ("dense", "splitk") or self.options.gdn_verify not in ("wy", "path"):
            raise ValueError(f"unknown lm_head {self.options.lm_head!r} or gdn_verify {self.options.gdn_verify!r}")
        self._check_faults()
        self.synthetic = synthetic
        param = next(target.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.max_len = max_len
        self.cache = Cache(target.cfg, max_len, self.device, self.dtype)
        self._graphs: dict = {}
        self._capture_stream = None  # created on the engine's device at its first capture
        self.graph_error: str | None = None  # why CUDA graphs were switched off, if a capture failed
        # The verify pass's weights: stock's, unless a low-precision verify fault is switched on.
        self._verify_target, self._verify_head = self.target, self.target.lm_head_weight
        if self.options.verify_weights is not None:
            if self.options.verify_weight_scope == "all":
                self._verify_target = quantized_copy(self.target, self.options.verify_weights)
                self._verify_head = self._verify_target.lm_head_weight
            else:
                self._verify_head = quantize_weight(self.target.lm_head_weight, self.options.verify_weights)
        self._faulty = False  # whether the faults apply to the request being served (fault_requests)
        self._flips: torch.Tensor | None = None  # per output index: replace the prediction by the runner-up

    # -- construction ------------------------------------------------------------------------------------

    @classmethod
    def random(
        cls,
        seed: int = 0,
        target_cfg: TargetConfig | None = None,
        drafter_cfg: DrafterConfig | None = None,
        device="cpu",
        dtype=torch.float32,
        options: EngineOptions | None = None,
        max_len: int = 2048,
    ) -> "Engine":
        """Seeded random weights (synthetic: flat logits, no real acceptance or near-ties)."""
        torch.manual_seed(seed)
        target_cfg = target_cfg or TargetConfig()
        target = HybridTarget(target_cfg).to(device=device, dtype=dtype)
        drafter = BlockDrafter(drafter_cfg or DrafterConfig(d_model=target_cfg.d_model), target_cfg).to(
            device=device, dtype=dtype
        )
        return cls(target, drafter, options, max_len=max_len, synthetic=True)

    @classmethod
    def load(
        cls,
        model_dir: Path,
        device="cpu",
        dtype=torch.float32,
        options: EngineOptions | None = None,
        max_len: int = 2048,
    ) -> "Engine":
        target = weights.load_target(Path(model_dir) / weights.TARGET_FILE, device, dtype)
        drafter = weights.load_drafter(Path(model_dir) / weights.DRAFTER_FILE, target.cfg, device, dtype)
        return cls(target, drafter, options, max_len=max_len, synthetic=False)

    @classmethod
    def load_default(
        cls, device="cpu", dtype=torch.float32, options: EngineOptions | None = None, max_len: int = 2048
    ) -> "Engine":
        """The committed trained pair under models/ when present, else seeded random weights (synthetic)."""
        if weights.has_trained_pair():
            return cls.load(weights.DEFAULT_MODEL_DIR, device, dtype, options, max_len)
        return cls.random(0, device=device, dtype=dtype, options=options, max_len=max_len)

    def _check_faults(self) -> None:
        opts = self.options
        if opts.verify_weights is not None and opts.verify_weights not in WEIGHT_FORMATS:
            raise ValueError(f"unknown verify_weights {opts.verify_weights!r}; use one of {WEIGHT_FORMATS}")
        if opts.verify_weight_scope not in ("head", "all"):
            raise ValueError(f"unknown verify_weight_scope {opts.verify_weight_scope!r}; use 'head' or 'all'")
        if not 0.0 <= opts.flip_rate <= 1.0 or not 0.0 <= opts.fault_requests <= 1.0:
            raise ValueError(f"flip_rate {opts.flip_rate} and fault_requests {opts.fault_requests} must lie in [0, 1]")
        if (opts.attn_window is not None and opts.attn_window < 1) or (
            opts.stop_after is not None and opts.stop_after < 1
        ):
            raise ValueError(f"attn_window {opts.attn_window} and stop_after {opts.stop_after} must be positive")

    @property
    def lossy(self) -> bool:
        """Whether any fault option is switched on (the §6.2 fault or the fault study's)."""
        opts = self.options
        return (
            opts.fault_after is not None
            or opts.verify_weights is not None
            or opts.flip_rate > 0
            or opts.rope_offset != 0
            or opts.attn_window is not None
            or opts.stop_after is not None
        )

    def with_options(self, **changes) -> "Engine":
        """Another engine over the same weights with some options changed (e.g. fault_after=32)."""
        return Engine(self.target, self.drafter, replace(self.options, **changes), self.max_len, self.synthetic)

    # -- passes ------------------------------------------------------------------------------------------

    @property
    def captured_graphs(self) -> list[str]:
        """The passes replayed as CUDA graphs so far: "draft", and "verify/R" per verify shape of R rows."""
        return sorted(key if isinstance(key, str) else "/".join(map(str, key)) for key in self._graphs)

    def _use_graphs(self) -> bool:
        return (
            self.device.type == "cuda"
            and self.options.cuda_graphs
            and self.options.gdn_verify == "wy"
            and self.graph_error is None
        )

    def _verify_eager(self, rows: Rows, window: int):
        opts = self.options
        if not self._faulty:
            hidden, pending = self.target.forward_rows(rows, self.cache, opts.gdn_verify, window)
            return lm_head(hidden[0], self.target.lm_head_weight, opts.lm_head, opts.splitk_chunks), pending
        hidden, pending = self._verify_target.forward_rows(
            rows, self.cache, opts.gdn_verify, window, opts.rope_offset, opts.attn_window
        )
        return lm_head(hidden[0], self._verify_head, opts.lm_head, opts.splitk_chunks), pending

    @torch.no_grad()
    @_on_own_device
    def verify(self, rows: Rows):
        """Logits [R, V] of rows against the cache, and their Pending; keys/values written at slots
        cache.length + i, nothing committed (so repeating it is idempotent: benchmarks time it)."""
        if not self._use_graphs():
            return self._verify_eager(rows, self.cache.length + rows.count)
        key = ("verify", rows.count, self._faulty)
        if key not in self._graphs:
            static = Rows(
                rows.tokens.clone(), rows.depth.clone(), rows.anc.clone(), rows.conv_idx.clone(), rows.parents
            )
            captured = self._capture(lambda: self._verify_eager(static, self.max_len))
            if captured is None:
                return self._verify_eager(rows, self.cache.length + rows.count)
            self._graphs[key] = (static, *captured)
        static, graph, out = self._graphs[key]
        static.tokens.copy_(rows.tokens)
        static.depth.copy_(rows.depth)
        static.anc.copy_(rows.anc)
        static.conv_idx.copy_(rows.conv_idx)
        graph.replay()
        return out

    def _capture(self, fn):
        """(graph, static outputs) of ``fn``; None (and graphs off for this engine) if it cannot be captured.

        Warm-up and capture run on one side stream of the engine's own device (torch's shared default
        capture stream lives on whichever device captured first, so a second GPU could not use it),
        and the warm-up on that very stream sets up its cuBLAS workspace before capture. The capture
        is thread-local, so another thread may run eager passes on another GPU meanwhile.
        """
        with _CAPTURE_LOCK, torch.cuda.device(self.device):
            if self._capture_stream is None:
                self._capture_stream = torch.cuda.Stream(self.device)
            side, main = self._capture_stream, torch.cuda.current_stream(self.device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn()
            main.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                    out = fn()
            except RuntimeError as err:  # e.g. a library call that allocates host memory while capturing
                self.graph_error = str(err)[:300]
                self._graphs.clear()
                return None
        return graph, out

    def _draft_eager(self, anchor: torch.Tensor, block: int | None = None):
        """anchor [1] token id at position cache.length -> (hidden [block, d], base logits [block, V])."""
        W = self.drafter.cfg.context_window
        idx = self.cache.length_t - W + torch.arange(W, device=self.device)
        valid = idx >= 0
        feats = self.cache.features[idx.clamp(min=0)][None]
        hidden = self.drafter(self.target.embed, feats, valid[None], anchor, self.cache.length_t[None], block)[0]
        return hidden, lm_head(hidden, self.target.lm_head_weight)

    @torch.no_grad()
    @_on_own_device
    def draft(self, anchor_token: int, positions: int, block: int | None = None) -> Lattice:
        """The drafter's lattice for ``positions`` positions after ``anchor_token`` at cache.length, from a
        forward over ``block`` masked positions (default the drafter's trained block; >= positions)."""
        anchor = torch.tensor([anchor_token], device=self.device)
        key = "draft" if block is None else ("draft", block)
        if self._use_graphs():
            if key not in self._graphs:
                static = anchor.clone()
                captured = self._capture(lambda: self._draft_eager(static, block))
                if captured is not None:
                    self._graphs[key] = (static, *captured)
        if key in self._graphs:
            static, graph, (hidden, base) = self._graphs[key]
            static.copy_(anchor)
            graph.replay()
        else:
            hidden, base = self._draft_eager(anchor, block)
        return self.drafter.lattice(hidden, base, anchor_token, positions)

    def _fault(self, logits: torch.Tensor, predicted_index: torch.Tensor) -> torch.Tensor:
        """The §6.2 fault: +bias on every fault_stride-th vocabulary id for output indices >= fault_after."""
        opts = self.options
        if opts.fault_after is None or not self._faulty:
            return logits
        hit = (predicted_index >= opts.fault_after).to(logits.dtype)[:, None]
        bias = torch.zeros(logits.shape[-1], device=logits.device, dtype=logits.dtype)
        bias[:: opts.fault_stride] = opts.fault_bias
        return logits + hit * bias

    @torch.no_grad()
    @_on_own_device
    def prefill(self, tokens: list[int], chunk_starts: list[int] | None = None) -> torch.Tensor:
        """Commit ``tokens`` in chunks (default: chunk_size pieces from 0); returns hidden [T, d]."""
        size = self.options.chunk_size
        starts = chunk_starts if chunk_starts is not None else list(range(0, len(tokens), size))
        bounds = starts + [len(tokens)]
        hidden = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            for s in range(a, b, size):
                piece = tokens[s : min(s + size, b)]
                rows = chain_rows(piece, self.target.cfg.conv_size, self.device)
                h, pending = self.target.forward_rows(rows, self.cache, "wy", self.cache.length + rows.count)
                self.cache.commit(pending, list(range(len(piece))))
                hidden.append(h[0])
        return torch.cat(hidden, dim=0)

    # -- public API --------------------------------------------------------------------------------------

    @torch.no_grad()
    @_on_own_device
    def generate(self, requests, mode: str = "ar", max_new_tokens: int = 128) -> list[Generation]:
        """Greedy decoding of each request. ``requests``: token-id lists, dicts with ``prompt_ids``
        (and optional ``max_new_tokens``, ``id``) or Request objects. ``mode``: "ar" or "spec"."""
        if mode not in ("ar", "spec"):
            raise ValueError(f"unknown mode {mode!r}; use 'ar' or 'spec'")
        if mode == "spec" and self.drafter is None:
            raise ValueError("speculative decoding needs a drafter")
        return [self._generate_one(_as_request(r, i, max_new_tokens), mode) for i, r in enumerate(requests)]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _generate_one(self, request: Request, mode: str) -> Generation:
        prompt = request.prompt_ids
        if not prompt:
            raise ValueError(f"request {request.id!r} has an empty prompt")
        if len(prompt) + request.max_new_tokens + self.options.nodes + 2 > self.max_len:
            raise ValueError(f"request {request.id!r}: prompt + output exceed the engine's max_len {self.max_len}")
        self._start_request(request)
        self._sync()
        start = time.perf_counter()
        self.cache.reset()
        hidden = self.prefill(prompt)
        last = lm_head(hidden[-1:], self.target.lm_head_weight, self.options.lm_head, self.options.splitk_chunks)
        first = int(self._fault(last, torch.zeros(1, device=self.device)).argmax(-1))
        outputs, times, accepted = [first], [time.perf_counter() - start], []
        limit = request.max_new_tokens
        if self._faulty and self.options.stop_after is not None:
            limit = min(limit, self.options.stop_after)
        while len(outputs) < limit:
            pending_token = outputs[-1]
            if mode == "ar":
                tokens, parents = [pending_token], [-1]
            else:
                tokens, parents = self._draft_tree(pending_token)
            rows = make_rows(tokens, parents, self.target.cfg.conv_size, self.device)
            logits, pending = self.verify(rows)
            logits = self._fault(logits, len(outputs) + rows.depth)
            best = self._predict(logits, len(outputs) + rows.depth)
            path = [0]
            children: dict[int, list[int]] = {}
            for i, p in enumerate(parents):
                children.setdefault(p, []).append(i)
            while True:
                nxt = next((c for c in children.get(path[-1], []) if tokens[c] == best[path[-1]]), None)
                if nxt is None:
                    break
                path.append(nxt)
            self.cache.commit(pending, path)
            new = [tokens[i] for i in path[1:]] + [best[path[-1]]]
            now = time.perf_counter() - start
            outputs.extend(new)
            times.extend([now] * len(new))
            accepted.append(len(new))
        total = time.perf_counter() - start
        n = limit
        return Generation(request.id, list(prompt), outputs[:n], times[:n], total, len(accepted), accepted)

    def _start_request(self, request: Request) -> None:
        """Whether the faults apply to this request (a hash of its prompt against fault_requests), and
        its seeded flip positions."""
        opts = self.options
        key = zlib.crc32(np.asarray(request.prompt_ids, dtype=np.int64).tobytes())
        self._faulty = self.lossy and (key % 100_000) / 100_000 < opts.fault_requests
        self._flips = None
        if self._faulty and opts.flip_rate > 0:
            flips = np.random.default_rng([opts.flip_seed, key]).random(request.max_new_tokens + opts.nodes + 2)
            self._flips = torch.as_tensor(flips < opts.flip_rate, device=self.device)

    def _predict(self, logits: torch.Tensor, predicted_index: torch.Tensor) -> list[int]:
        """Each row's prediction: the argmax, or the runner-up at the request's flip positions."""
        if self._flips is None:
            return logits.argmax(-1).tolist()
        top2 = logits.topk(2, dim=-1).indices
        flip = self._flips[predicted_index.clamp(max=self._flips.numel() - 1)]
        return torch.where(flip, top2[:, 1], top2[:, 0]).tolist()

    def _draft_tree(self, anchor_token: int) -> tuple[list[int], list[int]]:
        """Rows to verify: the anchor (root, row 0) and the drafted chain or tree below it."""
        opts = self.options
        lattice = self.draft(anchor_token, opts.positions).to("cpu")
        if opts.tree == "chain":
            chain = lattice.chain()
            return [anchor_token] + chain, list(range(-1, len(chain)))
        from specpilot_mem.engine.trees import build_tree

        tokens, parents = build_tree(opts.tree, lattice, opts.nodes)
        return [anchor_token] + tokens, [-1] + [p + 1 for p in parents]

    @torch.no_grad()
    @_on_own_device
    def record_lattices(
        self,
        recorder,
        requests,
        positions: int = 16,
        max_new_tokens: int = 128,
        labels: list[str] | None = None,
        batch: int = 64,
        block: int | None = None,
        greedy: list[Generation] | None = None,
    ) -> list[Generation]:
        """Record teacher-forced lattices at EVERY position of each request's greedy output into a
        ``specpilot_mem.replay.lattice.LatticeRecorder`` (kind "selector", ``positions`` positions).

        The step at position p (p output tokens committed) drafts after the last committed token from
        the target's features of everything before it, exactly as a live step would, with ``block``
        masked positions in the drafter's forward (default its trained block). Returns the AR
        generations (the greedy outputs) so callers can reuse them: passing them back as ``greedy``
        records another block size on the same outputs without decoding again.
        """
        if self.drafter is None:
            raise ValueError("recording lattices needs a drafter")
        runs = greedy if greedy is not None else self.generate(requests, "ar", max_new_tokens)
        W = self.drafter.cfg.context_window
        for index, run in enumerate(runs):
            seq = run.prompt_ids + run.output_ids
            self.cache.reset()
            self.prefill(seq)
            P, n = len(run.prompt_ids), len(run.output_ids)
            anchor_pos = torch.arange(P - 1, P - 1 + n, device=self.device)
            for lo in range(0, n, batch):
                pos = anchor_pos[lo : lo + batch]
                ctx = pos[:, None] - W + torch.arange(W, device=self.device)
                anchors = torch.tensor(seq, device=self.device)[pos]
                hidden = self.drafter(
                    self.target.embed, self.cache.features[ctx.clamp(min=0)], ctx >= 0, anchors, pos, block
                )
                base = lm_head(hidden, self.target.lm_head_weight)
                cand, unary, pair = self.drafter.lattice_batch(hidden, base, anchors, positions)
                recorder.add_batch([run.id] * pos.numel(), (pos - (P - 1)).tolist(), cand, unary, pair)
            recorder.set_greedy(run.id, run.output_ids, label=labels[index] if labels else "")
        return runs

    @torch.no_grad()
    @_on_own_device
    def prefill_argmax(
        self, prompt_ids: list[int], output_ids: list[int], queries: list[tuple[int, int]], fp32_head: bool = True
    ) -> list[int]:
        """For each (position, prefill_len): the argmax ``score(prompt_ids, output_ids[:position + 1],
        prefill_len=prefill_len)`` gives at ``position`` (``prefill_logprobs``)."""
        rows = self.prefill_logprobs(prompt_ids, output_ids, queries, fp32_head)
        return [int(row.argmax()) for row in rows]

    @torch.no_grad()
    @_on_own_device
    def prefill_logprobs(
        self, prompt_ids: list[int], output_ids: list[int], queries: list[tuple[int, int]], fp32_head: bool = True
    ) -> list[torch.Tensor]:
        """For each (position, prefill_len): the log-probabilities [V] that ``score(prompt_ids,
        output_ids[:position + 1], prefill_len=prefill_len)`` computes at ``position``, bit for bit, without
        re-running the whole prefix per query.

        ``score`` chunks the sequence from 0 in chunk_size pieces up to prefill_len, then from prefill_len on. Every
        piece that ends at or before the last multiple of chunk_size below prefill_len is the plain grid's, so one
        pass over the sequence on the plain grid, with the cache saved at those boundaries, serves every query: a
        query restores its boundary, runs the piece up to prefill_len and, where the row it asks about lies beyond,
        the pieces after prefill_len up to it; then the same LM head and softmax over the same rows as ``score``.
        The audit's prefill-length check asks this for every event of a request at once (a 4,096-token output's
        events cost a piece or two each, not a whole re-score)."""
        seq = list(prompt_ids) + list(output_ids)
        P, size = len(prompt_ids), self.options.chunk_size
        plan = []
        for position, split in queries:
            end = P + position + 1  # the query's sequence: prompt + output[: position + 1]
            if not 0 <= position < len(output_ids) or not 0 < split <= end:
                raise ValueError(f"query ({position}, {split}) outside the output / sequence")
            plan.append((position, split, end, (split - 1) // size * size))
        if not plan:
            return []
        boundaries = {b for *_, b in plan}
        self.cache.reset()
        saved, hidden = {}, []
        for start in range(0, max(boundaries) + 1, size):
            if start in boundaries:
                saved[start] = (
                    {i: t.clone() for i, t in self.cache.state.items()},
                    {i: t.clone() for i, t in self.cache.conv.items()},
                )
            if start == max(boundaries):
                break
            hidden.append(self._commit_piece(seq[start : start + size]))
        base = torch.cat(hidden, dim=0) if hidden else None
        answers: list[torch.Tensor | None] = [None] * len(plan)
        # latest boundary first: a query rewrites the keys and values from its boundary on, which later queries
        # (at earlier boundaries) never read
        for index in sorted(range(len(plan)), key=lambda q: -plan[q][3]):
            position, split, end, boundary = plan[index]
            states, convs = saved[boundary]
            for i in self.cache.state:
                self.cache.state[i].copy_(states[i])
                self.cache.conv[i].copy_(convs[i])
            self.cache.length = boundary
            self.cache.length_t.fill_(boundary)
            rows = [base[:boundary]] if boundary else []
            rows.append(self._commit_piece(seq[boundary:split]))
            start = split
            while start < end - 1:  # the row asked about (end - 2) lies in the pieces after the prefill
                rows.append(self._commit_piece(seq[start : min(start + size, end)]))
                start += size
            predicting = torch.cat(rows, dim=0)[P - 1 : end - 1]
            logits = lm_head(predicting, self.target.lm_head_weight, "dense", fp32=fp32_head)
            answers[index] = torch.log_softmax(logits.float(), dim=-1)[position]
        return answers  # type: ignore[return-value]

    def _commit_piece(self, piece: list[int]) -> torch.Tensor:
        """One prefill piece through the target, committed (``prefill``'s inner step); its hidden [n, d]."""
        rows = chain_rows(piece, self.target.cfg.conv_size, self.device)
        h, pending = self.target.forward_rows(rows, self.cache, "wy", self.cache.length + rows.count)
        self.cache.commit(pending, list(range(len(piece))))
        return h[0]

    @torch.no_grad()
    @_on_own_device
    def score(
        self, prompt_ids: list[int], output_ids: list[int], fp32_head: bool = True, prefill_len: int | None = None
    ) -> Score:
        """Teacher-forced scorer (stock passes, FP32 LM head by default): feeds prompt + output through the
        target and scores each output token. ``prefill_len`` moves the boundary of the first forward
        (default: the prompt's length), which changes chunking and so rounding (the audit's check)."""
        seq = list(prompt_ids) + list(output_ids)
        if not prompt_ids or not output_ids:
            raise ValueError("score needs a non-empty prompt and output")
        if len(seq) > self.max_len:
            raise ValueError(f"prompt + output ({len(seq)}) exceed the engine's max_len {self.max_len}")
        split = len(prompt_ids) if prefill_len is None else prefill_len
        if not 0 < split <= len(seq):
            raise ValueError(f"prefill_len {prefill_len} outside 1..{len(seq)}")
        self.cache.reset()
        size = self.options.chunk_size
        starts = list(range(0, split, size)) + list(range(split, len(seq), size))
        hidden = self.prefill(seq, sorted(set(starts)))
        predicting = hidden[len(prompt_ids) - 1 : len(seq) - 1]
        logits = lm_head(predicting, self.target.lm_head_weight, "dense", fp32=fp32_head)
        logp = torch.log_softmax(logits.float(), dim=-1)
        given = torch.tensor(output_ids, device=logp.device)
        top2 = logp.topk(2, dim=-1)
        token_logp = logp.gather(1, given[:, None])[:, 0]
        return Score(
            logprob=token_logp.tolist(),
            argmax=top2.indices[:, 0].tolist(),
            margin=(top2.values[:, 0] - token_logp).tolist(),
            top2_margin=(top2.values[:, 0] - top2.values[:, 1]).tolist(),
        )
