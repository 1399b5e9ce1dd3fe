# ~115 s on one H200 cold (the FP8 Q pass extension's build ~45 s included): the warpgroup (wgmma) FP8 Q pass. First
# its check against the emulation at 1-64 rows (timeout 120 s: a broken mbarrier ring would hang, not fail); if that
# fails, the sweep leaves the warpgroup kind out. Then tlv_fp8.sh's measurement with its sweep shortened to fit: the
# engine's Q pass vs the exact step at 1 and 33 rows in each mode, the tuned table in $RESULTS/qpass_fp8_configs.json.
set -euo pipefail
export MAX_JOBS=$(nproc)
kinds=e4m3,f16,wgmma
if ! timeout 120 python benchmarks/tlv_fp8_qpass_bench.py --sections wgmma_check \
    --out "$RESULTS/tlv-fp8-wgmma-check-h200.json" > /dev/null 2> "$RESULTS/tlv-fp8-wgmma-check.log"; then
  tail -3 "$RESULTS/tlv-fp8-wgmma-check.log"
  echo "wgmma check failed or timed out: sweeping e4m3,f16 only"
  kinds=e4m3,f16
fi
python -c "
import json, sys
d = json.load(open('$RESULTS/tlv-fp8-wgmma-check-h200.json')).get('wgmma_check', {})
bad = {k: v for k, v in d.items() if isinstance(v, dict) and not v['within']}
print('wgmma check', 'ok' if d.get('all_within') else bad)
" || true
TLV_FP8_ARGS="${TLV_FP8_ARGS:---rows 1,33 --sweep-s 30} --kinds $kinds" bash scripts/device_stages/tlv_fp8.sh
