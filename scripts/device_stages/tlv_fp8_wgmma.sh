# ~110 s on one H200 cold (the FP8 Q pass extension's build ~45 s included): the warpgroup (wgmma, f16 operands) FP8
# Q pass. First its check against the emulation at 1-64 rows, element by element within the GPU tests' slack beside
# the per-warp kernel's, and gdn_out / gate_up timed beside the per-warp kernel (timeout 150 s: a broken mbarrier ring
# would hang, not fail); the sweep times the warpgroup kind only if it passed. Then tlv_fp8.sh's measurement with its
# sweep shortened to fit: the engine's Q pass vs the exact step at 1 and 33 rows in each mode, the tuned table in
# $RESULTS/qpass_fp8_configs.json.
set -euo pipefail
source scripts/device_stages/_common.sh
passed=""
if timeout 150 python benchmarks/tlv_fp8_qpass_bench.py --sections wgmma_check --kinds e4m3,f16,wgmma_f16 \
    --passed "$RESULTS/wgmma-passed.txt" --out "$RESULTS/tlv-fp8-wgmma-check-h200.json" \
    > /dev/null 2> "$RESULTS/tlv-fp8-wgmma-check.log"; then
  passed=$(cat "$RESULTS/wgmma-passed.txt")
else
  tail -3 "$RESULTS/tlv-fp8-wgmma-check.log"
  echo "wgmma check failed or timed out"
fi
python -c "
import json
d = json.load(open('$RESULTS/tlv-fp8-wgmma-check-h200.json')).get('wgmma_check', {})
worst = {}
for key, v in d.items():
    if isinstance(v, dict) and 'worst_over_slack' in v:
        kind = key.split(',')[-1].rsplit('_r1', 1)[0]
        worst[kind] = max(worst.get(kind, 0.0), v['worst_over_slack'])
print('wgmma check: passed', d.get('passed'), 'per-warp within', d.get('per_warp_within'), 'worst error/slack', worst)
for key, v in d.items():
    if key.startswith('time '):
        print(' ', key, {k: round(t, 1) for k, t in v.items()})
" || true
echo "sweeping e4m3,f16${passed:+,$passed}"
TLV_FP8_ARGS="${TLV_FP8_ARGS:---rows 1,33 --sweep-s 25} --kinds e4m3,f16${passed:+,$passed}" bash scripts/device_stages/tlv_fp8.sh
