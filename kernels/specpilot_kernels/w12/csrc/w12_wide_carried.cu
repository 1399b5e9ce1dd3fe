// The wide kernel's launches with the weights carried in the activation slots (weight stages 0: a slot a chunk, 1:
// a slot half a chunk; w12_wide.cuh).
#include "w12_wide.cuh"

namespace w12 {

cudaError_t launch_wide_carried(const W12MmaArgs& args, int low_bits, const W12Wide& wide, cudaStream_t stream) {
  return low_bits == 0 ? launch_low_bits<0, true>(args, wide, stream) : cudaErrorNotSupported;
}

}  // namespace w12
