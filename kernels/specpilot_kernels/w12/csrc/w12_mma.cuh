// Host interface of the W12 GEMM kernels (w12_launch.cu and the kernel files it dispatches to); plain pointers so the
// kernels build without torch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

struct W12MmaArgs {
  const __nv_bfloat16* x;  // [m, ldx] activations, m <= 64 (wide kernel: 256), k_padded columns readable, 16-byte rows
  const uint8_t* view;     // fragment layout: [n_padded/16][k_padded/32][32 lanes][16 bytes]
  const uint8_t* nibbles;  // fragment layout: [n_padded/16][k_padded/32][32 lanes][8 bytes], two nibbles a byte
  const uint8_t* base;     // [n_padded]
  const int32_t* esc_tile;     // [n_padded/16 + 1] index of each 16-row tile's first escape entry (CSR over tiles)
  const uint32_t* esc_chunk;   // [n_padded/16][k_padded/128] chunk words: (first entry - the tile's) << 12 | count
  const uint32_t* esc_entry;   // [E] fragment position << 16 | exact BF16 bits (w12_common.cuh, EscapeStream)
  float* partial;          // [splits][m][n] workspace when K is split (summed into y in split order), else nullptr
  __nv_bfloat16* y;        // [m][n]; a row region of a wider GEMM: its first column, n = the GEMM's N (row stride)
  int m, n, k, ldx, n_padded, k_padded;  // n_padded: 16 x the tiles this launch computes
  int warps_n, warps_k, chunks_per_split;  // the partition (from N, K and the GPU, never from m)
  // The step plan (changes no bit): 32-column blocks a warp decodes per step (4 or 2: a chunk or a half) and
  // 16-row tiles a warp (1 or 2: one activation load serves both)
  int step_blocks, tiles_per_warp;
  int staged_weights;  // 1: weights staged through a shared-memory double buffer (whole steps, up to 16 rows)
  int overlap_prior;  // sm_90+: a W12Overlap, how the launch overlaps the previous kernel in the stream
  int cluster_splits;  // set by w12_mma_launch: K splits reduced within a thread-block cluster (sm_90+), else 1
};

// Programmatic dependent launch (sm_90+; elsewhere every launch waits for the one before). A GEMM whose partition
// splits the output rows into two regions launches the first as kOverlapFirstRegion: its blocks let the next kernel
// start only after they have waited for the kernel before (the writer of x), so the second region
// (kOverlapSecondRegion) reads x without waiting and runs beside the first one's last blocks; it still waits for the
// first region before it stores, so a kernel waiting for the second also waits for the first.
enum W12Overlap { kOverlapNone = 0, kOverlapPrior = 1, kOverlapFirstRegion = 2, kOverlapSecondRegion = 3 };

// 17-32 rows, one tile a warp, sm_90+ (elsewhere ignored, with the same bits): activations copied once per block into
// a ring of `ring` slots (2-8; 0: off) by a producer warp, `tiles` tiles a block (w12_mma.cu). Apart from W12MmaArgs
// so that the other kernels' parameters stay as they were: a larger W12MmaArgs changed ptxas's register allotment of
// several of them (the two-tile 32-row kernel 168 -> 176 registers: a warp less a sub-partition, 20-60% slower).
struct W12SharedActivations {
  int tiles = 0, ring = 0;
  int warpgroups = 0;  // 9-64 rows, sm_90a: warpgroup MMAs, this many warpgroups of 4 tiles a K class a block; 0: off
  void* x_image = nullptr;  // warpgroup MMAs: device memory for every chunk's B image, k_padded / 128 x MT x 2 KB
                            // (MT = 2, 4 or 8 token tiles for up to 16, 32 or 64 rows), 16-byte aligned
  bool x_image_written = false;  // the image already holds x (written for the GEMM's first row region)
};

// 33-256 rows, sm_90a: the wide kernel (w12_wide.cu), `groups` warpgroups of 4 tiles a block, all of one K class and
// split; 0: off. The caller picks the slab of token rows (token_tiles x 8 rows, up to 256) from m.
struct W12Wide {
  int groups = 0;
  int slots = 3;   // activation slots a block (2-6)
  int stages = 3;  // weight stages a warp (2-6)
  int token_tiles = 0;  // 6, 8, 12, 16, 24 or 32 token tiles of 8 rows a slab (set by the caller from m)
  int multicast = 1;  // 1, 2 or 4 neighbouring tile groups sharing each activation copy (one slab only; no bit changes)
  void* x_image = nullptr;  // device memory for every slab's chunk images: slabs x k_padded / 128 x token_tiles x 2 KB
  bool x_image_written = false;  // the image already holds x (written for the GEMM's first row region)
  // 1: the decoded-weight kernel (w12_wide_ss.cu): `groups` tile groups of 64 rows a block decoded once into shared
  // memory for one MMA warpgroup, `slots` activation slots, `stages` decoded-weight slots (2-3); 0: w12_wide.cu
  int decoded = 0;
};

// cudaErrorInvalidValue: m outside 1..64 (1..256 for the wide kernel), more than 16 warps per block, or a step plan not built for m's token tiles
// (staged weights: whole steps of one tile a warp, up to 16 rows; shared activations: one tile a warp, 17-32 rows,
// 2-8 slots, at most 16 warps besides the producer; warpgroup MMAs: 9-64 rows, neither staged weights nor a ring, at
// most 32 warps a block, an x_image). Warpgroup MMAs whose block fits no multiprocessor run with fewer warpgroups a
// block, or as the per-warp kernel (the same bits): `launched_warpgroups` (when given) receives the warpgroups a K
// class a block that ran, 0 for the per-warp kernels. cudaErrorLaunchOutOfResources: a shared-activation block that
// fits no multiprocessor.
// The wide kernel: cudaErrorNotSupported off sm_90a or where no block of it fits a multiprocessor (the caller runs 64
// rows at a time instead: the same bits).
cudaError_t w12_mma_launch(const W12MmaArgs& args, int low_bits, cudaStream_t stream,
                           W12SharedActivations shared_x = {}, int* launched_warpgroups = nullptr, W12Wide wide = {});
