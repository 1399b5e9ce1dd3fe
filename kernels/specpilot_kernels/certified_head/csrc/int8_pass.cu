// The certified head's INT8 pass in CUDA C++ (sm_80+, run on the H200): approximate logits, their
// radius, the running best lower bound and the candidate rows, as _int8_bound_kernel (int8_bound.py).
//
// Three launches, all graphable (the third, the compaction, may be left to the rescore). The prologue (one
// block per input row) computes ||x_m|| in FP32, picks a power of two 2^e_m that puts max|x_m| in
// [2^14, 2^15), writes x_m * 2^e_m in fp16 (in the MMA's B-fragment order, token rows padded to 8, 16 or 32
// with zeros) and checks that every element came back exactly; it resets the row's best lower bound and
// stage count, and marks a row that does not convert exactly (or whose max|x| lies outside [2^-50, 2^50))
// for the full-head fallback. The pass streams the weights once: each warp owns units of tiles_per_warp
// 16-row tiles and walks their K in 2 KB chunks through a private shared-memory ring filled by cp.async
// (evict-first in L2); the activations come through a block-shared ring in batches of CPB chunks, the
// block's warps meeting once per batch (or through L1), and each load serves every tile of the unit. The
// default partition (3 ring slots, batches of 8, 1-2 tiles) runs the batched kernel, which fixes both at
// compile time and carries its addresses in running offsets; every other partition the general one.
// Weights are stored pre-shuffled in the mma.sync fragment layout (fragments.py) as
// offset-binary bytes u = q + 128: prmt puts a byte under 0x64 (fp16 1024 + u) and one sub.f16x2 of
// 1152 leaves q exactly, two weights per instruction pair. m16n8k16 f16 x f16 -> f32 with weights on
// the 16-row side and tokens on the 8-wide side. The compaction keeps the listed rows that reach the
// final best lower bound.
//
// Why the certificate holds unchanged: q (|q| <= 127) and x_m 2^e_m (fp16) are exact, and so is their
// product in FP32 (7 + 11 significant bits), so the accumulation is a sum of exact products in FP32
// like the reference's (gamma_K covers any order and the tensor cores' truncation). Scaling by 2^e_m
// commutes with every rounding while nothing under- or overflows: scaled elements are multiples of
// 2^-24 below 2^15 in magnitude, the sum stays below 2^35, and the range check keeps acc * 2^-e_m
// normal. So acc * 2^-e_m is the FP32 dot product x . q of some summation order, and
// I = (acc * 2^-e_m) * s_r, radius = (||x|| c_r)(1 + SLACK) + |I| SLACK are the reference's.
//
// Best lower bound: a warp publishes a unit's best lower bound with a fire-and-forget atomic max
// (float order through int max / uint min) when it beats the value it read; it keeps the rows whose
// upper bound reaches max(value read, unit best). Both are at most the final best, so a dropped row
// provably is not the argmax. Kept rows go to a large stage list (one atomicAdd per warp and input row):
// early in the pass every warp still sees a low running best (the whole grid starts at once), so the
// stage list holds several times the final survivors; the compaction (8 blocks per input row, places in
// the candidate list taken by atomics: a launch of its own, or the first step of the CUDA rescore,
// exact_head.cu) keeps those that reach the final best, so the rescore reads exactly the reference's
// survivors (in an order that varies; its result does not).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <algorithm>

#include "compaction.cuh"
#include "int8_pass.cuh"
#include "pdl.cuh"
#include "ptx.cuh"

namespace {

constexpr int kSlotBytes = 2048;  // one ring slot: 4 (tile, 32-column block) fragments of 512 bytes
constexpr int kMaxRows = 32;
constexpr int kMaxStages = 12;
constexpr int kPrologueThreads = 256;
constexpr uint32_t kOffsetHalves = 0x64646464u;  // the fp16 exponent byte of 1024 + u
constexpr uint32_t kBias2 = 0x64806480u;         // 1152 = 1024 + 128 in both fp16 lanes

__device__ __forceinline__ uint32_t to_f16_pair(uint32_t word, uint32_t selector) {
  uint32_t widened, out;
  widened = ptx::permute_bytes(word, kOffsetHalves, selector);
  asm("sub.f16x2 %0, %1, %2;" : "=r"(out) : "r"(widened), "r"(kBias2));
  return out;
}

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3};
  ptx::mma_f16_16816(c, a, b0, b1);
}

