// W12 GEMM with mma.sync (sm_80+, including sm_90 and sm_120): y = x @ W^T, W decoded in registers.
//
// Weights sit on the 16-row side of m16n8k16, tokens on the 8-wide side. The fragment layout
// (mma.py) gives each lane of a warp its own A fragments for two k16 steps as 16 view bytes plus 8
// bytes of nibbles. The K order inside each 32-column block is permuted so that lane t's B fragments of
// both k16 steps are 8 consecutive columns of x (MMA k-slot 2t+h+8q of step s is column 8t+4s+2q+h).
// Decode per pair of weights (two 16-bit lanes): prmt spreads two view bytes into lanes with their
// signs replicated, then ((b & 0x7F) << 4) + (base << 7) | sign | nibble. Escapes of a (16-row,
// 128-column) chunk are patched into the owning lane's register before the MMA; a warp keeps a window
// of 32 of its tile's escapes in registers (one per lane) and finds each block's by ballot.
//
// Two kernels, one partition and one order of sums (so a row's bits do not depend on which runs):
// - ring (1-4 rows): each warp owns a ring of `stages` shared-memory slots holding one chunk's view
//   (2 KB), nibbles (1 KB) and its tile's row bases and escape offsets; cp.async keeps stages - 1 chunks
//   in flight per warp while the warp decodes and multiplies the oldest (the launcher picks the depth
//   from occupancy). The ring is private to the warp.
// - register (5-64 rows): each warp holds its next chunk in registers and reads activations through L1.
// The partition is fixed by (N, K, GPU), never by M: a warp owns one 16-row tile and an interleaved set
// of its 128-column chunks; warps of one tile reduce through shared memory in warp order, K splits
// through a workspace summed in split order. No atomics.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "w12_mma.cuh"

namespace {

constexpr int kBlocksPerChunk = 4;   // 4 x 32 columns = one 128-column chunk (the escape bucket width)
constexpr int kViewBytes = 2048;     // per (16-row tile, chunk)
constexpr int kNibbleBytes = 1024;
constexpr int kMaxStages = 8;
constexpr int kMaxRows = 64;         // rows per launch (up to 8 token tiles of 8)
constexpr int kRingRows = 4;         // the ring kernel's rows; the register kernel takes 5-64
constexpr int kMaxWarpsPerBlock = 16;
constexpr int kInflightChunksPerSm = 48;  // ~144 KB of weights in flight per multiprocessor
constexpr int kBulkInflightChunksPerSm = 64;  // bulk copies hold no registers: up to ~192 KB in flight

__device__ __forceinline__ uint32_t spread_signed(uint32_t word, uint32_t selector) {
  uint32_t out;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(out) : "r"(word), "r"(selector));
  return out;
}

