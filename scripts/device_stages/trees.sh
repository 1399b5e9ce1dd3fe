# ~70 s on the H200 (Triton compiles ~18 build-kernel variants and shapes, then CUDA-graph timing): draft_tree parity + µs.
# CPU dry run: TREES_ARGS="--device cpu" TRITON_INTERPRET=1 RESULTS=/tmp/r PYTHONPATH=kernels:. bash scripts/device_stages/trees.sh
set -euo pipefail
python3 benchmarks/draft_tree_bench.py --out "$RESULTS/draft-tree-h200.json" ${TREES_ARGS:-}
python3 - "$RESULTS/draft-tree-h200.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print("trees:", doc.get("headline", "no headline"), "| parity:", doc.get("parity"))
PY
