# <= 150 s on one H200 (W12 build ~60 s; bits of the class-split kernel ~10 s; per shape a tune of its candidates at
# 33-64, 65-128 and 129-256 rows within --tune-budget's share, then its timing at 32-256 rows against cuBLAS with escapes
# at 33 rows, ~12 s): the class-split kernel (csrc/w12_wgmma.cu, W12Wide kind 2) on the engine's and the issue's shapes
# whose 33-64-row launch runs 1.2-2 rounds of one block a multiprocessor (attn_out/gdn_out 5120x6144, down, o_proj, qkv,
# the GDN input 16480x5120), the engine qkv 14336x5120 and (last, whatever time is left) gate_up. Bit-neutral choices only (each candidate's bits checked
# against the per-warp kernel); the winners land in $RESULTS/w12-split-mma_configs.json to commit.
# W12SPLIT_DRY=1: on the CPU, the same arguments parsed and every shape's candidates made (no GPU run).
set -euo pipefail
source scripts/device_stages/_common.sh
SHAPES=${W12SPLIT_SHAPES:-5120x6144,down,o_proj,qkv,16480x5120,14336x5120,gate_up}
ARGS=(--out "$RESULTS/w12-split-h200.json" --settle 0 --sections build,bits,timing
  --check-configs n1_k3_s2_split,n1_k8_s2_split,n1_k1_s1_split,tail_split --rows 32,33,48,64,96,128,192,256 --escape-rows 33
  --tune --tune-only split --tune-buckets 33-64,65-128,129-256 --tune-budget "${W12SPLIT_TUNE_S:-45}"
  --shapes "$SHAPES" --write-configs "$RESULTS/w12-split-mma_configs.json")
if [ -n "${W12SPLIT_DRY:-}" ]; then
  python - "${ARGS[@]}" <<'PY'
import sys
from benchmarks import w12_device_check as check
from specpilot_kernels.w12.mma import MmaConfig, TUNED_PATH
import json
argv = sys.argv[1:]
shapes = argv[argv.index("--shapes") + 1].split(",")
only = tuple(argv[argv.index("--tune-only") + 1].split(","))
checked = argv[argv.index("--check-configs") + 1].split(",")
assert all(c in check.CHECK_CONFIGS for c in checked), checked
tuned = json.loads(TUNED_PATH.read_text())["NVIDIA H200"]
for name in shapes:
    n, k = check.shape_dims(name)
    base = MmaConfig(**tuned[f"{n},{k}"])
    for bucket in argv[argv.index("--tune-buckets") + 1].split(","):
        names = list(check.tune_candidates(base, bucket, only=only))
        assert names[0] == "current" and len(names) > 1, (name, bucket, names)
        print(name, bucket, names)
print("dry run ok")
PY
  exit 0
fi
timeout 148 python benchmarks/w12_device_check.py "${ARGS[@]}" || echo "device check rc $?"
python - "$RESULTS/w12-split-h200.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print("bits all_ok:", doc.get("bits", {}).get("all_ok"), "build s:", doc.get("build", {}).get("seconds"))
for name, tune in doc.get("tune", {}).items():
    print(name, "best:", {b: r.get("best") for b, r in tune.get("buckets", {}).items()})
for name, shape in doc.get("shapes", {}).items():
    print(name, " ".join(f"{r['M']}: {r['cublas_us']:.1f}/{r['w12_us']:.1f} {r['speedup']:.2f}x" for r in shape.get("rows", [])))
print({k: v for k, v in doc.get("summary", {}).items() if k in ("all_33_64_geomean", "all_33_64_min", "all_65_256_min")})
PY
