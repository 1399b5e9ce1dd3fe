# ~90 s on one H200 (~30 s of it the FP8 Q pass's extension build; + the W12 extension's if no earlier stage built it):
# the FP8 Q pass (the W12 8-bit view on the FP8 tensor cores, E4M3 activations per token row) against the exact W12
# GEMM and the BF16 Q mode at the 27B-like shapes, 1/16/32/33 rows, with its correctness checks; then the system
# engine's Q pass and TLV cycle in each Q mode at 1 and 33 rows.
set -euo pipefail
export MAX_JOBS=$(nproc)
python benchmarks/tlv_fp8_qpass_bench.py --out "$RESULTS/tlv-fp8-qpass-h200.json" ${TLV_FP8_ARGS:-} \
    | python -c "
import json, sys
d = json.load(sys.stdin)
for name, s in d.get('gemm', {}).items():
    print(name, s['config'], {k: v for k, v in s['check'].items()})
    for r in s['rows']:
        print('  M=%d exact %.1f bf16Q %.1f fp8Q mid %.1f (%.2fx) trunc %.1f (%.2fx)' % (r['M'], r['exact_us'], r['bf16_q_midpoint_us'], r['fp8_q_midpoint_us'], r['fp8_q_midpoint_over_exact'], r['fp8_q_truncated_us'], r['fp8_q_truncated_over_exact']))
for k, v in d.get('system', {}).items():
    print(k, {key: round(val, 3) for key, val in v.items()})
print('wall_s', d['wall_s'])
"
