# ~60 s on one H200 (W12 build ~25 s; bits of the narrow kernels' configs at 1-32 rows and every escape fraction 0,
# 1e-4, 1e-3, 1e-2 ~10 s; the five 27B-class shapes timed at 1, 2, 4, 8, 16, 24 and 32 rows with those escape
# fractions against cuBLAS ~25 s): issue 29's escape targets at 1-32 rows (1e-3 within 10% of the escape-free time,
# 1e-2 still >= 1.0x cuBLAS) and the escape-free 1-32-row figures beside them.
set -euo pipefail
source scripts/device_stages/_common.sh
ROWS=1,2,4,8,16,24,32
timeout 110 python benchmarks/w12_device_check.py --out "$RESULTS/w12-esc-device-check-h200.json" --settle 0 \
    --sections build,bits,timing --rows "$ROWS" --escape-rows "$ROWS" \
    --check-configs n4_k1_s1,n1_k3_s1_wgmma,n1_k3_s2_cluster6,n1_k3_s1_staged_shared_x,n1_k3_s2_staged_shared_x,n4_k1_s1_staged_wgmma,n1_k1_s1_wgmma_half,tail \
    ${W12_ARGS:-}
python - "$RESULTS/w12-esc-device-check-h200.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print(doc.get("headline"))
for fraction, shapes in doc.get("summary", {}).get("escapes", {}).items():
    for name, rows in shapes.items():
        print(fraction, name, " ".join(f"{m}:{r['vs_escape_free']:.3f}/{r['speedup_vs_cublas']:.2f}x" for m, r in rows.items()))
PY
