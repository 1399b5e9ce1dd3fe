// GDN tree path-verify with lanes along V (CUDA C++): the launch interface (path_verify_lanes.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

// Inputs prepared once per token (path_verify.py: prepare_node_inputs): q (normalised, scaled) and k
// (normalised) FP32 [B, T, H, 128], decay exp(g) and beta FP32 [B, T, HV]. v and o bf16 [B, T, HV, V];
// pool [slots, HV, V, 128] FP32 or bf16 (read only); saved FP32 [B, max_saved, HV, V, 128] (kept branch
// states); the schedule arrays int32 as tree_schedule makes them (order, replay_len, restore_slot,
// save_slot [B, T]; replay [B, T, T]; num_nodes [B]); state_indices int32 [B]. write_state: commit — no
// outputs, and the state after the last visited node goes back into the pool at state_indices.
struct PathVerifyArgs {
  const float* q;
  const float* k;
  const uint16_t* v;
  const float* decay;
  const float* beta;
  void* pool;
  const int32_t* state_indices;
  const int32_t* order;
  const int32_t* replay_len;
  const int32_t* replay;
  const int32_t* restore_slot;
  const int32_t* save_slot;
  const int32_t* num_nodes;
  float* saved;
  uint16_t* o;
  int batch, nodes, heads, value_heads, value_dim, max_saved;
  bool pool_bf16;
  bool write_state;
};

// lanes_per_column: 4, 8, 16 or 32 (FP32 pools; 4-16 for bf16 pools) lanes share one value column
// (32 / lanes_per_column columns per warp, 128 / lanes_per_column state values per lane);
// warps_per_block: 1-32 warps of one (request, value head) share the block's staged inputs (shared
// memory: about T x 1 KB for T nodes); V must be a multiple of the block's columns.
cudaError_t path_verify_lanes_launch(const PathVerifyArgs& args, int lanes_per_column, int warps_per_block,
                                     cudaStream_t stream);
