// torch binding of the W12 GEMM kernels (built on the GPU machine by torch.utils.cpp_extension.load).
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "w12_mma.cuh"

// y: bf16 [M, min(n, n_padded)] with row stride n: all of y [M, N], or (a row region of the GEMM: the weight's
// rows from 16 x its first tile, n_padded of them) that region's columns of y; workspace: fp32 [splits, M, n] when K
// is split, else empty. overlap_prior: a W12Overlap (w12_mma.cuh). x_image_written: the warpgroup kernel's
// activation image already holds x (the second row region of one GEMM).
// esc_tile int32 [tiles + 1], esc_chunk int32 [tiles * chunks], esc_entry int32 [E]: the kernel layout's escapes
// (mma.py). wide_groups > 0: the wide kernel (33-256 rows, sm_90a) with that many warpgroups a block, wide_slots
// activation slots, wide_stages weight stages, wide_token_tiles token tiles of 8 rows a slab and wide_multicast
// neighbouring tile groups sharing each activation copy (1, 2 or 4), wide_decoded 1 for the decoded-weight kernel
// (w12_wide_ss.cu); x_image then holds slabs x chunks x
// wide_token_tiles x 2 KB.
int64_t w12_mma_gemm(torch::Tensor x, torch::Tensor view, torch::Tensor nibbles, torch::Tensor base,
                  torch::Tensor esc_tile, torch::Tensor esc_chunk, torch::Tensor esc_entry, torch::Tensor y,
                  torch::Tensor workspace, int64_t n, int64_t n_padded, int64_t k_padded, int64_t warps_n,
                  int64_t warps_k, int64_t chunks_per_split, int64_t step_blocks, int64_t tiles_per_warp,
                  int64_t staged_weights, int64_t shared_x_tiles, int64_t shared_x_ring, int64_t warpgroups, torch::Tensor x_image,
                  int64_t x_image_written, int64_t overlap_prior, int64_t low_bits, int64_t wide_groups, int64_t wide_slots,
                  int64_t wide_stages, int64_t wide_token_tiles, int64_t wide_multicast, int64_t wide_decoded) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.stride(1) == 1 &&
                  x.size(0) <= (wide_groups ? 256 : 64),
              "w12_mma_gemm: x must be CUDA bf16 [M <= 64 (wide kernel: 256), K] with unit column stride");
  TORCH_CHECK(y.is_cuda() && y.scalar_type() == torch::kBFloat16 && y.dim() == 2 && y.size(0) == x.size(0) &&
                  y.size(1) == std::min(n, n_padded) && y.stride(1) == 1 && (y.size(0) == 1 || y.stride(0) == n),
              "w12_mma_gemm: y must be CUDA bf16 [M, min(n, n_padded)] with row stride n and unit column stride");
  TORCH_CHECK(overlap_prior >= kOverlapNone && overlap_prior <= kOverlapSecondRegion,
              "w12_mma_gemm: overlap_prior must be a W12Overlap (0-3), got ", overlap_prior);
  TORCH_CHECK((reinterpret_cast<uintptr_t>(view.data_ptr()) | reinterpret_cast<uintptr_t>(nibbles.data_ptr())) % 16 == 0,
              "w12_mma_gemm: view and nibbles must be 16-byte aligned (the kernel loads them in 16- and 8-byte pieces)");
  W12MmaArgs args{};
  args.x = reinterpret_cast<const __nv_bfloat16*>(x.data_ptr());
  args.view = view.data_ptr<uint8_t>();
  args.nibbles = nibbles.data_ptr<uint8_t>();
  args.base = base.data_ptr<uint8_t>();
  args.esc_tile = esc_tile.data_ptr<int32_t>();
  args.esc_chunk = reinterpret_cast<const uint32_t*>(esc_chunk.data_ptr<int32_t>());
  args.esc_entry = reinterpret_cast<const uint32_t*>(esc_entry.data_ptr<int32_t>());
  args.partial = workspace.numel() ? workspace.data_ptr<float>() : nullptr;
  args.y = reinterpret_cast<__nv_bfloat16*>(y.data_ptr());
  args.m = x.size(0);
  args.n = n;
  args.k = x.size(1);
  args.ldx = x.stride(0);
  args.n_padded = n_padded;
  args.k_padded = k_padded;
  args.warps_n = warps_n;
  args.warps_k = warps_k;
  args.chunks_per_split = chunks_per_split;
  args.step_blocks = step_blocks;
  args.tiles_per_warp = tiles_per_warp;
  args.staged_weights = staged_weights;
  args.overlap_prior = overlap_prior;
  // warpgroup MMAs: each 128-column chunk's activations as wgmma's B image, (MT * 8 rows) x 256 bytes
  const int64_t token_rows = x.size(0) <= 8 ? 8 : x.size(0) <= 16 ? 16 : x.size(0) <= 32 ? 32 : 64;
  TORCH_CHECK(warpgroups == 0 || (x_image.is_cuda() && x_image.nbytes() >= (size_t)(k_padded / 128 * token_rows * 256) &&
                                  reinterpret_cast<uintptr_t>(x_image.data_ptr()) % 16 == 0),
              "w12_mma_gemm: warpgroup MMAs need x_image: CUDA memory of ", k_padded / 128 * token_rows * 256,
              " bytes, 16-byte aligned");
  const int64_t slab_rows = wide_token_tiles * 8;
  const int64_t wide_bytes = wide_groups ? (x.size(0) + slab_rows - 1) / slab_rows * (k_padded / 128) * slab_rows * 256 : 0;
  TORCH_CHECK(wide_groups == 0 || (x_image.is_cuda() && x_image.nbytes() >= (size_t)wide_bytes &&
                                   reinterpret_cast<uintptr_t>(x_image.data_ptr()) % 16 == 0),
              "w12_mma_gemm: the wide kernel needs x_image: CUDA memory of ", wide_bytes, " bytes, 16-byte aligned");
  W12SharedActivations shared_x{(int)shared_x_tiles, (int)shared_x_ring, (int)warpgroups};
  shared_x.x_image = warpgroups ? x_image.data_ptr() : nullptr;
  shared_x.x_image_written = x_image_written != 0;
  W12Wide wide;
  wide.groups = (int)wide_groups;
  wide.slots = (int)wide_slots;
  wide.stages = (int)wide_stages;
  wide.token_tiles = (int)wide_token_tiles;
  wide.multicast = (int)wide_multicast;
  wide.decoded = (int)wide_decoded;
  wide.x_image = wide_groups ? x_image.data_ptr() : nullptr;
  wide.x_image_written = x_image_written != 0;
  int launched_warpgroups = 0;
  const cudaError_t err =
      w12_mma_launch(args, low_bits, at::cuda::getCurrentCUDAStream(), shared_x, &launched_warpgroups, wide);
  if (err == cudaErrorNotSupported && wide_groups) {  // no wide block fits: the caller runs 64 rows at a time
    cudaGetLastError();
    return -1;
  }
  if (err != cudaSuccess) cudaGetLastError();  // a refused launch must not fail the next CUDA call as well
  TORCH_CHECK(err == cudaSuccess, "w12_mma_gemm launch failed: ", cudaGetErrorString(err));
  return launched_warpgroups;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("w12_mma_gemm", &w12_mma_gemm, "W12 GEMM; returns the warpgroups a block that ran (0: per-warp; -1: the wide kernel fits no multiprocessor)");
}
