// Host interface of the exact head's CUDA arithmetic (exact_head.cu): the full head and the rescoring of
// listed candidates, one warp per logit in the same order in both. Plain pointers so it builds without torch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

struct ExactHeadArgs {
  const __nv_bfloat16* x;       // [m, k] input rows (contiguous, 16-byte aligned)
  const __nv_bfloat16* weight;  // [n, k] head rows (contiguous, 16-byte aligned)
  float* logits;                // [m, n] the full head's output (unused by the rescore)
  int m, n, k;
};

struct RescoreArgs {
  const float* best_lower;    // [m] the INT8 pass's best lower bound
  int32_t* count;             // [m] listed candidates (above cap: the row takes the full head, token -1)
  int32_t* cand_idx;          // [m][cap]
  float* cand_upper;          // [m][cap]
  int64_t* tokens;            // [m] output: the exact head's argmax over the candidates reaching best_lower
  unsigned long long* keys;   // [>= m] workspace: zero before the call, left zero after it
  unsigned int* ticket;       // [1] workspace: zero before the call, left zero after it
  unsigned int* arrived;      // [1] workspace (with stage lists): zero before the call, left zero after it
  // The INT8 pass's stage lists, where the rescore compacts them itself (else null: count and the candidate list
  // are given): count (zero before the call) and the candidate list are written first, as the pass's compaction
  // would.
  const int32_t* stage_count;  // [m] (above stage_cap: the row takes the full head)
  const int32_t* stage_idx;    // [m][stage_cap]
  const float* stage_upper;    // [m][stage_cap]
  // With stage lists: [m] workspace, zero before the call and left zero; the rows' incumbents (exact_head.cu) are
  // used when the lists hold at least incumbent_min_pairs pairs (negative: never).
  unsigned long long* incumbent;
  int cap, blocks_per_sm, stage_cap, incumbent_min_pairs;
};

// blocks_per_sm: the rescore's blocks per multiprocessor, 0 for its own choice (2 up to 16 rows, 3 above).
// cudaErrorInvalidValue: m < 1, k not a multiple of 8, n < 1 (full head), cap < 1 or blocks_per_sm < 0 (rescore).
cudaError_t exact_head_launch(const ExactHeadArgs& args, cudaStream_t stream, bool overlap_prior);
cudaError_t rescore_launch(const ExactHeadArgs& args, const RescoreArgs& rescore, cudaStream_t stream,
                           bool overlap_prior);