// Wait until at most `pending` of this thread's copy groups are outstanding (the depth is a launch value).
__device__ __forceinline__ void copy_wait(int pending) {
  switch (pending) {
    case 0: ptx::cp_async_wait<0>(); break;
    case 1: ptx::cp_async_wait<1>(); break;
    case 2: ptx::cp_async_wait<2>(); break;
    case 3: ptx::cp_async_wait<3>(); break;
    case 4: ptx::cp_async_wait<4>(); break;
    case 5: ptx::cp_async_wait<5>(); break;
    case 6: ptx::cp_async_wait<6>(); break;
    case 7: ptx::cp_async_wait<7>(); break;
    case 8: ptx::cp_async_wait<8>(); break;
    case 9: ptx::cp_async_wait<9>(); break;
    default: ptx::cp_async_wait<10>(); break;
  }
}

// Atomic max on a float in memory: int max orders non-negative floats, uint min orders negative ones,
// and any non-negative value beats any negative one under both. Fire and forget.
__device__ __forceinline__ void atomic_max_float(float* addr, float value) {
  if (__float_as_int(value) >= 0)
    atomicMax(reinterpret_cast<int*>(addr), __float_as_int(value));
  else
    atomicMin(reinterpret_cast<unsigned int*>(addr), __float_as_uint(value));
}

__device__ __forceinline__ float load_relaxed(const float* addr) {
  float value;
  asm volatile("ld.relaxed.gpu.global.f32 %0, [%1];" : "=f"(value) : "l"(addr));
  return value;
}

template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T value, Op op, T* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // scratch may still be read by the previous reduction
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = scratch[0];
  for (int w = 1; w < kPrologueThreads / 32; ++w) value = op(value, scratch[w]);
  return value;
}

// Token tiles of 8 the pass multiplies for m rows (padding rows are zero).
__host__ __device__ constexpr int token_tiles(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : 4; }

// One block per row of the padded token tiles. x16 is written in B-fragment order,
// [k/32][token tile][32 lanes][8 halves]: lane 4g + t of tile j holds row 8j + g, columns 8t .. 8t+7
// of the 32-column block, so a warp's activation load is 512 contiguous bytes.
__global__ void __launch_bounds__(kPrologueThreads) prologue_kernel(Int8PassArgs a) {
  __shared__ float scratch[kPrologueThreads / 32];
  const int m = blockIdx.x;
  const int tiles = token_tiles(a.m);
  const int vectors = a.k / 8;
  uint4* out = reinterpret_cast<uint4*>(a.x16);
  auto out_index = [&](int v) { return ((size_t)(v >> 2) * tiles + (m >> 3)) * 32 + (m & 7) * 4 + (v & 3); };
  if (m >= a.m) {
    for (int v = threadIdx.x; v < vectors; v += kPrologueThreads) out[out_index(v)] = make_uint4(0, 0, 0, 0);
    return;
  }
  const uint4* row = reinterpret_cast<const uint4*>(a.x + (size_t)m * a.k);
  float amax = 0.f, sum_sq = 0.f;
  for (int v = threadIdx.x; v < vectors; v += kPrologueThreads) {
    const uint4 raw = row[v];
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float f = __bfloat162float(e[i]);
      amax = fmaxf(amax, fabsf(f));  // fmaxf drops NaN: the range check below catches NaN through sum_sq
      sum_sq = fmaf(f, f, sum_sq);
    }
  }
  amax = block_reduce(amax, [](float p, float q) { return fmaxf(p, q); }, scratch);
  sum_sq = block_reduce(sum_sq, [](float p, float q) { return p + q; }, scratch);
  // max|x| in [2^-50, 2^50): the products' sums stay normal after unscaling and ||x||^2 stays finite
  bool ok = amax >= 0x1p-50f && amax < 0x1p50f && isfinite(sum_sq);
  int exponent = 0;
  frexpf(amax, &exponent);  // amax < 2^exponent <= 2 amax
  const int shift = ok ? 15 - exponent : 0;
  const float up = ldexpf(1.f, shift);
  for (int v = threadIdx.x; v < vectors; v += kPrologueThreads) {
    const uint4 raw = row[v];
    const __nv_bfloat162* e = reinterpret_cast<const __nv_bfloat162*>(&raw);
    uint4 packed;
    uint32_t* halves = reinterpret_cast<uint32_t*>(&packed);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(e[i]);
      const float lo = f.x * up, hi = f.y * up;  // exact: a power of two inside the range
      const __half2 h = __floats2half2_rn(lo, hi);
      const float2 back = __half22float2(h);
      ok = ok && back.x == lo && back.y == hi;
      halves[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
    out[out_index(v)] = packed;
  }
  ok = __syncthreads_and(ok);
  if (threadIdx.x == 0) {
    a.inv_scale[m] = ldexpf(1.f, -shift);
    a.norm[m] = sqrtf(sum_sq) * a.norm_inflation;
    a.best_lower[m] = -INFINITY;
    a.stage_count[m] = ok ? 0 : a.stage_cap + 1;
    a.count[m] = 0;  // the compaction counts into it
  }
}

