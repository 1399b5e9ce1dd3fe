# ~45 s on one H200 (no builds; 1.9G weights of the five 27B-class shapes encoded, checked, their version 3 records
# written and read back, ~25 s, plus CUDA start): the W12 encode path's speed with the v3 record (target: a
# 27B-parameter model's linears < 60 s) and its bit-exact round trip on the device.
set -euo pipefail
timeout 120 python benchmarks/w12_record_speed.py --device cuda --out "$RESULTS/w12-record-speed-h200.json"
