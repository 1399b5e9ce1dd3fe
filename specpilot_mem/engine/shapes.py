"""Named target shapes of the system engine: the paper's targets with synthetic weights, and tiny smoke shapes.

A shape fixes every tensor of a hybrid (Gated DeltaNet + gated attention) or dense (attention only) target
and of its block drafter. Weights for these shapes are synthetic (seeded N(0, 0.02) made on the GPU, never
on the host) and only good for timing; the trained pair (``SystemShape.from_target``) is the one for
correctness, tau and token forcing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from specpilot_mem.errors import SpecPilotError


class ShapeError(SpecPilotError):
    pass


@dataclass(frozen=True)
class SystemShape:
    name: str
    d_model: int
    layer_types: tuple[str, ...]
    ffn_dim: int
    vocab_size: int
    # Gated DeltaNet: key heads (q, k) and value heads, K = V = head dim; causal conv over q, k, v.
    gdn_key_heads: int = 16
    gdn_value_heads: int = 32
    gdn_head_dim: int = 128
    conv_size: int = 4
    attn_heads: int = 16
    attn_kv_heads: int = 4
    attn_head_dim: int = 128
    # Qwen3.5-style attention: an output gate per query head and RMS norms on q and k (Llama: neither).
    attn_output_gate: bool = True
    qk_norm: bool = True
    tied_head: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    # The block drafter: dense layers over the drafted block, the target's LM head on its positions.
    drafter_layers: int = 1
    drafter_block: int = 16
    synthetic: bool = True

    @property
    def n_layers(self) -> int:
        return len(self.layer_types)

    @property
    def gdn_layers(self) -> int:
        return self.layer_types.count("gdn")

    @property
    def attn_layers(self) -> int:
        return self.layer_types.count("attn")

    @property
    def gdn_conv_channels(self) -> int:
        return (2 * self.gdn_key_heads + self.gdn_value_heads) * self.gdn_head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(out, in) of each fused linear class of one layer kind (the engine's GEMMs)."""
        hv = self.gdn_value_heads * self.gdn_head_dim
        q_out = self.attn_heads * self.attn_head_dim * (2 if self.attn_output_gate else 1)
        return {
            "gdn_in": (self.gdn_conv_channels + hv + 2 * self.gdn_value_heads, self.d_model),  # q k v | z | a b
            "gdn_out": (self.d_model, hv),
            "attn_qkv": (q_out + 2 * self.attn_kv_heads * self.attn_head_dim, self.d_model),
            "attn_out": (self.d_model, self.attn_heads * self.attn_head_dim),
            "gate_up": (2 * self.ffn_dim, self.d_model),
            "down": (self.d_model, self.ffn_dim),
        }

    def layer_linears(self, kind: str) -> list[str]:
        return (["gdn_in", "gdn_out"] if kind == "gdn" else ["attn_qkv", "attn_out"]) + ["gate_up", "down"]

    def params(self) -> dict[str, int]:
        """Parameter counts: target linears (streamed every step), embedding, LM head, drafter linears."""
        shapes = self.linear_shapes()
        linears = sum(shapes[n][0] * shapes[n][1] for kind in self.layer_types for n in self.layer_linears(kind))
        drafter = self.drafter_layers * sum(
            shapes[n][0] * shapes[n][1] for n in ("attn_qkv", "attn_out", "gate_up", "down")
        )
        embed = self.vocab_size * self.d_model
        return {
            "target_linears": linears,
            "embedding": embed,
            "lm_head": 0 if self.tied_head else embed,
            "drafter_linears": drafter,
        }

    def weight_floor_ms(self, bandwidth_Bps: float, bytes_per_weight: float = 2.0) -> float:
        """Time to stream the target's linears and LM head once at ``bandwidth_Bps`` (the verify pass's floor)."""
        p = self.params()
        return (p["target_linears"] + self.vocab_size * self.d_model) * bytes_per_weight / bandwidth_Bps * 1e3

    def to_dict(self) -> dict:
        out = asdict(self)
        out["layer_types"] = f"{self.gdn_layers} gdn + {self.attn_layers} attn"
        out["params"] = self.params()
        return out


def _hybrid(layers: int, every: int = 4) -> tuple[str, ...]:
    """Qwen3.5's mix: three GDN layers, then one attention layer."""
    return tuple("attn" if (i + 1) % every == 0 else "gdn" for i in range(layers))


SHAPES: dict[str, SystemShape] = {
    # Qwen3.6/3.8-27B-like: 64 layers (48 GDN + 16 attention), d 5120, ffn 17408, vocab 248320.
    "qwen3.8-27b-like": SystemShape(
        name="qwen3.8-27b-like",
        d_model=5120,
        layer_types=_hybrid(64),
        ffn_dim=17408,
        vocab_size=248320,
        gdn_key_heads=16,
        gdn_value_heads=48,
        gdn_head_dim=128,
        attn_heads=24,
        attn_kv_heads=4,
        attn_head_dim=256,
        drafter_layers=5,
    ),
    # Qwen3.5-4B-like: 32 layers (24 GDN + 8 attention), d 2560, ffn 9216, tied head.
    "qwen3.5-4b-like": SystemShape(
        name="qwen3.5-4b-like",
        d_model=2560,
        layer_types=_hybrid(32),
        ffn_dim=9216,
        vocab_size=248320,
        gdn_key_heads=16,
        gdn_value_heads=32,
        gdn_head_dim=128,
        attn_heads=16,
        attn_kv_heads=4,
        attn_head_dim=256,
        tied_head=True,
        drafter_layers=5,
    ),
    # Llama-3.1-8B-like dense target: 32 attention layers, d 4096, ffn 14336, vocab 128256, no gate or qk norm.
    "llama-3.1-8b-like": SystemShape(
        name="llama-3.1-8b-like",
        d_model=4096,
        layer_types=("attn",) * 32,
        ffn_dim=14336,
        vocab_size=128256,
        attn_heads=32,
        attn_kv_heads=8,
        attn_head_dim=128,
        attn_output_gate=False,
        qk_norm=False,
        rope_theta=500000.0,
        drafter_layers=5,
    ),
}

# Tiny stand-ins with the same structure, for the CPU dry run (--smoke): every code path, seconds.
SMOKE_SHAPES: dict[str, SystemShape] = {
    name: replace(
        shape,
        d_model=128,
        layer_types=shape.layer_types[:4] if "gdn" in shape.layer_types else ("attn",) * 2,
        ffn_dim=256,
        vocab_size=1024,
        gdn_key_heads=2,
        gdn_value_heads=4,
        gdn_head_dim=32,
        attn_heads=4,
        attn_kv_heads=2,
        attn_head_dim=32,
        drafter_layers=1,
    )
    for name, shape in SHAPES.items()
}


def get_shape(name: str, smoke: bool = False) -> SystemShape:
    table = SMOKE_SHAPES if smoke else SHAPES
    if name not in table:
        raise ShapeError(f"unknown shape {name!r}", where="shape", fix=f"use one of {', '.join(sorted(table))}")
    return table[name]
