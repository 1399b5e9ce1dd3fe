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

namespace {

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

// Piece q (columns 8q .. 8q+7, zero past k) of token `row` as 8 E4M3 bytes at their place in the B image:
// column c = 64 p + 32 h + 8 t + i of token 8 j + g -> image[j][p][4 g + t][8 h + i].
__device__ __forceinline__ void store_piece(uint8_t* __restrict__ image, int row, int pairs, int q, uint4 raw,
                                            float inv) {
  float v[8];
  bf16x8_to_float(raw, v);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] *= inv;
  const int j = row / 8, g = row % 8, p = q / 8, h = (q / 4) % 2, t = q % 4;
  *reinterpret_cast<uint2*>(image + (((size_t)j * pairs + p) * 32 + 4 * g + t) * 16 + 8 * h) = to_e4m3x8(v);
}

// One block a token row: its largest |x|, then every 8 columns as 8 E4M3 bytes at their place in the B image.
__global__ void __launch_bounds__(kQuantThreads) quantize_kernel(const __nv_bfloat16* __restrict__ x, int k, int ldx,
                                                                  int k_padded, uint8_t* __restrict__ image,
                                                                  float* __restrict__ scale) {
  allow_next_grid();  // the GEMM's prologue reads only its weights
  wait_for_prior_grid();
  const int row = blockIdx.x;
  const __nv_bfloat16* xr = x + (size_t)row * ldx;
  const int groups = k / 8, pieces = k_padded / 8, pairs = k_padded / 64;
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
  if (threadIdx.x == 0) scale[row] = amax > 0.0f ? amax / kQpassFp8Max : 1.0f;
#pragma unroll
  for (int i = 0; i < kQuantKeep; ++i) {
    const int q = threadIdx.x + i * kQuantThreads;
    if (q < pieces) store_piece(image, row, pairs, q, kept[i], inv);
  }
  for (int q = threadIdx.x + kQuantKeep * kQuantThreads; q < pieces; q += kQuantThreads)
    store_piece(image, row, pairs, q,
                q < groups ? *reinterpret_cast<const uint4*>(xr + 8 * q) : make_uint4(0, 0, 0, 0), inv);
}

// Weight pairs (2 blocks of 32 columns) of each of its R tiles a warp keeps in flight: about 4 KB of view a warp at
// few rows, fewer registers at many.
template <int TT, int R>
constexpr int kPrefetchPairs = R >= 4 ? 1 : R == 2 ? 2 : TT <= 2 ? 4 : 3;

