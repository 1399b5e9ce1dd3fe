# ~150 s on an H200: the composed engine's step times at the rows issue 32's batching policies use (T_AR, the
# drafter at blocks 16/12/8, stock's and path verify's steps at 2-17 rows a request), 4B-like at 1/8/16/24/32/64
# requests (each batch size in its own process) and 27B-like at 1/8/16/32/64: the engine-timed closed loop of
# benchmarks/batched_bench.py --engine-costs (Figure A2, run on the CPU afterwards). Stock's 17-row steps past the
# GPU's memory at the 27B-like shape are recorded as errors (its FP32 snapshots).
# Needs .sglang_gdn (see system.sh). CPU dry run:
#   BATCHED_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/batched_costs.sh
set -uo pipefail
source scripts/device_stages/_common.sh
need_sglang_gdn
mkdir -p "$RESULTS"
rc=0
if [ "${BATCHED_DRY:-0}" = 1 ]; then
    small="--device cpu --smoke --batches 1,4 --rows 2,5 --blocks 16,8 --context 32"
    large="$small"
else
    small="--isolate --iters 5 --bursts 3 --batches 1,8,16,24,32,64"
    large="--iters 3 --bursts 2 --batches 1,8,16,32,64"
fi
python3 benchmarks/batched_engine_costs.py --shape qwen3.5-4b-like $small --out "$RESULTS/batched-engine-costs-h200.json" \
    >/dev/null || rc=1
python3 benchmarks/batched_engine_costs.py --shape qwen3.8-27b-like $large \
    --out "$RESULTS/batched-engine-costs-27b-h200.json" >/dev/null || rc=1
python3 - "$RESULTS" <<'PY' || rc=1
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/batched-engine-costs-*.json")):
    e = json.load(open(f))
    for b, x in e["by_batch"].items():
        print(f.split("/")[-1], b, "AR", x["T_AR_ms"], "stock", x.get("T_step_ms"), "path", x.get("T_step_path_ms"))
    print("errors:", e["errors"])
PY
exit $rc
