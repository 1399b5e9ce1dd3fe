// W12 GEMM kernels' shared device code (sm_80+; warpgroup and cluster parts sm_90+): y = x @ W^T, W decoded in registers.
//
// Weights sit on the 16-row side of the tensor-core MMA, tokens on the other side. The fragment layout (mma.py) gives
// each lane of a warp its own m16n8k16 A fragments for two k16 steps as 16 view bytes plus 8 nibble bytes. The K
// order inside each 32-column block is permuted so that lane t's B fragments of both k16 steps are 8 consecutive
// columns of x (MMA k-slot 2t+h+8q of step s is column 8t+4s+2q+h).
//
// Decode: four SASS instructions per pair of weights (two 16-bit lanes of one register). One prmt builds
// V = [view byte | nibble byte] in each lane, the weight's nibble in the high half of its nibble byte (the layout stores
// two nibbles per byte: one read as is, the other from the word shifted left by 4); then
// bits = ((V & 0x7FF07FF0) >> 4) + ((V & 0x80008000) | (base << 7)): the mask drops the sign and the neighbouring lane's
// bits, the shift puts mantissa and exponent offset in place, sign and base fill disjoint bits (one LOP3), and the
// shift-and-add is one LEA.HI; the add cannot carry out of a lane (base + 15 <= 254). The decode is on the critical
// path of every kernel at few rows, where each warp's instruction stream sets the pace.
//
// Escapes are patched into the decoded fragment registers before the MMA, in parallel across the warp (EscapeStream).
//
// The partition is fixed by (N, K, GPU), never by M: a warp owns an interleaved set of its tile's 128-column chunks;
// warps of one tile (K classes) reduce in class order, K splits in split order (within a thread-block cluster through
// distributed shared memory, or through a workspace). How tiles share blocks, how far weights are prefetched, and how
// many token rows one MMA covers change no order of sums, so a row's bits are the same at every row count. No atomics.
//
// Kernel families, one file each: w12_warp.cu (per-warp mma.sync, 1-64 rows), w12_shared_x.cu (17-32 rows, a block's
// activations shared through a ring), w12_wgmma.cu (sm_90a warpgroup MMAs, 9-64 rows), w12_wide.cu (sm_90a warpgroup
// MMAs for 33-256 rows, every weight read once a launch); w12_launch.cu picks one.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "pdl.cuh"
#include "ptx.cuh"
#include "w12_mma.cuh"

namespace w12 {

constexpr int kBlocksPerChunk = 4;  // 4 x 32 columns = one 128-column chunk (the escape bucket width)
constexpr int kMaxRows = 64;        // rows a launch of the per-warp and warpgroup kernels (8 token tiles of 8)
constexpr int kMaxWideRows = 256;   // rows a launch of the wide kernel (two slabs of 128)
constexpr int kMaxWideWarpsPerBlock = 16;
constexpr int kMaxWideSlots = 6;   // activation slots a wide block
constexpr int kMaxWideStages = 6;  // weight stages a wide warp
constexpr int kMaxWarpsPerBlock = 16;  // the per-warp kernels
constexpr int kMaxWgmmaWarpsPerBlock = 32;  // the warpgroup kernel: 4 x warpgroups x warps_k (1024 threads)
constexpr int kMaxClusterSplits = 4;  // K splits reduced in a cluster by the per-warp kernels (more: a workspace)
constexpr int kStagedBlockWords = 48;  // 16-byte words a staged 32-column block: 32 view, 16 nibble
constexpr int kMaxSharedXRing = 8;     // ring slots of the shared-activation kernel
constexpr uint32_t kFullWarp = 0xFFFFFFFFu;

// Token tiles of 8 rows the per-warp and warpgroup kernels run m rows with: 1, 2, 4 or 8.
__host__ __device__ __forceinline__ int token_tiles(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }
// ... the per-warp and shared-activation kernels, which also run 17-24 rows as 3 token tiles: a quarter fewer MMAs and
// activation loads than 4 (each token column sums alone, so no bit depends on the count).
__host__ __device__ __forceinline__ int narrow_token_tiles(int m) { return m > 16 && m <= 24 ? 3 : token_tiles(m); }

// Register p (0: bytes 0-1, 1: bytes 2-3) of view word `view`, nibbles in the high halves of bytes 2p, 2p+1
// of `nibs`: V = [view byte | nibble byte] per lane, then the exact BF16 bits of both weights.
template <int P>
__device__ __forceinline__ uint32_t decode_pair(uint32_t view, uint32_t nibs, uint32_t base2) {
  const uint32_t v = ptx::permute_bytes(view, nibs, P == 0 ? 0x1504u : 0x3726u);
  // sign and base << 7 occupy disjoint bits (one LOP3); the masked shift and the add are one LEA.HI
  return ((v & 0x7FF07FF0u) >> 4) + ((v & 0x80008000u) | base2);
}

// One 32-column block's A fragments (two k16 steps), exact weights: view words w = 0..3 give registers 2w (row g) and
// 2w+1 (row g+8); words 0-1 take their nibbles from nibble word 0 (as is, then shifted), words 2-3 from word 1.
__device__ __forceinline__ void decode_block(uint32_t (&a)[8], uint4 view, uint2 nib, uint32_t base_lo,
                                             uint32_t base_hi) {
  const uint32_t words[4] = {view.x, view.y, view.z, view.w};
  const uint32_t sources[4] = {nib.x, nib.x << 4, nib.y, nib.y << 4};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    a[2 * w] = decode_pair<0>(words[w], sources[w], base_lo);
    a[2 * w + 1] = decode_pair<1>(words[w], sources[w], base_hi);
  }
}