// TT token tiles of 8 rows; R 16-row weight tiles a warp (each activation fragment feeds R MMAs: its L1/L2 reads per
// weight byte fall by R, what bounds the kernel at 32+ rows); MID: the midpoint's second MMA.
template <int TT, int R, bool MID>
__global__ void __launch_bounds__(32 * kQpassFp8MaxWarps) qpass_fp8_kernel(QpassFp8Args args) {
  static_assert(R * TT * (MID ? 2 : 1) <= kQpassFp8MaxAccumulators, "accumulators past the register budget");
  constexpr int DEPTH = kPrefetchPairs<TT, R>;
  extern __shared__ float reduce[];  // [groups_per_block][warps_k][R * TT * 4][32]: the K classes' sums
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int local = warp / args.warps_k, kclass = warp % args.warps_k;
  const int group = blockIdx.x * args.groups_per_block + local;
  const int tile0 = group * R;
  const int live_tiles = max(0, min(R, args.tiles - tile0));  // warp-uniform: the last group may be short
  // K classes: blockIdx.y's split of the K range, then warps_k warps within it
  const int classes = args.splits * args.warps_k, kglobal = blockIdx.y * args.warps_k + kclass;
  const int pairs = args.k_padded / 64, per = (pairs + classes - 1) / classes;
  const int p0 = min(pairs, kglobal * per), count = live_tiles ? min(pairs, p0 + per) - p0 : 0;
  const size_t tile_stride = (size_t)(args.k_padded / 32) * 512;
  const uint8_t* w = args.view + (size_t)tile0 * tile_stride + (size_t)(2 * p0) * 512 + lane * 16;
  const uint8_t* xi = args.x_image + ((size_t)p0 * 32 + lane) * 16;
  const size_t x_tile_stride = (size_t)pairs * 512;
  // lane 4g + t's B bytes belong to token 8j + g: rows past m are never read (at 1 row 7/8 of the image)
  const int g = lane / 4, t = lane % 4;
  const int live_token_tiles = (args.m - g + 7) / 8;  // token tiles j with 8j + g < m

  uint4 next[DEPTH][R][2];
#pragma unroll
  for (int d = 0; d < DEPTH; ++d)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (d < count && r < live_tiles) {
        next[d][r][0] = ptx::load_streaming16(w + r * tile_stride + (2 * d) * 512);
        next[d][r][1] = ptx::load_streaming16(w + r * tile_stride + (2 * d + 1) * 512);
      }
  if (args.overlap_prior) wait_for_prior_grid();  // x_image is the quantizer's

  float acc[R][TT][4] = {}, mid[MID ? R : 1][MID ? TT : 1][4] = {};
  for (int p = 0; p < count; p += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      if (p + d >= count) break;
      uint4 cur[R][2];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        cur[r][0] = next[d][r][0];
        cur[r][1] = next[d][r][1];
        if (p + DEPTH + d < count && r < live_tiles) {  // refill the slot before using what it held
          next[d][r][0] = ptx::load_streaming16(w + r * tile_stride + (2 * (p + DEPTH + d)) * 512);
          next[d][r][1] = ptx::load_streaming16(w + r * tile_stride + (2 * (p + DEPTH + d) + 1) * 512);
        }
      }
      uint4 xb[TT];
#pragma unroll
      for (int j = 0; j < TT; ++j)
        xb[j] = j < live_token_tiles ? __ldg(reinterpret_cast<const uint4*>(xi + j * x_tile_stride + (p + d) * 512))
                                     : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4 v = cur[r][h];
          // two bytes of row g, two of row g + 8 a view word -> one row a register
          const uint32_t a[4] = {ptx::permute_bytes(v.x, v.y, 0x5410), ptx::permute_bytes(v.x, v.y, 0x7632),
                                 ptx::permute_bytes(v.z, v.w, 0x5410), ptx::permute_bytes(v.z, v.w, 0x7632)};
#pragma unroll
          for (int j = 0; j < TT; ++j) {
            const uint32_t b0 = h ? xb[j].z : xb[j].x, b1 = h ? xb[j].w : xb[j].y;
            ptx::mma_e4m3_16832(acc[r][j], a, b0, b1);
            if constexpr (MID) {
              const uint32_t e[4] = {a[0] & 0xF8F8F8F8u, a[1] & 0xF8F8F8F8u, a[2] & 0xF8F8F8F8u, a[3] & 0xF8F8F8F8u};
              ptx::mma_e4m3_16832(mid[r][j], e, b0, b1);
            }
          }
        }
    }
  }
  allow_next_grid();
  if constexpr (MID) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < TT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][j][c] += mid[r][j][c] * 0.0625f;
  }
  constexpr int SUMS = R * TT * 4;  // a lane's fp32 sums
  if (args.warps_k > 1) {  // K classes in warp order
    float* mine = reduce + ((size_t)(local * args.warps_k + kclass) * SUMS) * 32 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < TT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) mine[((r * TT + j) * 4 + c) * 32] = acc[r][j][c];
    __syncthreads();
    if (kclass != 0) return;
    const float* first = reduce + ((size_t)local * args.warps_k * SUMS) * 32 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < TT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int at = ((r * TT + j) * 4 + c) * 32;
          float sum = first[at];
          for (int q = 1; q < args.warps_k; ++q) sum += first[q * SUMS * 32 + at];
          acc[r][j][c] = sum;
        }
  }
  if (args.splits > 1) {  // the blocks of a group's K splits: the last to arrive sums them in split order
    if (live_tiles == 0) return;
    float* part = args.workspace + ((size_t)group * args.splits * SUMS) * 32 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < TT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) part[((size_t)blockIdx.y * SUMS + (r * TT + j) * 4 + c) * 32] = acc[r][j][c];
    __threadfence();  // the partial is visible before the count says so
    int arrived = 0;
    if (lane == 0) arrived = atomicAdd(args.counters + group, 1);
    if (__shfl_sync(0xFFFFFFFFu, arrived, 0) != args.splits - 1) return;
    __threadfence();
    const float* all = args.workspace + ((size_t)group * args.splits * SUMS) * 32 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < TT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int at = ((r * TT + j) * 4 + c) * 32;
          float sum = __ldcg(all + at);
          for (int q = 1; q < args.splits; ++q) sum += __ldcg(all + (size_t)q * SUMS * 32 + at);
          acc[r][j][c] = sum;
        }
    if (lane == 0) args.counters[group] = 0;  // ready for the next launch
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= live_tiles) break;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = (tile0 + r) * 16 + g + 8 * half;
      if (row >= args.n) continue;
      const float window = __uint_as_float((uint32_t)(args.base[row] + 7) << 23);  // 2**(base - 120), exact
