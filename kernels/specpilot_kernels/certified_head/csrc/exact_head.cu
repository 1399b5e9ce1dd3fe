// The exact head's arithmetic on CUDA GPUs (sm_80+): one warp computes one logit x_m . w_r, and both the full
// head (the fallback and reference) and the rescoring of the certified head's survivors call the same
// warp_dot, so a row's logit is the same bits wherever it is computed.
//
// The order of a logit's sum: lane l takes the 16-byte pieces l, l + 32, l + 64, ... of the row (8 bf16
// each) and accumulates their products one after another with FMA in FP32 (bf16 x bf16 products are exact in
// FP32, so each FMA rounds once, as an addition); the 32 lane sums are then added by a xor butterfly (16, 8, 4,
// 2, 1; every lane ends with the same value since FP32 addition commutes). Every product passes through at most
// K/256 + 5 additions, well inside the gamma_K the bound allows for the exact head.
//
// The rescore reads each listed candidate's bf16 row once, a whole row (10 KB at K = 5120) in flight per warp
// (CHUNK 16-byte loads per lane before the first FMA), over a persistent grid whose warps take the (row,
// candidate) pairs of all input rows in turn, so a row with many survivors does not wait for one block. Each
// logit goes into its input row's packed key (orderable logit bits above the complemented token index) with a
// 64-bit atomic max, which keeps the largest logit and on ties the lowest index, in any order; the last block
// to finish (a ticket counter) turns the keys into tokens and sets keys and ticket back to zero for the next
// call (the state is the caller's per-stream workspace, zero on first use).
//
// Launches may overlap the kernel before them in the stream (programmatic dependent launch, sm_90+): nothing
// written by an earlier kernel is read before griddepcontrol.wait.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>

#include "exact_head.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 20;  // 16-byte pieces per lane in flight: a 5120-wide row in one go

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__device__ __forceinline__ float bf16_lo(uint32_t word) { return __uint_as_float(word << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t word) { return __uint_as_float(word & 0xFFFF0000u); }

__device__ __forceinline__ float fma_pieces(const uint4& x, const uint4& w, float acc) {
  acc = fmaf(bf16_lo(x.x), bf16_lo(w.x), acc);
  acc = fmaf(bf16_hi(x.x), bf16_hi(w.x), acc);
  acc = fmaf(bf16_lo(x.y), bf16_lo(w.y), acc);
  acc = fmaf(bf16_hi(x.y), bf16_hi(w.y), acc);
  acc = fmaf(bf16_lo(x.z), bf16_lo(w.z), acc);
  acc = fmaf(bf16_hi(x.z), bf16_hi(w.z), acc);
  acc = fmaf(bf16_lo(x.w), bf16_lo(w.w), acc);
  acc = fmaf(bf16_hi(x.w), bf16_hi(w.w), acc);
  return acc;
}

__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// x_m . w_r in the order described above; every lane returns it. x and w are rows of `pieces` 16-byte pieces.
// STREAM: the weight row is read once (no L1 allocation), else through L1 (the full head reads it once per input row).
template <bool STREAM>
__device__ __forceinline__ float warp_dot(const uint4* x, const uint4* w, int pieces, int lane) {
  float acc = 0.f;
  for (int base = lane; base < pieces; base += 32 * kChunk) {
    uint4 wv[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int p = base + 32 * i;
      if (p < pieces) wv[i] = STREAM ? load_streaming(w + p) : __ldg(w + p);
    }
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int p = base + 32 * i;
      if (p < pieces) acc = fma_pieces(__ldg(x + p), wv[i], acc);
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, offset);
  return acc;
}

// Largest logit first, lowest index on ties: orderable logit bits (+0 for -0, so both zeros tie) above ~index.
__device__ __forceinline__ unsigned long long token_key(float logit, int index) {
  const uint32_t bits = __float_as_uint(logit == 0.f ? 0.f : logit);
  const uint32_t order = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  return (static_cast<unsigned long long>(order) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(index));
}

// Full head: warp r of the grid computes w_r against every input row; the weight row comes through L1.
__global__ void __launch_bounds__(kThreads) exact_head_kernel(ExactHeadArgs a) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * kWarps + (threadIdx.x >> 5);
  wait_for_prior_grid();
  if (r >= a.n) return;
  const int pieces = a.k / 8;
  const uint4* w = reinterpret_cast<const uint4*>(a.weight) + (size_t)r * pieces;
  for (int m = 0; m < a.m; ++m) {
    const float logit = warp_dot<false>(reinterpret_cast<const uint4*>(a.x) + (size_t)m * pieces, w, pieces, lane);
    if (lane == 0) a.logits[(size_t)m * a.n + r] = logit;
  }
}

