// The compaction of the certified head's INT8 pass: the stage list's rows that reach the final best lower bound, into
// the candidate list. Shared by the compaction launch (int8_pass.cu; exact_head.cu where its compacting rescore cannot
// run) and the rescore that compacts the stage lists itself before rescoring them (exact_head.cu).
#pragma once
#include <math.h>
#include <stdint.h>

namespace {

// Largest value first, lowest index on ties: orderable float bits (+0 for -0, so both zeros tie) above ~index. The
// rescore's token keys (logits) and the compaction's incumbents (upper bounds).
__device__ __forceinline__ unsigned long long token_key(float value, int index) {
  const uint32_t bits = __float_as_uint(value == 0.f ? 0.f : value);
  const uint32_t order = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  return (static_cast<unsigned long long>(order) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(index));
}

// The value and index a nonzero token_key was made from.
__device__ __forceinline__ float key_value(unsigned long long key) {
  const uint32_t order = static_cast<uint32_t>(key >> 32);
  return __uint_as_float((order & 0x80000000u) ? order & 0x7FFFFFFFu : ~order);
}
__device__ __forceinline__ int key_index(unsigned long long key) {
  return static_cast<int>(~static_cast<uint32_t>(key));
}

constexpr int kCompactSplit = 8;  // blocks per input row of the compaction launch
constexpr int kCompactThreads = 256;

// What the compaction reads (the pass's stage lists, stage_cap entries a row, and its best lower bounds) and writes
// (count, zero before, and the candidate lists of cap entries a row).
struct StageLists {
  const int32_t* stage_count;  // [m] (above stage_cap: the row takes the full head)
  const int32_t* stage_idx;    // [m][stage_cap]
  const float* stage_upper;    // [m][stage_cap]
  const float* best_lower;     // [m]
  int32_t* count;              // [m]
  int32_t* cand_idx;           // [m][cap]
  float* cand_upper;           // [m][cap]
  int stage_cap, cap;
  unsigned long long* incumbent;  // [m] or null: token_key of the kept row with the largest upper bound (zero before)
};

// One input row's stage list, slice `slice` of `slices`: each thread tests entries slice * blockDim + t +
// i * slices * blockDim, four at a time with their indices loaded beside their bounds, and each warp reserves its
// kept rows' places with one atomicAdd on the row's count (zero before the first slice), so no block waits on
// another. The order of the list varies with the atomics; which rows it holds does not. listed <= the stage list's
// capacity; cand_idx and cand_upper are the row's candidate list of cap entries (the places past cap are counted,
// not written). incumbent (or null): the largest token_key(upper bound, row) of the kept rows, by atomic max.
__device__ __forceinline__ void compact_stage_slice(int slice, int slices, int listed, float best,
                                                    const int32_t* stage_idx, const float* stage_upper,
                                                    int32_t* count, int32_t* cand_idx, float* cand_upper, int cap,
                                                    unsigned long long* incumbent) {
  constexpr int kUnroll = 4;
  const int lane = threadIdx.x & 31, threads = blockDim.x, step = slices * threads;
  for (int start = slice * threads + threadIdx.x; start - (int)threadIdx.x < listed; start += kUnroll * step) {
    float up[kUnroll];
    int32_t idx[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int e = start + u * step;
      up[u] = e < listed ? stage_upper[e] : -INFINITY;
      idx[u] = e < listed ? stage_idx[e] : 0;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool keep = start + u * step < listed && up[u] >= best;
      const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, keep);
      if (ballot == 0) continue;
      int base = 0;
      if (lane == 0) base = atomicAdd(count, __popc(ballot));
      const int pos = __shfl_sync(0xFFFFFFFFu, base, 0) + __popc(ballot & ((1u << lane) - 1u));
      if (keep && pos < cap) {
        cand_idx[pos] = idx[u];
        cand_upper[pos] = up[u];
      }
      if (incumbent) {
        unsigned long long key = keep ? token_key(up[u], idx[u]) : 0ull;
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) key = max(key, __shfl_xor_sync(0xFFFFFFFFu, key, offset));
        if (lane == 0) atomicMax(incumbent, key);
      }
    }
  }
}

// Input row m's part `slice` of `slices`: count = cap + 1 (the full head) where the stage list overflowed or the
// prologue flagged the row; above cap where more rows survive than the list holds.
__device__ __forceinline__ void compact_stage_row(const StageLists& l, int m, int slice, int slices) {
  const int listed = l.stage_count[m];
  if (listed > l.stage_cap) {
    if (slice == 0 && threadIdx.x == 0) l.count[m] = l.cap + 1;
    return;
  }
  compact_stage_slice(slice, slices, listed, l.best_lower[m], l.stage_idx + (size_t)m * l.stage_cap,
                      l.stage_upper + (size_t)m * l.stage_cap, l.count + m, l.cand_idx + (size_t)m * l.cap,
                      l.cand_upper + (size_t)m * l.cap, l.cap, l.incumbent ? l.incumbent + m : nullptr);
}

// The compaction launch: grid (m, kCompactSplit) of kCompactThreads threads, so no block waits on another (one block
// per row testing 256 entries a round took 15 us at 32 rows, 51 us on longer stage lists).
__global__ void __launch_bounds__(kCompactThreads) compact_kernel(StageLists l) {
  compact_stage_row(l, blockIdx.x, blockIdx.y, gridDim.y);
}

}  // namespace
