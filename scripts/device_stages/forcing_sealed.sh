# Runtime: at most ~170 s on one H200 by construction, every phase under `timeout`: serving SEALED_SERVE_LIMIT s
# (100; one process per system list, sharing the GPU, no new system after SEALED_SERVE_BUDGET s; engine load and
# Triton builds included), judging SEALED_JUDGE_LIMIT s (55), joins ~10 s. What is finished is kept.
# Token forcing (issue 38) at the default sealed sample's size and shape, per seed: 12 requests x 2,000 tokens
# (24,000 output tokens; the sealed final's long-output pass gives 24,262 on the project's 12 unseen requests) drawn
# per seed from the fault-study pool, served through the composed system engine (SystemDecoder: drafter, batched
# verify, CUDA graphs), every seed's requests in flight at once. The decode loop is step-bound, so each system is
# served by its own process and seeds cost (almost) nothing to serve:
# - bf16: AR, stock and the 16 faults (then the lossless controls, if the budget allows) on 10 seeds, judged here
#   per seed (each seed one sealed-size check, δ calibrated on it) -> fault_study-sealed-h200-bf16.json;
# - fp32: AR, stock, one or two faults of each kind and two controls on 3 seeds, served only: judged on the CPU in
#   fp32 (fault_study-sealed-outputs-h200-fp32.json.gz).
# A later lease: SEALED_PREVIOUS names an earlier lease's bf16 outputs file (AR, stock and what it served, same
# seeds); SEALED_ONLY the systems to serve now, one process each, NAME@FIRST:COUNT for a share of the seeds (the
# trees' builders run per request on the host). Everything is judged again, together, one process per seed and
# half of the systems, with SEALED_AUDIT (5) events audited per system. CPU dry run: SEALED_DEVICE=cpu (tiny sizes).
set -uo pipefail
DEVICE=${SEALED_DEVICE:-cuda}
RESULTS=${RESULTS:-/tmp/forcing-results}
mkdir -p "$RESULTS"
if [ "$DEVICE" = cpu ]; then
    SIZE=(--requests-per-seed 2 --max-new-tokens 12 --threads 1) SEEDS=2 FP32_SEEDS=1 BATCH=4 AUDIT=5
    BF16_LISTS=("ar" "stock" "fp8-head,cut-short" "flip-2%-quarter-of-requests,positions-4")
    FP32_LISTS=("ar" "stock" "flip-0.3%,context-32")
    BUDGET=60 SERVE_LIMIT=300 JUDGE_LIMIT=200
else
    SIZE=(--requests-per-seed 12 --max-new-tokens 2000 --threads 1) SEEDS=10 FP32_SEEDS=3 BATCH=120 AUDIT=20
    # two faults per process (a slow one, whose verify rarely agrees with the drafter, beside a fast one), a
    # control after them; the trees (~100 s each here) are left to a later lease
    BF16_LISTS=("ar" "stock" "fp8-head,flip-0.3%,path-verify" "fp8-all,flip-0.1%,positions-4"
        "int8-all,rope-off-by-one,w12-linears-head" "flip-1%,int6-all,certified-head"
        "context-32,flip-2%-quarter-of-requests" "int4-head,cut-short" "int4-all,int4-all-quarter-of-requests"
        "context-8,bias-fault")
    FP32_LISTS=("ar" "stock" "fp8-head,flip-0.1%,int8-all" "flip-0.3%,rope-off-by-one,int4-head"
        "context-32,flip-2%-quarter-of-requests,positions-4" "cut-short,bias-fault,w12-linears-head")
    BUDGET=${SEALED_SERVE_BUDGET:-65} SERVE_LIMIT=${SEALED_SERVE_LIMIT:-100} JUDGE_LIMIT=${SEALED_JUDGE_LIMIT:-55}
fi
JUDGE_GROUPS=1
if [ -n "${SEALED_PREVIOUS:-}" ]; then
    IFS=, read -r -a BF16_LISTS <<<"$SEALED_ONLY"
    FP32_LISTS=() AUDIT=${SEALED_AUDIT:-5} JUDGE_GROUPS=2
