// torch binding of the certified head's CUDA INT8 pass (built on the GPU machine by torch.utils.cpp_extension).
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "exact_head.cuh"
#include "int8_pass.cuh"

// Shapes: x bf16 [m, k]; x16 fp16 [k/32, p/8, 32, 8] with p = 8, 16 or 32 rows padded (m <= p),
// inv_scale and norm fp32 [m] (workspaces); fragments uint8 [n_padded/16, k/32, 32, 16]; scale and
// radius_coef fp32 [n]; best_lower fp32 [m]; stage_count int32 [m], stage_idx int32 and stage_upper fp32
// [m, stage_cap] (workspaces); count int32 [m]; cand_idx int32 and cand_upper fp32 [m, cap]. compact: false leaves
// count at zero and the candidate list unwritten for compact_and_rescore.
void int8_pass(torch::Tensor x, torch::Tensor x16, torch::Tensor inv_scale, torch::Tensor norm,
               torch::Tensor fragments, torch::Tensor scale, torch::Tensor radius_coef, torch::Tensor best_lower,
               torch::Tensor stage_count, torch::Tensor stage_idx, torch::Tensor stage_upper,
               torch::Tensor count, torch::Tensor cand_idx, torch::Tensor cand_upper, double slack,
               double norm_inflation, int64_t tiles_per_warp, int64_t warps_per_block, int64_t stages,
               int64_t warps_per_sm, bool shared_activations, int64_t chunks_per_barrier, bool compact) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.is_contiguous() && x.dim() == 2,
              "int8_pass: x must be a contiguous CUDA bf16 [M, K] tensor");
  TORCH_CHECK((reinterpret_cast<uintptr_t>(x.data_ptr()) | reinterpret_cast<uintptr_t>(fragments.data_ptr())) % 16 == 0,
              "int8_pass: x and fragments must be 16-byte aligned (the kernels read them in 16-byte pieces)");
  TORCH_CHECK(fragments.scalar_type() == torch::kUInt8 && fragments.is_contiguous() && fragments.dim() == 4 &&
                  fragments.size(1) * 32 == x.size(1) && fragments.size(2) == 32 && fragments.size(3) == 16,
              "int8_pass: fragments must be contiguous uint8 [N_padded/16, K/32, 32, 16] with the input's K");
  const int64_t padded_rows = x.size(0) <= 8 ? 8 : x.size(0) <= 16 ? 16 : 32;
  TORCH_CHECK(x16.scalar_type() == torch::kHalf && x16.is_contiguous() && x16.numel() == padded_rows * x.size(1),
              "int8_pass: x16 must be a contiguous fp16 workspace of ", padded_rows, " x K elements");
  TORCH_CHECK(cand_idx.size(0) == x.size(0) && cand_upper.sizes() == cand_idx.sizes() && cand_idx.is_contiguous() &&
                  cand_upper.is_contiguous(),
              "int8_pass: cand_idx and cand_upper must be contiguous [M, cap]");
  TORCH_CHECK(stage_idx.size(0) == x.size(0) && stage_upper.sizes() == stage_idx.sizes() && stage_idx.is_contiguous() &&
                  stage_upper.is_contiguous() && stage_count.numel() == x.size(0),
              "int8_pass: stage_idx and stage_upper must be contiguous [M, stage_cap], stage_count [M]");
  Int8PassArgs args{};
  args.x = reinterpret_cast<const __nv_bfloat16*>(x.data_ptr());
  args.x16 = reinterpret_cast<__half*>(x16.data_ptr());
  args.inv_scale = inv_scale.data_ptr<float>();
  args.norm = norm.data_ptr<float>();
  args.fragments = fragments.data_ptr<uint8_t>();
  args.scale = scale.data_ptr<float>();
  args.radius_coef = radius_coef.data_ptr<float>();
  args.best_lower = best_lower.data_ptr<float>();
  args.stage_count = stage_count.data_ptr<int32_t>();
  args.stage_idx = stage_idx.data_ptr<int32_t>();
  args.stage_upper = stage_upper.data_ptr<float>();
  args.count = count.data_ptr<int32_t>();
  args.cand_idx = cand_idx.data_ptr<int32_t>();
  args.cand_upper = cand_upper.data_ptr<float>();
  args.m = x.size(0);
  args.n = scale.size(0);
  args.n_padded = fragments.size(0) * 16;
  args.k = x.size(1);
  args.cap = cand_idx.size(1);
  args.stage_cap = stage_idx.size(1);
  args.slack = static_cast<float>(slack);
  args.norm_inflation = static_cast<float>(norm_inflation);
  const Int8PassConfig config{static_cast<int>(tiles_per_warp), static_cast<int>(warps_per_block),
                              static_cast<int>(stages), static_cast<int>(warps_per_sm), shared_activations,
                              static_cast<int>(chunks_per_barrier)};
  const cudaError_t err = int8_pass_launch(args, config, at::cuda::getCurrentCUDAStream(), compact);
  TORCH_CHECK(err == cudaSuccess, "int8_pass launch failed: ", cudaGetErrorString(err));
}

