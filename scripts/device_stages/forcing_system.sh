# Runtime: at most ~150 s on one H200 by construction, every phase under `timeout`: serving 85 s (one process; no new
# system after 65 s; Triton builds of SGLang's GDN kernel, gdn_tree path verify, W12 and the certified head
# included), judging 50 s (16 processes sharing the GPU: one per seed, six for the pooled check's systems; the audit's
# eager re-score pieces are the judging's cost, and they are CPU-bound), merging ~5 s. What is finished is kept.
# Token forcing (issue 38) in bf16 on the trained pair through the composed system engine (SystemDecoder over
# specpilot_mem.engine.system: drafter, batched verify, CUDA graphs): AR, stock (chain of 8), 6 lossless controls
# (path verify, best-first 32, DDTree 16, 4 positions, W12 linears + head, certified head) and the fault study's 16
# faults as SystemOptions; 10 seeds x 12 requests (the sealed final's request count) x 256 tokens, all 120 requests
# in flight at once; judged per seed and as one pooled check of all 10 seeds (30,720 tokens, a sealed sample's size).
# Every system's outputs come back too (fault_study-system-outputs-*.json), so anything not judged here can be.
# CPU dry run: FORCING_DEVICE=cpu bash scripts/device_stages/forcing_system.sh (2 seeds, tiny sizes, no Triton).
set -uo pipefail
DEVICE=${FORCING_DEVICE:-cuda}
RESULTS=${RESULTS:-/tmp/forcing-results}
mkdir -p "$RESULTS"
if [ "$DEVICE" = cpu ]; then
    # path verify and the certified head need Triton's interpreter on a CPU (minutes): left out of the dry run
    SEEDS=2 SIZE=(--requests-per-seed 3 --max-new-tokens 8 --threads 1 --dtype float32) SERVE=(--budget-seconds 60)
    ONLY=positions-4,best-first-32,w12-linears-head,fp8-head,flip-1%,int4-all-quarter-of-requests,cut-short
    GROUPS_=("positions-4,best-first-32,w12-linears-head" "fp8-head,flip-1%,int4-all-quarter-of-requests,cut-short")
    SERVE_LIMIT=170 JUDGE_LIMIT=170
else
    SEEDS=10 SIZE=(--requests-per-seed 12 --max-new-tokens 256 --batch 120 --dtype bfloat16 --threads 1)
    # FORCING_ONLY: a comma-separated subset of the controls and faults (a second lease for those the first did not
    # reach; fault_study.py --merge joins the two files' runs by seed)
    SERVE=(--budget-seconds 65) ONLY=${FORCING_ONLY:-}
    GROUPS_=("path-verify,best-first-32,ddtree-16,positions-4" "w12-linears-head,certified-head,fp8-head,fp8-all"
        "int8-all,int6-all,flip-0.1%,flip-0.3%" "flip-1%,rope-off-by-one,context-32,context-8"
        "int4-head,int4-all,flip-2%-quarter-of-requests" "int4-all-quarter-of-requests,cut-short,bias-fault")
    SERVE_LIMIT=85 JUDGE_LIMIT=50
fi
only=()
[ -n "$ONLY" ] && only=(--only "$ONLY")
OUTPUTS="$RESULTS/fault_study-system-outputs-$DEVICE.json"
OUT="$RESULTS/fault_study-system-$DEVICE.json"
LOG="$RESULTS/fault-study-system"
rm -f "$OUTPUTS" "$RESULTS"/.fs-*.json
started=$SECONDS
timeout -s INT "$SERVE_LIMIT" python3 benchmarks/fault_study.py --engine system --serve-only --device "$DEVICE" \
    --seeds "$SEEDS" "${SIZE[@]}" "${SERVE[@]}" "${only[@]}" --outputs-out "$OUTPUTS" 2>"$LOG-serve.log"
echo "served after $((SECONDS - started)) s"
if [ ! -s "$OUTPUTS" ]; then
    echo "nothing served within $SERVE_LIMIT s:"
    tail -n 20 "$LOG-serve.log"
    exit 1
fi
for ((seed = 0; seed < SEEDS; seed++)); do
    timeout -s INT "$JUDGE_LIMIT" python3 benchmarks/fault_study.py --engine system --from-outputs "$OUTPUTS" \
        --device "$DEVICE" --first-seed "$seed" --seeds 1 "${SIZE[@]}" --audit-sample 5 \
        --part-out "$RESULTS/.fs-seed$seed.json" >/dev/null 2>"$LOG-judge$seed.log" &
done
for ((g = 0; g < ${#GROUPS_[@]}; g++)); do
    timeout -s INT "$JUDGE_LIMIT" python3 benchmarks/fault_study.py --engine system --from-outputs "$OUTPUTS" \
        --device "$DEVICE" --seeds "$SEEDS" "${SIZE[@]}" --pool-only --only "${GROUPS_[$g]}" --pool-size "$SEEDS" \
        --pool-audit-sample 10 --drop-outputs >"$RESULTS/.fs-pool$g.json" 2>"$LOG-pool$g.log" &
done
wait
echo "judged after $((SECONDS - started)) s"
parts=() pools=()
for f in "$RESULTS"/.fs-seed*.json; do [ -s "$f" ] && parts+=("$f"); done
for f in "$RESULTS"/.fs-pool*.json; do python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$f" 2>/dev/null && pools+=("$f"); done
if [ ${#parts[@]} -eq 0 ]; then
    echo "no seed judged within $JUDGE_LIMIT s:"
    tail -n 5 "$LOG"-judge*.log
    exit 1
fi
pooled_from=()
[ ${#pools[@]} -gt 0 ] && pooled_from=(--pooled-from "${pools[@]}")
python3 benchmarks/fault_study.py --device "$DEVICE" --merge "${parts[@]}" "${pooled_from[@]}" >"$OUT"
rm -f "$RESULTS"/.fs-*.json
echo "stage done after $((SECONDS - started)) s: ${#parts[@]} of $SEEDS seeds judged, ${#pools[@]} of ${#GROUPS_[@]} pooled groups"
grep -hE "^system engine:" "$LOG-serve.log"
python3 - "$OUT" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"{len(doc['runs'])} seeds of {doc['settings']['requests_per_seed']} x {doc['settings']['max_new_tokens']} tokens; "
      "per seed reject/inconclusive/accept, then pooled:")
names = list(doc["systems"]) + [n for g in doc.get("pooled", []) for n in g["systems"] if n not in doc["systems"]]
for name in names:
    row = doc["systems"].get(name)
    text = f"{row['reject']}/{row['inconclusive']}/{row['accept']}" if row else "-"
    for group in doc.get("pooled", []):
        pooled = group["systems"].get(name)
        if pooled:
            text += f"  x{group['group']} {pooled['reject']}/{pooled['inconclusive']}/{pooled['accept']}"
    print(f"  {name:30s} {text}")
print(doc["headline"])
PY
