# ~60 s (H200): the composed engine's decode step of 1-64 requests (17-row chains, GDN path verify), the same step
# with one 16/64/128-row prompt segment in its forward (prompt admission's mixed step, when the engine has it), and
# stock's separate prefill pass, at the 4B-like and 27B-like shapes (benchmarks/admission_costs.py).
# CPU dry run (~9 min: interpreted kernels): ADMISSION_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/admission.sh
set -uo pipefail
if [ "${ADMISSION_DRY:-0}" = 1 ]; then
    args="--device cpu --smoke --batches 1,2 --segments 4,8 --context 32"
else
    args=""
fi
mkdir -p "$RESULTS"
rc=0
python3 benchmarks/admission_costs.py $args --out "$RESULTS/admission-costs-h200.json" >/dev/null || rc=1
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(n, 'step', s['T_step_ms'], 'mixed', s['T_mixed_ms'], 'prefill', s['T_prefill_ms'], 'errors', list(s['errors'])) for n, s in d['shapes'].items()]" "$RESULTS/admission-costs-h200.json" || rc=1
exit $rc