static ExactHeadArgs exact_args(const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.is_contiguous() && x.dim() == 2 &&
                  weight.scalar_type() == torch::kBFloat16 && weight.is_contiguous() && weight.dim() == 2 &&
                  weight.size(1) == x.size(1) && x.size(1) % 8 == 0,
              "exact head: x [M, K] and weight [N, K] must be contiguous CUDA bf16 with K a multiple of 8");
  TORCH_CHECK((reinterpret_cast<uintptr_t>(x.data_ptr()) | reinterpret_cast<uintptr_t>(weight.data_ptr())) % 16 == 0,
              "exact head: x and weight must be 16-byte aligned (read in 16-byte pieces)");
  ExactHeadArgs args{};
  args.x = reinterpret_cast<const __nv_bfloat16*>(x.data_ptr());
  args.weight = reinterpret_cast<const __nv_bfloat16*>(weight.data_ptr());
  args.m = x.size(0);
  args.n = weight.size(0);
  args.k = x.size(1);
  return args;
}

// logits fp32 [m, n] (output).
void exact_head(torch::Tensor x, torch::Tensor weight, torch::Tensor logits, bool overlap_prior) {
  ExactHeadArgs args = exact_args(x, weight);
  TORCH_CHECK(logits.scalar_type() == torch::kFloat && logits.is_contiguous() && logits.size(0) == x.size(0) &&
                  logits.size(1) == weight.size(0),
              "exact_head: logits must be contiguous fp32 [M, N]");
  args.logits = logits.data_ptr<float>();
  const cudaError_t err = exact_head_launch(args, at::cuda::getCurrentCUDAStream(), overlap_prior);
  TORCH_CHECK(err == cudaSuccess, "exact_head launch failed: ", cudaGetErrorString(err));
}

static RescoreArgs rescore_args(const torch::Tensor& x, const torch::Tensor& best_lower, const torch::Tensor& count,
                                const torch::Tensor& cand_idx, const torch::Tensor& cand_upper,
                                const torch::Tensor& tokens, const torch::Tensor& state, int64_t blocks_per_sm) {
  const int64_t m = x.size(0);
  TORCH_CHECK(best_lower.scalar_type() == torch::kFloat && best_lower.numel() == m &&
                  count.scalar_type() == torch::kInt && count.numel() == m && tokens.scalar_type() == torch::kLong &&
                  tokens.numel() == m && cand_idx.scalar_type() == torch::kInt && cand_idx.is_contiguous() &&
                  cand_idx.size(0) == m && cand_upper.scalar_type() == torch::kFloat &&
                  cand_upper.sizes() == cand_idx.sizes() && cand_upper.is_contiguous(),
              "rescore: best_lower fp32 [M], count int32 [M], tokens int64 [M], cand_idx int32 and cand_upper fp32 "
              "contiguous [M, cap]");
  TORCH_CHECK(state.scalar_type() == torch::kLong && state.is_contiguous() && state.numel() >= 2 * m + 2 &&
                  state.numel() % 2 == 0,
              "rescore: state must be a contiguous int64 workspace of 2 R + 2 elements, R >= M");
  RescoreArgs r{};
  r.best_lower = best_lower.data_ptr<float>();
  r.count = count.data_ptr<int32_t>();
  r.cand_idx = cand_idx.data_ptr<int32_t>();
  r.cand_upper = cand_upper.data_ptr<float>();
  r.tokens = tokens.data_ptr<int64_t>();
  const int64_t rows = (state.numel() - 2) / 2;
  r.keys = reinterpret_cast<unsigned long long*>(state.data_ptr<int64_t>());
  r.incumbent = reinterpret_cast<unsigned long long*>(state.data_ptr<int64_t>() + rows);
  r.arrived = reinterpret_cast<unsigned int*>(state.data_ptr<int64_t>() + (state.numel() - 2));
  r.ticket = reinterpret_cast<unsigned int*>(state.data_ptr<int64_t>() + (state.numel() - 1));
  r.cap = cand_idx.size(1);
  r.blocks_per_sm = blocks_per_sm;
  return r;
}

