"""The GEMM shapes the W12 and Q-pass benchmarks time, (N output rows, K inputs): one decoder layer's linears and
the LM head of the 27B-like target (Qwen3.5-style, hidden size 5120; the weights the benchmarks make are synthetic)."""

SHAPES = {
    "qkv": (10240, 5120),
    "o_proj": (5120, 8192),
    "gate_up": (34816, 5120),
    "down": (5120, 17408),
    "lm_head": (248320, 5120),
}
# The per-layer projections (a layer's share of a forward pass); the LM head runs once a pass.
PROJECTIONS = ("qkv", "o_proj", "gate_up", "down")
