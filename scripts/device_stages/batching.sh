# ~2.5 min (H200): c(R) of the 4B/27B-like target layer GEMMs and LM head at 1-2048 rows (batched_costs.py, ~40 s),
# then the composed engine's T_AR, draft (blocks 16/12/8) and verify step at 2-17 rows for 1-64 requests, one process per
# batch size (~100 s).
# CPU dry run: BATCHING_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/batching.sh
set -euo pipefail
if [ "${BATCHING_DRY:-0}" = 1 ]; then
    costs_args="--device cpu --scale 32 --rows 1,16,64"
    engine_args="--device cpu --smoke --batches 1,4 --rows 2,5 --blocks 16,8 --context 32"
else
    costs_args=""
    engine_args=""
fi
mkdir -p "$RESULTS"
python3 benchmarks/batched_costs.py $costs_args --out "$RESULTS/batched-costs-h200.json" >/dev/null
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(k, 'rows', v.get('rows', [])[-1:], 'layer_ms', [round(x, 4) for x in v.get('layer_ms', [])][:4], v.get('error', '')) for k, v in d['shapes'].items()]" "$RESULTS/batched-costs-h200.json"
python3 benchmarks/batched_engine_costs.py --isolate $engine_args --out "$RESULTS/batched-engine-costs-h200.json" >/dev/null
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d.get('skipped') or {b: e['T_AR_ms'] for b, e in d['by_batch'].items()}, 'errors:', len(d.get('errors', {})))" "$RESULTS/batched-engine-costs-h200.json"
