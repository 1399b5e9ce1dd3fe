# ~45 s on the H200 (Triton compiles ~11 kernel specialisations of each copy at 32 nodes, ~30 s; bit checks and
# CUDA-graph timing at B = 1, 8, 32 with the entry's heads): the library's GDN tree kernels against the copy the
# gdn-tree entry vendors (entries/gdn-tree/delta.patch), bit for bit and side by side in time.
# CPU dry run: GDN_VENDORED_ARGS="--device cpu --sections bits" TRITON_INTERPRET=1 RESULTS=/tmp/r \
#     PYTHONPATH=kernels:. bash scripts/device_stages/gdn_tree_vendored.sh
set -euo pipefail
python3 benchmarks/gdn_tree_vendored_check.py --out "$RESULTS/gdn-tree-vendored-check-h200.json" \
    ${GDN_VENDORED_ARGS:-} > /dev/null
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['files_that_differ'], json.dumps(d['summary']))" \
    "$RESULTS/gdn-tree-vendored-check-h200.json"
