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
// Partition (fixed by N, K and the GPU, never by M): a warp owns one tile and a contiguous range of 64-column pairs;
// warps_k warps share a tile and are summed in warp order through shared memory. No atomics, and each token's sums
// do not depend on the other tokens: the same bits at every row count.
#include <cuda_fp8.h>

#include "pdl.cuh"
#include "ptx.cuh"
#include "w12_qpass_fp8.cuh"

namespace {

constexpr int kQuantThreads = 256;
constexpr size_t kL2PrefetchBytes = 24u << 20;  // about half the H100/H200's L2: prefetched lines stay until read

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

// One block a token row: its largest |x|, then every 8 columns as 8 E4M3 bytes at their place in the B image.
__global__ void __launch_bounds__(kQuantThreads) quantize_kernel(const __nv_bfloat16* __restrict__ x, int k, int ldx,
                                                                  int k_padded, uint8_t* __restrict__ image,
                                                                  float* __restrict__ scale) {
  allow_next_grid();  // the GEMM's prologue reads only its weights
  wait_for_prior_grid();
  const int row = blockIdx.x;
  const __nv_bfloat16* xr = x + (size_t)row * ldx;
  const int groups = k / 8;
  float amax = 0.0f;
  for (int q = threadIdx.x; q < groups; q += kQuantThreads) {
    float v[8];
    bf16x8_to_float(*reinterpret_cast<const uint4*>(xr + 8 * q), v);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
  }
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
  // column c = 64 p + 32 h + 8 t + i of token 8 j + g -> image[j][p][4 g + t][8 h + i]
  const int pairs = k_padded / 64, j = row / 8, g = row % 8;
  for (int q = threadIdx.x; q < k_padded / 8; q += kQuantThreads) {
    float v[8] = {};
    if (q < groups) {
      bf16x8_to_float(*reinterpret_cast<const uint4*>(xr + 8 * q), v);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] *= inv;
    }
    const int p = q / 8, h = (q / 4) % 2, t = q % 4;
    *reinterpret_cast<uint2*>(image + (((size_t)j * pairs + p) * 32 + 4 * g + t) * 16 + 8 * h) = to_e4m3x8(v);
  }
}

// Weight pairs (2 blocks of 32 columns) a warp keeps in flight: enough bytes at few rows, fewer registers at many.
template <int TT>
constexpr int kPrefetchPairs = TT <= 2 ? 4 : 2;
static_assert(kPrefetchPairs<1> % 2 == 0 && kPrefetchPairs<8> % 2 == 0, "the activation slots alternate");

// y for one pair of 32-column blocks: the view's 4 words a block regrouped into A (one prmt a register), the MMA
// on each token tile's B (the quantizer's 16 bytes: block 0 in .x/.y, block 1 in .z/.w).
template <int TT, bool MID>
__device__ __forceinline__ void multiply_pair(const uint4 (&v)[2], const uint4 (&xb)[TT], float (&acc)[TT][4],
                                              float (&mid)[MID ? TT : 1][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // two bytes of row g, two of row g + 8 a view word -> one row a register
    const uint32_t a[4] = {ptx::permute_bytes(v[h].x, v[h].y, 0x5410), ptx::permute_bytes(v[h].x, v[h].y, 0x7632),
                           ptx::permute_bytes(v[h].z, v[h].w, 0x5410), ptx::permute_bytes(v[h].z, v[h].w, 0x7632)};
#pragma unroll
    for (int j = 0; j < TT; ++j) {
      const uint32_t b0 = h ? xb[j].z : xb[j].x, b1 = h ? xb[j].w : xb[j].y;
      ptx::mma_e4m3_16832(acc[j], a, b0, b1);
      if constexpr (MID) {
        const uint32_t e[4] = {a[0] & 0xF8F8F8F8u, a[1] & 0xF8F8F8F8u, a[2] & 0xF8F8F8F8u, a[3] & 0xF8F8F8F8u};
        ptx::mma_e4m3_16832(mid[j], e, b0, b1);
      }
    }
  }
}

