# ~90 s on one H200 (~20 s of it the FP8 Q pass's extension build; + the W12 extension's if no earlier stage built it):
# the FP8 Q pass (the W12 8-bit view on the FP8 tensor cores, E4M3 activations per token row) against the exact W12
# GEMM at the 27B-like engine's shapes, 1/16/32/33 rows, with its correctness checks and a sweep of partitions; then
# the system engine's Q pass and TLV cycle in each FP8 Q mode at 1 and 33 rows.
set -euo pipefail
export MAX_JOBS=$(nproc)
python benchmarks/tlv_fp8_qpass_bench.py --out "$RESULTS/tlv-fp8-qpass-h200.json" ${TLV_FP8_ARGS:-} \
    | python -c "
import json, sys
d = json.load(sys.stdin)
for name, s in d.get('gemm', {}).items():
    c = s['check']
    print(name, 'errs', {k: round(v, 5) if isinstance(v, float) else v for k, v in c.items() if 'err_vs_emulation' in k or 'equal' in k or 'same' in k})
    for r in s['rows']:
        print('  M=%d exact %.1f mid %s %.1f (%.2fx) trunc %s %.1f (%.2fx) best %s %.2fx' % (r['M'], r['exact_us'], r['fp8_q_midpoint_config'], r['fp8_q_midpoint_us'], r['fp8_q_midpoint_over_exact'], r['fp8_q_truncated_config'], r['fp8_q_truncated_us'], r['fp8_q_truncated_over_exact'], r.get('sweep_truncated_best'), r.get('sweep_truncated_best_over_exact', 0)))
for k, v in d.get('system', {}).items():
    print(k, {key: round(val, 3) for key, val in v.items()})
print('wall_s', d['wall_s'])
"
