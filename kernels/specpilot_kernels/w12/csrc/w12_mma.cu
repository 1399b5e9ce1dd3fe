// W12 GEMM with mma.sync (sm_80+, including sm_90 and sm_120): y = x @ W^T, W decoded in registers.
//
// Weights sit on the 16-row side of m16n8k16, tokens on the 8-wide side (1-8 token tiles of 8 rows). The
// fragment layout (mma.py) gives each lane of a warp its own A fragments for two k16 steps as 16 view
// bytes plus 8 nibble bytes. The K order inside each 32-column block is permuted so that lane t's B
// fragments of both k16 steps are 8 consecutive columns of x (MMA k-slot 2t+h+8q of step s is column
// 8t+4s+2q+h).
//
// Decode: four SASS instructions per pair of weights (two 16-bit lanes of one register). One prmt builds
// V = [view byte | nibble byte] in each lane, the weight's nibble in the high half of its nibble byte (the
// layout stores two nibbles per byte: one read as is, the other from the word shifted left by 4); then
// bits = ((V & 0x7FF07FF0) >> 4) + ((V & 0x80008000) | (base << 7)): the mask drops the sign and the
// neighbouring lane's bits, the shift puts mantissa and exponent offset in place, sign and base fill disjoint
// bits (one LOP3), and the shift-and-add is one LEA.HI; the add cannot carry out of a lane (base + 15 <= 254).
// v5's decode took eight instructions, v7's six (ncu, docs/w12-notes.md): at one row each warp's
// instruction stream, not the bytes, sets the pace.
//
// Escapes of a (16-row, 128-column) chunk are patched into the owning lane's register before the MMA; a
// warp keeps a window of 32 of its tile's escapes in registers (one per lane) and finds a chunk's by ballot.
//
// Each warp holds its next step (a chunk or half of one) in registers while it decodes and multiplies the
// current one, and reads activations through L1 (shared by the warps of a multiprocessor). Staged launches (up to
// 16 rows, per shape) copy the next step into the warp's own shared-memory double buffer instead (cp.async, L2 only):
// the same bytes in flight without the 24 registers that hold them, so more warps fit a multiprocessor. At 17-32 rows
// a shape may instead share its activations: a producer warp copies them once per block into a shared-memory ring
// (w12_shared_x_kernel). On sm_90a a shape may instead run 9-64 rows as warpgroup MMAs (w12_wgmma_kernel: the same
// decoded fragments as wgmma's register A, activations as its shared-memory B, brought in by bulk copies of the image
// w12_permute_x_kernel writes first; each warp's weights come through its own cp.async ring of 2-3 chunks where the
// block's shared memory allows as many resident blocks as weights in registers do). The partition is
// fixed by (N, K, GPU), never by M: a warp owns an interleaved set of its tile's 128-column chunks; warps of one
// tile reduce through shared memory in warp order, K splits in split order: within a thread-block cluster through
// distributed shared memory (sm_90+, up to 4 splits of one tile a warp), else through a workspace. The step
// plan (step size, one or two tiles a warp) may follow M: it changes no order of sums. No atomics: a row's bits
// are the same at every row count.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "pdl.cuh"
#include "w12_mma.cuh"

namespace {

constexpr int kBlocksPerChunk = 4;  // 4 x 32 columns = one 128-column chunk (the escape bucket width)
constexpr int kMaxRows = 64;        // rows per launch (up to 8 token tiles of 8)
constexpr int kMaxWarpsPerBlock = 16;
constexpr int kMaxWgmmaWarpsPerBlock = 32;  // the warpgroup kernel: 4 x warpgroups x warps_k (1024 threads)
constexpr int kMaxClusterSplits = 4;  // K splits reduced in a cluster (more: through the workspace kernel)
constexpr int kStagedBlockWords = 48;  // 16-byte words a staged 32-column block: 32 view, 16 nibble
constexpr int kMaxSharedXRing = 8;     // ring slots of the shared-activation kernel

__device__ __forceinline__ uint32_t permute_bytes(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t out;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(b), "r"(selector));
  return out;
}

// Register p (0: bytes 0-1, 1: bytes 2-3) of view word `view`, nibbles in the high halves of bytes 2p, 2p+1
// of `nibs`: V = [view byte | nibble byte] per lane, then the exact BF16 bits of both weights.
template <int P>
__device__ __forceinline__ uint32_t decode_pair(uint32_t view, uint32_t nibs, uint32_t base2) {
  const uint32_t v = permute_bytes(view, nibs, P == 0 ? 0x1504u : 0x3726u);
  // sign and base << 7 occupy disjoint bits (one LOP3); the masked shift and the add are one LEA.HI
  return ((v & 0x7FF07FF0u) >> 4) + ((v & 0x80008000u) | base2);
}

// The Q pass reads the view as E4M3 with zero low bits (truncated) or 8 (midpoint): view bytes s.0000.000
// are E4M3 zeros (signed), not 2^(base) (whose BF16 bits the decode would give them).
template <int P>
__device__ __forceinline__ uint32_t zero_fix(uint32_t bits, uint32_t view) {
  const uint32_t x = permute_bytes(view, 0, P == 0 ? 0x9180u : 0xB3A2u);  // [sign x8 | s eeee mmm] per lane
  if ((x & 0x7Fu) == 0) bits = (bits & 0xFFFF0000u) | (x & 0x8000u);
  if ((x & 0x007F0000u) == 0) bits = (bits & 0x0000FFFFu) | (x & 0x80000000u);
  return bits;
}

// Escape `loc` (chunk << 11 | block << 9 | row << 5 | column % 32) with exact BF16 bits `value`: the lane
// holding that weight overwrites its 16-bit lane of the block's decoded fragment registers a[8].
__device__ __forceinline__ void patch_escape(uint32_t (&a)[8], int lane, uint32_t loc, uint32_t value) {
  const int r = (loc >> 5) & 15, c = loc & 31;
  const int lt = (c >> 3) & 3, s = (c >> 2) & 1, q = (c >> 1) & 1;
  if (lane != (r & 7) * 4 + lt) return;
  const int reg = 4 * s + 2 * q + (r >> 3);
  const bool high = c & 1;
#pragma unroll
  for (int rr = 0; rr < 8; ++rr)
    if (rr == reg) a[rr] = high ? (a[rr] & 0x0000FFFFu) | (value << 16) : (a[rr] & 0xFFFF0000u) | value;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One 32-column block's A fragments (two k16 steps): view words w = 0..3 give registers 2w (row g) and
// 2w+1 (row g+8); words 0-1 take their nibbles from nibble word 0 (as is, then shifted), words 2-3 from word 1.
template <int LOW_BITS>
__device__ __forceinline__ void decode_block(uint32_t (&a)[8], uint4 view, uint2 nib, uint32_t base_lo,
                                             uint32_t base_hi) {
  constexpr uint32_t kQpassNibbles = LOW_BITS == 2 ? 0x88888888u : 0u;  // midpoint: low bits 1000
  const uint32_t n0 = LOW_BITS == 0 ? nib.x : kQpassNibbles;
  const uint32_t n1 = LOW_BITS == 0 ? nib.y : kQpassNibbles;
  const uint32_t words[4] = {view.x, view.y, view.z, view.w};
  const uint32_t sources[4] = {n0, n0 << 4, n1, n1 << 4};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    a[2 * w] = decode_pair<0>(words[w], sources[w], base_lo);
    a[2 * w + 1] = decode_pair<1>(words[w], sources[w], base_hi);
    if (LOW_BITS != 0) {
      a[2 * w] = zero_fix<0>(a[2 * w], words[w]);
      a[2 * w + 1] = zero_fix<1>(a[2 * w + 1], words[w]);
    }
  }
}

// acc += another warp's or split's sums of the same tiles, stored in acc's order.
template <int TP, int MT>
__device__ __forceinline__ void add_sums(float (&acc)[TP][MT][4], const float* other) {
#pragma unroll
  for (int p = 0; p < TP; ++p)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[p][j][q] += other[(p * MT + j) * 4 + q];
}

// 16-byte words of dynamic shared memory before the staged weights: the in-block reduction of warps sharing a tile,
// then the inbox of a cluster's first split (a tile's sums from each later split).
template <int MT, int TP>
__host__ __device__ __forceinline__ int epilogue_words(const W12MmaArgs& args, int threads) {
  return (args.warps_k > 1 ? threads * TP * MT : 0) +
         (args.cluster_splits > 1 ? (args.cluster_splits - 1) * args.warps_n * 32 * TP * MT : 0);
}

