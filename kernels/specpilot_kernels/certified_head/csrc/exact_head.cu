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
// (20 16-byte loads per lane before the first FMA; above 16 input rows half a row at a time, in more warps), over a
// persistent grid: block b takes the b-th of gridDim equal ranges of the flat list of every input row's (row,
// candidate) pairs, so a row with many survivors does not wait for one block, and copies each input row of its range
// into shared memory once (read from L2 for every pair, the same few input rows wanted by every warp of the grid at
// once, each piece's load was slow: 32 -> 25 us at 32 rows on the H200). Each logit goes into its input row's packed
// key (orderable logit bits above the complemented token index) with a 64-bit atomic max, which keeps the largest
// logit and on ties the lowest index, in any order; the last block to finish (a ticket counter) turns the keys into
// tokens and sets keys and ticket back to zero for the next call (the state is the caller's per-stream workspace,
// zero on first use).
//
// The rescore may also take the INT8 pass's stage lists instead of its candidate lists: its grid then compacts them
// first, as the compaction launch would (compaction.cuh), and its blocks meet in a grid barrier before the
// rescoring, so the certified call is the prologue, the pass and this one launch (on the H200 1-2 us less at 1-16
// rows than with the compaction launch between them; at 32 rows within the rounds' noise). It is launched
// cooperative, so the runtime starts it only when all its blocks can be resident together (else the compaction
// launch and the plain rescore run instead).
//
// Launches may overlap the kernel before them in the stream (programmatic dependent launch, sm_90+): nothing
// written by an earlier kernel is read before griddepcontrol.wait.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>

#include "compaction.cuh"
#include "exact_head.cuh"
#include "pdl.cuh"
#include "ptx.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 20;  // 16-byte pieces per lane in flight: a 5120-wide row in one go

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

__device__ __forceinline__ uint4 load_streaming(const uint4* p) { return ptx::load_streaming16(p); }

// Where warp_dot reads a row (the weights' or the input's) from: registers loaded ahead (InRegisters, the weight
// row: STREAM reads it once without L1 allocation, else through L1), L1 at each piece's adds (ThroughL1), or
// shared memory (InShared). Lane l always takes pieces l, l + 32, ...: the same products in the same order
// wherever they come from.
template <bool STREAM, int CHUNK = kChunk>
struct InRegisters {
  static constexpr int kPieces = CHUNK;  // per lane in flight
  const uint4* row;
  uint4 held[CHUNK];
  __device__ __forceinline__ void fetch(int base, int pieces, int) {
#pragma unroll
    for (int i = 0; i < CHUNK; ++i)
      if (base + 32 * i < pieces) held[i] = STREAM ? load_streaming(row + base + 32 * i) : __ldg(row + base + 32 * i);
  }
  __device__ __forceinline__ void wait() const {}
  __device__ __forceinline__ uint4 piece(int, int i) const { return held[i]; }
};

struct ThroughL1 {
  const uint4* row;
  __device__ __forceinline__ void fetch(int, int, int) const {}
  __device__ __forceinline__ void wait() const {}
  __device__ __forceinline__ uint4 piece(int p, int) const { return __ldg(row + p); }
};

struct InShared {
  const uint4* row;  // the whole row in shared memory
  __device__ __forceinline__ void fetch(int, int, int) const {}
  __device__ __forceinline__ void wait() const {}
  __device__ __forceinline__ uint4 piece(int p, int) const { return row[p]; }
};

// x_m . w_r in the order described above; every lane returns it. x and w are rows of `pieces` 16-byte pieces.
template <typename WSource, typename XSource>
__device__ __forceinline__ float warp_dot(WSource w, XSource x, int pieces, int lane) {
  constexpr int chunk = WSource::kPieces;
  float acc = 0.f;
  for (int base = lane; base < pieces; base += 32 * chunk) {
    w.fetch(base, pieces, lane);
    x.fetch(base, pieces, lane);
#pragma unroll
    for (int i = 0; i < chunk; ++i) {
      const int p = base + 32 * i;
      if (p < pieces) {
        if (i == 0) {  // past the first piece's test, so that every load above goes out before the waits
          w.wait();
          x.wait();
        }
        acc = fma_pieces(x.piece(p, i), w.piece(p, i), acc);
      }
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, offset);
  return acc;
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
    const ThroughL1 x{reinterpret_cast<const uint4*>(a.x) + (size_t)m * pieces};
    const float logit = warp_dot(InRegisters<false>{w}, x, pieces, lane);
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
    if (r.incumbent) r.incumbent[m] = 0;
    const int n = r.count[m];
    r.tokens[m] = n > r.cap ? -1 : key == 0 ? INT32_MAX : (int64_t)(~static_cast<uint32_t>(key));
  }
  if (threadIdx.x == 0) {
    *r.ticket = 0;
    if (r.arrived) *r.arrived = 0;  // every block has passed the barrier before taking its ticket
  }
}

