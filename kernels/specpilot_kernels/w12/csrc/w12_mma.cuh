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
  float* partial;          // [splits][m][n] when K is split, else nullptr
  __nv_bfloat16* y;        // [m][n] when K is not split
  int m, n, k, ldx, n_padded, k_padded;
  int warps_n, warps_k, chunks_per_split;  // the partition (from N, K and the GPU, never from m)
  int half_steps;  // 17-32 rows: warps step through half chunks (fewer registers; changes no bit)
};

// cudaErrorInvalidValue: m outside 1..64 or more than 16 warps per block.
cudaError_t w12_mma_launch(const W12MmaArgs& args, int low_bits, cudaStream_t stream);