// One tile's next step of weights into registers, read once (no L1 allocation, so L1 keeps the activations): per
// 32-column block a lane's 16 view bytes and (exact weights) 8 nibble bytes.
template <int BLOCKS, int LOW_BITS>
__device__ __forceinline__ void load_step_registers(uint4 (&v)[BLOCKS], uint2 (&nb)[BLOCKS], const uint4* view,
                                                    const uint2* nibs) {
#pragma unroll
  for (int u = 0; u < BLOCKS; ++u) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                 : "l"(view + u * 32));
    if (LOW_BITS == 0) {
      asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];"
                   : "=r"(nb[u].x), "=r"(nb[u].y) : "l"(nibs + u * 32));
    } else {
      nb[u] = make_uint2(0, 0);
    }
  }
}

// One tile's step of weights (BLOCKS 32-column blocks) copied into shared memory at `words` (cp.async, L2 only): each
// lane copies its own view pieces, and the warp its nibble words as one contiguous run after them, which other lanes
// read (__syncwarp between reading a copy and refilling it). The weights are read once, so they enter L2 first in
// line for eviction: 1-4% off 16-32 rows on the H200 (v21, docs/w12-notes.md). The policy is made where it is used
// (volatile): made once and held, it took a register pair and a conversion to a uniform register per copy.
template <int BLOCKS, int LOW_BITS>
__device__ __forceinline__ void stage_step(uint32_t words, const uint4* view, const uint2* nibs, int lane) {
  const uint32_t mine = words + lane * 16;  // this lane's first view piece (its nibble words: i words past the view)
  uint64_t read_once;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(read_once));
#pragma unroll
  for (int u = 0; u < BLOCKS; ++u)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(mine + u * 32 * 16),
                 "l"(view + u * 32), "l"(read_once));
  if (LOW_BITS == 0) {
    const uint4* run = reinterpret_cast<const uint4*>(nibs - lane) + lane;  // the warp's nibble words from this lane's
#pragma unroll
    for (int i = 0; i < BLOCKS * 16; i += 32)
      asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(mine + (BLOCKS * 32 + i) * 16),
                   "l"(run + i), "l"(read_once));
  }
}

// Block u of a step stage_step copied to `words`, back into a lane's registers.
template <int BLOCKS, int LOW_BITS>
__device__ __forceinline__ void read_staged_block(uint32_t words, int u, int lane, uint4& v, uint2& nb) {
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(words + lane * 16 + u * 32 * 16) : "memory");
  if (LOW_BITS == 0) {
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(nb.x), "=r"(nb.y)
                 : "r"(words + BLOCKS * 32 * 16 + lane * 8 + u * 32 * 8) : "memory");
  } else {
    nb = make_uint2(0, 0);
  }
}

// Fragment words from a step's first block to the next step's: the chunk's next step, or (after its last) the first
// blocks of the warp's next chunk, warps_k chunks on.
template <int BLOCKS>
__device__ __forceinline__ size_t step_advance(int part, int warps_k) {
  constexpr int kSteps = kBlocksPerChunk / BLOCKS;
  return part == kSteps - 1 ? (size_t)(warps_k * kBlocksPerChunk - (kSteps - 1) * BLOCKS) * 32 : (size_t)BLOCKS * 32;
}

// A warp's window of 32 of its tile's escapes (lane i holds escape win + i of the tile's range, sorted by chunk,
// block and position): a step's escapes are found by ballot and patched by shuffle.
struct EscapeWindow {
  int win, end;
  uint32_t loc = 0xFFFFFFFFu, val = 0;
  __device__ __forceinline__ void load(const W12MmaArgs& args, int lane) {
    const int idx = win + lane;
    loc = idx < end ? uint32_t(args.esc_loc[idx]) : 0xFFFFFFFFu;
    val = idx < end ? uint32_t(args.esc_val[idx]) : 0u;
  }
  // Patch step `key` (escape loc >> KEY_SHIFT: the chunk, or chunk and half) into the decoded blocks a of step part
  // `part`, sliding the window when its last escape is at or before this step (rare).
  template <int BLOCKS, int KEY_SHIFT>
  __device__ __forceinline__ void patch(uint32_t (&a)[BLOCKS][8], uint32_t key, int part, const W12MmaArgs& args,
                                        int lane) {
    while (true) {
      uint32_t hits = __ballot_sync(0xFFFFFFFFu, (loc >> KEY_SHIFT) == key);
      while (hits) {
        const int src = __ffs(hits) - 1;
        hits &= hits - 1;
        const uint32_t at = __shfl_sync(0xFFFFFFFFu, loc, src);
        const uint32_t value = __shfl_sync(0xFFFFFFFFu, val, src);
        const int u = ((at >> 9) & 3) - part * BLOCKS;
#pragma unroll
        for (int uu = 0; uu < BLOCKS; ++uu)
          if (uu == u) patch_escape(a[uu], lane, at, value);
      }
      const uint32_t last_loc = __shfl_sync(0xFFFFFFFFu, loc, 31);
      if (win + 32 < end && (last_loc >> KEY_SHIFT) <= key) {
        win += 32;
        load(args, lane);
        continue;
      }
      break;
    }
  }
};

// Before the first read of x (or its image): wait for the kernel before this one in the stream, except in a second
// row region, whose x the first region's blocks have waited for before letting it start (W12Overlap). A first region
// then lets the second start.
__device__ __forceinline__ void wait_before_reading_x(const W12MmaArgs& args) {
  if (args.overlap_prior == kOverlapSecondRegion) return;
  wait_for_prior_grid();
  if (args.overlap_prior == kOverlapFirstRegion) allow_next_grid();
}

// Where a warp that owns one tile (`own`) starts, from chunk `first` of its split's [.., last): the exponent bases of
// its rows g and g + 8 (base << 7 in both lanes), its first fragment words and its escape window over the chunks it
// reads (empty when first >= last; loaded by the caller).
struct OneTile {
  uint32_t base_lo, base_hi;
  const uint4* view;
  const uint2* nibs;
  EscapeWindow esc;
  __device__ __forceinline__ OneTile(const W12MmaArgs& args, int own, int first, int last, int lane) {
    const int g = lane >> 2, chunks = args.k_padded / 128;
    base_lo = uint32_t(args.base[own * 16 + g]) * 0x00800080u;
    base_hi = uint32_t(args.base[own * 16 + g + 8]) * 0x00800080u;
    const size_t start = ((size_t)own * (args.k_padded / 32) + (size_t)first * kBlocksPerChunk) * 32 + lane;
    view = reinterpret_cast<const uint4*>(args.view) + start;
    nibs = reinterpret_cast<const uint2*>(args.nibbles) + start;
    esc.win = args.esc_ptr[own * chunks + min(first, chunks)];
    esc.end = args.esc_ptr[own * chunks + max(first, last)];
  }
};

// After the main loop: lets the next kernel in the stream start and waits for the one before (the outputs may be its
// inputs); the warps of one tile reduce in warp_k order through shared memory, K splits in split order (CLUSTER:
// within a thread-block cluster, sm_90+; else each split writes its partial sums to args.partial for
// split_reduce_kernel), and the tile's first warp writes the bf16 outputs where `stores`. No atomics: the same order
// at every row count.
template <int TP, int MT, bool CLUSTER>
__device__ __forceinline__ void reduce_and_store(float (&acc)[TP][MT][4], const W12MmaArgs& args, int warp, int warp_n,
                                                 int warp_k, int lane, int first_tile, bool stores) {
  const int g = lane >> 2, t = lane & 3;
  const int tiles = args.n_padded / 16;
  // The next kernel in the stream may start its prologue once every block is past its main loop; the outputs are
  // written only once the kernel before this one is done (a warp without chunks did not wait above). A first row
  // region lets the next kernel (the second region, which reads x without waiting) start only after waiting.
  if (args.overlap_prior == kOverlapFirstRegion) {
    wait_for_prior_grid();
    allow_next_grid();
  } else {
    allow_next_grid();
    wait_for_prior_grid();
  }
  extern __shared__ float red[];
  constexpr int kAcc = TP * MT * 4;
  const bool tile_sums = warp_k == 0;  // the warps that end with their tiles' sums
  if (args.warps_k > 1) {
    float* mine = red + ((size_t)warp * 32 + lane) * kAcc;
#pragma unroll
    for (int p = 0; p < TP; ++p)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) mine[(p * MT + j) * 4 + q] = acc[p][j][q];
    __syncthreads();
    if (!tile_sums && !CLUSTER) return;
    if (tile_sums) {
      for (int wk = 1; wk < args.warps_k; ++wk) {
        add_sums(acc, red + ((size_t)(wk * args.warps_n + warp_n) * 32 + lane) * kAcc);
      }
    }
  }
  // K splits launched as one thread-block cluster (sm_90+): every split hands its sums to the first split's block
  // through distributed shared memory, which adds them in split order — the order of split_reduce_kernel, without
  // its workspace and launch. No thread leaves before the cluster barrier.
  if constexpr (CLUSTER) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    float* inbox = red + (args.warps_k > 1 ? (size_t)blockDim.x * kAcc : 0);  // [split - 1][warp_n][lane][kAcc]
    const int split = blockIdx.y;  // the block's rank in its cluster of (1, splits, 1)
    if (split > 0 && tile_sums) {
      const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(
          inbox + (((size_t)(split - 1) * args.warps_n + warp_n) * 32 + lane) * kAcc));
      uint32_t remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(remote) : "r"(local));
