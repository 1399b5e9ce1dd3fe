// Host interface of the W12 mma.sync GEMM (w12_mma.cu); plain pointers so the kernel builds without torch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

struct W12MmaArgs {
  const __nv_bfloat16* x;  // [m, ldx] activations, m <= 64, k_padded columns readable, 16-byte aligned rows
  const uint8_t* view;     // fragment layout: [n_padded/16][k_padded/32][32 lanes][16 bytes]
  const uint8_t* nibbles;  // fragment layout: [n_padded/16][k_padded/32][32 lanes][8 bytes], two nibbles a byte
  const uint8_t* base;     // [n_padded]
  const int32_t* esc_ptr;  // [n_padded/16 * k_padded/128 + 1] CSR over (16-row tile, 128-column chunk)
  const int32_t* esc_loc;  // chunk << 11 | block << 9 | (row % 16) << 5 | (column % 32), sorted per tile
  const uint16_t* esc_val; // exact BF16 bits
  float* partial;          // [splits][m][n] workspace when K is split (summed into y in split order), else nullptr
  __nv_bfloat16* y;        // [m][n]
  int m, n, k, ldx, n_padded, k_padded;
  int warps_n, warps_k, chunks_per_split;  // the partition (from N, K and the GPU, never from m)
  // The step plan (changes no bit): 32-column blocks a warp decodes per step (4 or 2: a chunk or a half) and
  // 16-row tiles a warp (1 or 2: one activation load serves both)
  int step_blocks, tiles_per_warp;
  int staged_weights;  // 1: weights staged through a shared-memory double buffer (whole steps, up to 16 rows)
  int overlap_prior;  // sm_90+: launched to overlap the previous kernel in the stream (programmatic dependent launch)
  int cluster_splits;  // set by w12_mma_launch: K splits reduced within a thread-block cluster (sm_90+), else 1
};

// cudaErrorInvalidValue: m outside 1..64, more than 16 warps per block, or a step plan not built for m's token tiles
// (staged weights: whole steps of one tile a warp, up to 16 rows).
cudaError_t w12_mma_launch(const W12MmaArgs& args, int low_bits, cudaStream_t stream);