fi
LOG="$RESULTS/fault-study-sealed"
rm -f "$RESULTS"/.sealed-*
started=$SECONDS
serve() { # dtype seeds index systems[@first:count: those seeds only]
    local systems=${4%@*} seeds=(--seeds "$2") share=${4#*@}
    [ "$systems" != "$4" ] && seeds=(--first-seed "${share%:*}" --seeds "${share#*:}")
    timeout -s INT "$SERVE_LIMIT" python3 benchmarks/fault_study.py --engine system --serve-only --device "$DEVICE" \
        --dtype "$1" "${seeds[@]}" "${SIZE[@]}" --batch "$BATCH" --budget-seconds "$BUDGET" --serve "$systems" \
        --outputs-out "$RESULTS/.sealed-$1-w$3.json.gz" 2>"$LOG-serve-$1-w$3.log"
}
for ((w = 0; w < ${#BF16_LISTS[@]}; w++)); do serve bfloat16 "$SEEDS" "$w" "${BF16_LISTS[$w]}" & done
for ((w = 0; w < ${#FP32_LISTS[@]}; w++)); do serve float32 "$FP32_SEEDS" "$w" "${FP32_LISTS[$w]}" & done
wait
echo "served after $((SECONDS - started)) s"
grep -hE "^system engine:" "$LOG"-serve-*.log
join() { # dtype seeds out (bf16: an earlier lease's outputs first)
    local parts=()
    [ "$1" = bfloat16 ] && parts=(${SEALED_PREVIOUS:-})
    for f in "$RESULTS"/.sealed-"$1"-w*.json.gz; do [ -s "$f" ] && parts+=("$f"); done
    [ ${#parts[@]} -gt 0 ] && timeout 60 python3 benchmarks/fault_study.py --engine system --serve-only --device cpu \
        --dtype "$1" --seeds "$2" "${SIZE[@]}" --from-outputs "${parts[@]}" --outputs-out "$3" 2>>"$LOG-join.log"
}
[ ${#FP32_LISTS[@]} -gt 0 ] && join float32 "$FP32_SEEDS" "$RESULTS/fault_study-sealed-outputs-h200-fp32.json.gz" &
bf16=(${SEALED_PREVIOUS:-})
for f in "$RESULTS"/.sealed-bfloat16-w*.json.gz; do [ -s "$f" ] && bf16+=("$f"); done
if [ "$JUDGE_GROUPS" -gt 1 ]; then
    # one process per seed and half of the systems (a part is written once judged; the audit's re-scores are
    # CPU-bound, so more processes finish more)
    names=$(python3 -c "import gzip, json, sys
seen = []
for path in sys.argv[1:]:
    raw = open(path, 'rb').read()
    seen += [n for n in json.loads(gzip.decompress(raw))['outputs'] if n not in seen + ['ar', 'stock']]
print(','.join(seen[0::2]), ','.join(seen[1::2]))" "${bf16[@]}")
    read -r -a groups <<<"$names"
    for ((seed = 0; seed < SEEDS; seed++)); do
        for ((g = 0; g < ${#groups[@]}; g++)); do
            timeout -s INT "$JUDGE_LIMIT" python3 benchmarks/fault_study.py --engine system --from-outputs "${bf16[@]}" \
                --device "$DEVICE" --dtype bfloat16 --first-seed "$seed" --seeds 1 "${SIZE[@]}" --audit-sample "$AUDIT" \
                --only "${groups[$g]}" --part-out "$RESULTS/.sealed-seed$seed-g$g.json" >/dev/null 2>"$LOG-judge$seed-$g.log" &
        done
    done
else
    # judges of two seeds each (a seed's part is written once it is judged): if the GPU is what limits them, half
    # the seeds are judged rather than none
    for ((seed = 0; seed < SEEDS; seed += 2)); do
        timeout -s INT "$JUDGE_LIMIT" python3 benchmarks/fault_study.py --engine system --from-outputs "${bf16[@]}" \
            --device "$DEVICE" --dtype bfloat16 --first-seed "$seed" --seeds 2 "${SIZE[@]}" --audit-sample "$AUDIT" \
            --part-out "$RESULTS/.sealed-seed$seed.json" >/dev/null 2>"$LOG-judge$seed.log" &
    done
fi
wait
echo "judged after $((SECONDS - started)) s"
join bfloat16 "$SEEDS" "$RESULTS/fault_study-sealed-outputs-h200-bf16.json.gz"
parts=()
for f in "$RESULTS"/.sealed-seed*.json; do [ -s "$f" ] && parts+=("$f"); done
OUT="$RESULTS/fault_study-sealed-h200-bf16.json"
if [ ${#parts[@]} -eq 0 ]; then
    echo "no seed judged within $JUDGE_LIMIT s:"
    tail -n 5 "$LOG"-judge*.log
else
    python3 benchmarks/fault_study.py --merge "${parts[@]}" --drop-outputs >"$OUT"
fi
cat "$LOG"-*.log >"$RESULTS/fault-study-sealed.log"
rm -f "$RESULTS"/.sealed-* "$LOG"-*.log
echo "stage done after $((SECONDS - started)) s: ${#parts[@]} judge parts (of $SEEDS bf16 seeds x $JUDGE_GROUPS system groups)"
ls -la "$RESULTS"/fault_study-sealed-* 2>/dev/null
[ -s "$OUT" ] && python3 - "$OUT" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"{len(doc['runs'])} seeds of {doc['settings']['requests_per_seed']} x {doc['settings']['max_new_tokens']} tokens; "
      "per seed reject/inconclusive/accept (mean excess mismatch, added events per 1,000):")
for name, row in doc["systems"].items():
    size = f"{100 * row['mean_excess_mismatch']:.2f}%, {row['mean_added_events_per_1000']:.1f}" if row["kind"] == "fault" else ""
    print(f"  {name:30s} {row['reject']}/{row['inconclusive']}/{row['accept']}  {size}")
print(doc["headline"])
PY
true
