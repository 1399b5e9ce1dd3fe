// The FP8 Q pass with f16 operands (w12_qpass_fp8_kernel.cuh): its own translation unit, built beside the E4M3 one.
#include "w12_qpass_fp8_kernel.cuh"

cudaError_t qpass_fp8_gemm_f16(const QpassFp8Args& args, bool midpoint, cudaStream_t stream) {
  using qpass_fp8_detail::dispatch;
  return midpoint ? dispatch<true, true>(args, stream) : dispatch<false, true>(args, stream);
}