// Where pair i of the flat list lies: the rows are walked in groups of 32 (lane j: row group_row + j), pair i in
// the group whose inclusive prefix of listed counts first exceeds i - group_base. Pairs are asked in increasing
// order (warp-uniform).
struct PairWalk {
  int group_row = 0, group_base = 0, incl = 0;
  __device__ __forceinline__ void load_group(const RescoreArgs& r, int rows, int lane) {
    const int m = group_row + lane;
    int n = m < rows ? r.count[m] : 0;
    incl = n > r.cap ? 0 : n;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xFFFFFFFFu, incl, d);
      if (lane >= d) incl += v;
    }
  }
  // Row m of pair i (-1 past the list's end) and the row's pairs [first, last) in the flat list.
  __device__ __forceinline__ int locate_row(const RescoreArgs& r, int rows, int lane, int i, int& first, int& last) {
    while (i - group_base >= __shfl_sync(0xFFFFFFFFu, incl, 31) && group_row + 32 < rows) {
      group_base += __shfl_sync(0xFFFFFFFFu, incl, 31);
      group_row += 32;
      load_group(r, rows, lane);
    }
    const int local = i - group_base;
    if (local >= __shfl_sync(0xFFFFFFFFu, incl, 31)) return -1;
    const int j = __popc(__ballot_sync(0xFFFFFFFFu, incl <= local));
    const int before = __shfl_sync(0xFFFFFFFFu, incl, max(j - 1, 0));
    first = group_base + (j == 0 ? 0 : before);
    last = group_base + __shfl_sync(0xFFFFFFFFu, incl, j);
    return group_row + j;
  }
};

// The grid's blocks meet here (the launch keeps the grid within what the multiprocessors hold at once): every write
// before it is visible to every block after it. The last block of the call sets the count back to zero.
__device__ __forceinline__ void grid_barrier(unsigned int* arrived) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(arrived, 1u);
    unsigned int seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrived) : "memory");
    } while (seen < gridDim.x);
  }
  __syncthreads();
}

__host__ __device__ __forceinline__ StageLists stage_lists(const RescoreArgs& r) {
  return StageLists{r.stage_count, r.stage_idx, r.stage_upper, r.best_lower, r.count,
                    r.cand_idx,    r.cand_upper, r.stage_cap,  r.cap,        r.incumbent};
}

// The INT8 pass's compaction, by the rescore's grid: max(1, gridDim / m) blocks per input row, each a slice of the
// row's stage list, as the compaction launch spreads it.
__device__ __forceinline__ void compact_stage_lists(int rows, const RescoreArgs& r) {
  const int slices = max(1, static_cast<int>(gridDim.x) / rows);
  for (int v = blockIdx.x; v < rows * slices; v += gridDim.x)
    compact_stage_row(stage_lists(r), v / slices, v % slices, slices);
}

