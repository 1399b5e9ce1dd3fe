# Runtime estimate: ~2.3 min on one H200 (8 study workers x 75 s budget, then ~30 s of pooled re-scoring + the scoring bench).
# Token forcing (issue 38) in bf16 on the trained pair: the fault study's faults and lossless controls through the
# composed engine, seeds spread over 8 worker processes sharing the GPU (batch-1 decoding leaves it mostly idle),
# then sealed-size checks (4 seeds' outputs judged as one sample) and the batched scorer's speed on >= 100k tokens.
# CPU dry run: FORCING_DEVICE=cpu bash scripts/device_stages/forcing.sh (2 workers, tiny sizes).
set -euo pipefail
DEVICE=${FORCING_DEVICE:-cuda}
RESULTS=${RESULTS:-/tmp/forcing-results}
mkdir -p "$RESULTS"
if [ "$DEVICE" = cpu ]; then
    WORKERS=2 SEEDS=1 REQS=2 TOKENS=16 BUDGET=1 POOL=2 THREADS=1 AUDIT=10 BENCH_TOKENS=2000 DTYPE=float32
else
    WORKERS=8 SEEDS=6 REQS=12 TOKENS=256 BUDGET=75 POOL=4 THREADS=2 AUDIT=50 BENCH_TOKENS=120000 DTYPE=bfloat16
fi
parts=()
for ((w = 0; w < WORKERS; w++)); do
    part="$RESULTS/.fault-study-part$w.json"
    parts+=("$part")
    python3 benchmarks/fault_study.py --device "$DEVICE" --dtype "$DTYPE" --seeds "$SEEDS" --first-seed $((w * 100)) \
        --requests-per-seed "$REQS" --max-new-tokens "$TOKENS" --audit-sample "$AUDIT" --budget-seconds "$BUDGET" \
        --threads "$THREADS" >"$part" 2>"$RESULTS/fault-study-worker$w.log" &
done
wait
python3 benchmarks/fault_study.py --device "$DEVICE" --merge "${parts[@]}" --pool-size "$POOL" --audit-sample "$AUDIT" \
    >"$RESULTS/fault_study-$DEVICE-$DTYPE.json" 2>"$RESULTS/fault-study-pooled.log"
rm -f "${parts[@]}"
python3 benchmarks/forcing_score_bench.py --device "$DEVICE" --dtype "$DTYPE" --tokens "$BENCH_TOKENS" \
    --out "$RESULTS/forcing_score_bench-$DEVICE-$DTYPE.json"
python3 - "$RESULTS/fault_study-$DEVICE-$DTYPE.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"{len(doc['runs'])} seeds; per seed (reject/inconclusive/accept):")
for name, row in doc["systems"].items():
    pooled = doc.get("pooled", {}).get("systems", {}).get(name)
    extra = f"  pooled {pooled['reject']}/{pooled['inconclusive']}/{pooled['accept']}" if pooled else ""
    print(f"  {name:30s} {row['reject']}/{row['inconclusive']}/{row['accept']}{extra}")
PY
