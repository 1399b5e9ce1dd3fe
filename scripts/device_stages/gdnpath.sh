# ~60-80 s on a warm H200 (Triton caches and the GDN tree CUDA extension built by an earlier stage of the call; on
# a cold machine their builds add ~1-2 min): issue 28's gdn_path at 0.95x stock. benchmarks/gdnpath_probe.py times the
# 27B-like single-request step at 1, 8 and 32 rows: stock, GDN path verify as the engine runs it now, as main 72fc6e2
# ran it (every view copied, one row included; int64 commit indices cast in each layer), and stock and path captured
# with SPECPILOT_PDL=0; interleaved rounds in one process with nvidia-smi's clocks under load per round, and the kernel
# table (launches and µs a step by name) of stock, path and path_before at 1 and 8 rows. It decides: thermal/power
# (the rounds' drift and clocks), the fix's share (path_before - path), PDL's share (the no-PDL pair's gap against
# the PDL pair's), and which of path's launches remain over stock's.
# GDNPATH_ARGS: more probe flags (--variants stock,path,path_before drops the no-PDL pair, ~20 s less).
# CPU dry run: GDNPATH_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/gdnpath.sh
# Needs .sglang_gdn (python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn; untracked, it travels).
set -uo pipefail
source scripts/device_stages/_common.sh
need_sglang_gdn
mkdir -p "$RESULTS"
args=""
if [ "${GDNPATH_DRY:-0}" = 1 ]; then
    args="--device cpu --smoke --rows 1,4 --profile-rows 1 --rounds 2 --iters 1 --graph-steps 1"
fi
rc=0
python3 benchmarks/gdnpath_probe.py $args ${GDNPATH_ARGS:-} --out "$RESULTS/gdnpath-probe-h200.json" >/dev/null \
    2>"$RESULTS/gdnpath-probe.log" || rc=1
python3 - "$RESULTS/gdnpath-probe-h200.json" <<'PY' || rc=1
import json, sys

doc = json.load(open(sys.argv[1]))
print("gdnpath probe", doc["git"]["commit"], doc.get("device_name"), f"{doc.get('total_s')} s")
for rows, e in doc["by_rows"].items():
    if "error" in e:
        print(f"rows {rows}: {e['error']}")
        continue
    ms = {n: v["ms"] for n, v in e["variants"].items()}
    drift = {n: round(v["last_round_ms"] - v["first_round_ms"], 3) for n, v in e["variants"].items()}
    print(f"rows {rows}: ms {ms}")
    print(f"  paired: {e['paired_vs_stock_ms']}")
    print(f"  last - first round: {drift}")
    clocks = [c for c in e.get("clocks_by_round", []) if c]
    if clocks:
        print("  SM MHz / W / C by round:", [(c["clocks.sm"], c["power.draw"], c["temperature.gpu"]) for c in clocks])
    if "kernels" in e:
        print(f"  launches over stock: {e['launches_over_stock']}")
        for name, diff in e["launches_by_kernel_vs_stock"].items():
            top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:8]
            print(f"  {name} - stock by kernel: {[(k[:48], c) for k, c in top]}")
        for name, t in e["kernels"].items():
            top = [(k["name"][:48], k["count"], k["us"]) for k in t["by_kernel"][:8]]
            print(f"  {name}: {t['kernels_per_step']} kernels, {t['kernel_us_per_step']} us/step; top {top}")
PY
exit $rc