template <int N>
__device__ __forceinline__ void copy_wait_const() {
  ptx::cp_async_wait<N>();
}

// Per lane: the unscaling and norm of rows 2t + h of each token tile (zero for padding rows).
template <int MT>
__device__ __forceinline__ void load_row_factors(const Int8PassArgs& a, int t, float (&inv_scale)[MT][2],
                                                 float (&norm)[MT][2]) {
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = j * 8 + 2 * t + h;
      inv_scale[j][h] = m < a.m ? a.inv_scale[m] : 0.f;
      norm[j][h] = m < a.m ? a.norm[m] : 0.f;
    }
}

// Every accumulator of the T weight tiles x MT token tiles to zero (a kernel's start).
template <int MT, int T>
__device__ __forceinline__ void zero_accumulators(float (&acc)[T][MT][4]) {
#pragma unroll
  for (int i = 0; i < T; ++i)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;
}

// One 2 KB chunk into the accumulators: this lane's 16 bytes of each (tile i, block b) fragment at
// slot + (i * 4/T + b) * 512, times the token tiles' activations load_x(b, j) (the B registers of block b).
template <int MT, int T, typename LoadX>
__device__ __forceinline__ void multiply_chunk(float (&acc)[T][MT][4], const uint8_t* slot, LoadX load_x) {
  constexpr int kBlocksPerChunk = 4 / T;
#pragma unroll
  for (int b = 0; b < kBlocksPerChunk; ++b) {
    uint4 xv[MT];
#pragma unroll
    for (int j = 0; j < MT; ++j) xv[j] = load_x(b, j);
#pragma unroll
    for (int i = 0; i < T; ++i) {
      const uint4 w = *reinterpret_cast<const uint4*>(slot + (i * kBlocksPerChunk + b) * 512);
      // word w: registers 2w (bytes 0, 1) and 2w + 1 (bytes 2, 3); registers 0-3 are k16 step 0
      const uint32_t r0 = to_f16_pair(w.x, 0x4140u), r1 = to_f16_pair(w.x, 0x4342u);
      const uint32_t r2 = to_f16_pair(w.y, 0x4140u), r3 = to_f16_pair(w.y, 0x4342u);
      const uint32_t r4 = to_f16_pair(w.z, 0x4140u), r5 = to_f16_pair(w.z, 0x4342u);
      const uint32_t r6 = to_f16_pair(w.w, 0x4140u), r7 = to_f16_pair(w.w, 0x4342u);
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        mma_f16(acc[i][j], r0, r1, r2, r3, xv[j].x, xv[j].y);
        mma_f16(acc[i][j], r4, r5, r6, r7, xv[j].z, xv[j].w);
      }
    }
  }
}

// A unit's epilogue inputs, loaded before its last multiplies: the scale and radius coefficient of the
// lane's vocabulary rows g, g + 8 of each tile, and (lanes g = 0) the running best of rows 2t + h.
template <int MT, int T>
__device__ __forceinline__ void load_unit_bounds(const Int8PassArgs& a, int tile0, int g, int t,
                                                 float (&row_scale)[T][2], float (&row_coef)[T][2],
                                                 float (&known)[MT][2]) {
#pragma unroll
  for (int i = 0; i < T; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = (tile0 + i) * 16 + g + 8 * h;
      row_scale[i][h] = n < a.n ? __ldg(a.scale + n) : 0.f;
      row_coef[i][h] = n < a.n ? __ldg(a.radius_coef + n) : 0.f;
    }
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = j * 8 + 2 * t + h;
      known[j][h] = g == 0 && m < a.m ? load_relaxed(a.best_lower + m) : -INFINITY;
    }
}

// Epilogue of the unit at tile0, per input row 2t + h of each token tile: bounds, the unit's best lower bound,
// candidates; the accumulators are zeroed for the next unit. Row r of a tile's fragment is vocabulary row
// g + 8r, in accumulator h + 2r.
template <int MT, int T>
__device__ __forceinline__ void unit_epilogue(const Int8PassArgs& a, float (&acc)[T][MT][4], int tile0, int lane,
                                              const float (&inv_scale)[MT][2], const float (&norm)[MT][2],
                                              const float (&row_scale)[T][2], const float (&row_coef)[T][2],
                                              const float (&known)[MT][2]) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = j * 8 + 2 * t + h;
      float lower[T][2], upper[T][2];
      float best = -INFINITY;