// Two weights of one row: view bytes (pair p of `word`), their nibbles at bits 0-3 / 16-19 of `nib`.
__device__ __forceinline__ uint32_t decode_pair(uint32_t word, uint32_t selector, uint32_t base2, uint32_t nib) {
  const uint32_t x = spread_signed(word, selector);  // lane = [sign x8 | s eeee mmm]
  return (((x & 0x007F007Fu) << 4) + base2) | (x & 0x80008000u) | (nib & 0x000F000Fu);
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

// Weights bypass L1 (each byte is read once); a tile's row bases and escape offsets are read by every
// warp on its tile.
__device__ __forceinline__ void copy_weights16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void copy_meta16(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void copy4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Wait until at most `pending` of this thread's copy groups are outstanding (the depth is a launch value).
__device__ __forceinline__ void copy_wait(int pending) {
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
  }
}

// Slot layout: view | nibbles (exact products only) | meta. Meta: the tile's 16 row
// bases (bytes 0-15), then the chunk's escape range in the escape arrays (int32 begin at 16, end at 20);
// it rides with the chunk so no dependent load waits when a warp moves to another tile.
__host__ __device__ constexpr int meta_offset(int low_bits) { return kViewBytes + (low_bits == 0 ? kNibbleBytes : 0); }
constexpr int kMetaBytes = 32;

__host__ __device__ constexpr int stage_bytes(int low_bits) { return meta_offset(low_bits) + kMetaBytes; }

// One warp's streaming state: its ring and its escape window.
template <int LOW_BITS>
struct WarpStream {
  const W12MmaArgs& args;
  uint8_t* ring;
  uint32_t ring_shared;
  int slot_bytes, lane;
  // Escape window: lane i holds escape win + i of the arrays (sorted by tile, chunk, then position);
  // escapes at or past e_limit belong to other warps.
  int win = 0, e_limit = 0;
  uint32_t my_loc = 0xFFFFFFFFu, my_val = 0;

  static constexpr int kMeta = meta_offset(LOW_BITS);

  __device__ WarpStream(const W12MmaArgs& a, uint8_t* smem, int warp, int lane_) : args(a), lane(lane_) {
    slot_bytes = stage_bytes(LOW_BITS);
    ring = smem + (size_t)warp * a.stages * slot_bytes;
    ring_shared = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  }

  // Copy chunk `chunk` of `tile` into ring slot `slot` (callers commit the group).
  __device__ __forceinline__ void copy_chunk(int tile, int chunk, int slot) const {
    const int kblocks = args.k_padded / 32;
    const uint32_t dst = ring_shared + slot * slot_bytes;
    const uint8_t* view = args.view + ((size_t)tile * kblocks * 512 + (size_t)chunk * kViewBytes) + lane * 16;
#pragma unroll
    for (int u = 0; u < kBlocksPerChunk; ++u) copy_weights16(dst + u * 512 + lane * 16, view + u * 512);
    if (LOW_BITS == 0) {  // lane l copies bytes 16l.. of each half; lanes read their 8 bytes after a warp sync
      const uint8_t* nib = args.nibbles + ((size_t)tile * kblocks * 256 + (size_t)chunk * kNibbleBytes) + lane * 16;
      copy_weights16(dst + kViewBytes + lane * 16, nib);
      copy_weights16(dst + kViewBytes + 512 + lane * 16, nib + 512);
    }
    const int unit = tile * (args.k_padded / 128) + chunk;
    if (lane == 0) copy_meta16(dst + kMeta, args.base + tile * 16);
    if (LOW_BITS == 0 && lane == 1) copy4(dst + kMeta + 16, args.esc_ptr + unit);
    if (LOW_BITS == 0 && lane == 2) copy4(dst + kMeta + 20, args.esc_ptr + unit + 1);
  }

  __device__ __forceinline__ void load_window() {
    const int idx = win + lane;
    my_loc = idx < e_limit ? uint32_t(args.esc_loc[idx]) : 0xFFFFFFFFu;
    my_val = idx < e_limit ? uint32_t(args.esc_val[idx]) : 0u;
  }

  // The warp's escapes are those of units [unit_lo, unit_hi) (loads while the first chunks are in flight).
  __device__ __forceinline__ void begin(int unit_lo, int unit_hi) {
    if (LOW_BITS != 0) return;
    win = args.esc_ptr[unit_lo];
    e_limit = args.esc_ptr[unit_hi];
    load_window();
  }

  // acc += x[:, chunk] . W[tile rows, chunk]^T from ring slot `slot_index` (up to 8 token rows).
  __device__ __forceinline__ void multiply_chunk(int slot_index, int chunk, float (&acc)[4]) {
    const int g = lane >> 2, t = lane & 3;
    const uint8_t* slot = ring + slot_index * slot_bytes;
    const uint32_t base_lo = uint32_t(slot[kMeta + g]) * 0x00800080u;  // base << 7, both lanes
    const uint32_t base_hi = uint32_t(slot[kMeta + g + 8]) * 0x00800080u;
    int e_begin = 0, e_end = 0;
    if (LOW_BITS == 0) {
      e_begin = *reinterpret_cast<const int*>(slot + kMeta + 16);
      e_end = *reinterpret_cast<const int*>(slot + kMeta + 20);
    }
    // Activations come through L1 (shared by the warps of a multiprocessor), two blocks' worth at a time
    // so their loads are in flight together within the 64-register budget.
    constexpr int XG = 2;
    uint4 xg[XG];
#pragma unroll
    for (int u = 0; u < kBlocksPerChunk; ++u) {
      if (u % XG == 0) {
#pragma unroll
        for (int b = 0; b < XG; ++b)
          xg[b] = g < args.m ? __ldg(reinterpret_cast<const uint4*>(args.x + (size_t)g * args.ldx + chunk * 128 +
                                                                    (u + b) * 32 + 8 * t))
                             : make_uint4(0, 0, 0, 0);
      }
      const uint4 v = *reinterpret_cast<const uint4*>(slot + u * 512 + lane * 16);
      uint2 nb;
      if (LOW_BITS == 0)
        nb = *reinterpret_cast<const uint2*>(slot + kViewBytes + (u * 32 + lane) * 8);
      else
        nb = make_uint2(LOW_BITS == 2 ? 0x88888888u : 0u, LOW_BITS == 2 ? 0x88888888u : 0u);
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      const uint32_t nw[2] = {nb.x, nb.y};
      uint32_t a[8];
#pragma unroll
      for (int w = 0; w < 4; ++w) {  // word w: step w/2; pairs: row g then row g+8
        const uint32_t n = nw[w >> 1] >> (8 * (w & 1));
        a[2 * w] = decode_pair(words[w], 0x9180u, base_lo, n);
        a[2 * w + 1] = decode_pair(words[w], 0xB3A2u, base_hi, n >> 4);
      }
      if (LOW_BITS != 0) {  // Q pass: view bytes s.0000.000 are E4M3 zeros
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          const uint32_t x = spread_signed(words[r >> 1], (r & 1) ? 0xB3A2u : 0x9180u);
          if ((x & 0x7Fu) == 0) a[r] = (a[r] & 0xFFFF0000u) | (x & 0x8000u);
          if ((x & 0x007F0000u) == 0) a[r] = (a[r] & 0x0000FFFFu) | (x & 0x80000000u);
        }
      }
      if (LOW_BITS == 0 && e_end > e_begin) {
        // Patch this block's escapes [e_begin, e_end): one ballot when they sit in the window; a chunk
        // with more than the window holds walks its windows again for each block (rare: zero rows).
        if (e_begin < win) {
          win = e_begin;
          load_window();
        }
        int pos = e_begin;
        while (true) {
          if (pos >= win + 32) {
            win = pos;
            load_window();
          }
          const int idx = win + lane;
          uint32_t hits = __ballot_sync(0xFFFFFFFFu, idx >= pos && idx < e_end && ((my_loc >> 9) & 3) == uint32_t(u));
          while (hits) {
            const int src = __ffs(hits) - 1;
            hits &= hits - 1;
            const uint32_t loc = __shfl_sync(0xFFFFFFFFu, my_loc, src);
            const uint32_t value = __shfl_sync(0xFFFFFFFFu, my_val, src);
            patch_escape(a, lane, loc, value);
          }
          if (win + 32 >= e_end) break;
          pos = win + 32;  // the chunk's escapes continue in the next window
        }
      }
      const uint32_t lo[4] = {a[0], a[1], a[2], a[3]};
      const uint32_t hi[4] = {a[4], a[5], a[6], a[7]};
      const uint4 xv = xg[u % XG];
      mma_bf16(acc, lo, xv.x, xv.y);
      mma_bf16(acc, hi, xv.z, xv.w);
    }
  }
};