#pragma unroll
      for (int p = 0; p < TP; ++p)
#pragma unroll
        for (int j = 0; j < MT; ++j)
          asm volatile("st.shared::cluster.v4.f32 [%0], {%1,%2,%3,%4};" ::"r"(remote + (p * MT + j) * 16),
                       "f"(acc[p][j][0]), "f"(acc[p][j][1]), "f"(acc[p][j][2]), "f"(acc[p][j][3]) : "memory");
    }
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
    if (split > 0) return;
    if (tile_sums) {
      for (int sp = 1; sp < args.cluster_splits; ++sp) {
        add_sums(acc, inbox + (((size_t)(sp - 1) * args.warps_n + warp_n) * 32 + lane) * kAcc);
      }
    }
#else
    __trap();  // the host launches clusters on sm_90+ only
#endif
  }
  if (!tile_sums || !stores) return;
#pragma unroll
  for (int p = 0; p < TP; ++p) {
    const int tile = first_tile + p;
    if (tile >= tiles) return;
#pragma unroll
    for (int j = 0; j < MT; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int n = tile * 16 + g + 8 * (q >> 1);
        const int m = j * 8 + 2 * t + (q & 1);
        if (n < args.n && m < args.m) {
          if (args.partial)
            args.partial[((size_t)blockIdx.y * args.m + m) * args.n + n] = acc[p][j][q];
          else
            args.y[(size_t)m * args.n + n] = __float2bfloat16_rn(acc[p][j][q]);
        }
      }
    }
  }
}

template <int MT, int LOW_BITS, int STEP_BLOCKS, int TP, bool STAGED, bool CLUSTER>
__global__ void w12_mma_kernel(W12MmaArgs args) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warp_n = warp % args.warps_n;
  const int warp_k = warp / args.warps_n;
  const int first_tile = (blockIdx.x * args.warps_n + warp_n) * TP;
  const int g = lane >> 2, t = lane & 3;
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int kblocks = args.k_padded / 32;

  // TP consecutive 16-row tiles a warp (one activation load serves all of them); past the last tile a warp
  // repeats it and stores nothing.
  float acc[TP][MT][4];
#pragma unroll
  for (int p = 0; p < TP; ++p)
#pragma unroll
    for (int j = 0; j < MT; ++j) acc[p][j][0] = acc[p][j][1] = acc[p][j][2] = acc[p][j][3] = 0.f;

  if (first_tile < tiles) {
    const int first = blockIdx.y * args.chunks_per_split + warp_k;
    const int last = min((int)(blockIdx.y + 1) * args.chunks_per_split, chunks);
    // A warp works in steps of STEP_BLOCKS 32-column blocks (a whole chunk or half of one): half steps hold fewer
    // registers (more warps a multiprocessor) at more instructions. Steps run in the chunk's block order, so
    // every accumulator sums in the same order at every step size and row count.
    static_assert(STEP_BLOCKS == 4 || STEP_BLOCKS == 2, "a step is a chunk or half of one");
    constexpr int kBlocks = STEP_BLOCKS;
    constexpr int kStepsPerChunk = kBlocksPerChunk / kBlocks;
    constexpr int kKeyShift = kStepsPerChunk == 1 ? 11 : 10;  // escape loc >> shift: the chunk, or chunk and half
    // Running pointers (one 64-bit add per step; block offsets are immediates): weights of the next step to
    // load and activations of the current one, where registers allow: up to two token tiles in whole steps, four
    // in half steps (53 fewer instructions a chunk at the same 128 registers); whole steps of four tiles (+12
    // registers) and eight tiles (spills) recompute the activation addresses.
    constexpr bool kRunningX = MT <= 2 ? kStepsPerChunk == 1 : MT == 4 && kStepsPerChunk == 2;
    const __nv_bfloat16* x_rows[MT];
#pragma unroll
    for (int j = 0; j < MT; ++j)
      x_rows[j] = args.x + (size_t)min(j * 8 + g, args.m - 1) * args.ldx + (kRunningX ? first * 128 + 8 * t : 0);

    uint32_t base_lo[TP], base_hi[TP];
    const uint4* view_next[TP];
    const uint2* nibs_next[TP];
    EscapeWindow esc[TP];  // per tile
#pragma unroll
    for (int p = 0; p < TP; ++p) {
      const int tile = min(first_tile + p, tiles - 1);
      base_lo[p] = uint32_t(args.base[tile * 16 + g]) * 0x00800080u;  // base << 7, both lanes
      base_hi[p] = uint32_t(args.base[tile * 16 + g + 8]) * 0x00800080u;
      const size_t start = ((size_t)tile * kblocks + (size_t)first * kBlocksPerChunk) * 32 + lane;
      view_next[p] = reinterpret_cast<const uint4*>(args.view) + start;
      nibs_next[p] = reinterpret_cast<const uint2*>(args.nibbles) + start;
      esc[p].win = args.esc_ptr[tile * chunks + min(first, chunks)];
      esc[p].end = args.esc_ptr[tile * chunks + last];
    }
    if (LOW_BITS == 0) {
#pragma unroll
      for (int p = 0; p < TP; ++p) esc[p].load(args, lane);
    }

    // Weights are read once: no L1 allocation, so L1 keeps the activations. The next step loads while this
    // one is decoded and multiplied: into registers, or (STAGED) into the other half of the warp's shared-memory
    // double buffer. A buffer half holds, per tile, the step's view pieces (each lane copies and reads its own) and
    // its nibble words (copied as one contiguous run, read by other lanes: __syncwarp before reading and refilling).
    constexpr int kStageWords = TP * kBlocks * kStagedBlockWords;  // 16-byte words a step
    extern __shared__ uint4 shared_words[];
    const uint32_t stage_base = static_cast<uint32_t>(__cvta_generic_to_shared(
        shared_words + epilogue_words<MT, TP>(args, blockDim.x) + warp * 2 * kStageWords));
    uint4 v_next[TP][kBlocks];
    uint2 n_next[TP][kBlocks];
    int load_part = 0;  // which step of its chunk the next load is
    int stage = 0;      // the buffer half the next load fills
    auto load_step = [&]() {
#pragma unroll
      for (int p = 0; p < TP; ++p) {
        if constexpr (STAGED) {
          stage_step<kBlocks, LOW_BITS>(
              stage_base + (uint32_t)((stage * kStageWords + p * kBlocks * kStagedBlockWords) * 16), view_next[p],
              nibs_next[p], lane);
        } else {
          load_step_registers<kBlocks, LOW_BITS>(v_next[p], n_next[p], view_next[p], nibs_next[p]);
        }
      }
      if (STAGED) {
        asm volatile("cp.async.commit_group;");
        stage ^= 1;
      }
      const size_t advance = step_advance<kBlocks>(load_part, args.warps_k);
#pragma unroll
      for (int p = 0; p < TP; ++p) {
        view_next[p] += advance;
        nibs_next[p] += advance;
      }
      load_part = (load_part + 1) & (kStepsPerChunk - 1);
    };
    if (first < last) load_step();
    // Everything above reads only the weights. Activations (and the outputs below) may belong to the kernel before
    // this one in the stream: wait for it here, when it was launched to overlap (sm_90+: programmatic dependent
    // launch; without it this returns at once).
    wait_before_reading_x(args);
    for (int chunk = first; chunk < last; chunk += args.warps_k) {
#pragma unroll
      for (int part = 0; part < kStepsPerChunk; ++part) {
        uint4 v[TP][kBlocks];
        uint2 nb[TP][kBlocks];
        if constexpr (STAGED) {
          asm volatile("cp.async.wait_group 0;" ::: "memory");
          __syncwarp();
#pragma unroll
          for (int p = 0; p < TP; ++p) {
            const uint32_t words =
                stage_base + (uint32_t)(((stage ^ 1) * kStageWords + p * kBlocks * kStagedBlockWords) * 16);
#pragma unroll
            for (int u = 0; u < kBlocks; ++u) read_staged_block<kBlocks, LOW_BITS>(words, u, lane, v[p][u], nb[p][u]);
          }
          __syncwarp();  // every lane has read the half the next load refills
        } else {
#pragma unroll
          for (int p = 0; p < TP; ++p)
#pragma unroll
            for (int u = 0; u < kBlocks; ++u) {
              v[p][u] = v_next[p][u];
              nb[p][u] = n_next[p][u];
            }
        }
        if (part + 1 < kStepsPerChunk || chunk + args.warps_k < last) load_step();
        // activations of this step: one 16-byte load per token row and 32-column block. Lanes past the last
        // row read it again: their MMA columns are outputs that are never stored (no predicates, no zeroing).
        uint4 xv[kBlocks][MT];
#pragma unroll
        for (int u = 0; u < kBlocks; ++u)
#pragma unroll
          for (int j = 0; j < MT; ++j)
            xv[u][j] = __ldg(reinterpret_cast<const uint4*>(
                x_rows[j] + (kRunningX ? u * 32 : (chunk * kBlocksPerChunk + part * kBlocks + u) * 32 + 8 * t)));
        if (kRunningX) {  // to the chunk's other half, or to the warp's next chunk
          const int x_advance = part == kStepsPerChunk - 1 ? args.warps_k * 128 - (kStepsPerChunk - 1) * kBlocks * 32
                                                           : kBlocks * 32;
#pragma unroll
          for (int j = 0; j < MT; ++j) x_rows[j] += x_advance;
        }

#pragma unroll
        for (int p = 0; p < TP; ++p) {
          uint32_t a[kBlocks][8];
#pragma unroll
          for (int u = 0; u < kBlocks; ++u) decode_block<LOW_BITS>(a[u], v[p][u], nb[p][u], base_lo[p], base_hi[p]);
          if (LOW_BITS == 0)
            esc[p].template patch<kBlocks, kKeyShift>(a, uint32_t(chunk * kStepsPerChunk + part), part, args, lane);
#pragma unroll
          for (int u = 0; u < kBlocks; ++u) {
#pragma unroll
            for (int s = 0; s < 2; ++s) {
              const uint32_t frag[4] = {a[u][4 * s], a[u][4 * s + 1], a[u][4 * s + 2], a[u][4 * s + 3]};
#pragma unroll
              for (int j = 0; j < MT; ++j)
                mma_bf16(acc[p][j], frag, s ? xv[u][j].z : xv[u][j].x, s ? xv[u][j].w : xv[u][j].y);
            }
          }
        }
      }
    }
  }

  reduce_and_store<TP, MT, CLUSTER>(acc, args, warp, warp_n, warp_k, lane, first_tile, true);
}

