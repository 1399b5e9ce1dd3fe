// W12 GEMM with mma.sync (sm_80+, including sm_90 and sm_120): y = x @ W^T, W decoded in registers.
//
// Weights sit on the 16-row side of m16n8k16, tokens on the 8-wide side. The fragment layout
// (mma.py) gives each lane of a warp its own A fragments for two k16 steps as one 16-byte load of
// the 8-bit view plus one 8-byte load of nibbles. The K order inside each 32-column block is permuted so
// that lane t's B fragments of both k16 steps are 8 consecutive columns of x: one 16-byte load per token
// row (MMA k-slot 2t+h+8q of step s is column 8t+4s+2q+h). Decode per pair of weights (two 16-bit lanes):
// prmt spreads two view bytes into lanes with their signs replicated, then
// ((b & 0x7F) << 4) + (base << 7) | sign | nibble. Escapes of a (16-row, 128-column) chunk are
// patched into the owning lane's register before the MMA; a warp keeps a window of 32 of its tile's
// escapes in registers (one per lane) and finds each chunk's by ballot, so no load waits in the K loop. Work per warp: one 16-row tile and a fixed,
// interleaved set of 128-column chunks; warps of one tile reduce through shared memory in warp order,
// K splits through a workspace reduced in split order: no atomics, and nothing depends on M.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "w12_mma.cuh"

namespace {

constexpr int kBlocksPerChunk = 4;  // 4 x 32 columns = one 128-column chunk (the escape bucket width)

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

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int MT, int LOW_BITS>
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
            const int r = (loc >> 7) & 15, c = loc & 127;
            const int u = c >> 5, lt = (c >> 3) & 3, s = (c >> 2) & 1, q = (c >> 1) & 1;
            if (lane == (r & 7) * 4 + lt) {
              const int reg = 4 * s + 2 * q + (r >> 3);
              const bool high = c & 1;
#pragma unroll
              for (int uu = 0; uu < kBlocksPerChunk; ++uu)
#pragma unroll
                for (int rr = 0; rr < 8; ++rr)
                  if (uu == u && rr == reg)
                    a[uu][rr] = high ? (a[uu][rr] & 0x0000FFFFu) | (value << 16) : (a[uu][rr] & 0xFFFF0000u) | value;
            }
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

template <int MT>
cudaError_t launch_mt(const W12MmaArgs& args, int low_bits, cudaStream_t stream) {
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  dim3 grid((tiles + args.warps_n - 1) / args.warps_n, (chunks + args.chunks_per_split - 1) / args.chunks_per_split);
  dim3 block(32 * args.warps_n * args.warps_k);
  const size_t smem = args.warps_k > 1 ? (size_t)block.x * MT * 4 * sizeof(float) : 0;
  auto kernel = low_bits == 0 ? w12_mma_kernel<MT, 0> : low_bits == 1 ? w12_mma_kernel<MT, 1> : w12_mma_kernel<MT, 2>;
  if (smem > 48 * 1024) {  // the in-block reduction of 16 warps x 64 rows needs 64 KB (sm_120 allows 99 KB)
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, block, smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

cudaError_t w12_mma_launch(const W12MmaArgs& args, int low_bits, cudaStream_t stream) {
  // Token tiles of 8: 1, 2, 4 or 8 (up to 64 rows); each tile's MMA is independent of the others.
  if (args.m <= 8) return launch_mt<1>(args, low_bits, stream);
  if (args.m <= 16) return launch_mt<2>(args, low_bits, stream);
  if (args.m <= 32) return launch_mt<4>(args, low_bits, stream);
  return launch_mt<8>(args, low_bits, stream);
}
