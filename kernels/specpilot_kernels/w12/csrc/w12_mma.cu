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
// Each warp holds its next chunk (or half chunk: `half_steps`) in registers while it decodes and multiplies
// the current one, and reads activations through L1 (shared by the warps of a multiprocessor). The partition
// is fixed by (N, K, GPU), never by M: a warp owns one 16-row tile and an interleaved set of its 128-column
// chunks; warps of one tile reduce through shared memory in warp order, K splits through a workspace summed in
// split order. No atomics: a row's bits are the same at every row count.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "w12_mma.cuh"

namespace {

constexpr int kBlocksPerChunk = 4;  // 4 x 32 columns = one 128-column chunk (the escape bucket width)
constexpr int kMaxRows = 64;        // rows per launch (up to 8 token tiles of 8)
constexpr int kMaxWarpsPerBlock = 16;

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

template <int MT, int LOW_BITS, bool HALF_STEPS>
__global__ void w12_mma_kernel(W12MmaArgs args) {
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
    // A warp works in steps of kBlocks 32-column blocks: a whole chunk, or half of one (HALF_STEPS, four token
    // tiles: a whole chunk's activations take 64 of 163 registers, so 12 warps fit a multiprocessor; in halves
    // 128 registers, 16 warps, at ~11% more instructions). Steps run in the chunk's block order, so every
    // accumulator sums in the same order either way and at every row count.
    constexpr int kBlocks = HALF_STEPS ? 2 : kBlocksPerChunk;
    constexpr int kStepsPerChunk = kBlocksPerChunk / kBlocks;
    constexpr int kKeyShift = kStepsPerChunk == 1 ? 11 : 10;  // escape loc >> shift: chunk, or chunk and half
    // Running pointers (one 64-bit add per step; block offsets are immediates): weights of the next step to
    // load and, up to two token tiles, activations of the current one (above that, recomputing the activation
    // addresses costs fewer registers).
    constexpr bool kRunningX = MT <= 2 && !HALF_STEPS;
    const __nv_bfloat16* x_rows[MT];
#pragma unroll
    for (int j = 0; j < MT; ++j)
      x_rows[j] = args.x + (size_t)min(j * 8 + g, args.m - 1) * args.ldx + (kRunningX ? first * 128 + 8 * t : 0);
    const uint4* view_next = view + (size_t)first * kBlocksPerChunk * 32;
    const uint2* nibs_next = nibs + (size_t)first * kBlocksPerChunk * 32;

    // Escape window: lane i holds escape win + i of this tile's range (sorted by chunk, block, position).
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

    // Weights are read once: no L1 allocation, so L1 keeps the activations. The next step loads while this
    // one is decoded and multiplied.
    uint4 v_next[kBlocks];
    uint2 n_next[kBlocks];
    int load_half = 0;  // which half of its chunk the next load is (half-chunk steps)
    auto load_step = [&]() {
#pragma unroll
      for (int u = 0; u < kBlocks; ++u) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v_next[u].x), "=r"(v_next[u].y), "=r"(v_next[u].z), "=r"(v_next[u].w)
                     : "l"(view_next + u * 32));
        if (LOW_BITS == 0) {
          asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];"
                       : "=r"(n_next[u].x), "=r"(n_next[u].y) : "l"(nibs_next + u * 32));
        } else {
          n_next[u] = make_uint2(0, 0);
        }
      }
      // to the chunk's other half, or to the first blocks of the warp's next chunk
      const size_t advance = kStepsPerChunk == 1 || load_half == 1
                                 ? (size_t)(args.warps_k * kBlocksPerChunk - (kStepsPerChunk - 1) * kBlocks) * 32
                                 : (size_t)kBlocks * 32;
      view_next += advance;
      nibs_next += advance;
      load_half ^= kStepsPerChunk - 1;
    };
    if (first < last) load_step();
    for (int chunk = first; chunk < last; chunk += args.warps_k) {
#pragma unroll
      for (int half = 0; half < kStepsPerChunk; ++half) {
        uint4 v[kBlocks];
        uint2 nb[kBlocks];
#pragma unroll
        for (int u = 0; u < kBlocks; ++u) {
          v[u] = v_next[u];
          nb[u] = n_next[u];
        }
        if (half + 1 < kStepsPerChunk || chunk + args.warps_k < last) load_step();
        // activations of this step: one 16-byte load per token row and 32-column block. Lanes past the last
        // row read it again: their MMA columns are outputs that are never stored (no predicates, no zeroing).
        uint4 xv[kBlocks][MT];
#pragma unroll
        for (int u = 0; u < kBlocks; ++u)
#pragma unroll
          for (int j = 0; j < MT; ++j)
            xv[u][j] = __ldg(reinterpret_cast<const uint4*>(
                x_rows[j] + (kRunningX ? u * 32 : (chunk * kBlocksPerChunk + half * kBlocks + u) * 32 + 8 * t)));
        if (kRunningX) {
#pragma unroll
          for (int j = 0; j < MT; ++j) x_rows[j] += args.warps_k * 128;
        }

        uint32_t a[kBlocks][8];
#pragma unroll
        for (int u = 0; u < kBlocks; ++u) decode_block<LOW_BITS>(a[u], v[u], nb[u], base_lo, base_hi);
        if (LOW_BITS == 0) {
          const uint32_t key = uint32_t(chunk * kStepsPerChunk + half);
          while (true) {
            uint32_t hits = __ballot_sync(0xFFFFFFFFu, (my_loc >> kKeyShift) == key);
            while (hits) {
              const int src = __ffs(hits) - 1;
              hits &= hits - 1;
              const uint32_t loc = __shfl_sync(0xFFFFFFFFu, my_loc, src);
              const uint32_t value = __shfl_sync(0xFFFFFFFFu, my_val, src);
              const int u = ((loc >> 9) & 3) - half * kBlocks;
#pragma unroll
              for (int uu = 0; uu < kBlocks; ++uu)
                if (uu == u) patch_escape(a[uu], lane, loc, value);
            }
            // the window is spent once its last escape is at or before this step: slide it (rare)
            const uint32_t last_loc = __shfl_sync(0xFFFFFFFFu, my_loc, 31);
            if (win + 32 < e_hi && (last_loc >> kKeyShift) <= key) {
              win += 32;
              load_window();
              continue;
            }
            break;
          }
        }
#pragma unroll
        for (int u = 0; u < kBlocks; ++u) {
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

template <int MT, int LOW_BITS, bool HALF_STEPS = false>
cudaError_t launch(const W12MmaArgs& args, cudaStream_t stream) {
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  dim3 grid((tiles + args.warps_n - 1) / args.warps_n, (chunks + args.chunks_per_split - 1) / args.chunks_per_split);
  dim3 block(32 * args.warps_n * args.warps_k);
  const size_t smem = args.warps_k > 1 ? (size_t)block.x * MT * 4 * sizeof(float) : 0;
  auto kernel = w12_mma_kernel<MT, LOW_BITS, HALF_STEPS>;
  if (smem > 48 * 1024) {  // the in-block reduction of 16 warps x 64 rows needs 64 KB (sm_120 allows 99 KB)
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
  }
  int resident = 0;
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, block.x, smem);
  if (err != cudaSuccess) return err;
  if (resident == 0 && args.warps_n > 1) {  // registers for fewer warps than the block: fewer tiles a block
    W12MmaArgs fewer = args;                // (which tiles share a block changes no bit)
    fewer.warps_n = args.warps_n / 2;
    return launch<MT, LOW_BITS, HALF_STEPS>(fewer, stream);
  }
  kernel<<<grid, block, smem, stream>>>(args);
  return cudaGetLastError();
}

template <int LOW_BITS>
cudaError_t launch_rows(const W12MmaArgs& args, cudaStream_t stream) {
  // Token tiles of 8: 1, 2, 4 or 8 (up to 64 rows); each tile's MMA is independent of the others.
  if (args.m <= 8) return launch<1, LOW_BITS>(args, stream);
  if (args.m <= 16) return launch<2, LOW_BITS>(args, stream);
  if (args.m <= 32) return args.half_steps ? launch<4, LOW_BITS, true>(args, stream) : launch<4, LOW_BITS>(args, stream);
  return launch<8, LOW_BITS>(args, stream);
}

}  // namespace

cudaError_t w12_mma_launch(const W12MmaArgs& args, int low_bits, cudaStream_t stream) {
  if (args.m < 1 || args.m > kMaxRows || args.warps_n * args.warps_k < 1 || args.warps_n * args.warps_k > kMaxWarpsPerBlock)
    return cudaErrorInvalidValue;
  return low_bits == 0 ? launch_rows<0>(args, stream) : low_bits == 1 ? launch_rows<1>(args, stream) : launch_rows<2>(args, stream);
}
