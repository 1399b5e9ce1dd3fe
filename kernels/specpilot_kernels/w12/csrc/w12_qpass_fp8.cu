// The TLV Q pass on the FP8 tensor cores (sm_89+): y = x @ Wq^T with Wq the exact pass's 8-bit view, read in place.
//
// Every stored view byte is a normal E4M3 number (format.py), so the view needs no decode: its fragment layout
// (mma.py) already gives lane 4g + t of a warp, per 16-row tile and 32-column block, the 16 bytes of rows g and g + 8
// at columns 8t .. 8t + 7, two bytes of one row then two of the other. One prmt a register regroups them into the
// m16n8k32 E4M3 A fragment (a[0]: row g, columns 8t .. 8t+3; a[1]: row g+8, the same columns; a[2], a[3]: columns
// 8t+4 .. 8t+7), whose partner B bytes are then columns 8t .. 8t+7 of a token: 8 consecutive bytes. The activations
// are quantized to E4M3 per token row first (qpass_fp8_quantize) and written in exactly that order, so a lane's B for
// two blocks is one 16-byte load. The row window 2**(base - 120) and the token's scale multiply the fp32 sums.
//
// Midpoint (the dropped 4 mantissa bits at 1000): the weight is v + (v & sign|exponent) / 16, so a second MMA over the
// view bytes masked to sign and exponent (one LOP a register; still normal E4M3 numbers, 0 for the zero code) adds
// the exact midpoint in fp32. Truncated: the first MMA alone.
//
// Partition: a warp owns R consecutive tiles (tiles_per_warp) and a contiguous range of 64-column pairs; warps_k warps
// of a block share a tile group and are summed in warp order through shared memory; where groups are few (small N,
// many tiles a warp) `splits` blocks share its K too, each writing its fp32 partial to a workspace, and the last
// block to arrive (a counter a group, reset by that block) sums them in split order. Each token's sums do not
// depend on the other tokens' values, and a tile's sums depend on (splits, warps_k) alone (its K ranges, summed in
// order), never on R or the tiles a block: one (splits, warps_k) gives the same bits at every row count.
#include <cuda_fp8.h>

#include "pdl.cuh"
#include "ptx.cuh"
#include "w12_qpass_fp8.cuh"
#include "w12_qpass_fp8_kernel.cuh"

namespace {

using qpass_fp8_detail::launch;
constexpr int kQuantThreads = 256;

// 8 floats -> 8 E4M3 bytes, round to nearest, saturated at +-448.
__device__ __forceinline__ uint2 to_e4m3x8(const float (&v)[8]) {
  uint32_t word[2];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * w], v[4 * w + 1]), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * w + 2], v[4 * w + 3]), __NV_SATFINITE, __NV_E4M3);
    word[w] = lo | (hi << 16);
  }
  return make_uint2(word[0], word[1]);
}

__device__ __forceinline__ void bf16x8_to_float(const uint4& raw, float (&v)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

// 16-byte pieces of its row a quantizer thread keeps in registers between the largest |x| and the bytes: rows of up
// to 18,432 columns are read once (the quantizer sits on the GEMM's critical path: one L2 round trip less).
constexpr int kQuantKeep = 9;

__device__ __forceinline__ float amax8(const uint4& raw, float amax) {
  float v[8];
  bf16x8_to_float(raw, v);
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
  return amax;
}

// Piece q (columns 8q .. 8q+7, zero past k) of token `row` as 8 E4M3 bytes at their place in the B image. The
// per-warp kernel's (wgmma_tiles 0): column c = 64 p + 32 h + 8 t + i of token 8 j + g -> image[j][p][4 g + t][8 h + i].
// The warpgroup kernel's for T = wgmma_tiles token tiles, in f16 (the same numbers, exactly): c = 32 b + 8 t + 4 s +
// 2 h + e -> f16 image[b][s][h][j][g][2 t + e] (k16 step s, k half h).
__device__ __forceinline__ void store_piece(uint8_t* __restrict__ image, int row, int pairs, int q, uint4 raw,
                                            float inv, int wgmma_tiles) {
  float v[8];
  bf16x8_to_float(raw, v);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] *= inv;
  const int j = row / 8, g = row % 8, t = q % 4;
  const uint2 bytes = to_e4m3x8(v);
  if (wgmma_tiles) {
    uint8_t* at = image + (size_t)(q / 4) * wgmma_tiles * 512 + j * 128 + g * 16 + 4 * t;
#pragma unroll
    for (int step = 0; step < 2; ++step)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<uint32_t*>(at + (2 * step + h) * wgmma_tiles * 128) =
            qpass_fp8_detail::e4m3x2_to_f16x2((step ? bytes.y : bytes.x) >> (16 * h));
  } else {
    const int p = q / 8, h = (q / 4) % 2;
    *reinterpret_cast<uint2*>(image + (((size_t)j * pairs + p) * 32 + 4 * g + t) * 16 + 8 * h) = bytes;
  }
}