#pragma unroll
      for (int i = 0; i < T; ++i)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int n = (tile0 + i) * 16 + g + 8 * r;
          const float approx = (acc[i][j][h + 2 * r] * inv_scale[j][h]) * row_scale[i][r];
          const float radius = (norm[j][h] * row_coef[i][r]) * (1.f + a.slack) + fabsf(approx) * a.slack;
          const bool valid = n < a.n && m < a.m;
          lower[i][r] = valid ? approx - radius : -INFINITY;
          upper[i][r] = valid ? approx + radius : -INFINITY;
          best = fmaxf(best, lower[i][r]);
          acc[i][j][h + 2 * r] = 0.f;
        }
#pragma unroll
      for (int offset = 4; offset < 32; offset <<= 1) best = fmaxf(best, __shfl_xor_sync(0xFFFFFFFFu, best, offset));
      if (g == 0 && m < a.m && best > known[j][h]) atomic_max_float(a.best_lower + m, best);
      // lane t (g = 0) read the running best of row m; every lane of that row takes it
      const float threshold = fmaxf(best, __shfl_sync(0xFFFFFFFFu, known[j][h], t));
      // invalid rows carry upper = -inf: they must not pass a threshold that is still -inf
      auto keep = [&](float upper_bound) { return upper_bound > -INFINITY && upper_bound >= threshold; };
      int kept = 0;
#pragma unroll
      for (int i = 0; i < T; ++i) kept += keep(upper[i][0]) + keep(upper[i][1]);
      if (!__any_sync(0xFFFFFFFFu, kept > 0)) continue;
      // One atomicAdd per row m: the 8 lanes of row m (lanes t, t + 4, ..., t + 28) scan their counts.
      int before = kept;
#pragma unroll
      for (int d = 4; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(0xFFFFFFFFu, before, d);
        if (lane >= d) before += v;
      }
      const int total = __shfl_sync(0xFFFFFFFFu, before, 28 + t);
      int base = 0;
      if (g == 0 && total > 0) base = atomicAdd(a.stage_count + m, total);
      int pos = __shfl_sync(0xFFFFFFFFu, base, t) + before - kept;
#pragma unroll
      for (int i = 0; i < T; ++i)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          if (keep(upper[i][r])) {
            if (pos < a.stage_cap) {
              a.stage_idx[(size_t)m * a.stage_cap + pos] = (tile0 + i) * 16 + g + 8 * r;
              a.stage_upper[(size_t)m * a.stage_cap + pos] = upper[i][r];
            }
            ++pos;
          }
    }
}