// 1-4 rows: the ring kernel, held to 64 registers so 32 warps fit a multiprocessor.
template <int LOW_BITS>
__global__ void __launch_bounds__(512, 2) w12_mma_ring_kernel(W12MmaArgs args) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warp_n = warp % args.warps_n;
  const int warp_k = warp / args.warps_n;
  const int tile = blockIdx.x * args.warps_n + warp_n;
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  WarpStream<LOW_BITS> stream(args, smem, warp, lane);

  const int first = blockIdx.y * args.chunks_per_split + warp_k;
  const int last = min((int)(blockIdx.y + 1) * args.chunks_per_split, chunks);
  const int count = tile < tiles && first < last ? (last - first + args.warps_k - 1) / args.warps_k : 0;
  // every lane commits a group per issue, empty or not, so the wait counts stay uniform
  auto issue = [&](int i, int slot) {
    if (i < count) stream.copy_chunk(tile, first + i * args.warps_k, slot);
    copy_commit();
  };
  for (int s = 0; s < args.stages - 1; ++s) issue(s, s);

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  if (count > 0) {
    stream.begin(tile * chunks + first, tile * chunks + last);
    int read_slot = 0, write_slot = args.stages - 1;
    for (int i = 0; i < count; ++i) {
      copy_wait(args.stages - 2);
      __syncwarp();  // nibble bytes were copied by other lanes; and every lane is done with write_slot
      issue(i + args.stages - 1, write_slot);
      write_slot = write_slot + 1 == args.stages ? 0 : write_slot + 1;
      stream.multiply_chunk(read_slot, first + i * args.warps_k, acc);
      read_slot = read_slot + 1 == args.stages ? 0 : read_slot + 1;
    }
  }

  // Warps of one tile reduce in warp_k order through shared memory (the ring's space, once drained).
  asm volatile("cp.async.wait_all;" ::: "memory");
  if (args.warps_k > 1) {
    __syncthreads();
    float* red = reinterpret_cast<float*>(smem);
    float* mine = red + ((size_t)warp * 32 + lane) * 4;
#pragma unroll
    for (int q = 0; q < 4; ++q) mine[q] = acc[q];
    __syncthreads();
    if (warp_k != 0) return;
    for (int wk = 1; wk < args.warps_k; ++wk) {
      const float* other = red + ((size_t)(wk * args.warps_n + warp_n) * 32 + lane) * 4;
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[q] += other[q];
    }
  }
  if (tile >= tiles) return;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int n = tile * 16 + g + 8 * (q >> 1);
    const int m = 2 * t + (q & 1);
    if (n < args.n && m < args.m) {
      if (args.partial)
        args.partial[((size_t)blockIdx.y * args.m + m) * args.n + n] = acc[q];
      else
        args.y[(size_t)m * args.n + n] = __float2bfloat16_rn(acc[q]);
    }
  }
}

