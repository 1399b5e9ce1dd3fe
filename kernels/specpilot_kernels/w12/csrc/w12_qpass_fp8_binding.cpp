// torch binding of the FP8 Q pass (built on the GPU machine by torch.utils.cpp_extension.load).
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "w12_qpass_fp8.cuh"

static void check_quantize_operands(const torch::Tensor& x, const torch::Tensor& x_image, const torch::Tensor& x_scale,
                                    int64_t image_bytes, const char* what) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.stride(1) == 1 &&
                  x.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0,
              what, ": x must be CUDA bf16 [M, K] with unit column stride and 16-byte rows");
  TORCH_CHECK(x_image.is_cuda() && x_image.scalar_type() == torch::kUInt8 && x_image.numel() >= image_bytes, what,
              ": x_image must be CUDA uint8 of ", image_bytes, " bytes");
  TORCH_CHECK(x_scale.is_cuda() && x_scale.scalar_type() == torch::kFloat32 && x_scale.numel() >= x.size(0), what,
              ": x_scale must be CUDA fp32 [M]");
}

// x: bf16 [m <= 64, k] (16-byte rows); x_image: uint8 [ceil(m/8) * 8 * k_padded]; x_scale: fp32 [m].
void qpass_fp8_quantize_rows(torch::Tensor x, torch::Tensor x_image, torch::Tensor x_scale, int64_t k_padded,
                             bool overlap_prior) {
  const int64_t m = x.size(0), tiles8 = (m + 7) / 8;
  check_quantize_operands(x, x_image, x_scale, tiles8 * 8 * k_padded, "qpass_fp8_quantize_rows");
  const cudaError_t err = qpass_fp8_quantize(reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), (int)m,
                                             (int)x.size(1), (int)x.stride(0), (int)k_padded,
                                             x_image.data_ptr<uint8_t>(), x_scale.data_ptr<float>(), overlap_prior,
                                             c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "qpass_fp8_quantize_rows: ", cudaGetErrorString(err),
              " (M must be 1..64, K a multiple of 8, K padded a multiple of 128)");
}

// The warpgroup kernel's f16 image: x_image uint8 [token_tiles * 8 * k_padded * 2] (rows past m zero).
void qpass_fp8_quantize_rows_wgmma(torch::Tensor x, torch::Tensor x_image, torch::Tensor x_scale, int64_t k_padded,
                                   int64_t token_tiles, bool overlap_prior) {
  check_quantize_operands(x, x_image, x_scale, token_tiles * 8 * k_padded * 2, "qpass_fp8_quantize_rows_wgmma");
  const cudaError_t err = qpass_fp8_quantize_wgmma(
      reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), (int)x.size(0), (int)x.size(1), (int)x.stride(0),
      (int)k_padded, (int)token_tiles, x_image.data_ptr<uint8_t>(), x_scale.data_ptr<float>(), overlap_prior,
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "qpass_fp8_quantize_rows_wgmma: ", cudaGetErrorString(err),
              " (M must be 1..64 within token_tiles x 8, K a multiple of 8, K padded a multiple of 128)");
}