// best_lower fp32 [m]; count int32 [m]; cand_idx int32 and cand_upper fp32 [m, cap]; tokens int64 [m] (output);
// state int64 [2 R + 2], R >= m (zero before the call, left zero: R keys, R incumbents, then the barrier count and the
// ticket).
void rescore(torch::Tensor x, torch::Tensor weight, torch::Tensor best_lower, torch::Tensor count,
             torch::Tensor cand_idx, torch::Tensor cand_upper, torch::Tensor tokens, torch::Tensor state,
             int64_t blocks_per_sm, bool overlap_prior) {
  const ExactHeadArgs args = exact_args(x, weight);
  RescoreArgs r = rescore_args(x, best_lower, count, cand_idx, cand_upper, tokens, state, blocks_per_sm);
  r.incumbent = nullptr;  // incumbents come from the compaction
  const cudaError_t err = rescore_launch(args, r, at::cuda::getCurrentCUDAStream(), overlap_prior);
  TORCH_CHECK(err == cudaSuccess, "rescore launch failed: ", cudaGetErrorString(err));
}

// The rescore of the INT8 pass's stage lists (the pass launched without its compaction): stage_count int32 [m],
// stage_idx int32 and stage_upper fp32 [m, stage_cap]; count (zero, as the pass's prologue leaves it), cand_idx and
// cand_upper are written first, as the compaction would; the rest as rescore's. incumbent_min_pairs: the listed pairs
// from which the rescore first computes each row's incumbent (exact_head.cu; negative: never).
void compact_and_rescore(torch::Tensor x, torch::Tensor weight, torch::Tensor best_lower, torch::Tensor stage_count,
                         torch::Tensor stage_idx, torch::Tensor stage_upper, torch::Tensor count,
                         torch::Tensor cand_idx, torch::Tensor cand_upper, torch::Tensor tokens, torch::Tensor state,
                         int64_t blocks_per_sm, int64_t incumbent_min_pairs, bool overlap_prior) {
  const ExactHeadArgs args = exact_args(x, weight);
  RescoreArgs r = rescore_args(x, best_lower, count, cand_idx, cand_upper, tokens, state, blocks_per_sm);
  TORCH_CHECK(stage_count.scalar_type() == torch::kInt && stage_count.numel() == x.size(0) &&
                  stage_idx.scalar_type() == torch::kInt && stage_idx.is_contiguous() && stage_idx.dim() == 2 &&
                  stage_idx.size(0) == x.size(0) && stage_upper.scalar_type() == torch::kFloat &&
                  stage_upper.sizes() == stage_idx.sizes() && stage_upper.is_contiguous(),
              "compact_and_rescore: stage_count int32 [M], stage_idx int32 and stage_upper fp32 contiguous "
              "[M, stage_cap]");
  r.stage_count = stage_count.data_ptr<int32_t>();
  r.stage_idx = stage_idx.data_ptr<int32_t>();
  r.stage_upper = stage_upper.data_ptr<float>();
  r.stage_cap = stage_idx.size(1);
  r.incumbent_min_pairs = static_cast<int>(std::max<int64_t>(-1, std::min<int64_t>(incumbent_min_pairs, INT32_MAX)));
  const cudaError_t err = rescore_launch(args, r, at::cuda::getCurrentCUDAStream(), overlap_prior);
  TORCH_CHECK(err == cudaSuccess, "compact_and_rescore launch failed: ", cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_pass", &int8_pass, "certified head INT8 pass");
  m.def("exact_head", &exact_head, "the exact head's logits (the rescore's arithmetic)");
  m.def("rescore", &rescore, "the exact head's argmax over each row's listed candidates");
  m.def("compact_and_rescore", &compact_and_rescore,
        "the INT8 pass's compaction and the exact head's argmax over the kept candidates, one launch");
}