// The Q pass (LOW_BITS 1: the dropped bits zero, 2: at their midpoint 1000) reads the view bytes alone, three SASS
// instructions a register: one prmt spreads two bytes into 16-bit lanes [sign x8 | s eeee mmm], one shift by 4 and
// one LOP3 (mask, then OR the exponent bias 112 and the midpoint bit) give the BF16 number s | (112 + eeee) << 7 |
// mmm << 4 [| 1000] = the weight / 2^(base - 112): normal for every code, so every product with an activation is exact
// in fp32, and the row's window 2^(base - 112) multiplies the fp32 sums instead (qpass_row_scale: a power of two,
// exact). The zero code s.0000.000 reads as 2^-15 here; every byte carrying it is an escape below the window (the
// format never stores a weight at offset 0), so the warp's escape patch sets it to a signed zero (EscapeStream::patch).
template <int LOW_BITS>
__device__ __forceinline__ uint32_t qpass_pair(uint32_t view, uint32_t select) {
  constexpr uint32_t kBias = LOW_BITS == 2 ? 0x38083808u : 0x38003800u;
  const uint32_t u = ptx::permute_bytes(view, 0, select);
  return ((u << 4) & 0x87F087F0u) | kBias;
}
template <int LOW_BITS>
__device__ __forceinline__ void decode_block_q(uint32_t (&a)[8], uint4 view) {
  static_assert(LOW_BITS == 1 || LOW_BITS == 2, "the Q pass's view: truncated (1) or midpoint (2)");
  const uint32_t words[4] = {view.x, view.y, view.z, view.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    a[2 * w] = qpass_pair<LOW_BITS>(words[w], 0x9180u);      // bytes 0, 1: row g
    a[2 * w + 1] = qpass_pair<LOW_BITS>(words[w], 0xB3A2u);  // bytes 2, 3: row g + 8
  }
}
// 2^(base - 112) as an fp32 (biased exponent base + 15 <= 254: always normal), the factor of a row's Q-pass sums.
__device__ __forceinline__ float qpass_row_scale(uint8_t base) { return __uint_as_float((uint32_t(base) + 15u) << 23); }

__device__ __forceinline__ uint32_t ld_shared2(uint32_t at) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(at) : "memory");
  return v;
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
    v[u] = ptx::load_streaming16(view + u * 32);
    nb[u] = LOW_BITS == 0 ? ptx::load_streaming8(nibs + u * 32) : make_uint2(0, 0);
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
  const uint64_t read_once = ptx::evict_first_policy();
#pragma unroll
  for (int u = 0; u < BLOCKS; ++u) ptx::cp_async16(mine + u * 32 * 16, view + u * 32, read_once);
  if (LOW_BITS == 0) {
    const uint4* run = reinterpret_cast<const uint4*>(nibs - lane) + lane;  // the warp's nibble words from this lane's
#pragma unroll
    for (int i = 0; i < BLOCKS * 16; i += 32)
      ptx::cp_async16(mine + (BLOCKS * 32 + i) * 16, run + i, read_once);
  }
}

