# Runtime estimate: ~1.5 min on one H200 (10 study workers, one seed each: 24 systems x 6 requests x 128 tokens, ~40-70 s
# at 300-600 tok/s per process, path verify ~70 tok/s; then ~15 s of pooled re-scoring and audits; the scoring bench ~10 s).
# Token forcing (issue 38) in bf16 on the trained pair: the fault study's faults and lossless controls through the
# composed engine, seeds spread over 10 worker processes sharing the GPU (batch-1 decoding leaves it mostly idle),
# then sealed-size checks (5 and 10 seeds' outputs judged as one sample) and the batched scorer's speed on >= 100k tokens.
# CPU dry run: FORCING_DEVICE=cpu bash scripts/device_stages/forcing.sh (2 workers, tiny sizes).
set -euo pipefail
DEVICE=${FORCING_DEVICE:-cuda}
RESULTS=${RESULTS:-/tmp/forcing-results}
mkdir -p "$RESULTS"
if [ "$DEVICE" = cpu ]; then
    WORKERS=2 SEEDS=1 REQS=2 TOKENS=16 BUDGET=1 POOL=2 THREADS=1 AUDIT=10 BENCH_TOKENS=2000 DTYPE=float32
else
    WORKERS=10 SEEDS=1 REQS=6 TOKENS=128 BUDGET=1 POOL=5 THREADS=1 AUDIT=50 BENCH_TOKENS=120000 DTYPE=bfloat16
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
python3 benchmarks/fault_study.py --device "$DEVICE" --merge "${parts[@]}" --pool-size "$POOL" --pool-size $((POOL * 2)) \
    --audit-sample "$AUDIT" \
    >"$RESULTS/fault_study-$DEVICE-$DTYPE.json" 2>"$RESULTS/fault-study-pooled.log"
rm -f "${parts[@]}"
python3 benchmarks/forcing_score_bench.py --device "$DEVICE" --dtype "$DTYPE" --tokens "$BENCH_TOKENS" \
    --out "$RESULTS/forcing_score_bench-$DEVICE-$DTYPE.json"
python3 - "$RESULTS/fault_study-$DEVICE-$DTYPE.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"{len(doc['runs'])} seeds; per seed (reject/inconclusive/accept):")
for name, row in doc["systems"].items():
    extra = ""
    for group in doc.get("pooled", []):
        row = group["systems"].get(name)
        if row:
            extra += f"  x{group['group']} {row['reject']}/{row['inconclusive']}/{row['accept']}"
    print(f"  {name:30s} {row['reject']}/{row['inconclusive']}/{row['accept']}{extra}")
PY
