# ~110 s on one H200 (the certified head's CUDA pass built by nvcc ~50 s, Triton rescore and exact-head compiles
# ~25 s, the adversarial 248320x5120 head and its INT8 copy ~5 s, capture + two checked inputs + timing at
# 1, 8, 32, 64, 128 rows ~25 s): the certified-head SGLang entry's own code (entries/certified-head/src with its
# kernels vendored as `record` does) captured in a CUDA graph at SGLang's decode / verify row counts.
# CPU dry run: CERTIFIED_GRAPH_ARGS="--vocab 1000 --hidden 256 --rows 1 40" TRITON_INTERPRET=1 RESULTS=/tmp/r \
#     PYTHONPATH=kernels:. bash scripts/device_stages/certified_graph.sh
set -euo pipefail
source scripts/device_stages/_common.sh
pkg=$(mktemp -d)
mkdir -p "$pkg/sglang/srt/specpilot/kernels"
cp entries/options/src/sglang/srt/specpilot/__init__.py entries/certified-head/src/sglang/srt/specpilot/certified_head.py \
    "$pkg/sglang/srt/specpilot/"
cp -r kernels/specpilot_kernels/certified_head kernels/specpilot_kernels/csrc kernels/specpilot_kernels/cuda_extension.py \
    "$pkg/sglang/srt/specpilot/kernels/"
touch "$pkg/sglang/srt/specpilot/kernels/__init__.py"
PYTHONPATH="$pkg:$PYTHONPATH" python benchmarks/certified_graph_check.py --out "$RESULTS/certified-graph-check-h200.json" \
    ${CERTIFIED_GRAPH_ARGS:-} > /dev/null
python -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['summary']))" "$RESULTS/certified-graph-check-h200.json"