// Shared activations (17-32 rows, sm_90+, one tile a warp). The warps of a block that share a K class (warp_k) read
// the same chunks in the same rounds: round r is chunks first + r * warps_k ... + warps_k - 1 of the block's split.
// A producer warp (the block's last) copies each round's activations (MT * 8 token rows of warps_k * 128 columns,
// rows past m repeat the last) into a slot of a shared-memory ring by bulk copies that complete on the slot's
// mbarrier, and refills a slot once every consumer warp has counted it released; the consumers read their
// activations with 16-byte shared loads (rows g and g + 1 of a quarter-warp on disjoint banks) instead of 8-line
// global loads, one copy a block instead of one a warp. The producer waits for nothing else, so the warps drift apart
// by up to ring - 1 rounds with no block barrier (the same ring refilled by the slowest consumer, or by cp.async, was
// 1.3-3x slower). Every warp sums its chunks as w12_mma_kernel's does, so no bit changes.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t phase) {
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "W12_WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra W12_WAIT_%=;\n}" ::"r"(bar), "r"(phase) : "memory");
}

// The mbarrier at shared address `bar` completes a phase after `count` arrivals (and any bytes expected of them).
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.shared::cta.b64 state, [%0];\n}" ::"r"(bar) : "memory");
}

// One arrival that also makes the phase wait for `bytes` more bytes of bulk copies completing on `bar`.
__device__ __forceinline__ void mbarrier_arrive_expecting(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}" ::"r"(bar),
               "r"(bytes) : "memory");
}

// `bytes` (a multiple of 16) from global `src` to shared `dst` by the copy engine, completing on mbarrier `bar`.
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// Bytes of a ring slot's token row: rows g and g + 1 start 64 bytes apart modulo 128, so a quarter-warp's 16-byte
// loads (two rows, 64 bytes each) fall on disjoint banks.
__host__ __device__ __forceinline__ int shared_x_pitch(int warps_k) { return warps_k * 256 + 64; }

