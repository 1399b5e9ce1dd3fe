// The FP8 Q pass's GEMM kernel (w12_qpass_fp8.cu: E4M3 operands; w12_qpass_fp8_f16.cu: f16 operands), one header
// so that the two operand kinds compile as two translation units in parallel.
#pragma once
#include <cuda_fp8.h>

#include "pdl.cuh"
#include "ptx.cuh"
#include "w12_qpass_fp8.cuh"

namespace qpass_fp8_detail {

// Weight pairs (2 blocks of 32 columns) of each of its R tiles a warp keeps in flight: about 4 KB of view a warp at
// few rows, fewer registers at many.
template <int TT, int R>
constexpr int kPrefetchPairs = R >= 4 ? 1 : R == 2 ? 2 : TT <= 2 ? 4 : 3;

// E4M3 x2 (the low 16 bits of `pair`) -> f16 x2, low byte to the low half: exact (E4M3 is a subset of f16).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t pair) {
  uint32_t out;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(out) : "h"((unsigned short)(pair & 0xFFFFu)));
  return out;
}

// The midpoint of the dropped mantissa bits in f16 (bit 6, right below E4M3's three) for every nonzero half: a
// normal E4M3 number has an f16 exponent field of 9..23, so bit 13 or 14 is set; the zero code stays zero.
__device__ __forceinline__ uint32_t f16x2_midpoint(uint32_t h) { return h | (((h >> 7) | (h >> 8)) & 0x00400040u); }

// TT token tiles of 8 rows; R 16-row weight tiles a warp (each activation fragment feeds R MMAs: its L1/L2 reads per
// weight byte fall by R); MID: the dropped bits at their midpoint. F16: f16 operands (both planes' E4M3 bytes
// converted in registers, A once per tile, B once per token tile for all R tiles, the midpoint one LOP3 a register)
// on m16n8k16 MMAs, where sm_90's m16n8k32 E4M3 mma.sync runs at a fraction of the f16 rate; else E4M3 m16n8k32
// with the midpoint as a second MMA.
template <int TT, int R, bool MID, bool F16>
__global__ void __launch_bounds__(32 * kQpassFp8MaxWarps) qpass_fp8_kernel(QpassFp8Args args) {
  static_assert(R * TT * (MID && !F16 ? 2 : 1) <= kQpassFp8MaxAccumulators, "accumulators past the register budget");
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

  constexpr bool MID_MMA = MID && !F16;  // the E4M3 midpoint's second accumulators
  float acc[R][TT][4] = {}, mid[MID_MMA ? R : 1][MID_MMA ? TT : 1][4] = {};
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
      if constexpr (F16) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // B of k16 MMA q: token g's columns 8t + 4q .. 8t + 4q + 3 (b0: the first two, b1: the last two)
          uint32_t b[TT][2][2];
#pragma unroll
          for (int j = 0; j < TT; ++j) {
            const uint32_t lo = h ? xb[j].z : xb[j].x, hi = h ? xb[j].w : xb[j].y;
            b[j][0][0] = e4m3x2_to_f16x2(lo);
            b[j][0][1] = e4m3x2_to_f16x2(lo >> 16);
            b[j][1][0] = e4m3x2_to_f16x2(hi);
            b[j][1][1] = e4m3x2_to_f16x2(hi >> 16);
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const uint4 v = cur[r][h];
            // view word: two bytes of row g, two of row g + 8; k16 MMA 0 takes words x, y, MMA 1 words z, w
            uint32_t a[2][4] = {{e4m3x2_to_f16x2(v.x), e4m3x2_to_f16x2(v.x >> 16), e4m3x2_to_f16x2(v.y),
                                 e4m3x2_to_f16x2(v.y >> 16)},
                                {e4m3x2_to_f16x2(v.z), e4m3x2_to_f16x2(v.z >> 16), e4m3x2_to_f16x2(v.w),
                                 e4m3x2_to_f16x2(v.w >> 16)}};
            if constexpr (MID) {
#pragma unroll
              for (int q = 0; q < 2; ++q)
#pragma unroll
                for (int i = 0; i < 4; ++i) a[q][i] = f16x2_midpoint(a[q][i]);
            }
#pragma unroll
            for (int j = 0; j < TT; ++j) {
              ptx::mma_f16_16816(acc[r][j], a[0], b[j][0][0], b[j][0][1]);
              ptx::mma_f16_16816(acc[r][j], a[1], b[j][1][0], b[j][1][1]);
            }
          }
        }
      } else {
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
                const uint32_t e[4] = {a[0] & 0xF8F8F8F8u, a[1] & 0xF8F8F8F8u, a[2] & 0xF8F8F8F8u,
                                       a[3] & 0xF8F8F8F8u};
                ptx::mma_e4m3_16832(mid[r][j], e, b0, b1);
              }
            }
          }
      }
    }
  }
  allow_next_grid();
  if constexpr (MID_MMA) {
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

template <int TT, int R, bool MID, bool F16>
cudaError_t launch_gemm(const QpassFp8Args& args, cudaStream_t stream) {
  const int warps = args.warps_k * args.groups_per_block;
  const size_t smem = args.warps_k > 1 ? (size_t)warps * R * TT * 4 * 32 * sizeof(float) : 0;
  auto kernel = qpass_fp8_kernel<TT, R, MID, F16>;
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
  }
  const int groups = (args.tiles + R - 1) / R;
  const dim3 grid((groups + args.groups_per_block - 1) / args.groups_per_block, args.splits);
  return launch(kernel, grid, dim3(32 * warps), smem, stream, args.overlap_prior, args);
}

// The built tiles a warp: 1, 2 and (E4M3 operands) 4 where the accumulators fit (qpass_fp8_tiles_per_warp_fits).
template <int TT, bool MID, bool F16>
cudaError_t launch_tiles(const QpassFp8Args& args, cudaStream_t stream) {
  constexpr int mmas = MID && !F16 ? 2 : 1;
  switch (args.tiles_per_warp) {
    case 1:
      return launch_gemm<TT, 1, MID, F16>(args, stream);
    case 2:
      if constexpr (2 * TT * mmas <= kQpassFp8MaxAccumulators) return launch_gemm<TT, 2, MID, F16>(args, stream);
      break;
    case 4:
      if constexpr (!F16 && 4 * TT * mmas <= kQpassFp8MaxAccumulators) return launch_gemm<TT, 4, MID, F16>(args, stream);
      break;
  }
  return cudaErrorInvalidValue;
}

// Built token tiles: 1-8, 9-16, 17-32, 33-40 (a 32-node tree and its root) and 41-64 rows.
template <bool MID, bool F16>
cudaError_t dispatch(const QpassFp8Args& args, cudaStream_t stream) {
  const int tiles8 = (args.m + 7) / 8;
  if (tiles8 <= 1) return launch_tiles<1, MID, F16>(args, stream);
  if (tiles8 <= 2) return launch_tiles<2, MID, F16>(args, stream);
  if (tiles8 <= 4) return launch_tiles<4, MID, F16>(args, stream);
  if (tiles8 <= 5) return launch_tiles<5, MID, F16>(args, stream);
  return launch_tiles<8, MID, F16>(args, stream);
}

}  // namespace qpass_fp8_detail

// f16 operands (w12_qpass_fp8_f16.cu); the arguments checked by qpass_fp8_gemm.
cudaError_t qpass_fp8_gemm_f16(const QpassFp8Args& args, bool midpoint, cudaStream_t stream);
