# ~90 s on one H200 (+ the W12 and FP8 Q pass extensions' builds if no earlier stage built them): the FP8 Q pass (the
# W12 8-bit view on the tensor cores, E4M3 activations per token row) against the exact W12 GEMM at the 27B-like
# engine's shapes, 1 and 33 rows (TLV_FP8_ARGS="--rows 1,16,32,33" for more). At 1 and 33 rows it first sweeps
# partitions and operand kinds (E4M3 m16n8k32, f16 m16n8k16) in both modes, the table's current choice first, each
# checked against the emulation, and tunes the table (written to $RESULTS/qpass_fp8_configs.json); then the timings
# and the contract checks of the chosen partitions, and the system engine's Q pass and TLV cycle in each mode at 1
# and 33 rows.
set -euo pipefail
source scripts/device_stages/_common.sh
python benchmarks/tlv_fp8_qpass_bench.py --out "$RESULTS/tlv-fp8-qpass-h200.json" \
    --tuned-out "$RESULTS/qpass_fp8_configs.json" ${TLV_FP8_ARGS:---rows 1,33 --sweep-s 50} \
    | python -c "
import json, sys
d = json.load(sys.stdin)
for name, s in d.get('gemm', {}).items():
    c = s['check']
    bad = {k: v for k, v in c.items() if ('err_vs_emulation' in k and v > 4e-3) or (('equal' in k or 'same' in k) and v is not True)}
    print(name, 'checks', 'ok' if not bad else bad)
    for r in s['rows']:
        print('  M=%d exact %.1f mid %s %.1f (%.2fx) trunc %s %.1f (%.2fx)' % (r['M'], r['exact_us'], r['fp8_q_midpoint_config'], r['fp8_q_midpoint_us'], r['fp8_q_midpoint_over_exact'], r['fp8_q_truncated_config'], r['fp8_q_truncated_us'], r['fp8_q_truncated_over_exact']))
        for mode, e in r.get('sweep', {}).items():
            print('    sweep', mode, len(e['us']), 'timed, best', e.get('best'))
for k, v in d.get('system', {}).items():
    print(k, {key: round(val, 3) for key, val in v.items()})
print(d.get('headline'))
print('wall_s', d['wall_s'])
"