// MT token tiles of 8 (up to 8 * MT rows); T 16-row tiles per unit. The 16 accumulator tiles of
// MT = T = 4 need more than 128 registers: that variant runs one 8-warp block per multiprocessor.
// XS = false: each warp owns `units_per_group` consecutive units and reads activations through L1.
// XS = true: the block's warps walk K in step over groups of one unit per warp (`units_per_group`
// consecutive groups per block); each chunk's activations are copied once into a block-shared ring
// beside the weight rings, so the multiprocessor reads them from L2 once per group whatever L1 holds.
// XS with CPB > 1: the activations come in batches of CPB chunks (a ring of ceil((stages - 1) / CPB) + 1
// batches) and the block meets at a barrier once per batch instead of once per chunk, so its warps drift
// apart by up to CPB chunks between barriers instead of moving in lockstep.
template <int MT, int T, bool XS, int CPB>
__global__ void __launch_bounds__(256, MT * T >= 16 ? 1 : 2) int8_pass_kernel(Int8PassArgs a, int stages,
                                                                               int units_per_group) {
  allow_next_grid();  // fires once every block has started: a launch overlapping the pass takes the places its
                      // blocks leave
  constexpr int kBlocksPerChunk = 4 / T;  // 32-column blocks per chunk: T tiles x 4/T blocks = one 2 KB slot
  constexpr int kActivationBytes = kBlocksPerChunk * MT * 512;  // one chunk's activations
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int kblocks = a.k / 32;
  const int chunks = kblocks / kBlocksPerChunk;
  const int units = a.n_padded / (16 * T);
  // Unit i of this warp is first_unit + i * unit_step; it exists while below `units`.
  int first_unit, unit_step, count_units;
  if (XS) {
    const int groups = (units + warps - 1) / warps;
    const int group_lo = blockIdx.x * units_per_group;
    count_units = max(0, min(groups - group_lo, units_per_group));  // the same for every warp of the block
    first_unit = group_lo * warps + warp;
    unit_step = warps;
  } else {
    first_unit = (blockIdx.x * warps + warp) * units_per_group;
    count_units = max(0, min(units - first_unit, units_per_group));
    unit_step = 1;
  }
  const int total = count_units * chunks;
  uint8_t* ring = smem + (size_t)warp * stages * kSlotBytes;
  const uint32_t ring_shared = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  uint8_t* x_ring = smem + (size_t)warps * stages * kSlotBytes;
  const int batch_lead = (stages - 2) / CPB + 1;  // batches in flight: CPB * lead >= stages - 1
  const int batch_slots = batch_lead + 1;
  const uint32_t x_ring_shared = static_cast<uint32_t>(__cvta_generic_to_shared(x_ring));
  uint64_t policy;
  policy = ptx::evict_first_policy();

  // Stream position p is chunk p % chunks of this warp's unit p / chunks; the copies run stages - 1
  // positions ahead of the multiplies, each side counting (unit, chunk) without divisions.
  int issue_unit = first_unit, issue_chunk = 0;
  auto issue = [&](int p, int slot) {
    if (p < total) {
      const int block0 = issue_chunk * kBlocksPerChunk;
      if (issue_unit < units) {
        const uint32_t dst = ring_shared + slot * kSlotBytes + lane * 16;
        const uint8_t* src = a.fragments + (((size_t)issue_unit * T * kblocks + block0) * 32 + lane) * 16;
#pragma unroll
        for (int i = 0; i < T; ++i)
#pragma unroll
          for (int b = 0; b < kBlocksPerChunk; ++b)
            ptx::cp_async16(dst + (i * kBlocksPerChunk + b) * 512, src + ((size_t)i * kblocks + b) * 512, policy);
      }
      if (++issue_chunk == chunks) {
        issue_chunk = 0;
        issue_unit += unit_step;
      }
    }
    ptx::cp_async_commit();
  };
  // Activation batches are issued in order, each at its (position, chunk, slot) counters: batch b holds
  // positions b CPB .. b CPB + CPB - 1, chunks of one unit (CPB divides chunks), so one contiguous piece of
  // x16, in batch slot b % batch_slots. Committed with the next weight group.
  constexpr int kBatchBytes = CPB * kActivationBytes;
  int act_pos = 0, act_chunk = 0, act_slot = 0;
  auto issue_activations = [&]() {
    if (act_pos < total) {
      const uint8_t* src = reinterpret_cast<const uint8_t*>(a.x16) + (size_t)act_chunk * kActivationBytes;
      const uint32_t dst = x_ring_shared + act_slot * kBatchBytes;
      for (int piece = threadIdx.x; piece < kBatchBytes / 16; piece += blockDim.x)
        ptx::cp_async16(dst + piece * 16, src + piece * 16);
    }
    act_pos += CPB;
    act_chunk = act_chunk + CPB == chunks ? 0 : act_chunk + CPB;
    act_slot = act_slot + 1 == batch_slots ? 0 : act_slot + 1;
  };
  if (XS)
    for (int b = 0; b < batch_lead; ++b) issue_activations();
  for (int s = 0; s < stages - 1; ++s) issue(s, s);

  float inv_scale[MT][2], norm[MT][2];
  load_row_factors<MT>(a, t, inv_scale, norm);

  float acc[T][MT][4];
  zero_accumulators(acc);

  int read_slot = 0, write_slot = stages - 1;
  int in_batch = 0, batch_slot = 0;  // position p is chunk in_batch of the activation batch in batch_slot
  float row_scale[T][2] = {}, row_coef[T][2] = {}, known[MT][2];
#pragma unroll
  for (int j = 0; j < MT; ++j) known[j][0] = known[j][1] = -INFINITY;
  // (unit, chunk) of position p, advanced in the loop header so that every `continue` advances it
  int unit = first_unit, chunk = 0;
  for (int p = 0; p < total; ++p, chunk = chunk + 1 == chunks ? 0 : chunk + 1, unit += chunk == 0 ? unit_step : 0) {
    // Each lane reads back the weight pieces it copied itself; with XS, at a batch's first chunk, the
    // block's warps meet: the batch's activations (committed `batch_lead` batches, >= stages - 1 positions,
    // ago) are complete for every thread, and the batch slot refilled next was read in the batch before.
    copy_wait(stages - 2);
    if (XS && in_batch == 0) {
      __syncthreads();
      issue_activations();  // batch_lead batches ahead of this one
    } else {
      __syncwarp();
    }
    issue(p + stages - 1, write_slot);
    write_slot = write_slot + 1 == stages ? 0 : write_slot + 1;
    const int tile0 = unit * T;
    const uint8_t* x_slot = x_ring + batch_slot * kBatchBytes + in_batch * kActivationBytes + lane * 16;
    if (++in_batch == CPB) {
      in_batch = 0;
      batch_slot = batch_slot + 1 == batch_slots ? 0 : batch_slot + 1;
    }
    if (XS && unit >= units) {  // a warp past the last unit only keeps the block's barriers
      read_slot = read_slot + 1 == stages ? 0 : read_slot + 1;
      continue;
    }
    if (chunk == chunks - 1)  // the epilogue's loads go out before the unit's last multiplies
      load_unit_bounds<MT, T>(a, tile0, g, t, row_scale, row_coef, known);
    const uint8_t* slot = ring + read_slot * kSlotBytes + lane * 16;
    read_slot = read_slot + 1 == stages ? 0 : read_slot + 1;
    multiply_chunk<MT, T>(acc, slot, [&](int b, int j) {
      if (XS) return *reinterpret_cast<const uint4*>(x_slot + (b * MT + j) * 512);
      const uint4* x_block = reinterpret_cast<const uint4*>(a.x16) + (size_t)(chunk * kBlocksPerChunk + b) * MT * 32;
      return __ldg(x_block + j * 32 + lane);
    });
    if (chunk == chunks - 1) unit_epilogue<MT, T>(a, acc, tile0, lane, inv_scale, norm, row_scale, row_coef, known);
  }
  ptx::cp_async_wait_all();
}

