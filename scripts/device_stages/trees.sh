# ~60 s on the H200 (Triton compiles 12 kernels: 7 build variants at 32 nodes, the fastest at 16 and 63 nodes, the
# acceptance at 16/32/63; then CUDA-graph and eager timing): draft_tree parity on the GPU + µs per step.
# CPU dry run: TREES_ARGS="--device cpu" TRITON_INTERPRET=1 RESULTS=/tmp/r PYTHONPATH=kernels:. bash scripts/device_stages/trees.sh
set -euo pipefail
python3 benchmarks/draft_tree_bench.py --out "$RESULTS/draft-tree-h200.json" ${TREES_ARGS:-}
python3 - "$RESULTS/draft-tree-h200.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
build = doc.get("build", {})
print("trees:", doc.get("headline", "no headline"), "| parity:", doc.get("parity"))
for name, row in build.get("B32_N32", {}).get("variants", {}).items():
    print("  32x32", name, {k: v for k, v in row.items() if k.endswith("_us")})
PY
