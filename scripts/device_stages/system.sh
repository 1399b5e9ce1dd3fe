# ~7 min on an H200 (CUDA builds of the W12/certified/GDN kernels included when not cached): the composed system.
# check: the trained pair through every option set vs the engine's AR tokens (bf16, fp32); single: 27B-like, one
# request, T_AR / draft / verify step at 1..64 rows, stock vs each mechanism vs all; batched: 4B-like and 8B-like
# with 8/16/32 requests; profile: per kernel class (cost-model format); speedup: S(N), gains; forcing: outputs for
# benchmarks/system_forcing.py (judged on the CPU). Needs .sglang_gdn (SGLang's GDN kernel, vendored by
# `python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn`; untracked, not ignored: it travels).
set -euo pipefail
source scripts/device_stages/_common.sh
need_sglang_gdn
# the smoke shapes first (seconds): every kernel builds and every code path runs before the large shapes
python benchmarks/system_bench.py --smoke --sections single,batched --out "$RESULTS/system-smoke-h200.json" >/dev/null
python benchmarks/system_bench.py --sections ${SYSTEM_SECTIONS:-check,forcing,single,batched,profile,speedup} \
    --out "$RESULTS/system-h200.json" ${SYSTEM_ARGS:-} | tail -n 60