// The default partition's kernel: the shared-activation schedule (XS) with 3 ring slots and batches of 8
// chunks fixed at compile time and each chunk's addresses carried in running offsets: the weight copies walk
// a pointer through the unit (2 KB a chunk, one jump to the next unit), the ring and batch slots are offsets
// that wrap, a batch is 8 unrolled chunks (its activation offsets immediates) and the epilogue follows a
// unit's last batch instead of a test on every chunk: ~138 SASS instructions a 2 KB chunk at 32 rows instead
// of the general kernel's ~213. The copies and barriers are the general kernel's, in the same order: weights
// STAGES - 1 chunks ahead, activations one batch ahead, the block meeting once per batch.
constexpr int kBatchedStages = 3, kBatchedChunks = 8;  // the batched kernel's ring slots and chunks a batch

template <int MT, int T>
__global__ void __launch_bounds__(256, 2) int8_pass_batched_kernel(Int8PassArgs a, int units_per_group) {
  allow_next_grid();  // fires once every block has started: a launch overlapping the pass takes the places its
                      // blocks leave
  constexpr int STAGES = kBatchedStages, CPB = kBatchedChunks;
  static_assert(T <= 2 && CPB >= STAGES, "two tiles at most (128 registers); a unit's last copy in its last batch");
  constexpr int kBlocksPerChunk = 4 / T;
  constexpr int kActivationBytes = kBlocksPerChunk * MT * 512;
  constexpr int kBatchBytes = CPB * kActivationBytes;
  constexpr int kBatchRingBytes = 2 * kBatchBytes;  // one batch read, the next in flight (CPB >= STAGES - 1)
  constexpr int kRingBytes = STAGES * kSlotBytes;
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int t = lane & 3;
  const int kblocks = a.k / 32;
  const int chunks = kblocks / kBlocksPerChunk;
  const int batches_per_unit = chunks / CPB;
  const int units = a.n_padded / (16 * T);
  const int groups = (units + warps - 1) / warps;
  const int group_lo = blockIdx.x * units_per_group;
  const int count_units = max(0, min(groups - group_lo, units_per_group));  // the same for every warp of the block
  const int first_unit = group_lo * warps + warp;  // this warp's units: first_unit + i * warps, i < count_units
  // the positions that carry weights: a warp past the last unit only keeps the block's barriers
  const int own_chunks = first_unit < units ? min(count_units, (units - first_unit + warps - 1) / warps) * chunks : 0;
  uint8_t* ring = smem + (size_t)warp * kRingBytes;
  uint8_t* x_ring = smem + (size_t)warps * kRingBytes;
  uint64_t policy;
  policy = ptx::evict_first_policy();

  // Weight copies: this lane's 16 bytes of each (tile, block) of the next chunk; w_src walks a unit's chunks
  // 2 KB at a time and jumps to the next unit once its last chunk is issued (in the loop below).
  const size_t tile_bytes = (size_t)kblocks * 512;  // one 16-row tile over K
  const uint8_t* w_src = a.fragments + (size_t)first_unit * T * tile_bytes + lane * 16;
  const size_t unit_jump = ((size_t)warps * T - 1) * tile_bytes;  // from past a unit's tile 0 to the next unit
  const uint32_t w_ring = static_cast<uint32_t>(__cvta_generic_to_shared(ring)) + lane * 16;
  int w_issued = 0;
  auto issue_weights = [&](uint32_t slot_off) {
    if (w_issued < own_chunks) {
#pragma unroll
      for (int i = 0; i < T; ++i)
#pragma unroll
        for (int b = 0; b < kBlocksPerChunk; ++b)
          ptx::cp_async16(w_ring + slot_off + (i * kBlocksPerChunk + b) * 512, w_src + i * tile_bytes + b * 512,
                             policy);
      w_src += kBlocksPerChunk * 512;
    }
    ++w_issued;
    ptx::cp_async_commit();
  };
  // Activation batches in order: batch b is chunks b CPB .. b CPB + CPB - 1 of a unit (CPB divides chunks),
  // one contiguous piece of x16, into batch slot b % 2. Committed with the next weight group.
  const int block_batches = count_units * batches_per_unit;
  const uint32_t x_ring_shared = static_cast<uint32_t>(__cvta_generic_to_shared(x_ring)) + threadIdx.x * 16;
  const uint8_t* x16 = reinterpret_cast<const uint8_t*>(a.x16) + threadIdx.x * 16;
  int act_issued = 0, act_chunk = 0;
  uint32_t act_slot = 0;
  auto issue_activations = [&]() {
    if (act_issued < block_batches) {
      const uint8_t* src = x16 + (size_t)act_chunk * kActivationBytes;
      const uint32_t dst = x_ring_shared + act_slot;
      for (int offset = 0; offset < kBatchBytes - (int)threadIdx.x * 16; offset += blockDim.x * 16)
        ptx::cp_async16(dst + offset, src + offset);
    }
    ++act_issued;
    act_chunk = act_chunk + CPB == chunks ? 0 : act_chunk + CPB;
    act_slot = act_slot + kBatchBytes == kBatchRingBytes ? 0 : act_slot + kBatchBytes;
  };
  issue_activations();
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue_weights(s * kSlotBytes);

  float inv_scale[MT][2], norm[MT][2];
  load_row_factors<MT>(a, t, inv_scale, norm);
  float acc[T][MT][4];
  zero_accumulators(acc);
  float row_scale[T][2], row_coef[T][2], known[MT][2];

  // The slot read next, the one read last (refilled next: it is STAGES - 1 chunks ahead), the batch slot.
  uint32_t read_off = 0, write_off = (STAGES - 1) * kSlotBytes, x_read_off = 0;
  int unit = first_unit;
  for (int u = 0; u < count_units; ++u, unit += warps) {
    const bool active = unit < units;
    for (int batch = 0; batch < batches_per_unit; ++batch) {
      const uint8_t* x_batch = x_ring + x_read_off + lane * 16;
      x_read_off = x_read_off + kBatchBytes == kBatchRingBytes ? 0 : x_read_off + kBatchBytes;
      const bool last_batch = batch == batches_per_unit - 1;
#pragma unroll
      for (int c = 0; c < CPB; ++c) {
        // Each lane reads back the weight pieces it copied itself (no warp barrier needed); at a batch's first
        // chunk the block's warps meet: the batch's activations (committed a batch, >= STAGES - 1 chunks, ago)
        // are complete for every thread, and the batch slot refilled next was read in the batch before.
        copy_wait_const<STAGES - 2>();
        if (c == 0) {
          __syncthreads();
          issue_activations();  // the next batch
        }
        issue_weights(write_off);
        // chunk c + STAGES - 1 was issued: after the unit's last chunk the copies move on to the next unit
        if (c == CPB - STAGES && last_batch) w_src += unit_jump;
        const uint8_t* slot = ring + read_off + lane * 16;
        write_off = read_off;
        read_off = read_off == (STAGES - 1) * kSlotBytes ? 0 : read_off + kSlotBytes;
        if (!active) continue;
        if (last_batch && c == CPB - 1)  // the epilogue's loads go out before the unit's last multiplies
          load_unit_bounds<MT, T>(a, unit * T, lane >> 2, t, row_scale, row_coef, known);
        const uint8_t* x_chunk = x_batch + c * kActivationBytes;
        multiply_chunk<MT, T>(acc, slot, [&](int b, int j) {
          return *reinterpret_cast<const uint4*>(x_chunk + (b * MT + j) * 512);
        });
      }
    }
    if (active) unit_epilogue<MT, T>(a, acc, unit * T, lane, inv_scale, norm, row_scale, row_coef, known);
  }
  ptx::cp_async_wait_all();
}