// One block a token row: its largest |x|, then every 8 columns as 8 E4M3 bytes at their place in the B image; rows
// m .. gridDim.x - 1 (the warpgroup image's padding) zero.
__global__ void __launch_bounds__(kQuantThreads) quantize_kernel(const __nv_bfloat16* __restrict__ x, int m, int k,
                                                                  int ldx, int k_padded, int wgmma_tiles,
                                                                  uint8_t* __restrict__ image,
                                                                  float* __restrict__ scale) {
  allow_next_grid();  // the GEMM's prologue reads only its weights
  wait_for_prior_grid();
  const int row = blockIdx.x;
  const __nv_bfloat16* xr = x + (size_t)row * ldx;
  const int groups = row < m ? k / 8 : 0, pieces = k_padded / 8, pairs = k_padded / 64;
  uint4 kept[kQuantKeep];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kQuantKeep; ++i) {
    const int q = threadIdx.x + i * kQuantThreads;
    kept[i] = q < groups ? *reinterpret_cast<const uint4*>(xr + 8 * q) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int i = 0; i < kQuantKeep; ++i) amax = amax8(kept[i], amax);
  for (int q = threadIdx.x + kQuantKeep * kQuantThreads; q < groups; q += kQuantThreads)
    amax = amax8(*reinterpret_cast<const uint4*>(xr + 8 * q), amax);
  __shared__ float warp_max[kQuantThreads / 32];
#pragma unroll
  for (int offset = 16; offset; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
#pragma unroll
  for (int w = 1; w < kQuantThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float inv = amax > 0.0f ? kQpassFp8Max / amax : 1.0f;
  if (threadIdx.x == 0 && row < m) scale[row] = amax > 0.0f ? amax / kQpassFp8Max : 1.0f;
#pragma unroll
  for (int i = 0; i < kQuantKeep; ++i) {
    const int q = threadIdx.x + i * kQuantThreads;
    if (q < pieces) store_piece(image, row, pairs, q, kept[i], inv, wgmma_tiles);
  }
  for (int q = threadIdx.x + kQuantKeep * kQuantThreads; q < pieces; q += kQuantThreads)
    store_piece(image, row, pairs, q,
                q < groups ? *reinterpret_cast<const uint4*>(xr + 8 * q) : make_uint4(0, 0, 0, 0), inv, wgmma_tiles);
}

}  // namespace

cudaError_t qpass_fp8_quantize(const __nv_bfloat16* x, int m, int k, int ldx, int k_padded, uint8_t* x_image,
                               float* x_scale, bool overlap_prior, cudaStream_t stream) {
  if (m < 1 || m > kQpassFp8MaxRows || k % 8 || ldx % 8 || k_padded % 128 || k > k_padded) return cudaErrorInvalidValue;
  return launch(quantize_kernel, dim3(m), dim3(kQuantThreads), 0, stream, overlap_prior, x, m, k, ldx, k_padded, 0,
                x_image, x_scale);
}

cudaError_t qpass_fp8_quantize_wgmma(const __nv_bfloat16* x, int m, int k, int ldx, int k_padded, int token_tiles,
                                     uint8_t* x_image, float* x_scale, bool overlap_prior, cudaStream_t stream) {
  if (m < 1 || m > kQpassFp8MaxRows || m > 8 * token_tiles || token_tiles > kQpassFp8MaxRows / 8 || k % 8 ||
      ldx % 8 || k_padded % 128 || k > k_padded)
    return cudaErrorInvalidValue;
  return launch(quantize_kernel, dim3(8 * token_tiles), dim3(kQuantThreads), 0, stream, overlap_prior, x, m, k, ldx,
                k_padded, token_tiles, x_image, x_scale);
}

cudaError_t qpass_fp8_gemm(const QpassFp8Args& args, bool midpoint, cudaStream_t stream) {
  if (args.m < 1 || args.m > kQpassFp8MaxRows || args.warps_k < 1 || args.groups_per_block < 1 ||
      args.warps_k * args.groups_per_block > kQpassFp8MaxWarps || args.k_padded % 128 || args.splits < 1 ||
      (args.splits > 1 && (args.workspace == nullptr || args.counters == nullptr)) ||
      !qpass_fp8_tiles_per_warp_fits(args.m, args.tiles_per_warp, midpoint, args.f16_operands))
    return cudaErrorInvalidValue;
  if (args.f16_operands) return qpass_fp8_gemm_f16(args, midpoint, stream);
  using qpass_fp8_detail::dispatch;
  return midpoint ? dispatch<true, false>(args, stream) : dispatch<false, false>(args, stream);
}
