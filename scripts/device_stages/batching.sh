# ~2.7 min (H200): the composed engine's T_AR, draft (blocks 16/12/8) and verify step at 2-17 rows for 1-64 requests,
# one process per batch size (~100 s); then live batched decoding of the trained pair with the policies
# (AR, stock, shared budget, drafter block, both; 1-64 requests, ~60 s). c(R) of the GEMMs was measured in call 2
# (benchmarks/batched_costs.py, benchmarks/results/batched-costs-h200-2026-12-02.json); BATCHING_COSTS=1 re-measures it (~40 s).
# CPU dry run: BATCHING_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/batching.sh
set -uo pipefail
if [ "${BATCHING_DRY:-0}" = 1 ]; then
    costs_args="--device cpu --scale 32 --rows 1,16,64"
    engine_args="--device cpu --smoke --batches 1,4 --rows 2,5 --blocks 16,8 --context 32"
    live_args="--device cpu --batches 1,2 --requests 4 --new-tokens 8"
else
    costs_args=""
    engine_args=""
    live_args=""
fi
mkdir -p "$RESULTS"
rc=0
if [ "${BATCHING_COSTS:-0}" = 1 ]; then
    python3 benchmarks/batched_costs.py $costs_args --out "$RESULTS/batched-costs-h200.json" >/dev/null || rc=1
fi
python3 benchmarks/batched_engine_costs.py --isolate $engine_args --out "$RESULTS/batched-engine-costs-h200.json" >/dev/null || rc=1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d.get('skipped') or {b: e['T_AR_ms'] for b, e in d['by_batch'].items()}, 'errors:', len(d.get('errors', {})))" "$RESULTS/batched-engine-costs-h200.json" || rc=1
python3 benchmarks/batched_live.py $live_args --out "$RESULTS/batched-live-h200.json" >/dev/null || rc=1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(b, {k: round(v.get('over_ar', 1.0), 2) for k, v in r.items()}) for b, r in d['by_batch'].items()]; print('errors:', d['errors'])" "$RESULTS/batched-live-h200.json" || rc=1
exit $rc