// Launches kKernel(args, extra..., units per owner) as the persistent grid: shared memory for the weight
// rings (and with XS the activation batch ring), whole units per warp (XS: groups of one unit per warp per
// block), as even as their count allows.
template <auto kKernel, int MT, int T, bool XS, int CPB, typename... Extra>
cudaError_t launch_persistent(const Int8PassArgs& args, const Int8PassConfig& config, cudaStream_t stream,
                              Extra... extra) {
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int warps = config.warps_per_block;
  const int batch_slots = (config.stages - 2) / CPB + 2;
  const int smem = warps * config.stages * kSlotBytes + (XS ? batch_slots * CPB * (4 / T) * MT * 512 : 0);
  // Raised once per kernel and size (not on every launch, so that graph capture sees only the launch).
  static thread_local int smem_allowed[16] = {};
  int& allowed = smem_allowed[device & 15];
  if (smem > allowed) {
    err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    allowed = smem;
  }
  const int units = args.n_padded / (16 * T);
  const int pieces = XS ? (units + warps - 1) / warps : units;
  const int target = XS ? std::max(1, sms * config.warps_per_sm / warps) : sms * config.warps_per_sm;
  const int per_owner = (pieces + target - 1) / target;
  const int owners = (pieces + per_owner - 1) / per_owner;
  const int blocks = XS ? owners : (owners + warps - 1) / warps;
  kKernel<<<blocks, 32 * warps, smem, stream>>>(args, extra..., per_owner);
  return cudaGetLastError();
}

