// Host interface of the certified head's CUDA INT8 pass (int8_pass.cu); plain pointers so it builds
// without torch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

struct Int8PassArgs {
  const __nv_bfloat16* x;    // [m, k] input rows (contiguous)
  __half* x16;               // [k/32][tiles][32][8] workspace: rows times 2^e_m in fp16, B-fragment order,
                             // tiles = 1, 2, 4 token tiles of 8 for m <= 8, 16, 32 (written by the prologue)
  float* inv_scale;          // [m] workspace: 2^-e_m
  float* norm;               // [m] workspace: ||x_m|| * norm_inflation
  const uint8_t* fragments;  // [n_padded/16][k/32][32 lanes][16 bytes] offset-binary weights (q + 128)
  const float* scale;        // [n] per-row INT8 scale
  const float* radius_coef;  // [n] per-row radius coefficient
  float* best_lower;         // [m] running best lower bound (reset by the prologue)
  int32_t* stage_count;      // [m] rows the pass kept (reset by the prologue; stage_cap + 1: fallback row)
  int32_t* stage_idx;        // [m][stage_cap]
  float* stage_upper;        // [m][stage_cap]
  int32_t* count;            // [m] rows reaching the final best (compaction; above cap: the full head)
  int32_t* cand_idx;         // [m][cap]
  float* cand_upper;         // [m][cap]
  int m, n, n_padded, k, cap, stage_cap;
  float slack, norm_inflation;
};

// The pass's partition: tiles_per_warp 16-row tiles share each activation load; warps_per_block warps
// each own a private ring of `stages` 2 KB slots; about warps_per_sm warps per multiprocessor;
// shared_activations: the block's warps walk K in step and share each chunk's activations through a
// shared-memory ring (else each warp reads them through L1 on its own schedule); chunks_per_barrier (with
// shared_activations): the block's warps meet once per that many 2 KB chunks (8, 4 or 1: the largest up
// to the asked value that divides a unit's chunks). With 3 stages, batches of 8 and 1-2 tiles the batched
// kernel runs (ring depth and batch fixed at compile time), else the general one.
struct Int8PassConfig {
  int tiles_per_warp, warps_per_block, stages, warps_per_sm;
  bool shared_activations;
  int chunks_per_barrier;
};

// The prologue, the pass and (compact) the compaction into count and the candidate list; without it the caller's
// rescore compacts the stage lists (rescore_launch with RescoreArgs::stage_count set). The pass lets the launch after
// it start once all its blocks run (programmatic dependent launch, sm_90+: a rescore launched to overlap it takes
// the multiprocessors its blocks leave in the pass's tail and waits there).
// cudaErrorInvalidValue: m outside 1..32, k not a multiple of 128, or a config out of range.
cudaError_t int8_pass_launch(const Int8PassArgs& args, const Int8PassConfig& config, cudaStream_t stream,
                             bool compact);
