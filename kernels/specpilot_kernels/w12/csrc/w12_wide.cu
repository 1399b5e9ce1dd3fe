// The wide kernel's launches with weight stages a warp (w12_wide_carried.cu: with the weights carried in the activation
// slots): one file each, so the build compiles the two sets of instantiations side by side.
#include "w12_wide.cuh"

namespace w12 {

cudaError_t launch_wide(const W12MmaArgs& args, int low_bits, const W12Wide& wide, cudaStream_t stream) {
  if (!wide.x_image || wide.groups < 1 || 4 * wide.groups > kMaxWideWarpsPerBlock) return cudaErrorInvalidValue;
  // exact weights only: the Q pass runs on the per-warp kernel (w12_warp.cu, decode_block_q)
  if (wide.stages < 2) return launch_wide_carried(args, low_bits, wide, stream);  // 0 or 1: carried weights
  return low_bits == 0 ? launch_low_bits<0, false>(args, wide, stream) : cudaErrorNotSupported;
}

}  // namespace w12