// Rescore: the flat list of every input row's listed candidates (row m's first min(count, 0 if count > cap)
// entries), block b taking the b-th of gridDim equal ranges of it, row by row: the block copies the row's input
// into shared memory (cp.async), then its warps take the row's pairs in that range in turn. A pair whose upper
// bound is below the row's best lower bound is skipped (the Triton pass lists such rows; the CUDA pass's
// compaction has dropped them). COMPACT: the grid first compacts the INT8 pass's stage lists into count and the
// candidate list, and meets before reading them (one launch instead of the compaction's and the rescore's).
//
// With incumbents (COMPACT, at least incumbent_min_pairs listed pairs): the compaction also keeps each input row's
// listed row of largest upper bound (its incumbent); after the barrier one warp per input row first computes its
// incumbent's exact logit (warp_dot: the bits the rescore would give it) into the row's key, and the blocks wait for
// that key (a row's key is set first by its incumbent: every other pair of the row waits for it) before choosing
// their pairs: a pair is rescored only if its upper bound reaches the row's largest exact logit so far. A row below
// an exact logit of the row cannot be the argmax (its own exact logit is at most its upper bound), and a row that
// ties it is still rescored, so the tokens are the same; far fewer pairs remain (on the H200's synthetic head at 32
// rows, 22 instead of 213 per input row).
template <bool COMPACT, int CHUNK, int MIN_BLOCKS>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) rescore_kernel(ExactHeadArgs a, RescoreArgs r) {
  extern __shared__ uint4 x_row[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int pieces = a.k / 8;
  const uint4* weight = reinterpret_cast<const uint4*>(a.weight);
  allow_next_grid();
  wait_for_prior_grid();
  if constexpr (COMPACT) {
    compact_stage_lists(a.m, r);
    grid_barrier(r.arrived);
  }
  int total = 0;
  for (int group = 0; group < a.m; group += 32) {
    const int n = group + lane < a.m ? r.count[group + lane] : 0;
    total += static_cast<int>(__reduce_add_sync(0xFFFFFFFFu, static_cast<unsigned>(n > r.cap ? 0 : n)));
  }
  // grid-uniform; a settling warp waits for nothing, so every row's key gets its incumbent
  const bool incumbents = COMPACT && r.incumbent && r.incumbent_min_pairs >= 0 && total >= r.incumbent_min_pairs;
  if (incumbents) {
    for (int m = blockIdx.x * kWarps + warp; m < a.m; m += gridDim.x * kWarps) {
      const int n = r.count[m];
      if (n < 1 || n > r.cap) continue;
      const int row = key_index(r.incumbent[m]);
      const float logit = warp_dot(InRegisters<true, CHUNK>{weight + (size_t)row * pieces},
                                   ThroughL1{reinterpret_cast<const uint4*>(a.x) + (size_t)m * pieces}, pieces, lane);
      if (lane == 0) atomicMax(r.keys + m, token_key(logit, row));
    }
  }
  const int share = (total + gridDim.x - 1) / gridDim.x;
  const int end = min(total, (blockIdx.x + 1) * share);
  const uint32_t x_shared = static_cast<uint32_t>(__cvta_generic_to_shared(x_row));
  PairWalk walk;
  walk.load_group(r, a.m, lane);
  for (int begin = blockIdx.x * share; begin < end;) {
    int first, last;
    const int m = walk.locate_row(r, a.m, lane, begin, first, last);
    const int stop = min(end, last);
    __syncthreads();  // the previous row's pairs are done with x_row
    const uint4* x = reinterpret_cast<const uint4*>(a.x) + (size_t)m * pieces;
    for (int p = threadIdx.x; p < pieces; p += kThreads)
      ptx::cp_async16(x_shared + 16 * p, x + p);
    float bound = r.best_lower[m];
    int done = -1;  // the incumbent, whose logit is in the key already
    if (incumbents) {
      if (threadIdx.x == 0) {
        unsigned long long key;
        do {
          asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(key) : "l"(r.keys + m) : "memory");
        } while (key == 0);
      }
      __syncthreads();
      bound = fmaxf(bound, key_value(__ldcg(r.keys + m)));  // an exact logit of the row's candidates: none below wins
      done = key_index(r.incumbent[m]);
    }
    bool wanted = false;
    for (int i = begin + threadIdx.x; i < stop; i += kThreads) {
      const size_t entry = (size_t)m * r.cap + (i - first);
      wanted |= r.cand_upper[entry] >= bound && r.cand_idx[entry] != done;
    }
    ptx::cp_async_wait_all();
    if (!__syncthreads_or(wanted)) {  // also: the input row is in shared memory
      begin = stop;
      continue;
    }
    for (int i = begin + warp; i < stop; i += kWarps) {
      const size_t entry = (size_t)m * r.cap + (i - first);
      const int row = r.cand_idx[entry];
      if (r.cand_upper[entry] < bound || row == done) continue;
      const float logit =
          warp_dot(InRegisters<true, CHUNK>{weight + (size_t)row * pieces}, InShared{x_row}, pieces, lane);
      if (lane == 0) atomicMax(r.keys + m, token_key(logit, row));
    }
    begin = stop;
  }
  finish_tokens(a, r);
}