// view: uint8 [tiles, k_padded/32, 32, 16] (the W12MmaTensor's view plane); base: uint8 [>= tiles * 16];
// y: bf16 [m, >= n] with row stride ldy; with splits > 1 workspace: fp32 [groups * splits * sums * 32] and counters:
// int32 [>= groups], zero (each launch leaves them zero).
void qpass_fp8_gemm_rows(torch::Tensor view, torch::Tensor base, torch::Tensor x_image, torch::Tensor x_scale,
                         torch::Tensor y, int64_t n, int64_t warps_k, int64_t tiles_per_warp,
                         int64_t groups_per_block, int64_t splits, torch::Tensor workspace,
                         torch::Tensor counters, int64_t operands, bool midpoint, bool overlap_prior) {
  TORCH_CHECK(operands >= 0 && operands <= 2, "qpass_fp8_gemm_rows: operands is 0 (E4M3), 1 (f16) or 2 (wgmma, f16)");
  TORCH_CHECK(view.is_cuda() && view.scalar_type() == torch::kUInt8 && view.dim() == 4 && view.size(2) == 32 &&
                  view.size(3) == 16 && view.is_contiguous() && reinterpret_cast<uintptr_t>(view.data_ptr()) % 16 == 0,
              "qpass_fp8_gemm_rows: view must be a contiguous 16-byte aligned uint8 [tiles, Kp/32, 32, 16]");
  TORCH_CHECK(base.is_cuda() && base.scalar_type() == torch::kUInt8 && base.numel() >= std::min<int64_t>(n, view.size(0) * 16),
              "qpass_fp8_gemm_rows: base must be CUDA uint8 with a byte a row");
  TORCH_CHECK(y.is_cuda() && y.scalar_type() == torch::kBFloat16 && y.dim() == 2 && y.stride(1) == 1 &&
                  y.size(1) >= n && y.size(0) == x_scale.numel(),
              "qpass_fp8_gemm_rows: y must be CUDA bf16 [M, >= N] with unit column stride, M = x_scale's length");
  const int64_t tiles8 = (y.size(0) + 7) / 8;
  const int64_t built_tiles = tiles8 <= 2 ? tiles8 : tiles8 <= 4 ? 4 : tiles8 <= 5 ? 5 : 8;  // the kernels' token tiles
  QpassFp8Args args{};
  args.view = view.data_ptr<uint8_t>();
  args.base = base.data_ptr<uint8_t>();
  args.x_image = x_image.data_ptr<uint8_t>();
  args.x_scale = x_scale.data_ptr<float>();
  args.y = reinterpret_cast<__nv_bfloat16*>(y.data_ptr());
  args.m = (int)y.size(0);
  args.n = (int)n;
  args.tiles = (int)view.size(0);
  args.k_padded = (int)view.size(1) * 32;
  args.ldy = (int)y.stride(0);
  args.warps_k = (int)warps_k;
  args.tiles_per_warp = (int)tiles_per_warp;
  args.groups_per_block = (int)groups_per_block;
  args.splits = (int)splits;
  args.f16_operands = operands == 1;
  if (splits > 1) {
    const int64_t groups = (args.tiles + tiles_per_warp - 1) / tiles_per_warp;  // wgmma: one tile a warp
    const int64_t sums = tiles_per_warp * 4 * built_tiles;
    TORCH_CHECK(workspace.is_cuda() && workspace.scalar_type() == torch::kFloat32 &&
                    workspace.numel() >= groups * splits * sums * 32,
                "qpass_fp8_gemm_rows: workspace must be CUDA fp32 of ", groups * splits * sums * 32, " floats");
    TORCH_CHECK(counters.is_cuda() && counters.scalar_type() == torch::kInt32 && counters.numel() >= groups,
                "qpass_fp8_gemm_rows: counters must be CUDA int32 of >= ", groups, " zeros");
    args.workspace = workspace.data_ptr<float>();
    args.counters = counters.data_ptr<int>();
  }
  args.overlap_prior = overlap_prior;
  TORCH_CHECK(x_image.is_cuda() &&
                  x_image.numel() >= (operands == 2 ? built_tiles * 2 : tiles8) * 8 * args.k_padded,
              "qpass_fp8_gemm_rows: x_image too small for M rows of K padded columns (wgmma: the built token tiles)");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const cudaError_t err = operands == 2 ? qpass_fp8_gemm_wgmma(args, midpoint, stream)
                                        : qpass_fp8_gemm(args, midpoint, stream);
  TORCH_CHECK(err == cudaSuccess, "qpass_fp8_gemm_rows: ", cudaGetErrorString(err),
              " (M must be 1..64, warps_k x groups_per_block at most 8, tiles_per_warp built for M, splits >= 1; "
              "wgmma: warps_k and tiles_per_warp 1, groups_per_block 1..2, sm_90a)");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("quantize_rows", &qpass_fp8_quantize_rows, "E4M3 activations per token row in the B image (w12_qpass_fp8.cu)");
  m.def("quantize_rows_wgmma", &qpass_fp8_quantize_rows_wgmma,
        "E4M3 activations per token row in the warpgroup kernel's B image (w12_qpass_fp8.cu)");
  m.def("gemm_rows", &qpass_fp8_gemm_rows, "the FP8 Q pass GEMM over the W12 view plane (w12_qpass_fp8.cu)");
}
