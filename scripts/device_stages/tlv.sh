# ~150 s (Q-pass GEMMs ~90 s, the 27B-like cycle in the system engine ~60 s) if the w12 stage built the W12 CUDA extension earlier in this call, else + that build
# TLV Q pass vs the exact W12 pass at the 27B-like shapes, 1/16/33 rows: the Triton Q pass over the exact kernels'
# records, the CUDA kernels' own Q mode, the INT8 copy variant (with its memory), cuBLAS BF16; correctness first.
# Then the modelled single-request gain of TLV from those pass times and the trained pair's committed tau, and the
# whole Q pass / exact step / draft in the system engine at the 27B-like shape (the cycle time).
set -euo pipefail
source scripts/device_stages/_common.sh
DEVICE=${TLV_DEVICE:-cuda}
python benchmarks/tlv_qpass_bench.py --device "$DEVICE" --out "$RESULTS/tlv-qpass-h200.json" ${TLV_ARGS:-} \
    | python -c "import json, sys; d = json.load(sys.stdin); print(json.dumps(d.get('summary', d.get('correctness')), indent=1))"
ENGINE=benchmarks/results/tlv-engine-trained-pair-cpu-2026-12-02.json
if [ "$DEVICE" = cuda ] && [ -f "$ENGINE" ]; then
    python benchmarks/tlv_model.py --qpass "$RESULTS/tlv-qpass-h200.json" --engine "$ENGINE" \
        --out "$RESULTS/tlv-model-h200.json" | python -c "import json, sys; print(json.load(sys.stdin)['headline'])"
fi
if [ "$DEVICE" = cuda ]; then
    python benchmarks/tlv_cycle_bench.py --out "$RESULTS/tlv-cycle-h200.json" \
        | python -c "import json, sys; print(json.load(sys.stdin)['headline'])"
else
    TRITON_INTERPRET=1 python benchmarks/tlv_cycle_bench.py --device cpu --smoke --context 32 --out "$RESULTS/tlv-cycle-cpu.json" >/dev/null
fi