// 5-64 rows: each warp holds its next chunk in registers and reads activations through L1 (the ring's
// shared memory would shrink L1, which holds the activations the warps of a multiprocessor share; the
// v4d A/B in docs/w12-notes.md). Same partition and order of sums as the ring kernel: identical bits.
template <int MT, int LOW_BITS>
__global__ void w12_mma_register_kernel(W12MmaArgs args) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warp_n = warp % args.warps_n;
  const int warp_k = warp / args.warps_n;
  const int tile = blockIdx.x * args.warps_n + warp_n;
  const int g = lane >> 2, t = lane & 3;
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int kblocks = args.k_padded / 32;

  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  if (tile < tiles) {
    const uint32_t base_lo = uint32_t(args.base[tile * 16 + g]) * 0x00800080u;  // base << 7, both lanes
    const uint32_t base_hi = uint32_t(args.base[tile * 16 + g + 8]) * 0x00800080u;
    const uint4* view = reinterpret_cast<const uint4*>(args.view) + (size_t)tile * kblocks * 32 + lane;
    const uint2* nibs = reinterpret_cast<const uint2*>(args.nibbles) + (size_t)tile * kblocks * 32 + lane;
    const int first = blockIdx.y * args.chunks_per_split + warp_k;
    const int last = min((int)(blockIdx.y + 1) * args.chunks_per_split, chunks);

    // Escape window: lane i holds escape win + i of this tile's range (sorted by chunk, then position).
    const int e_lo = args.esc_ptr[tile * chunks + min(first, chunks)];
    const int e_hi = args.esc_ptr[tile * chunks + last];
    int win = e_lo;
    uint32_t my_loc = 0xFFFFFFFFu, my_val = 0;
    auto load_window = [&]() {
      const int idx = win + lane;
      my_loc = idx < e_hi ? uint32_t(args.esc_loc[idx]) : 0xFFFFFFFFu;
      my_val = idx < e_hi ? uint32_t(args.esc_val[idx]) : 0u;
    };
    if (LOW_BITS == 0) load_window();

    uint4 v_next[kBlocksPerChunk];
    uint2 n_next[kBlocksPerChunk];
    auto load_chunk = [&](int chunk) {
#pragma unroll
      for (int u = 0; u < kBlocksPerChunk; ++u) {
        const size_t off = (size_t)(chunk * kBlocksPerChunk + u) * 32;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v_next[u].x), "=r"(v_next[u].y), "=r"(v_next[u].z), "=r"(v_next[u].w)
                     : "l"(view + off));
        if (LOW_BITS == 0) {
          asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];"
                       : "=r"(n_next[u].x), "=r"(n_next[u].y) : "l"(nibs + off));
        }
      }
    };
    if (first < last) load_chunk(first);
    for (int chunk = first; chunk < last; chunk += args.warps_k) {
      uint4 v[kBlocksPerChunk];
      uint2 nb[kBlocksPerChunk];
#pragma unroll
      for (int u = 0; u < kBlocksPerChunk; ++u) {
        v[u] = v_next[u];
        nb[u] = LOW_BITS == 0 ? n_next[u] : make_uint2(LOW_BITS == 2 ? 0x88888888u : 0u, LOW_BITS == 2 ? 0x88888888u : 0u);
      }
      if (chunk + args.warps_k < last) load_chunk(chunk + args.warps_k);
      // activations of this chunk: one 16-byte load per token row and 32-column block
      uint4 xv[kBlocksPerChunk][MT];
#pragma unroll
      for (int u = 0; u < kBlocksPerChunk; ++u)
#pragma unroll
        for (int j = 0; j < MT; ++j) {
          const int m = j * 8 + g;
          xv[u][j] = m < args.m ? __ldg(reinterpret_cast<const uint4*>(
                                      args.x + (size_t)m * args.ldx + (chunk * kBlocksPerChunk + u) * 32 + 8 * t))
                                : make_uint4(0, 0, 0, 0);
        }

      uint32_t a[kBlocksPerChunk][8];
#pragma unroll
      for (int u = 0; u < kBlocksPerChunk; ++u) {
        const uint32_t words[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
        const uint32_t nw[2] = {nb[u].x, nb[u].y};
#pragma unroll
        for (int w = 0; w < 4; ++w) {  // word w: step w/2; pairs: row g then row g+8
          const uint32_t n = nw[w >> 1] >> (8 * (w & 1));
          a[u][2 * w] = decode_pair(words[w], 0x9180u, base_lo, n);
          a[u][2 * w + 1] = decode_pair(words[w], 0xB3A2u, base_hi, n >> 4);
        }
        if (LOW_BITS != 0) {  // Q pass: view bytes s.0000.000 are E4M3 zeros
#pragma unroll
          for (int r = 0; r < 8; ++r) {
            const uint32_t x = spread_signed(words[r >> 1], (r & 1) ? 0xB3A2u : 0x9180u);
            if ((x & 0x7Fu) == 0) a[u][r] = (a[u][r] & 0xFFFF0000u) | (x & 0x8000u);
            if ((x & 0x007F0000u) == 0) a[u][r] = (a[u][r] & 0x0000FFFFu) | (x & 0x80000000u);
          }
        }
      }
      if (LOW_BITS == 0) {
        while (true) {
          uint32_t hits = __ballot_sync(0xFFFFFFFFu, (my_loc >> 11) == uint32_t(chunk));
          while (hits) {
            const int src = __ffs(hits) - 1;
            hits &= hits - 1;
            const uint32_t loc = __shfl_sync(0xFFFFFFFFu, my_loc, src);
            const uint32_t value = __shfl_sync(0xFFFFFFFFu, my_val, src);
            const int u = (loc >> 9) & 3;
#pragma unroll
            for (int uu = 0; uu < kBlocksPerChunk; ++uu)
              if (uu == u) patch_escape(a[uu], lane, loc, value);
          }
          // the window is spent once its last escape is at or before this chunk: slide it (rare)
          const uint32_t last_loc = __shfl_sync(0xFFFFFFFFu, my_loc, 31);
          if (win + 32 < e_hi && (last_loc >> 11) <= uint32_t(chunk)) {
            win += 32;
            load_window();
            continue;
          }
          break;
        }
      }
#pragma unroll
      for (int u = 0; u < kBlocksPerChunk; ++u) {
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const uint32_t frag[4] = {a[u][4 * s], a[u][4 * s + 1], a[u][4 * s + 2], a[u][4 * s + 3]};
#pragma unroll
          for (int j = 0; j < MT; ++j)
            mma_bf16(acc[j], frag, s ? xv[u][j].z : xv[u][j].x, s ? xv[u][j].w : xv[u][j].y);
        }
      }
    }
  }

  // Warps of one tile reduce in warp_k order through shared memory.
  extern __shared__ float red[];
  if (args.warps_k > 1) {
    float* mine = red + ((size_t)warp * 32 + lane) * MT * 4;
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) mine[j * 4 + q] = acc[j][q];
    __syncthreads();
    if (warp_k != 0) return;
    for (int wk = 1; wk < args.warps_k; ++wk) {
      const float* other = red + ((size_t)(wk * args.warps_n + warp_n) * 32 + lane) * MT * 4;
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] += other[j * 4 + q];
    }
  }
  if (tile >= tiles) return;
