# ~170 s on one H200 (W12 build ~40 s, bits of every checked config at 1-256 rows and every escape fraction ~45 s,
# timing of the five 27B-class shapes at 1-256 rows against cuBLAS, with escapes and settled 0.5 s, ~85 s): the device
# check with the committed configs, no tune and no breakdown probe (the `w12` stage with those left out).
set -euo pipefail
source scripts/device_stages/_common.sh
python benchmarks/w12_device_check.py --out "$RESULTS/w12-device-check-h200.json" --settle 0.5 \
    --sections build,bits,timing ${W12_ARGS:-}
