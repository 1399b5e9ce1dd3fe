# Controller noise on one H200: interleaved on cuda:0 against two worker processes sharing it (the per-process pool).
set -euo pipefail
python3 benchmarks/controller_pool_bench.py --devices 'cuda:0#0,cuda:0#1' --out "$RESULTS/controller-pool-h200.json"