template <int MT, int LOW_BITS, int STEP_BLOCKS, bool CLUSTER>
__global__ void w12_shared_x_kernel(W12MmaArgs args, int ring) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int consumers = args.warps_n * args.warps_k;
  const bool producer = warp == consumers;
  const int warp_n = warp % args.warps_n;
  const int warp_k = producer ? args.warps_k : warp / args.warps_n;  // the producer owns no K class
  const int tile = blockIdx.x * args.warps_n + warp_n;
  const int g = lane >> 2, t = lane & 3;
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const bool active = tile < tiles && !producer;

  const int pitch = shared_x_pitch(args.warps_k);
  const int slot_bytes = MT * 8 * pitch;
  extern __shared__ uint4 shared_words[];
  uint8_t* ring_ptr = reinterpret_cast<uint8_t*>(shared_words + epilogue_words<MT, 1>(args, blockDim.x));
  uint64_t* full = reinterpret_cast<uint64_t*>(ring_ptr + (size_t)ring * slot_bytes);
  int* released = reinterpret_cast<int*>(full + ring);
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring_ptr));
  const uint32_t full_s = static_cast<uint32_t>(__cvta_generic_to_shared(full));
  const int first0 = blockIdx.y * args.chunks_per_split;
  const int last = min(first0 + args.chunks_per_split, chunks);
  const int rounds = (last - first0 + args.warps_k - 1) / args.warps_k;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ring; ++s) {
      mbarrier_init(full_s + 8 * s, 1);
      released[s] = 0;
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  float acc[1][MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.f;

  if (producer) {
    wait_before_reading_x(args);  // the activations may be the previous kernel's output
    for (int r = 0; r < rounds; ++r) {
      const int slot = r % ring;
      if (r >= ring) {  // every consumer has released round r - ring from this slot
        const int need = (r / ring) * consumers;
        while (true) {
          int seen;
          asm volatile("ld.volatile.shared.s32 %0, [%1];" : "=r"(seen)
                       : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(released + slot))) : "memory");
          if (seen >= need) break;
          __nanosleep(32);
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the consumers' reads before the copies' writes
      }
      const int c0 = first0 + r * args.warps_k;
      const uint32_t row_bytes = (uint32_t)min(args.warps_k, last - c0) * 256;
      const uint32_t bar = full_s + 8 * slot;
      if (lane == 0) mbarrier_arrive_expecting(bar, row_bytes * MT * 8);
      __syncwarp();
      for (int row = lane; row < MT * 8; row += 32) {
        const __nv_bfloat16* src = args.x + (size_t)min(row, args.m - 1) * args.ldx + (size_t)c0 * 128;
        bulk_copy_to_shared(ring_s + slot * slot_bytes + row * pitch, src, row_bytes, bar);
      }
    }
  } else {
    static_assert(STEP_BLOCKS == 4 || STEP_BLOCKS == 2, "a step is a chunk or half of one");
    constexpr int kBlocks = STEP_BLOCKS;
    constexpr int kStepsPerChunk = kBlocksPerChunk / kBlocks;
    constexpr int kKeyShift = kStepsPerChunk == 1 ? 11 : 10;
    const int first = first0 + warp_k;
    const OneTile one(args, min(tile, tiles - 1), first, last, lane);  // past the last tile: repeat it, store nothing
    const uint32_t base_lo = one.base_lo, base_hi = one.base_hi;
    const uint4* view_next = one.view;
    const uint2* nibs_next = one.nibs;
    EscapeWindow esc = one.esc;
    if (LOW_BITS == 0 && active) esc.load(args, lane);
    uint4 v_next[kBlocks];
    uint2 n_next[kBlocks];
    int load_part = 0;
    auto load_step = [&]() {
      load_step_registers<kBlocks, LOW_BITS>(v_next, n_next, view_next, nibs_next);
      const size_t advance = step_advance<kBlocks>(load_part, args.warps_k);
      view_next += advance;
      nibs_next += advance;
      load_part = (load_part + 1) & (kStepsPerChunk - 1);
    };
    if (active && first < last) load_step();
    uint32_t phase = 0;
    for (int r = 0, slot = 0; r < rounds; ++r) {
      mbarrier_wait(full_s + 8 * slot, phase);
      const int chunk = first + r * args.warps_k;
      if (active && chunk < last) {
        // lane (g, t)'s 16 bytes of token row g of this warp's chunk; token tile j is 8 rows further
        const uint32_t xs = ring_s + slot * slot_bytes + g * pitch + warp_k * 256 + 16 * t;
#pragma unroll
        for (int part = 0; part < kStepsPerChunk; ++part) {
          uint4 v[kBlocks];
          uint2 nb[kBlocks];
#pragma unroll
          for (int u = 0; u < kBlocks; ++u) {
            v[u] = v_next[u];
            nb[u] = n_next[u];
          }
          if (part + 1 < kStepsPerChunk || chunk + args.warps_k < last) load_step();
          uint32_t a[kBlocks][8];
#pragma unroll
          for (int u = 0; u < kBlocks; ++u) decode_block<LOW_BITS>(a[u], v[u], nb[u], base_lo, base_hi);
          if (LOW_BITS == 0)
            esc.template patch<kBlocks, kKeyShift>(a, uint32_t(chunk * kStepsPerChunk + part), part, args, lane);
#pragma unroll
          for (int u = 0; u < kBlocks; ++u) {
            uint4 xb[MT];
#pragma unroll
            for (int j = 0; j < MT; ++j)
              asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                           : "=r"(xb[j].x), "=r"(xb[j].y), "=r"(xb[j].z), "=r"(xb[j].w)
                           : "r"(xs + j * 8 * pitch + (part * kBlocks + u) * 64) : "memory");
#pragma unroll
            for (int s = 0; s < 2; ++s) {
              const uint32_t frag[4] = {a[u][4 * s], a[u][4 * s + 1], a[u][4 * s + 2], a[u][4 * s + 3]};
#pragma unroll
              for (int j = 0; j < MT; ++j) mma_bf16(acc[0][j], frag, s ? xb[j].z : xb[j].x, s ? xb[j].w : xb[j].y);
            }
          }
        }
      }
      // Released: this warp's reads of the slot are done (their values fed the MMAs above). No fence: one would also
      // wait for the weight loads in flight.
      __syncwarp();
      if (lane == 0) atomicAdd(released + slot, 1);
      if (++slot == ring) {
        slot = 0;
        phase ^= 1;
      }
    }
  }
  reduce_and_store<1, MT, CLUSTER>(acc, args, warp, warp_n, warp_k, lane, tile, active);
#else
  __trap();  // the host launches shared activations on sm_90+ only
#endif
}

// Warpgroup MMA (sm_90a; 9-64 rows): the weights stay the A operand in registers, decoded and patched exactly as
// above (a warp's m16n8k16 A fragments are its slice of wgmma's register A), and the activations become the B operand,
// read by the tensor cores from shared memory: no activation registers and no per-warp activation loads. A warpgroup
// is 4 consecutive tiles of one K class, so each warp still sums its tile's chunks in the partition's order, and a
// k16 wgmma gives the same bits as four warps' m16n8k16 (the GPU tests compare the two kernels).
//
// B must hold the activations in the K order the weight fragments were permuted to (k-slot 2t + h + 8q of the chunk's
// k16 step (u, s) is column 32u + 8t + 4s + 2q + h), and no bulk or TMA copy permutes 4-byte words. So a small kernel
// first writes each chunk's activations (MT * 8 token rows, rows past m zero) in exactly the shared-memory image B
// wants (w12_permute_x_kernel, a few hundred KB), and each K class then brings a chunk in with one bulk copy into a
// ring of slots (full and empty mbarriers), issued by one thread up to three chunks ahead: no thread stages activations
// and no warp waits at a barrier for the others. (v16 staged them through every thread's registers and met at a named
// barrier each chunk: it lost to the per-warp kernel at 9-32 rows; docs/w12-notes.md.)
//
// Weights (STAGED): a warp's next chunk in registers, loaded once the MMAs are issued, leaves the load little to hide
// behind: the next decode waits for it. Each warp instead copies its chunks into its own shared-memory ring of
// wgmma_weight_stages() chunks (cp.async), stages - 1 ahead of the one it decodes, with 23 fewer registers at 32 rows:
// 4-6% off gate_up and the LM head at 32 rows on the H200 (v19, docs/w12-notes.md). The launch keeps weights in
// registers where the ring's shared memory would leave room for fewer resident blocks (e.g. three K classes a block at
// 64 rows).
template <int MT>
__device__ __forceinline__ void wgmma_step(float (&d)[MT * 4], const uint32_t* a, uint64_t b);

#define W12_WGMMA_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
template <>
__device__ __forceinline__ void wgmma_step<2>(float (&d)[8], const uint32_t* a, uint64_t b) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, "
      "0;\n}"
      : W12_WGMMA_D4(0), W12_WGMMA_D4(4)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_step<4>(float (&d)[16], const uint32_t* a, uint64_t b) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
      "{%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}"
      : W12_WGMMA_D4(0), W12_WGMMA_D4(4), W12_WGMMA_D4(8), W12_WGMMA_D4(12)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
template <>
__device__ __forceinline__ void wgmma_step<8>(float (&d)[32], const uint32_t* a, uint64_t b) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}"
      : W12_WGMMA_D4(0), W12_WGMMA_D4(4), W12_WGMMA_D4(8), W12_WGMMA_D4(12), W12_WGMMA_D4(16), W12_WGMMA_D4(20),
        W12_WGMMA_D4(24), W12_WGMMA_D4(28)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
#undef W12_WGMMA_D4

// Bytes of one k16 step of B in shared memory: [k half q][token group][8 rows][16 bytes], so the descriptor's
// leading offset (between the two k halves) is MT * 128 and its stride offset (between token groups) 128. A chunk is
// 8 steps (u, s) in order.
template <int MT>
__host__ __device__ constexpr int wgmma_step_bytes() { return MT * 256; }
template <int MT>
__host__ __device__ constexpr int wgmma_chunk_bytes() { return 8 * wgmma_step_bytes<MT>(); }
// Activation slots a K class: chunk i + slots - 1 is copied while chunks i .. i + slots - 2 are read. Four (three
// slots were ~1% slower), but three at 64 rows, where four of 16 KB a class leave three K classes no room.
template <int MT>
__host__ __device__ constexpr int wgmma_slots() { return MT == 8 ? 3 : 4; }
// Each warp's own ring of weight chunks (view words, then the nibble run, as the staged per-warp kernel lays a step
// out), filled by cp.async: chunk i + stages - 1 is in flight while chunk i is decoded. Three a warp at 9-16 rows; two
// at 17-32, where one chunk in flight a warp took 1-2% off gate_up's first region (fewer requests queued; an L2
// prefetch of one or two chunks more was 12-30% slower, v21), and at 64 rows, where 3 KB more a warp would leave two
// blocks of 8 warps no room beside their activation slots. At 9-16 rows two stages were 20% slower on gate_up.
template <int MT>
__host__ __device__ constexpr int wgmma_weight_stages() { return MT == 2 ? 3 : 2; }
constexpr int kWgmmaStageBytes = kBlocksPerChunk * kStagedBlockWords * 16;

