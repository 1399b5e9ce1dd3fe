# Runtime: at most 150 s on one H200 by construction (one judging process under `timeout`; engine load ~10 s, the
# batched scoring of ~2.4 M distinct output tokens ~30 s, the audit's shared prefill re-scores, the rules on the host).
# Token forcing (issue 38) at the sealed size, judged again from the committed bf16 outputs of the sealed-size study
# (benchmarks/results/fault_study-sealed-outputs-h200-bf16-call2-2026-12-02.json.gz: AR, stock, 6 controls and 16
# faults through the composed system engine, 10 seeds x 12 requests x 2,000 tokens), nothing served: every seed's
# outputs are scored in one batched teacher-forced pass over requests (each distinct request and output once, in
# bf16 on the GPU, as they were served), the audit's prefill re-scores of all seeds share one pass per output, and
# every seed is judged with all the rules -> fault_study-sealed-h200-bf16.json (+ Figure 4 PNG), and the scorer's
# numbers the tail and request rules read -> fault_study-sealed-scores-h200-bf16.npz (to study rules on the CPU).
# CPU dry run: SEALED_DEVICE=cpu (serves a tiny sample first, then judges it the same way).
set -uo pipefail
DEVICE=${SEALED_DEVICE:-cuda}
RESULTS=${RESULTS:-/tmp/forcing-results}
mkdir -p "$RESULTS"
OUTPUTS=benchmarks/results/fault_study-sealed-outputs-h200-bf16-call2-2026-12-02.json.gz
SIZE=(--seeds 10 --requests-per-seed 12 --max-new-tokens 2000) AUDIT=50 LIMIT=150
started=$SECONDS
if [ "$DEVICE" = cpu ]; then
    SIZE=(--seeds 3 --requests-per-seed 2 --max-new-tokens 12) AUDIT=20 LIMIT=600
    OUTPUTS="$RESULTS/.judge-outputs.json.gz"
    python3 benchmarks/fault_study.py --engine system --serve-only --device cpu --dtype bfloat16 "${SIZE[@]}" \
        --threads 1 --batch 8 --serve ar,stock,positions-4,fp8-all,int4-all-quarter-of-requests,flip-1%,cut-short \
        --outputs-out "$OUTPUTS" 2>"$RESULTS/.judge-serve.log" || tail -n 5 "$RESULTS/.judge-serve.log"
fi
OUT="$RESULTS/fault_study-sealed-h200-bf16.json"
timeout -s INT "$LIMIT" python3 benchmarks/fault_study.py --engine system --from-outputs "$OUTPUTS" --device "$DEVICE" \
    --dtype bfloat16 "${SIZE[@]}" --audit-sample "$AUDIT" --skip-settled-audit --drop-outputs \
    --scores-out "$RESULTS/fault_study-sealed-scores-h200-bf16.npz" >"$OUT.tmp" 2>"$RESULTS/fault-study-judge.log"
rc=$?
echo "judged after $((SECONDS - started)) s (exit $rc)"
grep -hE "^(scored|audit:)" "$RESULTS/fault-study-judge.log"
if [ $rc -ne 0 ] || [ ! -s "$OUT.tmp" ]; then
    tail -n 8 "$RESULTS/fault-study-judge.log"
    rm -f "$OUT.tmp"
else
    mv "$OUT.tmp" "$OUT"
    python3 benchmarks/fault_study.py --figure "$OUT" "$RESULTS/fault_study-sealed-h200-bf16-figure4.png" >/dev/null \
        2>&1 || echo "figure 4 not drawn here (no matplotlib?): draw it from the JSON with --figure"
fi
rm -f "$RESULTS"/.judge-*
ls -la "$RESULTS"/fault_study-sealed-* 2>/dev/null
[ -s "$OUT" ] && python3 - "$OUT" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"{len(doc['runs'])} seeds of {doc['settings']['requests_per_seed']} x {doc['settings']['max_new_tokens']} tokens; "
      "per seed reject/inconclusive/accept (mean excess mismatch, added events per 1,000; rules that rejected):")
for name, row in doc["systems"].items():
    size = (
        f"{100 * row['mean_excess_mismatch']:.2f}%, {row['mean_added_events_per_1000']:.1f}"
        f"{'' if row['target_size'] else ' (below target)'}; target-size instances rejected "
        f"{row['target_instances_rejected']}/{row['target_instances']}"
        if row["kind"] == "fault"
        else ""
    )
    by = {}
    for run in doc["runs"]:
        v = run["verdicts"].get(name, {})
        for rule in ("rate", "event", "band", "tail", "request", "length"):
            by[rule] = by.get(rule, 0) + bool(v.get(f"{rule}_reject"))
    rules = " ".join(f"{k}{n}" for k, n in by.items() if n)
    print(f"  {name:30s} {row['reject']}/{row['inconclusive']}/{row['accept']}  {size}  {rules}")
print("delta per seed:", [run.get("delta") for run in doc["runs"]])
print(doc["headline"])
PY
true
