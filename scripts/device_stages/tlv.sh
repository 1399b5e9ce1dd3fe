# ~60 s (48 Triton compiles ~35 s, timing ~20 s) if the w12 stage built the W12 CUDA extension earlier in this call, else + that build
# TLV Q pass vs the exact W12 pass at the 27B-like shapes, 1/16/32 rows: the Triton Q pass over the exact kernels'
# records, the CUDA kernels' own Q mode, the INT8 copy variant (with its memory), cuBLAS BF16; correctness first.
set -euo pipefail
export MAX_JOBS=$(nproc)
DEVICE=${TLV_DEVICE:-cuda}
python benchmarks/tlv_qpass_bench.py --device "$DEVICE" --out "$RESULTS/tlv-qpass-h200.json" ${TLV_ARGS:-} \
    | python -c "import json, sys; d = json.load(sys.stdin); print(json.dumps(d.get('summary', d.get('correctness')), indent=1))"