// kernel<<<grid, kThreads, smem>>>(args...), overlapping the kernel before it in the stream where asked (sm_90+), and
// cooperative where asked: the runtime then launches the grid only if all its blocks can be resident at once
// (cudaErrorCooperativeLaunchTooLarge otherwise) and schedules them together, which a grid barrier needs.
template <typename... Args>
cudaError_t launch(void (*kernel)(Args...), dim3 grid, int smem, cudaStream_t stream, bool overlap_prior,
                   bool cooperative, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  int attributes = 0;
  if (overlap_prior) {
    attribute[attributes].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[attributes++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cooperative) {
    attribute[attributes].id = cudaLaunchAttributeCooperative;
    attribute[attributes++].val.cooperative = 1;
  }
  config.attrs = attribute;
  config.numAttrs = attributes;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// The rescore kernel's launch: its shared memory raised once per device and size (graph capture then sees only the
// launch), the largest carveout (two or three blocks a multiprocessor: the driver's own choice may fit fewer), and
// blocks_per_sm blocks per multiprocessor (0: MIN_BLOCKS), at most as many as it holds at once; the compacting kernel
// (its blocks meet in a grid barrier) launched cooperative.
template <bool COMPACT, int CHUNK, int MIN_BLOCKS>
cudaError_t launch_rescore(const ExactHeadArgs& a, const RescoreArgs& r, cudaStream_t stream, bool overlap_prior,
                           int device, int sms) {
  auto* kernel = rescore_kernel<COMPACT, CHUNK, MIN_BLOCKS>;
  const int smem = a.k * 2;  // one input row
  static thread_local int smem_allowed[16] = {}, resident[16] = {};
  if (smem > smem_allowed[device & 15]) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (err == cudaSuccess)
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident[device & 15], kernel, kThreads, smem);
    if (err != cudaSuccess) return err;
    if (resident[device & 15] < 1) return cudaErrorInvalidConfiguration;
    smem_allowed[device & 15] = smem;
  }
  const int blocks = sms * std::min(r.blocks_per_sm > 0 ? r.blocks_per_sm : MIN_BLOCKS, resident[device & 15]);
  return launch(kernel, dim3(blocks), smem, stream, overlap_prior, COMPACT, a, r);
}

}  // namespace

cudaError_t exact_head_launch(const ExactHeadArgs& a, cudaStream_t stream, bool overlap_prior) {
  if (a.m < 1 || a.k % 8 || a.n < 1) return cudaErrorInvalidValue;
  return launch(exact_head_kernel, dim3((a.n + kWarps - 1) / kWarps), 0, stream, overlap_prior, false, a);
}

cudaError_t rescore_launch(const ExactHeadArgs& a, const RescoreArgs& r, cudaStream_t stream, bool overlap_prior) {
  if (a.m < 1 || a.k % 8 || r.cap < 1 || r.blocks_per_sm < 0 || (r.stage_count && (!r.arrived || r.stage_cap < 1)))
    return cudaErrorInvalidValue;
  static thread_local int sms[16] = {};  // multiprocessors per device, asked once
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (sms[device & 15] == 0) {
    err = cudaDeviceGetAttribute(&sms[device & 15], cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
  }
  const int sm_count = sms[device & 15];
  // Up to 16 rows a warp holds a whole weight row (20 pieces a lane, 120 registers, 2 blocks a multiprocessor); above,
  // half a row at a time (10 pieces, 75 registers, 3 blocks): more warps for the longest lists (~6,800 pairs at 32
  // rows). The same products in the same order either way.
  const bool half_rows = a.m > 16;
  auto rescore_lists = [&](const RescoreArgs& lists, bool overlap) {
    return half_rows ? launch_rescore<false, kChunk / 2, 3>(a, lists, stream, overlap, device, sm_count)
                     : launch_rescore<false, kChunk, 2>(a, lists, stream, overlap, device, sm_count);
  };
  if (!r.stage_count) return rescore_lists(r, overlap_prior);
  err = half_rows ? launch_rescore<true, kChunk / 2, 3>(a, r, stream, overlap_prior, device, sm_count)
                  : launch_rescore<true, kChunk, 2>(a, r, stream, overlap_prior, device, sm_count);
  if (err != cudaErrorCooperativeLaunchTooLarge) return err;
  // Not all blocks can be resident at once here (another context holds multiprocessors): the compaction launch, then
  // the rescore of its lists.
  (void)cudaGetLastError();  // the refused launch's error
  compact_kernel<<<dim3(a.m, kCompactSplit), kCompactThreads, 0, stream>>>(stage_lists(r));
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  RescoreArgs listed = r;
  listed.stage_count = nullptr;
  return rescore_lists(listed, true);
}