// TT token tiles of 8 rows; MID: the midpoint's second MMA. A block takes groups of tiles_per_block tiles in turn
// (blockIdx.x, + gridDim.x, ...: a grid of resident blocks, so the last round is at most one group short).
template <int TT, bool MID>
__global__ void __launch_bounds__(32 * kQpassFp8MaxWarps) qpass_fp8_kernel(QpassFp8Args args) {
  constexpr int DEPTH = kPrefetchPairs<TT>;
  extern __shared__ float reduce[];  // [tiles_per_block][warps_k][TT * 4][32]: the K classes' sums
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int local = warp / args.warps_k, kclass = warp % args.warps_k;
  const int pairs = args.k_padded / 64, per = (pairs + args.warps_k - 1) / args.warps_k;
  const int p0 = min(pairs, kclass * per), span = min(pairs, p0 + per) - p0;
  const int groups = (args.tiles + args.tiles_per_block - 1) / args.tiles_per_block;
  const uint8_t* xi = args.x_image + ((size_t)p0 * 32 + lane) * 16;
  const size_t x_tile_stride = (size_t)pairs * 512;
  const int g = lane / 4, t = lane % 4;
  bool waited = false;
  for (int group = blockIdx.x; group < groups; group += gridDim.x) {
    const int tile = group * args.tiles_per_block + local;
    const int count = tile < args.tiles ? span : 0;
    const uint8_t* w = args.view + ((size_t)tile * (args.k_padded / 32) + 2 * p0) * 512;
    if (lane == 0 && count) ptx::prefetch_l2_bulk(w, (uint32_t)min(count, args.l2_prefetch_pairs) * 1024);
    w += lane * 16;
    uint4 next[DEPTH][2];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d)
      if (d < count) {
        next[d][0] = ptx::load_streaming16(w + (2 * d) * 512);
        next[d][1] = ptx::load_streaming16(w + (2 * d + 1) * 512);
      }
    if (!waited) {  // the x image is the quantizer's: the weights above were asked for while it finished
      wait_for_prior_grid();
      waited = true;
    }
    float acc[TT][4] = {}, mid[MID ? TT : 1][4] = {};
    uint4 xb[2][TT];  // activations of this pair and the next, loaded a pair ahead (DEPTH is even: fixed slots)
#pragma unroll
    for (int j = 0; j < TT; ++j)
      if (count) xb[0][j] = __ldg(reinterpret_cast<const uint4*>(xi + j * x_tile_stride));
    for (int p = 0; p < count; p += DEPTH) {
#pragma unroll
      for (int d = 0; d < DEPTH; ++d) {
        if (p + d < count) {
          const uint4 cur[2] = {next[d][0], next[d][1]};
          if (p + DEPTH + d < count) {  // refill the slot before using what it held
            next[d][0] = ptx::load_streaming16(w + (2 * (p + DEPTH + d)) * 512);
            next[d][1] = ptx::load_streaming16(w + (2 * (p + DEPTH + d) + 1) * 512);
          }
#pragma unroll
          for (int j = 0; j < TT; ++j)
            if (p + d + 1 < count)
              xb[(d + 1) % 2][j] = __ldg(reinterpret_cast<const uint4*>(xi + j * x_tile_stride + (p + d + 1) * 512));
          multiply_pair<TT, MID>(cur, xb[d % 2], acc, mid);
        }
      }
    }
    if constexpr (MID) {
#pragma unroll
      for (int j = 0; j < TT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[j][r] += mid[j][r] * 0.0625f;
    }
    if (args.warps_k > 1) {  // K classes in warp order
      float* mine = reduce + ((size_t)(local * args.warps_k + kclass) * TT * 4) * 32 + lane;
#pragma unroll
      for (int j = 0; j < TT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) mine[(j * 4 + r) * 32] = acc[j][r];
      __syncthreads();
      const float* first = reduce + ((size_t)local * args.warps_k * TT * 4) * 32 + lane;
#pragma unroll
      for (int j = 0; j < TT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          float sum = first[(j * 4 + r) * 32];
          for (int c = 1; c < args.warps_k; ++c) sum += first[((c * TT + j) * 4 + r) * 32];
          acc[j][r] = sum;
        }
      __syncthreads();  // the next group writes `reduce` again
    }
    if (kclass != 0 || tile >= args.tiles) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = tile * 16 + g + 8 * half;
      if (row >= args.n) continue;
      const float window = __uint_as_float((uint32_t)(args.base[row] + 7) << 23);  // 2**(base - 120), exact
#pragma unroll
      for (int j = 0; j < TT; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int token = 8 * j + 2 * t + c;
          if (token < args.m)
            args.y[(size_t)token * args.ldy + row] =
                __float2bfloat16_rn(acc[j][2 * half + c] * window * args.x_scale[token]);
        }
    }
  }
  allow_next_grid();
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

