# ~100 s on one H200 once the W12 CUDA extension is built (the w12 or tlv stage earlier in the call; else + its build):
# where the TLV Q pass's time goes at the 27B-like shapes, one request. GEMMs at 1/16/33 rows against a plain streaming
# read of the bytes they must read (view plane alone; both planes), the CUDA kernels' Q mode with the exact partition
# and with the default one, the Triton Q pass; then the system engine's Q pass and exact step split into projections,
# LM head and the rest, and a kernel table of one eager Q pass.
set -euo pipefail
source scripts/device_stages/_common.sh
python benchmarks/tlv_qpass_probe.py --out "$RESULTS/tlv-qpass-probe-h200.json" ${TLV_PROBE_ARGS:-} \
    | python -c "
import json, sys
d = json.load(sys.stdin)
for name, s in d.get('gemm', {}).items():
    if 'rows' not in s:
        continue
    print(name, 'floor view %.1f us (%.2f TB/s), planes %.1f us' % (s['stream_view_us'], s['stream_view_TBps'], s['stream_planes_us']))
    for r in s['rows']:
        print('  M=%d exact %.1f cudaQ %.1f (default cfg %.1f) tritonQ %.1f' % (r['M'], r['exact_us'], r['cuda_q_midpoint_us'], r['cuda_q_midpoint_default_config_us'], r['triton_q_midpoint_us']))
for k, v in d.get('system', {}).items():
    if k.startswith('rows'):
        print(k, {key: round(val, 2) for key, val in v.items()})
print('wall_s', d['wall_s'])
"