// x [m, ldx] -> each 128-column chunk's B image (wgmma_chunk_bytes<MT>() apiece, rows past m zero). Thread p copies
// piece p of the chunk's MT * 8 rows x 16 pieces (8 columns 32u + 8t .. + 7 of token row n): its four words go to
// steps (u, 0) and (u, 1), k halves 0 and 1, k-slots 2t and 2t + 1.
template <int MT>
__global__ void w12_permute_x_kernel(const __nv_bfloat16* x, int m, int ldx, int chunks, uint32_t* image) {
  allow_next_grid();  // the GEMM's prologue reads only its weights
  wait_for_prior_grid();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= chunks * MT * 8 * 16) return;
  const int chunk = p / (MT * 8 * 16), n = (p / 16) % (MT * 8), u = (p >> 2) & 3, t = p & 3;
  uint4 v = make_uint4(0, 0, 0, 0);
  if (n < m) v = __ldg(reinterpret_cast<const uint4*>(x + (size_t)n * ldx + chunk * 128 + u * 32 + 8 * t));
  constexpr int kHalf = MT * 128, kStep = wgmma_step_bytes<MT>();
  uint32_t* at = image + ((size_t)chunk * wgmma_chunk_bytes<MT>() + 2 * u * kStep + (n >> 3) * 128 + (n & 7) * 16 + 4 * t) / 4;
  at[0] = v.x;
  at[kHalf / 4] = v.y;
  at[kStep / 4] = v.z;
  at[(kStep + kHalf) / 4] = v.w;
}

template <int MT, int LOW_BITS, bool CLUSTER, bool STAGED>
__global__ void w12_wgmma_kernel(W12MmaArgs args, const uint4* x_image) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warp_n = warp % args.warps_n;  // warps_n = 4 x warpgroups a K class
  const int warp_k = warp / args.warps_n;
  const int tile = blockIdx.x * args.warps_n + warp_n;
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int first = blockIdx.y * args.chunks_per_split + warp_k;
  const int last = min((int)(blockIdx.y + 1) * args.chunks_per_split, chunks);
  constexpr int kChunkBytes = wgmma_chunk_bytes<MT>();
  constexpr int kWgmmaSlots = wgmma_slots<MT>();
  extern __shared__ uint4 shared_words[];
  constexpr int kStages = STAGED ? wgmma_weight_stages<MT>() : 0;
  uint8_t* class_slots = reinterpret_cast<uint8_t*>(shared_words + epilogue_words<MT, 1>(args, blockDim.x));
  // [warps_k][slots] chunk images, [warps][stages] weight chunks, then [warps_k][slots] full and [warps_k][slots]
  // empty mbarriers
  uint8_t* weight_stages = class_slots + (size_t)args.warps_k * kWgmmaSlots * kChunkBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(weight_stages + (size_t)(blockDim.x / 32) * kStages * kWgmmaStageBytes);
  const uint32_t slots = static_cast<uint32_t>(__cvta_generic_to_shared(class_slots)) + warp_k * kWgmmaSlots * kChunkBytes;
  const uint32_t warp_stages =  // the warp's first stage (stage_step's layout of a chunk)
      static_cast<uint32_t>(__cvta_generic_to_shared(weight_stages)) + warp * kStages * kWgmmaStageBytes;
  const uint32_t full = static_cast<uint32_t>(__cvta_generic_to_shared(bars)) + warp_k * kWgmmaSlots * 8;
  const uint32_t empty = full + args.warps_k * kWgmmaSlots * 8;
  if (threadIdx.x == 0) {
    for (int i = 0; i < args.warps_k * kWgmmaSlots; ++i) {
      const uint32_t f = static_cast<uint32_t>(__cvta_generic_to_shared(bars + i));
      mbarrier_init(f, 1);
      mbarrier_init(f + args.warps_k * kWgmmaSlots * 8, args.warps_n);  // one arrival a warp of the class
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  float d[MT * 4];
#pragma unroll
  for (int i = 0; i < MT * 4; ++i) d[i] = 0.f;

  // A K class has chunks or not as a whole (the wgmma is collective), so warps past the last tile run too, repeating it.
  if (first < last) {
    const OneTile one(args, min(tile, tiles - 1), first, last, lane);  // past the last tile: repeat it, store nothing
    const uint32_t base_lo = one.base_lo, base_hi = one.base_hi;
    const uint4* view_next = one.view;
    const uint2* nibs_next = one.nibs;
    EscapeWindow esc = one.esc;
    if (LOW_BITS == 0) esc.load(args, lane);
    const size_t advance = (size_t)args.warps_k * kBlocksPerChunk * 32;
    const int count = (last - first + args.warps_k - 1) / args.warps_k;
    // Weights in registers (!STAGED): the next chunk's, loaded while this one's MMAs run.
    uint4 v_next[kBlocksPerChunk];
    uint2 n_next[kBlocksPerChunk];
    // Weights staged (STAGED): the warp's chunk i of weights into its stage i % stages (stage_step); one commit group
    // a chunk, empty past the last, so chunk i is always group i.
    auto copy_weights = [&](bool any, uint32_t stage) {
      if (any) {
        stage_step<kBlocksPerChunk, LOW_BITS>(warp_stages + stage, view_next, nibs_next, lane);
        view_next += advance;
        nibs_next += advance;
      }
      asm volatile("cp.async.commit_group;");
    };
    if constexpr (STAGED) {
#pragma unroll
      for (int i = 0; i < kStages - 1; ++i) copy_weights(i < count, i * kWgmmaStageBytes);
    } else {
      load_step_registers<kBlocksPerChunk, LOW_BITS>(v_next, n_next, view_next, nibs_next);
      view_next += advance;
      nibs_next += advance;
    }
    // stage offsets of chunk i (read this iteration) and of chunk i - 1 (refilled with chunk i + stages - 1)
    uint32_t stage = 0, previous = STAGED ? (kStages - 1) * kWgmmaStageBytes : 0;

    // The class's copier: its first thread puts chunk i + slots - 1 into the slot of chunk i - 1 once every warp of
    // the class has released it.
    const bool copier = threadIdx.x == warp_k * args.warps_n * 32;
    auto copy_chunk = [&](int i) {
      const uint32_t slot = i % kWgmmaSlots;
      mbarrier_arrive_expecting(full + 8 * slot, kChunkBytes);
      bulk_copy_to_shared(slots + slot * kChunkBytes, x_image + (size_t)(first + i * args.warps_k) * (kChunkBytes / 16),
                          kChunkBytes, full + 8 * slot);
    };
    if (copier) {
      wait_before_reading_x(args);  // the image is the permute kernel's output
      for (int i = 0; i < min(count, kWgmmaSlots - 1); ++i) copy_chunk(i);
    }
    // Descriptors: the low word holds the step's address >> 4 (slot 0's first step plus the offset, which cannot carry
    // out of its 14 bits) and the leading offset, the high word the stride offset.
    const uint32_t desc_lo0 = ((slots & 0x3FFFF) >> 4) | ((MT * 128 >> 4) << 16);
    constexpr uint64_t kDescHi = (uint64_t)(128 >> 4) << 32;
    uint32_t slot = 0, phase = 0;
    for (int i = 0; i < count; ++i) {
      const int chunk = first + i * args.warps_k;
      uint32_t a[kBlocksPerChunk][8];
      if constexpr (STAGED) {
        // chunk i + stages - 1 into the stage chunk i - 1 left (read by every lane before the last iteration's
        // __syncwarp), then wait for chunk i's own group
        copy_weights(i + kStages - 1 < count, previous);
        asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");
        __syncwarp();
#pragma unroll
        for (int u = 0; u < kBlocksPerChunk; ++u) {
          uint4 v;
          uint2 nb;
          read_staged_block<kBlocksPerChunk, LOW_BITS>(warp_stages + stage, u, lane, v, nb);
          decode_block<LOW_BITS>(a[u], v, nb, base_lo, base_hi);
        }
        previous = stage;
        stage = stage == (kStages - 1) * kWgmmaStageBytes ? 0 : stage + kWgmmaStageBytes;
      } else {  // decoded, the chunk's weights leave their registers for the next chunk's loads
#pragma unroll
        for (int u = 0; u < kBlocksPerChunk; ++u) decode_block<LOW_BITS>(a[u], v_next[u], n_next[u], base_lo, base_hi);
      }
      if (LOW_BITS == 0) esc.template patch<kBlocksPerChunk, 11>(a, uint32_t(chunk), 0, args, lane);
      mbarrier_wait(full + 8 * slot, phase);  // the chunk's activations have landed
      const uint32_t desc_lo = desc_lo0 + slot * (kChunkBytes >> 4);
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int u = 0; u < kBlocksPerChunk; ++u)
#pragma unroll
        for (int s = 0; s < 2; ++s)
          wgmma_step<MT>(d, &a[u][4 * s], kDescHi | (desc_lo + (2 * u + s) * (wgmma_step_bytes<MT>() >> 4)));
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      if (!STAGED && i + 1 < count) {
        load_step_registers<kBlocksPerChunk, LOW_BITS>(v_next, n_next, view_next, nibs_next);
        view_next += advance;
        nibs_next += advance;
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");  // the A registers and the slot are free again
      __syncwarp();
      if (lane == 0) mbarrier_arrive(empty + 8 * slot);
      if (copier && i + kWgmmaSlots - 1 < count) {
        if (i >= 1) mbarrier_wait(empty + 8 * ((i - 1) % kWgmmaSlots), ((i - 1) / kWgmmaSlots) & 1);
        copy_chunk(i + kWgmmaSlots - 1);
      }
      if (++slot == kWgmmaSlots) {
        slot = 0;
        phase ^= 1;
      }
    }
  }
  float acc[1][MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[0][j][q] = d[4 * j + q];
  reduce_and_store<1, MT, CLUSTER>(acc, args, warp, warp_n, warp_k, lane, tile, true);
#else
  __trap();  // the host launches warpgroup MMAs on sm_90a only
#endif
}

// K splits summed in split order (split 0, then 1, 2, ...: the Triton reduction's order), rounded once.
// partial: [splits][m][ld], y: [m][ld], both summed and written in their first `columns` columns.
__global__ void split_reduce_kernel(const float* partial, __nv_bfloat16* y, int m, int columns, int ld, int splits) {
  allow_next_grid();  // the next kernel's prologue reads only its weights
  wait_for_prior_grid();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m * columns) return;
  const size_t at = (size_t)(i / columns) * ld + i % columns;
  float acc = partial[at];
  for (int s = 1; s < splits; ++s) acc += partial[(size_t)s * m * ld + at];
  y[at] = __float2bfloat16_rn(acc);
}

// A launch that may overlap the kernel before it in the stream (programmatic dependent launch, sm_90+), and may group
// `cluster_y` blocks along y into a thread-block cluster (sm_90+).
template <typename Kernel, typename... Args>
cudaError_t launch_overlapping(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool overlap,
                               int cluster_y, Args... args) {
  cudaLaunchAttribute attributes[2];
  int count = 0;
  if (overlap) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_y > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count++].val.clusterDim = {1, (unsigned)cluster_y, 1};
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// Blocks of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory) that fit a multiprocessor of the
// current device, 0 when none does (more shared memory than a block may have counts as none). Asked of the runtime
// once per kernel, device and block shape: the query cost 0.2-0.4 us of an eager call's ~10 us of host time on the
// H200. The kernel's dynamic shared-memory limit only ever rises, to the largest size asked for, so a smaller size
// asked later cannot refuse a larger launch whose answer is already known.
cudaError_t resident_blocks(const void* kernel, int threads, size_t smem, int* resident) {
  struct Shape {
    const void* kernel;
    int device, threads;
    size_t smem;
    int resident;
  };
  struct Limit {
    const void* kernel;
    int device;
    size_t smem;
  };
  static thread_local Shape known[64];
  static thread_local int known_count = 0;
  static thread_local Limit limits[64];
  static thread_local int limit_count = 0;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  for (int i = 0; i < min(known_count, 64); ++i)
    if (known[i].kernel == kernel && known[i].device == device && known[i].threads == threads && known[i].smem == smem) {
      *resident = known[i].resident;
      return cudaSuccess;
    }
  Limit* limit = nullptr;
  for (int i = 0; i < min(limit_count, 64); ++i)
    if (limits[i].kernel == kernel && limits[i].device == device) limit = &limits[i];
  if (!limit) {  // the kernel's limit as the runtime has it (an entry pushed out of the table may have raised it)
    cudaFuncAttributes attributes;
    err = cudaFuncGetAttributes(&attributes, kernel);
    if (err != cudaSuccess) return err;
    limit = &limits[limit_count++ % 64];
    *limit = {kernel, device, (size_t)attributes.maxDynamicSharedSizeBytes};
  }
  *resident = 0;
  if (smem > limit->smem) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
      cudaGetLastError();  // more than a block may have: no block fits (not remembered: the limit stays as it was)
      return cudaSuccess;
    }
    limit->smem = smem;
  }
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(resident, kernel, threads, smem);
  if (err != cudaSuccess) return err;
  known[known_count++ % 64] = {kernel, device, threads, smem, *resident};
  return cudaSuccess;
}