#pragma unroll
  for (int j = 0; j < MT; ++j) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int n = tile * 16 + g + 8 * (q >> 1);
      const int m = j * 8 + 2 * t + (q & 1);
      if (n < args.n && m < args.m) {
        if (args.partial)
          args.partial[((size_t)blockIdx.y * args.m + m) * args.n + n] = acc[j][q];
        else
          args.y[(size_t)m * args.n + n] = __float2bfloat16_rn(acc[j][q]);
      }
    }
  }
}

// ---- Bulk-copy ring (sm_90 and later, sm_120 included) ----
// Each warp owns `stages` shared-memory slots (one chunk's view, 2 KB, and nibbles, 1 KB) and one mbarrier
// per slot. Lane 0 fills a slot with two 1-D bulk copies (the copy engine moves the bytes: nothing held in
// registers while they are in flight, two instructions per chunk where cp.async needs six per lane); the
// warp waits on the slot's phase, multiplies, and refills the slot with the chunk `stages` ahead, so up to
// `stages` chunks per warp are always in flight. Row bases live in registers (a warp keeps its tile);
// escapes come from the per-chunk CSR offsets, prefetched one chunk ahead, through the 32-entry window.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define W12_BULK_COPY 1
#endif

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void slot_barrier_init(uint32_t bar) {
#ifdef W12_BULK_COPY
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
#endif
}

