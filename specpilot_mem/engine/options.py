"""Options of the system engine. The defaults are stock (SGLang's way); each option switches on one mechanism.

    SystemOptions()                                   stock: cuBLAS BF16, snapshot GDN verify, BF16 head, chain
    SystemOptions(linears="w12", lm_head="w12")       W12 mma linears and head
    SystemOptions(lm_head="certified")                the certified head (graph-safe, in-graph fallback)
    SystemOptions(gdn_verify="path")                  GDN path verify + commit, no per-node state
    SystemOptions(tree="best-first", nodes=32)        best-first wide trees
    SystemOptions.parse("linears=w12,gdn_verify=path")

Everything is checked against the shape (and drafter) before any GPU work: unknown names, impossible
combinations and a memory need above what the GPU has are clear errors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from specpilot_mem.errors import SpecPilotError
from specpilot_mem.engine.shapes import SystemShape


class OptionsError(SpecPilotError):
    pass


CHOICES = {
    "linears": ("bf16", "w12"),
    "lm_head": ("bf16", "w12", "certified"),
    "gdn_verify": ("snapshot", "path"),
    "tree": ("chain", "best-first", "ddtree", "eagle2"),
}


@dataclass(frozen=True)
class SystemOptions:
    # "bf16": cuBLAS BF16 (stock); "w12": the W12 mma kernel (specpilot_kernels.w12) on every target linear.
    linears: str = "bf16"
    # "bf16" (stock), "w12" (the head's weight in W12), "certified" (INT8 pass + exact rescoring, §4.1).
    lm_head: str = "bf16"
    # "snapshot": SGLang's verify writing every drafted position's state, its commit a copy (stock);
    # "path": specpilot_kernels.gdn_tree path verify + commit replaying the accepted path.
    gdn_verify: str = "snapshot"
    # "chain": the drafter's greedy chain (stock); else a builder of specpilot_mem.replay.trees.
    tree: str = "chain"
    # Drafted positions (the chain's length; the tree's deepest level) and the tree's node budget.
    positions: int = 16
    nodes: int = 32
    # Certified head: survivors kept per row in the fixed-size buffers (beyond: the in-graph exact fallback).
    max_survivors: int = 2048
    cuda_graphs: bool = True
    # The injected fault of the paper's §6.2 (a lossy system token forcing must reject): +fault_bias on every
    # fault_stride-th vocabulary id once fault_after output tokens exist; -1 switches it off.
    fault_after: int = -1
    fault_bias: float = 2.0
    fault_stride: int = 7
    # Lossy verify passes for token forcing's fault study (issue 38; the pure-torch engine's EngineOptions has the
    # same ones), all off by default and never in the prefill. verify_weights: the verify pass's linears (and head)
    # rounded to "fp8" (E4M3), "int8", "int6" or "int4" with one scale per output channel, on every linear and the
    # head (verify_weight_scope "all") or the head only ("head"). flip_rate: at that share of output indices the
    # prediction is the verify logits' runner-up (drawn per request from flip_seed and a hash of its prompt, as the
    # pure-torch engine draws them). rope_offset: the verify pass rotates queries and keys this many positions too
    # far. attn_window: its attention sees only the last attn_window committed tokens (0: all of them).
    # stop_after: every output ends after this many tokens (-1: at max_new_tokens).
    verify_weights: str = "none"
    verify_weight_scope: str = "all"
    flip_rate: float = 0.0
    flip_seed: int = 0
    rope_offset: int = 0
    attn_window: int = 0
    stop_after: int = -1

    @classmethod
    def parse(cls, text: str) -> "SystemOptions":
        """``name=value,name=value`` (empty: stock)."""
        values: dict = {}
        known = {f.name: f.type for f in fields(cls)}
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = item.partition("=")
            if not sep:
                raise OptionsError(f"option {item!r} has no value", where=text, fix="write name=value")
            if name not in known:
                raise OptionsError(f"unknown option {name!r}", where=text, fix=f"use one of {', '.join(known)}")
            kind = known[name]
            if kind == "int":
                values[name] = int(value)
            elif kind == "float":
                values[name] = float(value)
            elif kind == "bool":
                values[name] = value.lower() in ("1", "true", "yes", "on")
            else:
                values[name] = value
        return cls(**values)

    def replace(self, **changes) -> "SystemOptions":
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise OptionsError(
                f"unknown option(s) {', '.join(sorted(unknown))}",
                where="SystemOptions",
                fix=f"use one of {', '.join(f.name for f in fields(self))}",
            )
        return replace(self, **changes)

    @property
    def rows(self) -> int:
        """Verify rows per request: the root plus the chain's positions or the tree's nodes."""
        return 1 + (self.positions if self.tree == "chain" else self.nodes)

    def label(self) -> str:
        stock = SystemOptions()
        changed = [f"{k}={v}" for k, v in asdict(self).items() if v != getattr(stock, k) and k != "cuda_graphs"]
        return ",".join(changed) or "stock"

    def validate(self, shape: SystemShape, drafter_block: int | None = None) -> "SystemOptions":
        """Raise OptionsError on a value or combination that cannot work on ``shape``; returns self."""
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise OptionsError(
                    f"{name}={getattr(self, name)!r} is not an option",
                    where=name,
                    fix=f"use one of {', '.join(allowed)}",
                )
        block = drafter_block if drafter_block is not None else shape.drafter_block
        if not 1 <= self.positions <= block:
            raise OptionsError(
                f"positions={self.positions}: the drafter drafts {block} positions per pass",
                where="positions",
                fix=f"use 1..{block}",
            )
        if self.tree != "chain":
            if self.nodes < self.positions:
                raise OptionsError(
                    f"a tree of {self.nodes} nodes cannot reach depth {self.positions}",
                    where="nodes",
                    fix=f"use nodes >= positions ({self.positions})",
                )
            if self.rows > 64:
                raise OptionsError(
                    f"{self.rows} verify rows per request: GDN path verify and its schedule take at most 64",
                    where="nodes",
                    fix="use nodes <= 63",
                )
        if self.fault_after >= 0 and self.lm_head == "certified":
            raise OptionsError(
                "the injected fault biases logits; the certified head returns only the argmax",
                where="fault_after with lm_head=certified",
                fix="inject the fault with lm_head=bf16 or w12",
            )
        self._validate_faults()
        if self.max_survivors < 1:
            raise OptionsError("max_survivors must be positive", where="max_survivors", fix="use e.g. 2048")
        if shape.d_model % 64 and (self.linears == "w12" or self.lm_head in ("w12", "certified")):
            raise OptionsError(
                f"d_model={shape.d_model}: W12 and the certified head need multiples of 64",
                where="d_model",
                fix="use bf16 linears and head for this shape",
            )
        return self

    @property
    def verify_faults(self) -> dict:
        """The fault study's verify-pass faults that are switched on (the prefill runs without them)."""
        stock = SystemOptions()
        names = ("verify_weights", "flip_rate", "rope_offset", "attn_window")
        return {name: getattr(self, name) for name in names if getattr(self, name) != getattr(stock, name)}

    def _validate_faults(self) -> None:
        from specpilot_mem.engine.model import WEIGHT_FORMATS

        if self.verify_weights not in ("none", *WEIGHT_FORMATS):
            raise OptionsError(
                f"verify_weights={self.verify_weights!r} is not a weight format",
                where="verify_weights",
                fix=f"use none or one of {', '.join(WEIGHT_FORMATS)}",
            )
        if self.verify_weight_scope not in ("all", "head"):
            raise OptionsError(
                f"verify_weight_scope={self.verify_weight_scope!r}", where="verify_weight_scope", fix="use all or head"
            )
        if not 0.0 <= self.flip_rate <= 1.0:
            raise OptionsError(f"flip_rate={self.flip_rate} is not a share", where="flip_rate", fix="use 0..1")
        if self.attn_window < 0 or self.stop_after < -1 or self.stop_after == 0:
            raise OptionsError(
                f"attn_window={self.attn_window}, stop_after={self.stop_after}",
                where="attn_window / stop_after",
                fix="use attn_window >= 0 (0: off) and stop_after >= 1 (-1: off)",
            )
        if (self.flip_rate > 0 or self.verify_weights != "none") and self.lm_head == "certified":
            raise OptionsError(
                "flips and low-precision verify weights need the head's logits; the certified head returns only the argmax",
                where="flip_rate / verify_weights with lm_head=certified",
                fix="inject them with lm_head=bf16",
            )
        if self.verify_weights != "none" and (self.linears != "bf16" or self.lm_head != "bf16"):
            raise OptionsError(
                "verify_weights replaces the BF16 weights of the verify pass",
                where="verify_weights with linears/lm_head other than bf16",
                fix="inject it with linears=bf16 and lm_head=bf16",
            )


