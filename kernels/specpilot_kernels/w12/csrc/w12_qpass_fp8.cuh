// Host interface of the FP8 Q pass (w12_qpass_fp8.cu); plain pointers so the kernels build without torch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

constexpr int kQpassFp8MaxRows = 64;      // token rows a launch: 8 token tiles of 8
constexpr int kQpassFp8MaxWarps = 8;      // warps a block (255 registers a thread)
constexpr float kQpassFp8Max = 448.0f;    // the largest finite E4M3 number: a row's largest |x| maps onto it
// Token tiles x weight tiles a warp x MMAs a block (2 with the midpoint) a warp may accumulate: 4 fp32 sums each,
// 80 registers at most (qpass_fp8.py MAX_ACCUMULATORS)
constexpr int kQpassFp8MaxAccumulators = 20;
// The warpgroup kernel (w12_qpass_fp8_wgmma.cu): warpgroups of 4 tiles a block sharing each chunk's activations, and
// its ring of chunks (stages - 1 in flight while one is read).
constexpr int kQpassWgmmaMaxGroups = 2;
constexpr int kQpassWgmmaStages = 4;

// Whether the kernel is built for tiles_per_warp weight tiles a warp at m token rows (1, 2 or, E4M3 operands, 4
// within the budget; the E4M3 midpoint's second MMA doubles the accumulators, the f16 midpoint does not).
inline bool qpass_fp8_tiles_per_warp_fits(int m, int tiles_per_warp, bool midpoint, bool f16_operands) {
  const int tiles8 = (m + 7) / 8, built = tiles8 <= 2 ? tiles8 : tiles8 <= 4 ? 4 : tiles8 <= 5 ? 5 : 8;
  return (tiles_per_warp == 1 || tiles_per_warp == 2 || (tiles_per_warp == 4 && !f16_operands)) &&
         tiles_per_warp * built * (midpoint && !f16_operands ? 2 : 1) <= kQpassFp8MaxAccumulators;
}

struct QpassFp8Args {
  const uint8_t* view;     // the exact pass's view plane, fragment layout: [tiles][k_padded/32][32 lanes][16 bytes]
  const uint8_t* base;     // [tiles * 16] each row's window: the view byte times 2**(base - 120) is its weight
  const uint8_t* x_image;  // [ceil(m/8)][k_padded/64][32 lanes][16 bytes] E4M3 activations (qpass_fp8_quantize)
  const float* x_scale;    // [m] each token row's scale: x ~ E4M3 value x scale
  __nv_bfloat16* y;        // [m][ldy], columns 0 .. n-1 written
  int m, n, tiles, k_padded, ldy;
  int warps_k;           // warps sharing a tile group's K (contiguous ranges of 64 columns, summed in warp order)
  int tiles_per_warp;    // 16-row weight tiles a warp (1, 2 or 4): each activation fragment it loads feeds them all
  int groups_per_block;  // tile groups a block, warps_k warps each
  int splits;            // blocks sharing a tile group's K (gridDim.y): 1, or > 1 with the two buffers below
  float* workspace;      // [ceil(tiles / tiles_per_warp)][splits][tiles_per_warp * token tiles * 4][32] partials
  int* counters;         // [ceil(tiles / tiles_per_warp)] zero before a launch; each launch leaves them zero
  bool f16_operands;     // both planes' E4M3 bytes converted to f16 in registers, m16n8k16 MMAs
  bool overlap_prior;   // sm_90+: prefetch weights while the kernel before (the quantizer) finishes
};

// x bf16 [m][ldx] (k columns, 16-byte rows) -> x_image and x_scale: per token row scale = max|x| / 448 (1 for a zero
// row), each x / scale rounded to nearest E4M3 (x times 448 / max|x|, saturated); columns k .. k_padded-1 zero.
cudaError_t qpass_fp8_quantize(const __nv_bfloat16* x, int m, int k, int ldx, int k_padded, uint8_t* x_image,
                               float* x_scale, bool overlap_prior, cudaStream_t stream);
// The same numbers in the warpgroup kernel's B image, in f16 (every E4M3 number is one), for token_tiles tiles of 8
// rows (rows past m zero) in the K order of the view's f16 A fragments: column c = 32b + 8t + 4s + 2h + e of token
// 8j + g at [b][s][h][j][g][2t + e] (32-column block b, k16 step s, k half h); [token_tiles * 8 * k_padded] f16.
cudaError_t qpass_fp8_quantize_wgmma(const __nv_bfloat16* x, int m, int k, int ldx, int k_padded, int token_tiles,
                                     uint8_t* x_image, float* x_scale, bool overlap_prior, cudaStream_t stream);

// y = x @ Wq^T from the view plane on the FP8 tensor cores; midpoint: + the dropped bits' midpoint (a second MMA on
// the view bytes' sign and exponent). cudaErrorInvalidValue for m outside 1..64, more than 8 warps a
// block, or tiles_per_warp not built for m (qpass_fp8_tiles_per_warp_fits).
cudaError_t qpass_fp8_gemm(const QpassFp8Args& args, bool midpoint, cudaStream_t stream);

// The same product on warpgroup MMAs (sm_90a, w12_qpass_fp8_wgmma.cu: both operands as f16 on m64nNk16, the midpoint
// an operand bit) from qpass_fp8_quantize_wgmma's image:
// groups_per_block warpgroups (1..kQpassWgmmaMaxGroups) of 4 tiles a block, warps_k and tiles_per_warp 1, splits
// blocks a tile's K (the workspace [tiles][splits][4 x token tiles][32], a counter a tile).
// cudaErrorInvalidValue for other partitions or m outside 1..64.
cudaError_t qpass_fp8_gemm_wgmma(const QpassFp8Args& args, bool midpoint, cudaStream_t stream);
