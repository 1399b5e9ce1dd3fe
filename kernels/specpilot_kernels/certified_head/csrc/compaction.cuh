// The compaction of the certified head's INT8 pass: the stage list's rows that reach the final best lower bound,
// into the candidate list. Shared by the pass's own compaction launch (int8_pass.cu) and the rescore that compacts
// the stage lists itself before rescoring them (exact_head.cu).
#pragma once
#include <math.h>
#include <stdint.h>

// One input row's stage list, slice `slice` of `slices`: each thread tests entries slice * blockDim + t +
// i * slices * blockDim, four at a time with their indices loaded beside their bounds, and each warp reserves its
// kept rows' places with one atomicAdd on the row's count (zero before the first slice), so no block waits on
// another. The order of the list varies with the atomics; which rows it holds does not. listed <= the stage list's
// capacity; cand_idx and cand_upper are the row's candidate list of cap entries (the places past cap are counted,
// not written).
__device__ __forceinline__ void compact_stage_slice(int slice, int slices, int listed, float best,
                                                    const int32_t* stage_idx, const float* stage_upper,
                                                    int32_t* count, int32_t* cand_idx, float* cand_upper, int cap) {
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
    }
  }
}
