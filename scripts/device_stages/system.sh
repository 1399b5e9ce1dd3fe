# ~6 min (H200): the composed system, stock vs each SpecPilot mechanism vs all, 27B-like x1 and 4B/8B-like x8-32.
# Needs SGLang's GDN kernel vendored in .sglang_gdn (python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn,
# run where the wheel is cached; the folder is untracked, not ignored, so it travels with the working tree).
set -euo pipefail
export MAX_JOBS=$(nproc)
test -f .sglang_gdn/sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py || {
    echo "missing .sglang_gdn: run python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn first" >&2; exit 2; }
# fail fast (seconds) on the smoke shapes before the full shapes
python benchmarks/system_bench.py --smoke --sections single,batched --out "$RESULTS/system-smoke-h200.json" >/dev/null
python benchmarks/system_bench.py --sections ${SYSTEM_SECTIONS:-single,batched} --out "$RESULTS/system-h200.json" \
    ${SYSTEM_ARGS:-} | tail -n 40
