# build the tree's extension and every named probe dir in parallel (torch caches them for the harness)
for d in "$@"; do
  if [ "$d" = "-" ]; then
    PYTHONPATH=kernels:. python3 -c "from specpilot_kernels.cuda_extension import load_cuda_extension as L; from specpilot_kernels.w12 import mma as M; L('specpilot_w12_mma', M.CSRC, ('binding.cpp','w12_mma.cu'))" &
  else
    PYTHONPATH=kernels:. python3 -c "from pathlib import Path; from specpilot_kernels.cuda_extension import load_cuda_extension as L; L('w12_'+Path('$d').name, Path('$d').resolve(), ('binding.cpp','w12_mma.cu'))" &
  fi
done
wait