__device__ __forceinline__ void slot_barriers_visible() {
#ifdef W12_BULK_COPY
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Lane 0: the slot's barrier completes its phase once `bytes` have landed.
__device__ __forceinline__ void slot_expect(uint32_t bar, uint32_t bytes) {
#ifdef W12_BULK_COPY
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#ifdef W12_BULK_COPY
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}

__device__ __forceinline__ void slot_wait(uint32_t bar, uint32_t phase) {
#ifdef W12_BULK_COPY
  asm volatile(
      "{\n.reg .pred ready;\nW12_SLOT_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 ready, [%0], %1;\n"
      "@!ready bra W12_SLOT_WAIT;\n}\n" ::"r"(bar), "r"(phase) : "memory");
#endif
}

constexpr int kBarrierBytes = kMaxWarpsPerBlock * kMaxStages * 8;  // one 8-byte mbarrier per warp and slot

__host__ __device__ constexpr int bulk_slot_bytes(int low_bits) { return kViewBytes + (low_bits == 0 ? kNibbleBytes : 0); }

template <int MT, int LOW_BITS>
__global__ void __launch_bounds__(512, MT == 1 ? 2 : 1) w12_mma_bulk_kernel(W12MmaArgs args) {
#ifdef W12_BULK_COPY
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kSlot = bulk_slot_bytes(LOW_BITS);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warp_n = warp % args.warps_n;
  const int warp_k = warp / args.warps_n;
  const int tile = blockIdx.x * args.warps_n + warp_n;
  const int g = lane >> 2, t = lane & 3;
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int kblocks = args.k_padded / 32;
  const int stages = args.stages;
  const uint32_t bars = shared_address(smem) + warp * kMaxStages * 8;
  const uint8_t* ring = smem + kBarrierBytes + (size_t)warp * stages * kSlot;
  const uint32_t ring_shared = shared_address(ring);

  const int first = blockIdx.y * args.chunks_per_split + warp_k;
  const int last = min((int)(blockIdx.y + 1) * args.chunks_per_split, chunks);
  const int count = tile < tiles && first < last ? (last - first + args.warps_k - 1) / args.warps_k : 0;

  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  if (count > 0) {
    const uint8_t* view = args.view + (size_t)tile * kblocks * 512;
    const uint8_t* nibs = args.nibbles + (size_t)tile * kblocks * 256;
    auto refill = [&](int i, int slot) {  // lane 0
      const int chunk = first + i * args.warps_k;
      const uint32_t bar = bars + slot * 8, dst = ring_shared + slot * kSlot;
      slot_expect(bar, kSlot);
      bulk_copy(dst, view + (size_t)chunk * kViewBytes, kViewBytes, bar);
      if (LOW_BITS == 0) bulk_copy(dst + kViewBytes, nibs + (size_t)chunk * kNibbleBytes, kNibbleBytes, bar);
    };
    if (lane == 0) {
      for (int s = 0; s < stages; ++s) slot_barrier_init(bars + s * 8);
      slot_barriers_visible();
      for (int s = 0; s < stages && s < count; ++s) refill(s, s);
    }
    __syncwarp();

    const uint32_t base_lo = uint32_t(args.base[tile * 16 + g]) * 0x00800080u;  // base << 7, both lanes
    const uint32_t base_hi = uint32_t(args.base[tile * 16 + g + 8]) * 0x00800080u;
    // Escape window: lane i holds escape win + i (sorted by chunk, 32-column block, row, column).
    // Entries up to e_hi (the end of the warp's chunk range) are loaded, so a window can serve later chunks.
    int win = -64, e_begin = 0, e_end = 0, e_begin_next = 0, e_end_next = 0, e_hi = 0;
    uint32_t my_loc = 0xFFFFFFFFu, my_val = 0;
    const int* esc_ptr = args.esc_ptr + tile * chunks;
    auto load_window = [&]() {
      const int idx = win + lane;
      my_loc = idx < e_hi ? uint32_t(args.esc_loc[idx]) : 0xFFFFFFFFu;
      my_val = idx < e_hi ? uint32_t(args.esc_val[idx]) : 0u;
    };
    if (LOW_BITS == 0) {
      e_begin_next = esc_ptr[first];
      e_end_next = esc_ptr[first + 1];
      e_hi = esc_ptr[last];
    }

    int slot = 0;
    uint32_t phase = 0;
    for (int i = 0; i < count; ++i) {
      const int chunk = first + i * args.warps_k;
      if (LOW_BITS == 0) {
        e_begin = e_begin_next;
        e_end = e_end_next;
        if (i + 1 < count) {  // the next chunk's escape range loads while this one computes
          e_begin_next = esc_ptr[chunk + args.warps_k];
          e_end_next = esc_ptr[chunk + args.warps_k + 1];
        }
        if (e_end > e_begin && (e_begin < win || e_begin >= win + 32)) {
          win = e_begin;
          load_window();
        }
      }
      // Activations through L1 (shared by the warps of a multiprocessor), XG blocks' worth at a time.
      constexpr int XG = MT == 1 ? 4 : MT == 2 ? 2 : 1;
      uint4 xg[XG][MT];
      slot_wait(bars + slot * 8, phase);
      const uint8_t* data = ring + slot * kSlot;
#pragma unroll
      for (int u = 0; u < kBlocksPerChunk; ++u) {
        if (u % XG == 0) {
#pragma unroll
          for (int b = 0; b < XG; ++b)
#pragma unroll
            for (int j = 0; j < MT; ++j) {
              const int m = j * 8 + g;
              xg[b][j] = m < args.m ? __ldg(reinterpret_cast<const uint4*>(args.x + (size_t)m * args.ldx + chunk * 128 +
                                                                           (u + b) * 32 + 8 * t))
                                    : make_uint4(0, 0, 0, 0);
            }
        }
        const uint4 v = *reinterpret_cast<const uint4*>(data + u * 512 + lane * 16);
        uint2 nb;
        if (LOW_BITS == 0)
          nb = *reinterpret_cast<const uint2*>(data + kViewBytes + (u * 32 + lane) * 8);
        else
          nb = make_uint2(LOW_BITS == 2 ? 0x88888888u : 0u, LOW_BITS == 2 ? 0x88888888u : 0u);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        const uint32_t nw[2] = {nb.x, nb.y};
        uint32_t a[8];
#pragma unroll
        for (int w = 0; w < 4; ++w) {  // word w: step w/2; pairs: row g then row g+8
          const uint32_t n = nw[w >> 1] >> (8 * (w & 1));
          a[2 * w] = decode_pair(words[w], 0x9180u, base_lo, n);
          a[2 * w + 1] = decode_pair(words[w], 0xB3A2u, base_hi, n >> 4);
        }
        if (LOW_BITS != 0) {  // Q pass: view bytes s.0000.000 are E4M3 zeros
#pragma unroll
          for (int r = 0; r < 8; ++r) {
            const uint32_t x = spread_signed(words[r >> 1], (r & 1) ? 0xB3A2u : 0x9180u);
            if ((x & 0x7Fu) == 0) a[r] = (a[r] & 0xFFFF0000u) | (x & 0x8000u);
            if ((x & 0x007F0000u) == 0) a[r] = (a[r] & 0x0000FFFFu) | (x & 0x80000000u);
          }
        }
        if (LOW_BITS == 0 && e_end > e_begin) {
          // this block's escapes, in window order; a block whose escapes run past the window slides it
          while (true) {
            const int idx = win + lane;
            uint32_t hits = __ballot_sync(0xFFFFFFFFu, idx >= e_begin && idx < e_end && ((my_loc >> 9) & 3) == uint32_t(u));
            while (hits) {
              const int src = __ffs(hits) - 1;
              hits &= hits - 1;
              patch_escape(a, lane, __shfl_sync(0xFFFFFFFFu, my_loc, src), __shfl_sync(0xFFFFFFFFu, my_val, src));
            }
            const uint32_t last_loc = __shfl_sync(0xFFFFFFFFu, my_loc, 31);
            if (win + 32 < e_end && ((last_loc >> 9) & 3) <= uint32_t(u)) {
              win += 32;
              load_window();
              continue;
            }
            break;
          }
        }
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const uint32_t frag[4] = {a[4 * s], a[4 * s + 1], a[4 * s + 2], a[4 * s + 3]};
#pragma unroll
          for (int j = 0; j < MT; ++j) {
            const uint4 xv = xg[u % XG][j];
            mma_bf16(acc[j], frag, s ? xv.z : xv.x, s ? xv.w : xv.y);
          }
        }
      }
      __syncwarp();  // every lane has read the slot
      if (lane == 0 && i + stages < count) refill(i + stages, slot);
      if (++slot == stages) {
        slot = 0;
        phase ^= 1;
      }
    }
  }

  // Warps of one tile reduce in warp_k order through shared memory (past the barriers; rings drained).
  if (args.warps_k > 1) {
    __syncthreads();
    float* red = reinterpret_cast<float*>(smem + kBarrierBytes);
    float* mine = red + ((size_t)warp * 32 + lane) * MT * 4;
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) mine[j * 4 + q] = acc[j][q];
    __syncthreads();
    if (warp_k != 0) return;
    for (int wk = 1; wk < args.warps_k; ++wk) {
      const float* other = red + ((size_t)(wk * args.warps_n + warp_n) * 32 + lane) * MT * 4;
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] += other[j * 4 + q];
    }
  }
  if (tile >= tiles) return;
