# <= 145 s on one H200 (W12 build ~60-100 s unless an earlier stage of the call built it; read bandwidth ~2 s; per
# shape a 33-64-row tune within --tune-budget's share, 64 rows a launch first, ~25 s, then its timing at 32-64 rows
# against cuBLAS with escapes at 33 rows ~10 s): the engine's two 33-64-row shapes outside the device check's five,
# its qkv 14336 x 5120 (no wide_rows in mma_configs.json: 33-256 rows run the wide kernel, 80-91 us at 33-64 rows in
# call 3 against 47 for 10240 x 5120 on the 64-row warpgroup path) and its GDN input 16480 x 5120. Bit-neutral choices
# only; the winners land in $RESULTS/mma_configs.json to commit.
set -euo pipefail
source scripts/device_stages/_common.sh
timeout 145 python benchmarks/w12_device_check.py --out "$RESULTS/w12-engine-33-64-h200.json" --settle 0 \
    --sections build,timing --tune --tune-buckets 33-64 --tune-budget 50 --shapes 14336x5120,16480x5120 \
    --rows 32,33,48,64 --escape-rows 33 --write-configs "$RESULTS/mma_configs.json"
python - "$RESULTS/w12-engine-33-64-h200.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for name, tune in doc.get("tune", {}).items():
    print(name, "33-64 best:", tune.get("buckets", {}).get("33-64", {}).get("best"))
for name, shape in doc.get("shapes", {}).items():
    print(name, " ".join(f"{r['M']}: {r['w12_us']:.1f} us {r['speedup']:.2f}x" for r in shape.get("rows", [])))
PY
