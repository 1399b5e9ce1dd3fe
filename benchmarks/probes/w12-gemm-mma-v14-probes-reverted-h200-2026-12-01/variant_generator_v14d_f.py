import sys, shutil, os
src = '/work/main/kernels/specpilot_kernels/w12/csrc'
# caps: A MT1 staged, B MT2 staged, C MT2 regs (whole), D MT4 half one tile, E MT4 whole one tile, F MT4 half two tiles
tables = {
 'v14d': dict(A=96, B=136, C=136, D=136, E=160, F=0),
 'v14e': dict(A=0, B=112, C=144, D=120, E=144, F=160),
 'v14f': dict(A=100, B=0, C=160, D=0, E=152, F=0),
}
for name, t in tables.items():
    d = f'/tmp/b8/vd/{name}'
    shutil.rmtree(d, ignore_errors=True); shutil.copytree(src, d)
    p = f'{d}/w12_mma.cu'; s = open(p).read()
    old = "template <int MT, int LOW_BITS, int STEP_BLOCKS, int TP, bool STAGED, bool CLUSTER>\n__global__ void w12_mma_kernel(W12MmaArgs args) {"
    assert old in s
    new = f"""template <int MT, int STEP_BLOCKS, int TP, bool STAGED>
constexpr int register_cap() {{
  return (STAGED && MT == 1) ? {t['A']} : (STAGED && MT == 2) ? {t['B']} : (!STAGED && MT == 2 && STEP_BLOCKS == 4) ? {t['C']}
       : (MT == 4 && STEP_BLOCKS == 2 && TP == 1) ? {t['D']} : (MT == 4 && STEP_BLOCKS == 4 && TP == 1) ? {t['E']}
       : (MT == 4 && STEP_BLOCKS == 2 && TP == 2) ? {t['F']} : 0;
}}
template <int MT, int LOW_BITS, int STEP_BLOCKS, int TP, bool STAGED, bool CLUSTER>
__device__ __forceinline__ void w12_mma_body(const W12MmaArgs& args) {{"""
    s = s.replace(old, new)
    # the kernels: plain and capped, one body
    anchor = "// K splits summed in split order"
    kernels = """template <int MT, int LOW_BITS, int STEP_BLOCKS, int TP, bool STAGED, bool CLUSTER>
__global__ void w12_mma_kernel(W12MmaArgs args) { w12_mma_body<MT, LOW_BITS, STEP_BLOCKS, TP, STAGED, CLUSTER>(args); }
template <int MT, int LOW_BITS, int STEP_BLOCKS, int TP, bool STAGED, bool CLUSTER, int REGS>
__global__ void __maxnreg__(REGS) w12_mma_kernel_capped(W12MmaArgs args) {
  w12_mma_body<MT, LOW_BITS, STEP_BLOCKS, TP, STAGED, CLUSTER>(args);
}

"""
    s = s.replace(anchor, kernels + anchor, 1)
    old_k = "  auto kernel = w12_mma_kernel<MT, LOW_BITS, STEP_BLOCKS, TP, STAGED, CLUSTER>;"
    assert old_k in s
    new_k = """  constexpr int cap = register_cap<MT, STEP_BLOCKS, TP, STAGED>();
  void (*kernel)(W12MmaArgs);
  if constexpr (cap > 0) kernel = w12_mma_kernel_capped<MT, LOW_BITS, STEP_BLOCKS, TP, STAGED, CLUSTER, cap>;
  else kernel = w12_mma_kernel<MT, LOW_BITS, STEP_BLOCKS, TP, STAGED, CLUSTER>;"""
    s = s.replace(old_k, new_k)
    open(p, 'w').write(s)
    print(name, 'written')