// Block u of a step stage_step copied to `words`, back into a lane's registers.
template <int BLOCKS, int LOW_BITS>
__device__ __forceinline__ void read_staged_block(uint32_t words, int u, int lane, uint4& v, uint2& nb) {
  v = ptx::ld_shared16(words + lane * 16 + u * 32 * 16);
  nb = LOW_BITS == 0 ? ptx::ld_shared8(words + BLOCKS * 32 * 16 + lane * 8 + u * 32 * 8) : make_uint2(0, 0);
}

// Fragment words from a step's first block to the next step's: the chunk's next step, or (after its last) the first
// blocks of the warp's next chunk, warps_k chunks on.
template <int BLOCKS>
__device__ __forceinline__ size_t step_advance(int part, int warps_k) {
  constexpr int kSteps = kBlocksPerChunk / BLOCKS;
  return part == kSteps - 1 ? (size_t)(warps_k * kBlocksPerChunk - (kSteps - 1) * BLOCKS) * 32 : (size_t)BLOCKS * 32;
}

// Escapes (exact weights; the Q pass's zero codes). The kernel layout (mma.py) lists each (16-row tile, 128-column chunk)'s escapes as
// entries `position << 16 | exact BF16 bits` with position = group << 8 | lane << 3 | (register & 3) << 1 | half: group
// = 2 x block + k16 step names one m16n8k16 A fragment (four registers a lane) of the chunk, and lane, register and half
// the weight's place in it. A chunk word, (first entry - the tile's first) << 12 | count, locates a chunk's entries.
//
// A warp patches a chunk in parallel, one entry a lane: for each fragment group that has escapes, every lane stores its
// four decoded registers of that group in the warp's 512-byte scratch, the lanes holding that group's entries overwrite
// their weights' halfwords there, and every lane reads its four registers back. That is a fixed few instructions a group
// with escapes (one more round per 32 escapes of a chunk), not a pass of the whole warp per escape; a chunk without
// escapes costs a shuffle and a branch. Entries are fetched a chunk ahead, with the weights.
constexpr int kEscapeOverlayBytes = 512;  // a warp's overlay: 32 lanes x the 4 registers of one fragment group
constexpr int kEscapeTableWords = 64;     // chunk words a warp keeps in shared memory a tile (its first 64 chunks)
// A warp's escape scratch: the overlay, then one table a tile it owns (up to two).
constexpr int kEscapeScratchBytes = kEscapeOverlayBytes + 2 * kEscapeTableWords * 4;

struct EscapeStream {
  int tile = 0;       // the tile
  int start = 0;      // index of the tile's first entry
  uint32_t table;     // shared address of the tile's chunk words (the warp's chunks in order)
  uint32_t next = 0;  // this lane's entry of the chunk fetched
  uint32_t mine = 0;  // ... of the chunk being patched