// Blocks of `kernel` resident on a multiprocessor, and the multiprocessors, asked once per (device, block shape).
cudaError_t resident_blocks(const void* kernel, int threads, size_t smem, int* blocks, int* sms) {
  struct Known {
    const void* kernel;
    int device, threads;
    size_t smem;
    int blocks, sms;
  };
  static thread_local Known known[64];
  static thread_local int count = 0;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  for (int i = 0; i < min(count, 64); ++i)
    if (known[i].kernel == kernel && known[i].device == device && known[i].threads == threads && known[i].smem == smem) {
      *blocks = known[i].blocks;
      *sms = known[i].sms;
      return cudaSuccess;
    }
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, smem);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  known[count++ % 64] = {kernel, device, threads, smem, *blocks, *sms};
  return cudaSuccess;
}

template <int TT, bool MID>
cudaError_t launch_gemm(QpassFp8Args args, cudaStream_t stream) {
  const int warps = args.warps_k * args.tiles_per_block;
  const size_t smem = args.warps_k > 1 ? (size_t)warps * TT * 4 * 32 * sizeof(float) : 0;
  auto kernel = qpass_fp8_kernel<TT, MID>;
  int blocks = 0, sms = 0;
  cudaError_t err = resident_blocks((const void*)kernel, 32 * warps, smem, &blocks, &sms);
  if (err != cudaSuccess) return err;
  if (blocks < 1) return cudaErrorInvalidConfiguration;
  const int groups = (args.tiles + args.tiles_per_block - 1) / args.tiles_per_block;
  const int grid = min(groups, blocks * sms);
  // L2 prefetch: each warp's first pairs, kL2PrefetchBytes in all, so what it brings is still there when read
  const int pairs = args.k_padded / 64, per = (pairs + args.warps_k - 1) / args.warps_k;
  args.l2_prefetch_pairs = min(per, (int)(kL2PrefetchBytes / 1024 / ((size_t)grid * warps)));
  return launch(kernel, dim3(grid), dim3(32 * warps), smem, stream, args.overlap_prior, args);
}

// Built token tiles: 1-8, 9-16, 17-32, 33-40 (a 32-node tree and its root) and 41-64 rows.
template <bool MID>
cudaError_t dispatch(const QpassFp8Args& args, cudaStream_t stream) {
  const int tiles8 = (args.m + 7) / 8;
  if (tiles8 <= 1) return launch_gemm<1, MID>(args, stream);
  if (tiles8 <= 2) return launch_gemm<2, MID>(args, stream);
  if (tiles8 <= 4) return launch_gemm<4, MID>(args, stream);
  if (tiles8 <= 5) return launch_gemm<5, MID>(args, stream);
  return launch_gemm<8, MID>(args, stream);
}

}  // namespace

cudaError_t qpass_fp8_quantize(const __nv_bfloat16* x, int m, int k, int ldx, int k_padded, uint8_t* x_image,
                               float* x_scale, bool overlap_prior, cudaStream_t stream) {
  if (m < 1 || m > kQpassFp8MaxRows || k % 8 || ldx % 8 || k_padded % 128 || k > k_padded) return cudaErrorInvalidValue;
  return launch(quantize_kernel, dim3(m), dim3(kQuantThreads), 0, stream, overlap_prior, x, k, ldx, k_padded, x_image,
                x_scale);
}

cudaError_t qpass_fp8_gemm(const QpassFp8Args& args, bool midpoint, cudaStream_t stream) {
  if (args.m < 1 || args.m > kQpassFp8MaxRows || args.warps_k < 1 || args.tiles_per_block < 1 ||
      args.warps_k * args.tiles_per_block > kQpassFp8MaxWarps || args.k_padded % 128)
    return cudaErrorInvalidValue;
  return midpoint ? dispatch<true>(args, stream) : dispatch<false>(args, stream);
}