template <int MT, int T, bool XS, int CPB>
cudaError_t launch_pass(const Int8PassArgs& args, const Int8PassConfig& config, cudaStream_t stream) {
  return launch_persistent<int8_pass_kernel<MT, T, XS, CPB>, MT, T, XS, CPB>(args, config, stream, config.stages);
}

// The partition picks the kernel: the batched one for 3 ring slots and batches of 8 with 1-2 tiles, else the
// general one. chunks_per_barrier must divide a unit's chunks: the largest of 8, 4, 1 up to the asked one that does.
template <int MT, int T>
cudaError_t launch_batches(const Int8PassArgs& args, const Int8PassConfig& config, cudaStream_t stream) {
  if (!config.shared_activations) return launch_pass<MT, T, false, 1>(args, config, stream);
  const int chunks = args.k / 32 / (4 / T);
  if (config.chunks_per_barrier >= 8 && chunks % 8 == 0) {
    if constexpr (T <= 2)
      if (config.stages == kBatchedStages)
        return launch_persistent<int8_pass_batched_kernel<MT, T>, MT, T, true, kBatchedChunks>(args, config, stream);
    return launch_pass<MT, T, true, 8>(args, config, stream);
  }
  if (config.chunks_per_barrier >= 4 && chunks % 4 == 0) return launch_pass<MT, T, true, 4>(args, config, stream);
  return launch_pass<MT, T, true, 1>(args, config, stream);
}

template <int MT>
cudaError_t launch_tiles(const Int8PassArgs& args, const Int8PassConfig& config, cudaStream_t stream) {
  switch (config.tiles_per_warp) {
    case 1: return launch_batches<MT, 1>(args, config, stream);
    case 2: return launch_batches<MT, 2>(args, config, stream);
    default: return launch_batches<MT, 4>(args, config, stream);
  }
}

}  // namespace

cudaError_t int8_pass_launch(const Int8PassArgs& args, const Int8PassConfig& config, cudaStream_t stream,
                             bool compact) {
  const int tpw = config.tiles_per_warp;
  if (args.m < 1 || args.m > kMaxRows || args.k % 128 || args.n_padded % 64 || args.n > args.n_padded ||
      (tpw != 1 && tpw != 2 && tpw != 4) || config.warps_per_block < 1 || config.warps_per_block > 8 ||
      config.stages < 2 || config.stages > kMaxStages || config.warps_per_sm < 1 || config.chunks_per_barrier < 1)
    return cudaErrorInvalidValue;
  prologue_kernel<<<8 * token_tiles(args.m), kPrologueThreads, 0, stream>>>(args);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  switch (token_tiles(args.m)) {
    case 1: err = launch_tiles<1>(args, config, stream); break;
    case 2: err = launch_tiles<2>(args, config, stream); break;
    default: err = launch_tiles<4>(args, config, stream); break;
  }
  if (err != cudaSuccess || !compact) return err;
  const StageLists lists{args.stage_count, args.stage_idx, args.stage_upper, args.best_lower,
                         args.count,       args.cand_idx,  args.cand_upper,  args.stage_cap, args.cap};
  compact_kernel<<<dim3(args.m, kCompactSplit), kCompactThreads, 0, stream>>>(lists);
  return cudaGetLastError();
}
