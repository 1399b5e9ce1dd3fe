# <= 150 s on one H200 (W12 build ~60 s unless built): the committed class-split tables measured, call 2 of the
# evening. (1) the LM head 248320x5120: class-split candidates at 65-128 and 129-256 rows (each bit-checked against
# the per-warp kernel), then its timing at 9-256 rows against cuBLAS, with the build and the bits of the class-split
# and warpgroup kernels (whose prologue now starts the weight loads before the escape table's) (~25 s after the
# build); (2) the three shapes still under cuBLAS at 33-64 rows (attn_out 5120x6144, qkv, the GDN input 16480x5120)
# re-timed at 32-256 rows with escapes at 33 rows (~20 s), and torch.profiler's split of a launch into its three
# kernels on five shape/row cases (~10 s); (3) the 27B-like engine step, stock vs W12 linears + head, at 32-64 rows
# (~30 s; needs .sglang_gdn, skipped without it). Each part has its own time limit; the tuned table lands in
# $RESULTS/w12-split-mma_configs.json to commit.
# W12SPLIT_DRY=1: on the CPU, the arguments parsed and the LM head's candidates made (no GPU run).
set -uo pipefail
source scripts/device_stages/_common.sh
LM=(--out "$RESULTS/w12-split-lm-head-h200.json" --settle 0 --sections build,bits,timing
  --check-configs n1_k1_s1_split,n1_k3_s2_split,n1_k3_s1_wgmma,n4_k1_s1_staged_wgmma --rows 9,16,17,32,33,48,64,96,128,192,256
  --escape-rows 33 --tune --tune-only split --tune-buckets 65-128,129-256 --tune-budget 15 --shapes lm_head
  --write-configs "$RESULTS/w12-split-mma_configs.json")
REST=(--out "$RESULTS/w12-split-shapes-h200.json" --settle 0 --sections timing --rows 32,33,48,64,96,128,192,256
  --escape-rows 33 --shapes 5120x6144,qkv,16480x5120)
if [ -n "${W12SPLIT_DRY:-}" ]; then
  python - "${LM[@]}" <<'PY'
import sys
from benchmarks import w12_device_check as check
from specpilot_kernels.w12.mma import MmaConfig, TUNED_PATH
import json
argv = sys.argv[1:]
tuned = json.loads(TUNED_PATH.read_text())["NVIDIA H200"]
assert all(c in check.CHECK_CONFIGS for c in argv[argv.index("--check-configs") + 1].split(","))
base = MmaConfig(**tuned["248320,5120"])
for bucket in argv[argv.index("--tune-buckets") + 1].split(","):
    names = list(check.tune_candidates(base, bucket, only=("split",)))
    assert names[0] == "current" and len(names) > 1, names
    print("lm_head", bucket, names)
print("dry run ok")
PY
  exit 0
fi
rc=0
timeout 80 python benchmarks/w12_device_check.py "${LM[@]}" > "$RESULTS/w12split2-lm.log" 2>&1 || { rc=1; echo "lm_head part rc $?"; }
[ -s "$RESULTS/w12-split-mma_configs.json" ] && cp "$RESULTS/w12-split-mma_configs.json" kernels/specpilot_kernels/w12/mma_configs.json
timeout 25 python benchmarks/w12_device_check.py "${REST[@]}" > "$RESULTS/w12split2-shapes.log" 2>&1 || { rc=1; echo "shapes part rc $?"; }
timeout 15 python benchmarks/probes/w12-split-kernels-2026-12-03/profile.py "$RESULTS/w12-split-kernel-times-h200.json" \
  > "$RESULTS/w12split2-profile.log" 2>&1 || { rc=1; echo "profile part rc $?"; }
tail -5 "$RESULTS/w12split2-profile.log"
if [ -f .sglang_gdn/sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py ]; then
  timeout 30 python3 benchmarks/system_bench.py --sections single --rows 32,33,48,64 \
    --single-options stock,w12_linears_head --out "$RESULTS/system-single-split-h200.json" \
    > /dev/null 2> "$RESULTS/w12split2-single.log" || { rc=1; echo "single part rc $?"; }
else
  echo "no .sglang_gdn: engine step skipped"
fi
python - "$RESULTS" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in ("w12-split-lm-head-h200.json", "w12-split-shapes-h200.json"):
    if not (out / name).exists():
        print(name, "missing")
        continue
    doc = json.loads((out / name).read_text())
    if "bits" in doc:
        print("bits all_ok:", doc["bits"].get("all_ok"))
    for shape, tune in doc.get("tune", {}).items():
        print(shape, "best:", {b: r.get("best") for b, r in tune.get("buckets", {}).items()})
    for shape, s in doc.get("shapes", {}).items():
        print(shape, " ".join(f"{r['M']}: {r['cublas_us']:.1f}/{r['w12_us']:.1f} {r['speedup']:.2f}x" for r in s.get("rows", [])))
single = out / "system-single-split-h200.json"
if single.exists():
    s = json.loads(single.read_text()).get("single", {})
    print(s.get("error") or {k: s.get(k) for k in ("steps_ms", "w12_linears_head_speedup_vs_stock")})
PY
exit $rc