  // `scratch`: the warp's kEscapeScratchBytes; `slot`: which of its tiles (0 or 1). The warp's chunks are first,
  // first + stride, ... below last.
  __device__ __forceinline__ void begin(const W12MmaArgs& args, int tile, int first, int last, int stride,
                                        uint32_t scratch, int slot, int lane) {
    this->tile = tile;
    start = args.esc_tile[tile];
    table = scratch + kEscapeOverlayBytes + slot * kEscapeTableWords * 4;
    const uint32_t* words = args.esc_chunk + (size_t)tile * (args.k_padded / 128);
#pragma unroll
    for (int h = 0; h < kEscapeTableWords / 32; ++h) {
      const int chunk = first + (32 * h + lane) * stride;
      ptx::st_shared4(table + (32 * h + lane) * 4, chunk < last ? __ldg(words + chunk) : 0u);
    }
    __syncwarp();
    if (first < last) fetch(args, 0, first, stride);
  }
  // The chunk word of the warp's i-th chunk: from the table, or (past its 64 chunks, rare) from memory.
  __device__ __forceinline__ uint32_t word(const W12MmaArgs& args, int i, int first, int stride) const {
    if (i < kEscapeTableWords) {
      return ptx::ld_shared4(table + i * 4);
    }
    return __ldg(args.esc_chunk + (size_t)tile * (args.k_padded / 128) + first + i * stride);
  }
  // Starts loading the escapes of the warp's i-th chunk.
  __device__ __forceinline__ void fetch(const W12MmaArgs& args, int i, int first, int stride) {
    const uint32_t w = word(args, i, first, stride);
    const int lane = threadIdx.x & 31;
    next = lane < (int)(w & 0xFFFu) ? __ldg(args.esc_entry + start + (w >> 12) + lane) : 0u;
  }
  // The chunk fetched last becomes the one patched.
  __device__ __forceinline__ void advance() { mine = next; }
  // Patches the chunk's escapes that fall in blocks first_block .. first_block + BLOCKS - 1 into their decoded
  // fragments a[0 .. BLOCKS - 1]. `overlay`: OVERLAY_GROUPS x kEscapeOverlayBytes of the warp's shared memory (the
  // first bytes of its escape scratch for OVERLAY_GROUPS 1, or any region no other warp touches meanwhile, e.g. a staged
  // weight buffer every lane has read: the caller's __syncwarp). The step's fragment groups with escapes go through the overlay OVERLAY_GROUPS at a
  // time, so one store, one patch and one load round trip serve all of them: at 1e-2 escapes almost every group has
  // one, and a round trip a group made the patch a serial chain of shared-memory latencies.
  // `i`: the chunk's place among the warp's chunks (those of ``begin``).
  // QPASS: the Q pass's decode (decode_block_q) instead, whose escapes keep their view reading except the zero code,
  // which becomes a signed zero (the entry's exact bits are not the Q pass's weight).
  template <int BLOCKS, bool EARLY_SECOND = false, bool QPASS = false, int OVERLAY_GROUPS = 1>
  __device__ __forceinline__ void patch(uint32_t (&a)[BLOCKS][8], int first_block, const W12MmaArgs& args, int i,
                                        int first, int stride, uint32_t overlay, int lane) {
    const uint32_t w = word(args, i, first, stride);
    const int count = w & 0xFFFu;
    if (count == 0) return;  // warp-uniform
    uint32_t entry = mine;
    // EARLY_SECOND: with more than 32 escapes in the chunk the second 32 are loaded before the first are patched, so
    // their latency hides behind that round; it costs registers, so only a kernel with them to spare asks for it.
    // Any further 32 (and the second without it) are loaded when reached.
    const uint32_t second =
        EARLY_SECOND && count > 32 && lane + 32 < count ? __ldg(args.esc_entry + start + (w >> 12) + 32 + lane) : 0u;
    constexpr int kGroups = 2 * BLOCKS;  // fragment groups of the step: 2 x block + k16 step
    for (int done = 0; done < count; done += 32) {
      if (EARLY_SECOND && done == 32)
        entry = second;
      else if (done > 0)
        entry = lane + done < count ? __ldg(args.esc_entry + start + (w >> 12) + done + lane) : 0u;
      const bool have = lane + done < count;
      const int group = ((entry >> 24) & 7) - 2 * first_block;  // the entry's group in this step (outside: not ours)
      const uint32_t groups = __reduce_or_sync(kFullWarp, have ? (1u << (group & 31)) & ((1u << kGroups) - 1) : 0u);
#pragma unroll
      for (int batch = 0; batch < kGroups; batch += OVERLAY_GROUPS) {
        constexpr int kAll = (1 << OVERLAY_GROUPS) - 1;
        if (groups & ((uint32_t)kAll << batch)) {  // warp-uniform
#pragma unroll
          for (int o = 0; o < OVERLAY_GROUPS && batch + o < kGroups; ++o) {
            const int u = (batch + o) >> 1, s = (batch + o) & 1;
            if (groups & (1u << (batch + o)))
              ptx::st_shared16(overlay + o * kEscapeOverlayBytes + lane * 16, a[u][4 * s], a[u][4 * s + 1],
                               a[u][4 * s + 2], a[u][4 * s + 3]);
          }
          __syncwarp();
          if (have && group >= batch && group < batch + OVERLAY_GROUPS) {
            const uint32_t at = overlay + (group - batch) * kEscapeOverlayBytes + ((entry >> 16) & 0xFFu) * 2;
            if (!QPASS) {
              ptx::st_shared2(at, entry);
            } else {
              const uint32_t read = ld_shared2(at);  // the zero code decodes with no exponent offset or mantissa
              if ((read & 0x07F0u) == 0) ptx::st_shared2(at, read & 0x8000u);
            }
          }
          __syncwarp();
#pragma unroll
          for (int o = 0; o < OVERLAY_GROUPS && batch + o < kGroups; ++o) {
            const int u = (batch + o) >> 1, s = (batch + o) & 1;
            if (groups & (1u << (batch + o))) {
              const uint4 r = ptx::ld_shared16(overlay + o * kEscapeOverlayBytes + lane * 16);
              a[u][4 * s] = r.x;
              a[u][4 * s + 1] = r.y;
              a[u][4 * s + 2] = r.z;
              a[u][4 * s + 3] = r.w;
            }
          }
        }
      }
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

// Where a warp that owns one tile (`own`) starts, from chunk `first` of its split: the exponent bases of its rows g and
// g + 8 (base << 7 in both lanes) and its first fragment words.
struct OneTile {
  uint32_t base_lo, base_hi;
  const uint4* view;
  const uint2* nibs;
  __device__ __forceinline__ OneTile(const W12MmaArgs& args, int own, int first, int lane) {
    const int g = lane >> 2;
    base_lo = uint32_t(args.base[own * 16 + g]) * 0x00800080u;
    base_hi = uint32_t(args.base[own * 16 + g + 8]) * 0x00800080u;
    const size_t start = ((size_t)own * (args.k_padded / 32) + (size_t)first * kBlocksPerChunk) * 32 + lane;
    view = reinterpret_cast<const uint4*>(args.view) + start;
    nibs = reinterpret_cast<const uint2*>(args.nibbles) + start;
  }
};

// Before an epilogue: the next kernel may start its prologue; outputs are written only once the kernel before is
// done. A first row region lets the next kernel (the second region, which reads x without waiting) start only after
// waiting.
__device__ __forceinline__ void epilogue_grid_order(const W12MmaArgs& args) {
  if (args.overlap_prior == kOverlapFirstRegion) {
    wait_for_prior_grid();
    allow_next_grid();
  } else {
    allow_next_grid();
    wait_for_prior_grid();
  }
}

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
  epilogue_grid_order(args);
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
      const uint32_t remote = ptx::map_to_block(
          ptx::shared_address(inbox + (((size_t)(split - 1) * args.warps_n + warp_n) * 32 + lane) * kAcc), 0);
#pragma unroll
      for (int p = 0; p < TP; ++p)
#pragma unroll
        for (int j = 0; j < MT; ++j)
          ptx::st_cluster16(remote + (p * MT + j) * 16, acc[p][j][0], acc[p][j][1], acc[p][j][2], acc[p][j][3]);
    }
    ptx::cluster_sync();
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

// Bytes of a ring slot's token row in the shared-activation kernel: rows g and g + 1 start 64 bytes apart modulo 128, so
// a quarter-warp's 16-byte loads (two rows, 64 bytes each) fall on disjoint banks.
__host__ __device__ __forceinline__ int shared_x_pitch(int warps_k) { return warps_k * 256 + 64; }

// The blocks of a thread-block cluster (sm_90+): `y` along y (an int converts to that), times `x` along x.
struct ClusterShape {
  unsigned x = 1, y = 1;
  ClusterShape(int y_) : y((unsigned)y_) {}  // NOLINT: implicit, as the launches pass a count along y
  ClusterShape(int x_, int y_) : x((unsigned)x_), y((unsigned)y_) {}
};

// A launch that may overlap the kernel before it in the stream (programmatic dependent launch, sm_90+), and may group
// its blocks into thread-block clusters of `cluster` (sm_90+).
template <typename Kernel, typename... Args>
cudaError_t launch_overlapping(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool overlap,
                               ClusterShape cluster, Args... args) {
  cudaLaunchAttribute attributes[2];
  int count = 0;
  if (overlap) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count++].val.clusterDim = {cluster.x, cluster.y, 1};
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

// Blocks of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory) that fit a multiprocessor of the current
// device, 0 when none does (w12_launch.cu).
cudaError_t resident_blocks(const void* kernel, int threads, size_t smem, int* resident);

// The kernel families' launches (one file each), given the token tiles of 8 rows (MT) the row count needs.
cudaError_t launch_warp(const W12MmaArgs& args, int low_bits, cudaStream_t stream);
cudaError_t launch_shared_x(const W12MmaArgs& args, int low_bits, const W12SharedActivations& shared_x,
                            cudaStream_t stream);
// cudaErrorNotSupported: no warpgroup block fits a multiprocessor (the caller runs the per-warp kernel).
cudaError_t launch_wgmma(const W12MmaArgs& args, int low_bits, W12SharedActivations& shared_x, cudaStream_t stream);
cudaError_t launch_wide(const W12MmaArgs& args, int low_bits, const W12Wide& wide, cudaStream_t stream);
// y = the sum of args.partial's `splits` K splits in split order (w12_launch.cu).
cudaError_t launch_split_sums(const W12MmaArgs& args, int splits, cudaStream_t stream);

}  // namespace w12
