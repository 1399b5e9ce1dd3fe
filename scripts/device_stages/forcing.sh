# Runtime: at most ~150 s on one H200 by construction (hard limits below), whatever the GPU's speed turns out to be:
# workers 95 s (engine load included; no new seed after 40 s), pooled judging 30 s, scoring bench 20 s, merges ~5 s.
# Token forcing (issue 38) in bf16 on the trained pair: the fault study's faults and lossless controls through the
# composed pure-torch engine (drafter + speculative verify), seeds spread over worker processes sharing the GPU
# (batch-1 decoding leaves it mostly idle). Each worker rewrites its part file after every seed, so one stopped at
# its hard limit keeps its finished seeds; the merge judges what exists per seed and as sealed-size checks (all
# seeds' outputs judged as one sample), then the batched scorer's speed on >= 100k tokens.
# CPU dry run: FORCING_DEVICE=cpu bash scripts/device_stages/forcing.sh (2 workers, tiny sizes).
set -uo pipefail
DEVICE=${FORCING_DEVICE:-cuda}
RESULTS=${RESULTS:-/tmp/forcing-results}
mkdir -p "$RESULTS"
if [ "$DEVICE" = cpu ]; then
    WORKERS=2 REQS=2 TOKENS=16 THREADS=1 AUDIT=10 POOL_AUDIT=10 BENCH_TOKENS=2000 DTYPE=float32
    SERVE_BUDGET=1 WORKER_LIMIT=150 POOL_LIMIT=120 BENCH_LIMIT=60
else
    WORKERS=8 REQS=4 TOKENS=64 THREADS=1 AUDIT=30 POOL_AUDIT=15 BENCH_TOKENS=120000 DTYPE=bfloat16
    SERVE_BUDGET=${FORCING_SERVE_BUDGET:-40} WORKER_LIMIT=95 POOL_LIMIT=30 BENCH_LIMIT=20
fi
started=$SECONDS
for ((w = 0; w < WORKERS; w++)); do
    rm -f "$RESULTS/.fault-study-part$w.json"
    timeout -s INT "$WORKER_LIMIT" python3 benchmarks/fault_study.py --device "$DEVICE" --dtype "$DTYPE" --seeds 50 \
        --first-seed $((w * 100)) --requests-per-seed "$REQS" --max-new-tokens "$TOKENS" --audit-sample "$AUDIT" \
        --budget-seconds "$SERVE_BUDGET" --threads "$THREADS" --part-out "$RESULTS/.fault-study-part$w.json" \
        >/dev/null 2>"$RESULTS/fault-study-worker$w.log" &
done
wait
echo "workers done after $((SECONDS - started)) s"
parts=()
for ((w = 0; w < WORKERS; w++)); do
    [ -s "$RESULTS/.fault-study-part$w.json" ] && parts+=("$RESULTS/.fault-study-part$w.json")
done
if [ ${#parts[@]} -eq 0 ]; then
    echo "no worker finished a seed: see $RESULTS/fault-study-worker*.log"
    tail -n 5 "$RESULTS"/fault-study-worker*.log
    exit 1
fi
OUT="$RESULTS/fault_study-$DEVICE-$DTYPE.json"
# the per-seed tallies first (no engine needed), then the same with the pooled checks if they fit their limit
python3 benchmarks/fault_study.py --device "$DEVICE" --merge "${parts[@]}" >"$OUT"
all=${#parts[@]}
seeds=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['runs']))" "$OUT")
half=$((seeds / 2))
pool_args=(--pool-size "$seeds")
[ "$half" -ge 2 ] && pool_args+=(--pool-size "$half")
if timeout -s INT "$POOL_LIMIT" python3 benchmarks/fault_study.py --device "$DEVICE" --merge "${parts[@]}" \
    "${pool_args[@]}" --audit-sample "$POOL_AUDIT" >"$OUT.pooled" 2>"$RESULTS/fault-study-pooled.log"; then
    mv "$OUT.pooled" "$OUT"
else
    echo "pooled checks did not finish within $POOL_LIMIT s (per-seed results kept): $(tail -n 1 "$RESULTS/fault-study-pooled.log")"
    rm -f "$OUT.pooled"
fi
echo "merged $all parts ($seeds seeds) after $((SECONDS - started)) s"
timeout -s INT "$BENCH_LIMIT" python3 benchmarks/forcing_score_bench.py --device "$DEVICE" --dtype "$DTYPE" \
    --tokens "$BENCH_TOKENS" --out "$RESULTS/forcing_score_bench-$DEVICE-$DTYPE.json" \
    || echo "scoring bench did not finish within $BENCH_LIMIT s"
echo "stage done after $((SECONDS - started)) s"
python3 - "$OUT" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"{len(doc['runs'])} seeds of {doc['settings']['requests_per_seed']} x {doc['settings']['max_new_tokens']} tokens; "
      "per seed reject/inconclusive/accept, then pooled:")
for name, row in doc["systems"].items():
    extra = ""
    for group in doc.get("pooled", []):
        pooled = group["systems"].get(name)
        if pooled:
            extra += f"  x{group['group']} {pooled['reject']}/{pooled['inconclusive']}/{pooled['accept']}"
    print(f"  {name:30s} {row['reject']}/{row['inconclusive']}/{row['accept']}{extra}")
print(doc["headline"])
PY