def memory_needed(shape: SystemShape, options: SystemOptions, batch: int, max_len: int) -> dict[str, int]:
    """Bytes the engine allocates for ``batch`` requests of up to ``max_len`` tokens (weights, caches, buffers)."""
    p = shape.params()
    rows = options.rows * batch
    bf16 = 2
    weights = (p["target_linears"] + p["embedding"] + p["lm_head"] + p["drafter_linears"]) * bf16
    if options.linears == "w12":
        weights += p["target_linears"] * 12 // 8 + 16 * shape.d_model * shape.n_layers
    if options.lm_head == "w12":
        weights += p["embedding"] * 12 // 8
    if options.lm_head == "certified":
        weights += p["embedding"] + 8 * shape.vocab_size
    kv = shape.attn_layers * batch * max_len * 2 * shape.attn_kv_heads * shape.attn_head_dim * bf16
    state = shape.gdn_value_heads * shape.gdn_head_dim**2 * 4
    gdn = shape.gdn_layers * batch * state * (2 if options.gdn_verify == "path" else 1)
    snapshots = shape.gdn_layers * rows * state if options.gdn_verify == "snapshot" else 0
    widest = max(o for o, _ in shape.linear_shapes().values())
    activations = rows * (widest * 4 + shape.vocab_size * 4) + rows * shape.gdn_layers * shape.gdn_conv_channels * 12
    return {
        "weights": weights,
        "kv_cache": kv,
        "gdn_states": gdn,
        "gdn_snapshots": snapshots,
        "activations": activations,
        "total": weights + kv + gdn + snapshots + activations,
    }


def check_fits(needed: dict[str, int], free_bytes: int, where: str) -> None:
    if needed["total"] > free_bytes:
        parts = ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in needed.items() if k != "total")
        raise OptionsError(
            f"{where} needs {needed['total'] / 2**30:.1f} GiB ({parts}); the GPU has {free_bytes / 2**30:.1f} GiB free",
            where=where,
            fix="use fewer requests, a shorter context, or one option set at a time",
        )