#pragma unroll
  for (int j = 0; j < MT; ++j) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int n = tile * 16 + g + 8 * (q >> 1);
      const int m = j * 8 + 2 * t + (q & 1);
      if (n < args.n && m < args.m) {
        if (args.partial)
          args.partial[((size_t)blockIdx.y * args.m + m) * args.n + n] = acc[j][q];
        else
          args.y[(size_t)m * args.n + n] = __float2bfloat16_rn(acc[j][q]);
      }
    }
  }
#endif
}

// Ring depth for one launch: as many resident warps as possible (v4a in docs/w12-notes.md: a deeper
// ring that costs resident warps is slower on the H200), then as many chunks in flight per
// multiprocessor as useful (up to kInflightChunksPerSm). Cached per launch geometry.
template <typename Kernel>
cudaError_t choose_stages(Kernel kernel, const W12MmaArgs& args, int slot_bytes, int fixed_bytes, int reduction,
                          int inflight_chunks_per_sm, int warps, int per_warp, int& stages, size_t& smem) {
  int device = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  auto bytes_for = [&](int s) { return (size_t)fixed_bytes + std::max(warps * s * slot_bytes, reduction); };
  using Key = std::tuple<const void*, int, int, int, int>;
  static thread_local std::map<Key, int> cache;
  const Key key{reinterpret_cast<const void*>(kernel), device, warps, std::min(per_warp + 1, kMaxStages), args.stages};
  auto hit = cache.find(key);
  if (hit != cache.end()) {
    stages = hit->second;
    smem = bytes_for(stages);
    return cudaSuccess;
  }
  err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
  if (err != cudaSuccess) return err;
  const int deepest = std::max(2, std::min(kMaxStages, per_warp + 1));
  int best = 0;
  long best_score = -1;
  for (int s = 2; s <= deepest && bytes_for(s) <= (size_t)optin; ++s) {
    if (args.stages > 0) {  // a requested depth, lowered to what fits
      if (s <= args.stages) best = s;
      continue;
    }
    int blocks = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, 32 * warps, bytes_for(s));
    if (err != cudaSuccess) return err;
    const long score = (long)blocks * warps * 4096 + std::min(blocks * warps * (s - 1), inflight_chunks_per_sm);
    if (blocks > 0 && score > best_score) {
      best_score = score;
      best = s;
    }
  }
  if (best == 0) return cudaErrorInvalidConfiguration;  // two ring slots per warp exceed the block's shared memory
  cache.emplace(key, best);
  stages = best;
  smem = bytes_for(best);
  return cudaSuccess;
}