// The last block to finish turns the keys into tokens and leaves keys and ticket zero: every thread's atomics are
// ordered before its block's ticket.
__device__ __forceinline__ void finish_tokens(const ExactHeadArgs& a, const RescoreArgs& r) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(r.ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int m = threadIdx.x; m < a.m; m += kThreads) {
    const unsigned long long key = atomicExch(r.keys + m, 0ull);
    const int n = r.count[m];
    r.tokens[m] = n > r.cap ? -1 : key == 0 ? INT32_MAX : (int64_t)(~static_cast<uint32_t>(key));
  }
  if (threadIdx.x == 0) *r.ticket = 0;
}

// Rescore: the flat list of every input row's listed candidates (row m's first min(count, 0 if count > cap)
// entries), pair i taken by warp i mod (warps in the grid); a pair whose upper bound is below the row's best
// lower bound is skipped (the Triton pass lists such rows; the CUDA pass's compaction has dropped them).
__global__ void __launch_bounds__(kThreads, 2) rescore_kernel(ExactHeadArgs a, RescoreArgs r) {
  const int lane = threadIdx.x & 31;
  const int warp_id = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int total_warps = gridDim.x * kWarps;
  const int pieces = a.k / 8;
  allow_next_grid();
  wait_for_prior_grid();
  // The rows are walked in groups of 32 (lane j: row group_row + j); pair i lies in the group whose
  // inclusive prefix of listed counts first exceeds i - group_base.
  int group_row = 0, group_base = 0, incl = 0;
  auto load_group = [&]() {
    const int m = group_row + lane;
    int n = m < a.m ? r.count[m] : 0;
    n = n > r.cap ? 0 : n;
    incl = n;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xFFFFFFFFu, incl, d);
      if (lane >= d) incl += v;
    }
  };
  load_group();
  for (int i = warp_id;; i += total_warps) {
    while (i - group_base >= __shfl_sync(0xFFFFFFFFu, incl, 31) && group_row + 32 < a.m) {
      group_base += __shfl_sync(0xFFFFFFFFu, incl, 31);
      group_row += 32;
      load_group();
    }
    const int local = i - group_base;
    if (local >= __shfl_sync(0xFFFFFFFFu, incl, 31)) break;
    const int j = __popc(__ballot_sync(0xFFFFFFFFu, incl <= local));  // row group_row + j holds pair i
    const int m = group_row + j;
    const int before = __shfl_sync(0xFFFFFFFFu, incl, max(j - 1, 0));  // pairs of the group's rows before m
    const int pos = local - (j == 0 ? 0 : before);
    const size_t entry = (size_t)m * r.cap + pos;
    if (r.cand_upper[entry] < r.best_lower[m]) continue;
    const int row = r.cand_idx[entry];
    const float logit = warp_dot<true>(reinterpret_cast<const uint4*>(a.x) + (size_t)m * pieces,
                                       reinterpret_cast<const uint4*>(a.weight) + (size_t)row * pieces, pieces, lane);
    if (lane == 0) atomicMax(r.keys + m, token_key(logit, row));
  }
  finish_tokens(a, r);
}

// kernel<<<grid, kThreads>>>(args...), overlapping the kernel before it in the stream where asked (sm_90+).
template <typename... Args>
cudaError_t launch(void (*kernel)(Args...), dim3 grid, cudaStream_t stream, bool overlap_prior, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = overlap_prior ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace

cudaError_t exact_head_launch(const ExactHeadArgs& a, cudaStream_t stream, bool overlap_prior) {
  if (a.m < 1 || a.k % 8 || a.n < 1) return cudaErrorInvalidValue;
  return launch(exact_head_kernel, dim3((a.n + kWarps - 1) / kWarps), stream, overlap_prior, a);
}

cudaError_t rescore_launch(const ExactHeadArgs& a, const RescoreArgs& r, cudaStream_t stream, bool overlap_prior) {
  if (a.m < 1 || a.k % 8 || r.cap < 1 || r.blocks_per_sm < 1) return cudaErrorInvalidValue;
  static thread_local int sms[16] = {};  // multiprocessors per device, asked once
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (sms[device & 15] == 0) {
    err = cudaDeviceGetAttribute(&sms[device & 15], cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
  }
  return launch(rescore_kernel, dim3(sms[device & 15] * r.blocks_per_sm), stream, overlap_prior, a, r);
}
