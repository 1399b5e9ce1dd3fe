# <= 150 s on one H200 (the W12 build ~30-90 s unless an earlier stage built this tree; bits of the ring kernel's
# configs with 3 and 4 token tiles at every escape fraction ~10 s; per shape a 17-32-row tune ~5-10 s, then its timing
# at 1-32 rows against cuBLAS with escapes at 24 and 32 rows ~6 s): the 17-32-row kernels (w12_shared_x.cu,
# w12_warp.cu) on the engine's N = 5120 shapes (attn_out / gdn_out 5120 x 6144, down 5120 x 17408), its qkv 14336 x
# 5120, the bench's qkv and o_proj, and last (if time is left) its GDN input 16480 x 5120. The tune budget runs from
# the start of the first shape and covers the timings between tunes. Bit-neutral choices only (each candidate's bits
# checked against the per-warp kernel); the winners land in $RESULTS/mma_configs.json to commit.
# SHAPES / TUNE_BUDGET override the defaults.
set -uo pipefail
source scripts/device_stages/_common.sh
SHAPES=${SHAPES:-5120x6144,down,qkv,14336x5120,o_proj,16480x5120}
rc=0
timeout 148 python benchmarks/w12_device_check.py --out "$RESULTS/w12-small-rows-h200.json" --settle 0 \
    --sections build,bits,timing --rows 1,8,17,24,25,32 --escape-rows 24,32 \
    --check-configs n1_k3_s1_staged_shared_x,n1_k3_s2_staged_shared_x \
    --tune --tune-buckets 17-32 --tune-budget "${TUNE_BUDGET:-75}" --shapes "$SHAPES" \
    --write-configs "$RESULTS/mma_configs.json" > "$RESULTS/w12small.log" 2>&1 || rc=$?
tail -n 5 "$RESULTS/w12small.log"
python - "$RESULTS/w12-small-rows-h200.json" <<'PY' || rc=1
import json, sys
from pathlib import Path
doc = json.load(open(sys.argv[1]))
configs = Path(sys.argv[1]).with_name("mma_configs.json")
tuned = {k: v["config"] for k, v in doc.get("tune", {}).items() if "config" in v}
if tuned and not configs.exists():  # the run stopped before --write-configs: the shapes tuned so far
    from benchmarks.w12_device_check import shape_dims, write_configs
    write_configs(configs, {"%d,%d" % shape_dims(k): c for k, c in tuned.items()}, doc["device"]["name"])
    print("wrote", configs, "from the tune of", list(tuned))
bits = doc.get("bits", {})
print("bits all_ok:", bits.get("all_ok"), {k: v for k, v in bits.items() if k == "error"})
for name, tune in doc.get("tune", {}).items():
    for bucket, b in tune.get("buckets", {}).items():
        times = b.get("times", {})
        top = sorted((v["score"], k) for k, v in times.items() if isinstance(v, dict) and "score" in v)[:4]
        print(name, bucket, "best:", b.get("best"), "| current", round(times.get("current", {}).get("score", 0), 1),
              "| top", [(k, round(s, 1)) for s, k in top])
for name, shape in doc.get("shapes", {}).items():
    if "rows" not in shape:
        print(name, shape.get("error"))
        continue
    print(name, " ".join(f"{r['M']}:{r['cublas_us']:.1f}/{r['w12_us']:.1f}={r['speedup']:.2f}x" for r in shape["rows"]))
    for fraction, rows in shape.get("escapes_w12_us", {}).items():
        print("  esc", fraction, rows)
PY
exit $rc
