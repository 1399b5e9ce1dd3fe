# W12: build, bits at 1-256 rows and every escape fraction, timing vs cuBLAS (bursts, escapes, settled).
set -euo pipefail
export MAX_JOBS=$(nproc)
python benchmarks/w12_device_check.py --out "$RESULTS/w12-device-check-h200.json" --settle 1.0 ${W12_ARGS:-}