template <int LOW_BITS>
cudaError_t launch_ring(W12MmaArgs args, cudaStream_t stream) {
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int warps = args.warps_n * args.warps_k;
  const int per_warp = (args.chunks_per_split + args.warps_k - 1) / args.warps_k;
  size_t smem = 0;
  int stages = 0;
  const cudaError_t err = choose_stages(w12_mma_ring_kernel<LOW_BITS>, args, stage_bytes(LOW_BITS), 0,
                                       warps * 32 * 4 * (int)sizeof(float), kInflightChunksPerSm, warps, per_warp,
                                       stages, smem);
  if (err != cudaSuccess) return err;
  args.stages = stages;
  dim3 grid((tiles + args.warps_n - 1) / args.warps_n, (chunks + args.chunks_per_split - 1) / args.chunks_per_split);
  w12_mma_ring_kernel<LOW_BITS><<<grid, 32 * warps, smem, stream>>>(args);
  return cudaGetLastError();
}

template <int MT, int LOW_BITS>
cudaError_t launch_register(const W12MmaArgs& args, cudaStream_t stream) {
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  dim3 grid((tiles + args.warps_n - 1) / args.warps_n, (chunks + args.chunks_per_split - 1) / args.chunks_per_split);
  dim3 block(32 * args.warps_n * args.warps_k);
  const size_t smem = args.warps_k > 1 ? (size_t)block.x * MT * 4 * sizeof(float) : 0;
  auto kernel = w12_mma_register_kernel<MT, LOW_BITS>;
  if (smem > 48 * 1024) {  // the in-block reduction of 16 warps x 64 rows needs 64 KB (sm_120 allows 99 KB)
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, block, smem, stream>>>(args);
  return cudaGetLastError();
}

template <int MT, int LOW_BITS>
cudaError_t launch_bulk(W12MmaArgs args, cudaStream_t stream) {
  int device = 0, major = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  if (major < 9) return cudaErrorNotSupported;  // cp.async.bulk and mbarrier transaction counts need sm_90
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int warps = args.warps_n * args.warps_k;
  const int per_warp = (args.chunks_per_split + args.warps_k - 1) / args.warps_k;
  size_t smem = 0;
  int stages = 0;
  auto kernel = w12_mma_bulk_kernel<MT, LOW_BITS>;
  err = choose_stages(kernel, args, bulk_slot_bytes(LOW_BITS), kBarrierBytes, warps * 32 * MT * 4 * (int)sizeof(float),
                      kBulkInflightChunksPerSm, warps, per_warp, stages, smem);
  if (err != cudaSuccess) return err;
  args.stages = stages;
  dim3 grid((tiles + args.warps_n - 1) / args.warps_n, (chunks + args.chunks_per_split - 1) / args.chunks_per_split);
  kernel<<<grid, 32 * warps, smem, stream>>>(args);
  return cudaGetLastError();
}

template <int LOW_BITS>
cudaError_t launch_rows(const W12MmaArgs& args, cudaStream_t stream) {
  if (args.kernel == 1) {
    if (args.m <= 8) return launch_bulk<1, LOW_BITS>(args, stream);
    if (args.m <= 16) return launch_bulk<2, LOW_BITS>(args, stream);
    if (args.m <= 32) return launch_bulk<4, LOW_BITS>(args, stream);
    return launch_bulk<8, LOW_BITS>(args, stream);
  }
  // Token tiles of 8: 1, 2, 4 or 8 (up to 64 rows); each tile's MMA is independent of the others.
  if (args.m <= kRingRows && args.kernel == 0) return launch_ring<LOW_BITS>(args, stream);
  if (args.m <= 8) return launch_register<1, LOW_BITS>(args, stream);
  if (args.m <= 16) return launch_register<2, LOW_BITS>(args, stream);
  if (args.m <= 32) return launch_register<4, LOW_BITS>(args, stream);
  return launch_register<8, LOW_BITS>(args, stream);
}

}  // namespace

cudaError_t w12_mma_launch(const W12MmaArgs& args, int low_bits, cudaStream_t stream) {
  if (args.m < 1 || args.m > kMaxRows || args.warps_n * args.warps_k < 1 || args.warps_n * args.warps_k > kMaxWarpsPerBlock)
    return cudaErrorInvalidValue;
  return low_bits == 0 ? launch_rows<0>(args, stream) : low_bits == 1 ? launch_rows<1>(args, stream) : launch_rows<2>(args, stream);
}