template <int MT, int LOW_BITS, int STEP_BLOCKS, int TP, bool STAGED, bool CLUSTER = false>
cudaError_t launch(const W12MmaArgs& args, cudaStream_t stream) {
  if constexpr (TP == 1 && !CLUSTER) {  // one tile a warp: K splits may meet in a cluster
    if (args.cluster_splits > 1) return launch<MT, LOW_BITS, STEP_BLOCKS, TP, STAGED, true>(args, stream);
  }
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int tiles_per_block = args.warps_n * TP;
  dim3 grid((tiles + tiles_per_block - 1) / tiles_per_block, (chunks + args.chunks_per_split - 1) / args.chunks_per_split);
  dim3 block(32 * args.warps_n * args.warps_k);
  // the epilogue's reduction and inbox, then (STAGED) each warp's double buffer
  const size_t smem = (size_t)epilogue_words<MT, TP>(args, block.x) * 16 +
                      (STAGED ? (size_t)(block.x / 32) * 2 * TP * STEP_BLOCKS * kStagedBlockWords * 16 : 0);
  auto kernel = w12_mma_kernel<MT, LOW_BITS, STEP_BLOCKS, TP, STAGED, CLUSTER>;
  int resident = 0;
  const cudaError_t err = resident_blocks(reinterpret_cast<const void*>(kernel), block.x, smem, &resident);
  if (err != cudaSuccess) return err;
  if (resident == 0 && args.warps_n > 1) {  // registers for fewer warps than the block: fewer tiles a block
    W12MmaArgs fewer = args;                // (which tiles share a block changes no bit)
    fewer.warps_n = args.warps_n / 2;
    return launch<MT, LOW_BITS, STEP_BLOCKS, TP, STAGED, CLUSTER>(fewer, stream);
  }
  return launch_overlapping(kernel, grid, block, smem, stream, args.overlap_prior, args.cluster_splits, args);
}

// The shared-activation kernel's launch: tiles_per_block tiles of the partition's warps_k warps and the producer a
// block; the ring after the epilogue's shared memory.
template <int MT, int LOW_BITS, int STEP_BLOCKS, bool CLUSTER = false>
cudaError_t launch_shared_x(const W12MmaArgs& args, W12SharedActivations shared_x, cudaStream_t stream) {
  if constexpr (!CLUSTER) {
    if (args.cluster_splits > 1) return launch_shared_x<MT, LOW_BITS, STEP_BLOCKS, true>(args, shared_x, stream);
  }
  W12MmaArgs launched = args;
  launched.warps_n = shared_x.tiles;  // which tiles share a block changes no bit
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  dim3 grid((tiles + launched.warps_n - 1) / launched.warps_n,
            (chunks + args.chunks_per_split - 1) / args.chunks_per_split);
  dim3 block(32 * (launched.warps_n * args.warps_k + 1));
  const size_t smem = (size_t)epilogue_words<MT, 1>(launched, block.x) * 16 +
                      (size_t)shared_x.ring * (MT * 8 * shared_x_pitch(args.warps_k) + 12);
  auto kernel = w12_shared_x_kernel<MT, LOW_BITS, STEP_BLOCKS, CLUSTER>;
  int resident = 0;
  const cudaError_t err = resident_blocks(reinterpret_cast<const void*>(kernel), block.x, smem, &resident);
  if (err != cudaSuccess) return err;
  if (resident == 0) return cudaErrorLaunchOutOfResources;  // a ring or block too large for a multiprocessor
  return launch_overlapping(kernel, grid, block, smem, stream, args.overlap_prior, args.cluster_splits, launched,
                            shared_x.ring);
}

