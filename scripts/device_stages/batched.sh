# ~190 s on an H200 (Triton/CUDA builds included): the composed engine's batched decoding, stock vs SpecPilot vs AR.
# 1. system_bench batched,speedup: 4B-like and 8B-like, 8/16/32 requests, T_AR, draft, stock and SpecPilot's verify
#    step at 2-17 rows per request; speedup over AR (SpecPilot's rows chosen by the budget planner, AR included).
# 2. batched_engine_costs: 4B-like (and 27B-like: BATCHED_SHAPES), 1-64 requests, T_AR, draft (16/12/8), verify at 2-17 rows for stock's and
#    SpecPilot's option sets (the closed-loop replay's engine-timed steps: Figure A2, run on the CPU afterwards).
# Needs .sglang_gdn (see system.sh). CPU dry run:
#   BATCHED_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/batched.sh
set -uo pipefail
export MAX_JOBS=$(nproc)
test -f .sglang_gdn/sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py || {
    echo "missing .sglang_gdn: run python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn first" >&2; exit 2; }
if [ "${BATCHED_DRY:-0}" = 1 ]; then
    system_args="--device cpu --smoke --batched-shapes qwen3.5-4b-like"
    engine_args="--device cpu --smoke --batches 1,4 --rows 2,5 --blocks 16,8 --context 32"
else
    system_args="--iters 5"
    engine_args="${BATCHED_ENGINE_ARGS:---isolate --iters 5 --bursts 3}"
fi
mkdir -p "$RESULTS"
rc=0
if [ "${BATCHED_SYSTEM:-1}" = 1 ]; then
    python3 benchmarks/system_bench.py --sections batched,speedup $system_args --out "$RESULTS/system-batched-h200.json" >/dev/null || rc=1
    python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for shape, table in d['speedup'].get('batched', {}).items():
    for b, r in table.items():
        print(shape, b, 'stock', r.get('stock', {}).get('speedup_over_ar'), 'specpilot', r.get('specpilot', {}).get('speedup_over_ar'), r.get('specpilot', {}).get('plan'))
print('errors:', {k: v.get('errors') for k, v in d['batched'].items() if isinstance(v, dict) and 'errors' in v} if isinstance(d.get('batched'), dict) else d.get('batched'), d['speedup'].get('error'))
" "$RESULTS/system-batched-h200.json" || rc=1
fi
# BATCHED_SHAPES: the engine shapes to time (one file each; the 4B-like one keeps its old name)
for shape in ${BATCHED_SHAPES:-qwen3.5-4b-like}; do
    [ "${BATCHED_ENGINE:-1}" = 1 ] || break
    out="$RESULTS/batched-engine-costs-h200.json"
    [ "$shape" = qwen3.5-4b-like ] || out="$RESULTS/batched-engine-costs-${shape}-h200.json"
    python3 benchmarks/batched_engine_costs.py --shape "$shape" $engine_args --out "$out" >/dev/null || rc=1
    python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for b, e in d['by_batch'].items():
    print(d['shape_name'], b, 'AR', e['T_AR_ms'], 'draft', e['T_draft_ms'], 'stock', e.get('T_step_ms'), 'path', e.get('T_step_path_ms'), e.get('seconds'))
print('errors:', d.get('errors'))
" "$out" || rc=1
done
exit $rc
