# Runtime: at most ~150 s on one H200 by construction: one process under a 145 s hard limit; no new system is
# served after 75 s (Triton builds of SGLang's GDN kernel, path verify, W12 and the certified head included), then
# every system's outputs are written (fault_study-system-outputs-*.json: the seeds not judged here are judged on the
# CPU from it), no new seed judged after 125 s, no pooled check started after 128 s; what is finished is kept
# (--part-out after every judged seed).
# Token forcing (issue 38) in bf16 on the trained pair through the composed system engine (SystemDecoder over
# specpilot_mem.engine.system: drafter, batched verify, CUDA graphs): AR, stock (chain of 8), 6 lossless controls
# (path verify, best-first 32, DDTree 16, 4 positions, W12 linears + head, certified head) and the fault study's 16
# faults as SystemOptions, 10 seeds x 12 requests (the sealed final's request count) x 256 tokens, all 120 requests
# in flight at once; per seed and pooled (5 and 10 seeds' outputs judged as one check: ~15k and ~30k tokens, the
# sealed final's ~24k).
# CPU dry run: FORCING_DEVICE=cpu bash scripts/device_stages/forcing_system.sh (2 seeds, tiny sizes, no Triton).
set -uo pipefail
DEVICE=${FORCING_DEVICE:-cuda}
RESULTS=${RESULTS:-/tmp/forcing-results}
mkdir -p "$RESULTS"
if [ "$DEVICE" = cpu ]; then
    # path verify and the certified head need Triton's interpreter on a CPU (minutes): left out of the dry run
    SIZE=(--seeds 2 --requests-per-seed 3 --max-new-tokens 8 --threads 1 --dtype float32
        --only positions-4,best-first-32,w12-linears-head,fp8-head,flip-1%,int4-all-quarter-of-requests,cut-short)
    LIMITS=(--budget-seconds 60 --judge-until 120 --pool-until 140) HARD=170 POOLS=(--pool-size 2) AUDIT=5
else
    SIZE=(--seeds 10 --requests-per-seed 12 --max-new-tokens 256 --batch 120 --dtype bfloat16)
    # the audit's re-scores are the judging's cost on the GPU (eager 64-token pieces): 5 events per system and seed
    LIMITS=(--budget-seconds 75 --judge-until 125 --pool-until 128) HARD=145 POOLS=(--pool-size 10) AUDIT=5
fi
OUT="$RESULTS/fault_study-system-$DEVICE.json"
PART="$RESULTS/.fault-study-system-part.json"
rm -f "$PART"
started=$SECONDS
if timeout -s INT "$HARD" python3 benchmarks/fault_study.py --engine system --device "$DEVICE" "${SIZE[@]}" \
    --audit-sample "$AUDIT" --pool-audit-sample 10 "${LIMITS[@]}" "${POOLS[@]}" --part-out "$PART" \
    --outputs-out "$RESULTS/fault_study-system-outputs-$DEVICE.json" \
    >"$OUT.tmp" 2>"$RESULTS/fault-study-system.log"; then
    mv "$OUT.tmp" "$OUT"
elif [ -s "$PART" ]; then
    echo "stopped at the $HARD s limit: keeping the seeds judged so far (no pooled checks)"
    python3 benchmarks/fault_study.py --device "$DEVICE" --merge "$PART" >"$OUT"
    rm -f "$OUT.tmp"
else
    echo "no seed judged within $HARD s:"
    tail -n 20 "$RESULTS/fault-study-system.log"
    exit 1
fi
rm -f "$PART"
echo "stage done after $((SECONDS - started)) s"
grep -E "^system engine:" "$RESULTS/fault-study-system.log"
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