// The warpgroup kernel's launch: `groups` warpgroups of 4 tiles for each of the partition's K classes a block; each
// class's activation slots and their mbarriers after the epilogue's shared memory. The permute kernel writes the
// chunks' B images to `x_image` first.
template <int MT, int LOW_BITS, bool CLUSTER = false>
cudaError_t launch_wgmma(const W12MmaArgs& args, int groups, void* x_image, bool x_image_written, cudaStream_t stream,
                         int* launched_groups) {
  if constexpr (!CLUSTER) {
    if (args.cluster_splits > 1)
      return launch_wgmma<MT, LOW_BITS, true>(args, groups, x_image, x_image_written, stream, launched_groups);
  }
  W12MmaArgs launched = args;
  launched.warps_n = 4 * groups;  // which tiles share a block changes no bit
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  dim3 grid((tiles + launched.warps_n - 1) / launched.warps_n,
            (chunks + args.chunks_per_split - 1) / args.chunks_per_split);
  dim3 block(32 * launched.warps_n * args.warps_k);
  const size_t smem_registers = (size_t)epilogue_words<MT, 1>(launched, block.x) * 16 +
                                (size_t)args.warps_k * wgmma_slots<MT>() * (wgmma_chunk_bytes<MT>() + 16);
  const size_t smem_staged = smem_registers + (size_t)(block.x / 32) * wgmma_weight_stages<MT>() * kWgmmaStageBytes;
  auto registers = w12_wgmma_kernel<MT, LOW_BITS, CLUSTER, false>;
  auto staged = w12_wgmma_kernel<MT, LOW_BITS, CLUSTER, true>;
  int resident = 0, resident_staged = 0;
  cudaError_t err = resident_blocks(reinterpret_cast<const void*>(registers), block.x, smem_registers, &resident);
  if (err == cudaSuccess)
    err = resident_blocks(reinterpret_cast<const void*>(staged), block.x, smem_staged, &resident_staged);
  if (err != cudaSuccess) return err;
  // Weights staged in shared memory wherever that keeps as many blocks resident as registers do (their shared memory
  // may leave room for fewer; the same bits either way).
  const bool stage_weights = resident_staged > 0 && resident_staged >= resident;
  resident = max(resident, resident_staged);
  if (resident == 0) {  // more registers or shared memory than a multiprocessor has: fewer warpgroups a block, or none
    if (groups > 1)
      return launch_wgmma<MT, LOW_BITS, CLUSTER>(args, groups / 2, x_image, x_image_written, stream, launched_groups);
    return cudaErrorNotSupported;  // the caller runs the per-warp kernel instead (the same bits)
  }
  if (!x_image_written) {
    const int pieces = chunks * MT * 8 * 16;
    err = launch_overlapping(w12_permute_x_kernel<MT>, dim3((pieces + 255) / 256), dim3(256), 0, stream,
                             args.overlap_prior != kOverlapNone, 1, args.x, args.m, args.ldx, chunks,
                             static_cast<uint32_t*>(x_image));
    if (err != cudaSuccess) return err;
  }
  *launched_groups = groups;
  return launch_overlapping(stage_weights ? staged : registers, grid, block, stage_weights ? smem_staged : smem_registers,
                            stream, args.overlap_prior, args.cluster_splits, launched, static_cast<const uint4*>(x_image));
}

// The step plans each token-tile count is built with (blocks a step, tiles a warp, weights staged in shared memory
// up to 16 rows); none changes a bit.
template <int MT, int LOW_BITS>
cudaError_t launch_plan(const W12MmaArgs& args, W12SharedActivations& shared_x, cudaStream_t stream) {
  const int plan = args.step_blocks * 10 + args.tiles_per_warp;
  if (shared_x.warpgroups > 0) {  // warpgroup MMAs: 9-64 rows, sm_90a (checked by w12_mma_launch)
    if constexpr (MT >= 2) {
      const cudaError_t err = launch_wgmma<MT, LOW_BITS>(args, shared_x.warpgroups, shared_x.x_image,
                                                         shared_x.x_image_written, stream, &shared_x.warpgroups);
      if (err != cudaErrorNotSupported) return err;
    }
    shared_x.warpgroups = 0;  // the per-warp kernel runs
  }
  if (shared_x.ring > 0) {  // shared activations: 17-32 rows, one tile a warp (checked by w12_mma_launch)
    if constexpr (MT == 4) {
      if (plan == 41) return launch_shared_x<MT, LOW_BITS, 4>(args, shared_x, stream);
      if (plan == 21) return launch_shared_x<MT, LOW_BITS, 2>(args, shared_x, stream);
    }
    return cudaErrorInvalidValue;
  }
  if constexpr (MT <= 2) {
    if (plan == 41 && args.staged_weights) return launch<MT, LOW_BITS, 4, 1, true>(args, stream);
  }
  if (args.staged_weights) return cudaErrorInvalidValue;
  if (plan == 41) return launch<MT, LOW_BITS, 4, 1, false>(args, stream);
  if constexpr (MT == 4) {
    if (plan == 21) return launch<MT, LOW_BITS, 2, 1, false>(args, stream);
  }
  if constexpr (MT >= 4) {
    if (plan == 22) return launch<MT, LOW_BITS, 2, 2, false>(args, stream);
  }
  return cudaErrorInvalidValue;
}

template <int LOW_BITS>
cudaError_t launch_rows(const W12MmaArgs& args, W12SharedActivations& shared_x, cudaStream_t stream) {
  // Token tiles of 8: 1, 2, 4 or 8 (up to 64 rows); each tile's MMA is independent of the others.
  if (args.m <= 8) return launch_plan<1, LOW_BITS>(args, shared_x, stream);
  if (args.m <= 16) return launch_plan<2, LOW_BITS>(args, shared_x, stream);
  if (args.m <= 32) return launch_plan<4, LOW_BITS>(args, shared_x, stream);
  return launch_plan<8, LOW_BITS>(args, shared_x, stream);
}

}  // namespace

cudaError_t w12_mma_launch(const W12MmaArgs& args, int low_bits, cudaStream_t stream, W12SharedActivations shared_x,
                           int* launched_warpgroups) {
  if (args.m < 1 || args.m > kMaxRows || args.warps_n * args.warps_k < 1 || args.warps_n * args.warps_k > kMaxWarpsPerBlock)
    return cudaErrorInvalidValue;
  if (shared_x.ring != 0 &&
      (args.m <= 16 || args.m > 32 || args.tiles_per_warp != 1 || args.staged_weights || shared_x.ring < 2 ||
       shared_x.ring > kMaxSharedXRing || shared_x.tiles < 1 || shared_x.tiles * args.warps_k > kMaxWarpsPerBlock))
    return cudaErrorInvalidValue;
  if (shared_x.warpgroups != 0 && (args.m <= 8 || shared_x.ring != 0 || args.staged_weights || shared_x.warpgroups < 0 ||
                                   4 * shared_x.warpgroups * args.warps_k > kMaxWgmmaWarpsPerBlock || !shared_x.x_image))
    return cudaErrorInvalidValue;
  static thread_local int major_of[16] = {};
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  int& major = major_of[device & 15];
  if (major == 0 && (status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) != cudaSuccess)
    return status;
  const int splits = (args.k_padded / 128 + args.chunks_per_split - 1) / args.chunks_per_split;
  W12MmaArgs launched = args;
  launched.cluster_splits = 1;
  // sm_90+: K splits meet in a cluster (up to kMaxClusterSplits, one tile a warp)
  if (args.partial && splits <= kMaxClusterSplits && args.tiles_per_warp == 1 && major >= 9) {
    launched.partial = nullptr;
    launched.cluster_splits = splits;
  }
  if (major < 9) shared_x.ring = 0;  // bulk copies and mbarrier transactions: sm_90+ (the same bits without)
  if (major != 9) shared_x.warpgroups = 0;  // wgmma: sm_90a only (the same bits without)
  const cudaError_t err = low_bits == 0   ? launch_rows<0>(launched, shared_x, stream)
                          : low_bits == 1 ? launch_rows<1>(launched, shared_x, stream)
                                          : launch_rows<2>(launched, shared_x, stream);
  if (launched_warpgroups) *launched_warpgroups = err == cudaSuccess ? shared_x.warpgroups : 0;
  if (err != cudaSuccess || !launched.partial) return err;
  const int columns = min(args.n, args.n_padded);  // a row region's: its rows of W
  const int total = args.m * columns;
  return launch_overlapping(split_reduce_kernel, dim3((total + 255) / 256), dim3(256), 0, stream, args.overlap_prior, 1,
                            (const float*)args.partial, args.y, args.m, columns, args.n, splits);
}
