// torch binding of the lanes-along-V GDN path-verify (built on the GPU machine by torch.utils.cpp_extension).
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include "path_verify_lanes.cuh"

namespace {

// vector_access: the kernel reads (or writes) the tensor in 16-byte pieces (8 for a bf16 pool), so its
// start must be 16-byte aligned; v, o and the gates are accessed one element at a time.
void check(const torch::Tensor& t, torch::ScalarType dtype, const char* name, bool vector_access) {
  TORCH_CHECK(t.is_cuda() && t.is_contiguous() && t.scalar_type() == dtype, "path_verify_lanes: ", name,
              " must be a contiguous CUDA tensor of ", c10::toString(dtype));
  TORCH_CHECK(!vector_access || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "path_verify_lanes: ", name,
              " must be 16-byte aligned (read in 16-byte pieces)");
}

}  // namespace

// Shapes in path_verify_lanes.cuh; K must be 128 and V a multiple of 32 / lanes_per_column. write_state:
// the commit (the pool is updated in place at state_indices; o, and saved when max_saved is 0, are not touched).
void path_verify_lanes(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor decay, torch::Tensor beta,
                       torch::Tensor pool, torch::Tensor state_indices, torch::Tensor order, torch::Tensor replay_len,
                       torch::Tensor replay, torch::Tensor restore_slot, torch::Tensor save_slot,
                       torch::Tensor num_nodes, torch::Tensor saved, torch::Tensor o, int64_t max_saved,
                       bool write_state, int64_t lanes_per_column, int64_t warps_per_block) {
  check(q, torch::kFloat32, "q", true);
  check(k, torch::kFloat32, "k", true);
  check(v, torch::kBFloat16, "v", false);
  if (!write_state) check(o, torch::kBFloat16, "o", false);  // the commit writes no outputs
  check(decay, torch::kFloat32, "decay", false);
  check(beta, torch::kFloat32, "beta", false);
  if (max_saved > 0) check(saved, torch::kFloat32, "saved", true);
  TORCH_CHECK(pool.scalar_type() == torch::kFloat32 || pool.scalar_type() == torch::kBFloat16,
              "path_verify_lanes: the state pool must be FP32 or bf16");
  check(pool, pool.scalar_type(), "pool", true);
  for (const auto* t : {&state_indices, &order, &replay_len, &replay, &restore_slot, &save_slot, &num_nodes}) {
    TORCH_CHECK(t->is_cuda() && t->is_contiguous() && t->scalar_type() == torch::kInt32,
                "path_verify_lanes: the schedule and state_indices must be contiguous CUDA int32");
  }
  TORCH_CHECK(q.dim() == 4 && q.size(3) == 128 && k.sizes() == q.sizes(), "path_verify_lanes: q, k must be [B, T, H, 128]");
  TORCH_CHECK(v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == q.size(1) &&
                  (write_state || o.sizes() == v.sizes()) && v.size(3) % (32 / lanes_per_column) == 0,
              "path_verify_lanes: v and o must be [B, T, HV, V] with V a multiple of the columns per warp");
  TORCH_CHECK(warps_per_block >= 1 && warps_per_block <= 32 && v.size(3) % (warps_per_block * (32 / lanes_per_column)) == 0,
              "path_verify_lanes: V must be a multiple of a block's columns (warps_per_block x 32 / lanes_per_column)");
  TORCH_CHECK(pool.scalar_type() == torch::kFloat32 || lanes_per_column <= 16,
              "path_verify_lanes: bf16 pools take at most 16 lanes per column (their sums run over 16 runs of 8)");
  PathVerifyArgs args{};
  args.q = q.data_ptr<float>();
  args.k = k.data_ptr<float>();
  args.v = reinterpret_cast<const uint16_t*>(v.data_ptr());
  args.decay = decay.data_ptr<float>();
  args.beta = beta.data_ptr<float>();
  args.pool = pool.data_ptr();
  args.state_indices = state_indices.data_ptr<int32_t>();
  args.order = order.data_ptr<int32_t>();
  args.replay_len = replay_len.data_ptr<int32_t>();
  args.replay = replay.data_ptr<int32_t>();
  args.restore_slot = restore_slot.data_ptr<int32_t>();
  args.save_slot = save_slot.data_ptr<int32_t>();
  args.num_nodes = num_nodes.data_ptr<int32_t>();
  args.saved = saved.data_ptr<float>();
  args.o = reinterpret_cast<uint16_t*>(o.data_ptr());
  args.batch = static_cast<int>(q.size(0));
  args.nodes = static_cast<int>(q.size(1));
  args.heads = static_cast<int>(q.size(2));
  args.value_heads = static_cast<int>(v.size(2));
  args.value_dim = static_cast<int>(v.size(3));
  args.max_saved = static_cast<int>(max_saved);
  args.pool_bf16 = pool.scalar_type() == torch::kBFloat16;
  args.write_state = write_state;
  const cudaError_t err = path_verify_lanes_launch(args, static_cast<int>(lanes_per_column),
                                                   static_cast<int>(warps_per_block), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "path_verify_lanes launch failed: ", cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("path_verify_lanes", &path_verify_lanes, "GDN tree path-verify, lanes along V");
}