#pragma unroll
      for (int j = 0; j < TT; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int token = 8 * j + 2 * t + c;
          if (token < args.m)
            args.y[(size_t)token * args.ldy + row] =
                __float2bfloat16_rn(acc[r][j][2 * half + c] * window * args.x_scale[token]);
        }
    }
  }
}

// Launches with the PDL attribute where asked (sm_90+), as the W12 kernels do.
template <typename Kernel, typename... Args>
cudaError_t launch(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool overlap, Args... args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = overlap ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

template <int TT, int R, bool MID>
cudaError_t launch_gemm(const QpassFp8Args& args, cudaStream_t stream) {
  const int warps = args.warps_k * args.groups_per_block;
  const size_t smem = args.warps_k > 1 ? (size_t)warps * R * TT * 4 * 32 * sizeof(float) : 0;
  auto kernel = qpass_fp8_kernel<TT, R, MID>;
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
  }
  const int groups = (args.tiles + R - 1) / R;
  const dim3 grid((groups + args.groups_per_block - 1) / args.groups_per_block, args.splits);
  return launch(kernel, grid, dim3(32 * warps), smem, stream, args.overlap_prior, args);
}

// The built tiles a warp: 1, 2 and 4 where the accumulators fit (qpass_fp8_tiles_per_warp_fits).
template <int TT, bool MID>
cudaError_t launch_tiles(const QpassFp8Args& args, cudaStream_t stream) {
  switch (args.tiles_per_warp) {
    case 1:
      return launch_gemm<TT, 1, MID>(args, stream);
    case 2:
      if constexpr (2 * TT * (MID ? 2 : 1) <= kQpassFp8MaxAccumulators) return launch_gemm<TT, 2, MID>(args, stream);
      break;
    case 4:
      if constexpr (4 * TT * (MID ? 2 : 1) <= kQpassFp8MaxAccumulators) return launch_gemm<TT, 4, MID>(args, stream);
      break;
  }
  return cudaErrorInvalidValue;
}

// Built token tiles: 1-8, 9-16, 17-32, 33-40 (a 32-node tree and its root) and 41-64 rows.
template <bool MID>
cudaError_t dispatch(const QpassFp8Args& args, cudaStream_t stream) {
  const int tiles8 = (args.m + 7) / 8;
  if (tiles8 <= 1) return launch_tiles<1, MID>(args, stream);
  if (tiles8 <= 2) return launch_tiles<2, MID>(args, stream);
  if (tiles8 <= 4) return launch_tiles<4, MID>(args, stream);
  if (tiles8 <= 5) return launch_tiles<5, MID>(args, stream);
  return launch_tiles<8, MID>(args, stream);
}

}  // namespace

cudaError_t qpass_fp8_quantize(const __nv_bfloat16* x, int m, int k, int ldx, int k_padded, uint8_t* x_image,
                               float* x_scale, bool overlap_prior, cudaStream_t stream) {
  if (m < 1 || m > kQpassFp8MaxRows || k % 8 || ldx % 8 || k_padded % 128 || k > k_padded) return cudaErrorInvalidValue;
  return launch(quantize_kernel, dim3(m), dim3(kQuantThreads), 0, stream, overlap_prior, x, k, ldx, k_padded, x_image,
                x_scale);
}

cudaError_t qpass_fp8_gemm(const QpassFp8Args& args, bool midpoint, cudaStream_t stream) {
  if (args.m < 1 || args.m > kQpassFp8MaxRows || args.warps_k < 1 || args.groups_per_block < 1 ||
      args.warps_k * args.groups_per_block > kQpassFp8MaxWarps || args.k_padded % 128 || args.splits < 1 ||
      (args.splits > 1 && (args.workspace == nullptr || args.counters == nullptr)) ||
      !qpass_fp8_tiles_per_warp_fits(args.m, args.tiles_per_warp, midpoint))
    return cudaErrorInvalidValue;
  return midpoint ? dispatch<true>(args, stream) : dispatch<false>(args, stream);
}
