# <= 150 s on one H200, in order, each part gated on the time left (SECONDS):
# 1. ~60 s (two W12 builds, the second from a copy of csrc/): benchmarks/probes/w12-ring-escape-free-steps-2026-12-03:
#    the ring kernel and the staged per-warp kernel with branch-free escape-free steps (this tree) against the files
#    before, bits equal, at 1-32 rows on the N = 5120 shapes. A file that is not faster (median ratio over its rows,
#    17-32 for the ring kernel, 1-8 for the per-warp one, >= 1) is replaced by its old version in this copy of the tree
#    for everything after (printed: "... -> before").
# 2. ~25 s: bits of the per-warp ring of 3 steps and the ring kernels at every escape fraction, a 1-16-row tune of the
#    staging (2 or 3 slots) on the engine's staged shapes; the winners written to $RESULTS/mma_configs.json and into
#    this copy of the tree, so part 3 runs them.
# 3. ~50 s: scripts/device_stages/engine_rows.sh at ROWS (default 1,8,17,24,32): the engine's linears and the stock vs
#    W12 linears + head step on this tree's tables.
# 4. what is left: issue 29's bench shapes at 1-32 rows with escapes at 24 and 32 rows (timing only).
# CPU dry run: W12SMALL2_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/w12small2.sh
# Needs .sglang_gdn for part 3 (python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn; untracked, carry it).
set -uo pipefail
export MAX_JOBS=$(nproc)
mkdir -p "$RESULTS"
rc=0
P=benchmarks/probes/w12-ring-escape-free-steps-2026-12-03
if [ "${W12SMALL2_DRY:-0}" = 1 ]; then
    python -c "import ast, sys; ast.parse(open('$P/harness.py').read())" || rc=1
    ENGINE_ROWS_DRY=1 bash scripts/device_stages/engine_rows.sh || rc=1
    exit $rc
fi
timeout 75 python $P/harness.py "$RESULTS/w12-ring-escape-free-steps-h200.json" > "$RESULTS/w12ring.log" 2>&1 || rc=1
tail -n 20 "$RESULTS/w12ring.log"
python - "$RESULTS/w12-ring-escape-free-steps-h200.json" "$P" <<'PY' || rc=1
import json, shutil, statistics, sys
doc = json.load(open(sys.argv[1]))
same = all(s["bits_equal"] for s in doc["shapes"].values())
print("bits equal:", same)
# the ring kernel by its 17-32-row launches, the per-warp kernel by its 1-8-row staged ones
for name, low, high in (("w12_shared_x", 17, 32), ("w12_warp", 1, 8)):
    ratios = [r["ratio"] for s in doc["shapes"].values() for m, r in s["rows"].items() if low <= int(m) <= high]
    keep = bool(ratios) and same and statistics.median(ratios) < 1.0
    if not keep:
        shutil.copy(f"{sys.argv[2]}/{name}_before.cu", f"kernels/specpilot_kernels/w12/csrc/{name}.cu")
    print(name, "median ratio", statistics.median(ratios) if ratios else None, "->", "escape-free steps" if keep else "before")
PY
left=$((145 - SECONDS))
if [ "$left" -gt 70 ]; then
    timeout $((left - 55)) python benchmarks/w12_device_check.py --out "$RESULTS/w12-small-staging-h200.json" \
        --settle 0 --sections build,bits,timing --rows 1,8,16,17,24,32 --escape-rows 8 \
        --check-configs n1_k3_s2_staged3,n1_k3_s2_staged_shared_x,n1_k3_s1_staged_shared_x \
        --tune --tune-buckets 1-16 --tune-budget 15 --shapes 5120x6144,down,14336x5120 \
        --write-configs "$RESULTS/mma_configs.json" > "$RESULTS/w12staging.log" 2>&1 || rc=1
    python - "$RESULTS/w12-small-staging-h200.json" <<'PY' || rc=1
import json, sys
doc = json.load(open(sys.argv[1]))
print("bits all_ok:", doc.get("bits", {}).get("all_ok"))
for name, tune in doc.get("tune", {}).items():
    b = tune.get("buckets", {}).get("1-16", {})
    print(name, "1-16 best:", b.get("best"), {k: round(v["score"], 2) for k, v in b.get("times", {}).items() if "score" in v})
PY
    if [ -f "$RESULTS/mma_configs.json" ]; then cp "$RESULTS/mma_configs.json" kernels/specpilot_kernels/w12/mma_configs.json; fi
else
    echo "skipped the staging tune: $left s left"
fi
ROWS=${ROWS:-1,8,17,24,32} bash scripts/device_stages/engine_rows.sh || rc=1
left=$((145 - SECONDS))
if [ "$left" -gt 25 ]; then
    timeout "$left" python benchmarks/w12_device_check.py --out "$RESULTS/w12-small-bench-h200.json" --settle 0 \
        --sections timing --rows 1,8,16,17,24,32 --escape-rows 24,32 \
        --shapes "${SHAPES:-down,o_proj,qkv,lm_head,gate_up}" > "$RESULTS/w12small2.log" 2>&1 || rc=1
    python - "$RESULTS/w12-small-bench-h200.json" <<'PY' || rc=1
import json, sys
doc = json.load(open(sys.argv[1]))
print({k: v for k, v in doc.get("summary", {}).items() if k != "escapes"})
for name, shape in doc.get("shapes", {}).items():
    if "rows" in shape:
        print(name, " ".join(f"{r['M']}:{r['speedup']:.2f}x" for r in shape["rows"]), shape.get("escapes_w12_us"))
PY
else
    echo "skipped the bench shapes: $left s left"
fi
echo "w12small2 done in $SECONDS s"
exit $rc
