# Sourced by the stages: what every stage on the lent machine shares.
export MAX_JOBS=$(nproc)  # CUDA extension builds use every core of the lent machine

# The SGLang 0.5.23 GDN kernels the engine's stock path imports: an untracked copy, carried with the tree.
need_sglang_gdn() {
    test -f .sglang_gdn/sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py || {
        echo "missing .sglang_gdn: run python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn first" >&2
        exit 2
    }
}
