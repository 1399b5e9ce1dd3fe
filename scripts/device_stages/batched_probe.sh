# ~100 s on an H200 (Triton builds and the GDN path kernel's CUDA build included): where the composed engine's
# batched verify step spends its time, 4B-like shape, B = 8/32, 1/5/9/17 rows per request, stock vs GDN path
# verify (benchmarks/probes/batched-probe-h200-2026-12-02/). Needs .sglang_gdn (see system.sh).
# CPU dry run: RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 PROBE_ARGS="--device cpu --smoke --batches 2" bash scripts/device_stages/batched_probe.sh
set -euo pipefail
source scripts/device_stages/_common.sh
need_sglang_gdn
mkdir -p "$RESULTS"
python3 benchmarks/probes/batched-probe-h200-2026-12-02/batched_verify_probe.py ${PROBE_ARGS:-} \
    --out "$RESULTS/batched-probe-h200.json" >/dev/null
python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for b, e in d['by_batch'].items():
    print('B', b, 'AR', e.get('ar', {}).get('step_ms'))
    for name in ('stock', 'path'):
        for r, x in e.get(name, {}).items():
            print(' ', name, r, x['step_ms'], x['profiled'], {k: v for k, v in list(x['by_class_ms'].items())[:6]})
    print('  isolated', e.get('isolated_17'))
print('errors:', d['errors'], 'seconds', d.get('seconds'))
" "$RESULTS/batched-probe-h200.json"
