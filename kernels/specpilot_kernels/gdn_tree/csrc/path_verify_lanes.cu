// GDN tree path-verify with lanes along V: each lane holds whole runs of one value column of the FP32
// state, so the sums over K are mostly in-thread and each column's arithmetic is done once, not by all
// 32 lanes as in the Triton kernel's tile (4 columns x 128 K over 32 lanes). The results are the Triton
// kernel's bit for bit: that kernel (like SGLang 0.5.23's) gives lane l the K elements 4l..4l+3, sums
// their four products in the order 1, 0, 2, 3 (a product, then three FMAs; read off its sm_90 PTX) and
// combines the 32 lanes by a butterfly (xor 16, 8, 4, 2, 1). Here "lane" l of that reduction is a
// (lane, run) pair: with P lanes per column, lane r of a column holds l = r + P*m for m < 32/P, so the
// butterfly's first log2(32/P) stages pair runs inside the thread and the last log2(P) stages are
// shuffles; every addition has the same two operands as before (IEEE addition commutes).
// The schedule (depth-first order, kept branch states, restarts) is path_verify.py's tree_schedule.
#include <cuda_bf16.h>

#include "path_verify_lanes.cuh"

namespace {

constexpr int kKeyDim = 128;

__device__ __forceinline__ float bf16_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* global) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global));
}

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

// The four products of a lane's run of K, summed in the Triton kernel's order (1, 0, 2, 3).
__device__ __forceinline__ float run_dot(const float* h, float4 w) {
  float s = __fmul_rn(w.y, h[1]);
  s = __fmaf_rn(w.x, h[0], s);
  s = __fmaf_rn(w.z, h[2], s);
  return __fmaf_rn(w.w, h[3], s);
}

// sum over K of h * w for this lane's column: runs, then the butterfly (in-thread stages, then shuffles).
template <int P>
__device__ __forceinline__ float column_dot(const float* h, const float4* w, int run0) {
  constexpr int M = 32 / P;
  float part[M];
#pragma unroll
  for (int m = 0; m < M; ++m) part[m] = run_dot(h + 4 * m, w[run0 + P * m]);
#pragma unroll
  for (int half = M / 2; half >= 1; half /= 2) {
#pragma unroll
    for (int m = 0; m < half; ++m) part[m] = __fadd_rn(part[m], part[m + half]);
  }
  float total = part[0];
#pragma unroll
  for (int half = P / 2; half >= 1; half /= 2) total = __fadd_rn(total, __shfl_xor_sync(0xffffffffu, total, half));
  return total;
}

template <typename PoolT>
__device__ __forceinline__ float4 load_run(const PoolT* p);

template <>
__device__ __forceinline__ float4 load_run<float>(const float* p) {
  return __ldg(reinterpret_cast<const float4*>(p));
}

template <>
__device__ __forceinline__ float4 load_run<uint16_t>(const uint16_t* p) {
  const uint2 bits = __ldg(reinterpret_cast<const uint2*>(p));
  return make_float4(__uint_as_float(bits.x << 16), __uint_as_float(bits.x & 0xffff0000u),
                     __uint_as_float(bits.y << 16), __uint_as_float(bits.y & 0xffff0000u));
}

// this lane's runs of one column of a [.., V, 128] committed state (read-only during the call)
template <int P, typename PoolT>
__device__ __forceinline__ void load_column(float* h, const PoolT* column, int run0) {
  constexpr int M = 32 / P;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float4 x = load_run<PoolT>(column + 4 * (run0 + P * m));
    h[4 * m] = x.x;
    h[4 * m + 1] = x.y;
    h[4 * m + 2] = x.z;
    h[4 * m + 3] = x.w;
  }
}

// the same from a kept branch state: plain loads, since this kernel wrote it (not the read-only cache)
template <int P>
__device__ __forceinline__ void load_saved_column(float* h, const float* column, int run0) {
  constexpr int M = 32 / P;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float4 x = *reinterpret_cast<const float4*>(column + 4 * (run0 + P * m));
    h[4 * m] = x.x;
    h[4 * m + 1] = x.y;
    h[4 * m + 2] = x.z;
    h[4 * m + 3] = x.w;
  }
}

template <typename PoolT>
__device__ __forceinline__ void store_run(PoolT* p, float4 x);

template <>
__device__ __forceinline__ void store_run<float>(float* p, float4 x) {
  *reinterpret_cast<float4*>(p) = x;
}

template <>
__device__ __forceinline__ void store_run<uint16_t>(uint16_t* p, float4 x) {
  const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(x.x)) | (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(x.y))) << 16);
  const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(x.z)) | (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(x.w))) << 16);
  *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
}

// this lane's runs back into one column of the pool (the commit)
template <int P, typename PoolT>
__device__ __forceinline__ void store_column(PoolT* column, const float* h, int run0) {
  constexpr int M = 32 / P;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    store_run<PoolT>(column + 4 * (run0 + P * m), make_float4(h[4 * m], h[4 * m + 1], h[4 * m + 2], h[4 * m + 3]));
  }
}

// One recurrence step of this lane's column; returns nothing, h is updated in place.
template <int P>
__device__ __forceinline__ void gdn_update(float* h, const float4* k_runs, float v, float decay, float beta, int run0) {
  constexpr int M = 32 / P;
#pragma unroll
  for (int i = 0; i < 4 * M; ++i) h[i] = __fmul_rn(h[i], decay);
  const float u = __fmul_rn(__fsub_rn(v, column_dot<P>(h, k_runs, run0)), beta);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float4 w = k_runs[run0 + P * m];
    h[4 * m] = __fmaf_rn(w.x, u, h[4 * m]);
    h[4 * m + 1] = __fmaf_rn(w.y, u, h[4 * m + 1]);
    h[4 * m + 2] = __fmaf_rn(w.z, u, h[4 * m + 2]);
    h[4 * m + 3] = __fmaf_rn(w.w, u, h[4 * m + 3]);
  }
}

template <int P, typename PoolT>
__global__ void path_verify_lanes_kernel(PathVerifyArgs a) {
  constexpr int M = 32 / P;        // runs of 4 K elements per lane
  constexpr int kColumns = 32 / P;  // value columns per warp
  extern __shared__ float4 smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int column_blocks = a.value_dim / kColumns;
  const int global_warp = blockIdx.x * (blockDim.x >> 5) + warp;
  if (global_warp >= column_blocks * a.batch * a.value_heads) return;
  const int block = global_warp % column_blocks;
  const int b = (global_warp / column_blocks) % a.batch;
  const int hv = global_warp / (column_blocks * a.batch);
  const int run0 = lane % P;
  const int column = block * kColumns + lane / P;
  const int i_h = hv / (a.value_heads / a.heads);
  // this warp's request: every per-node address below is a base here plus node * a 32-bit stride
  const int64_t bos = static_cast<int64_t>(b) * a.nodes;
  const float* k_rows = a.k + (bos * a.heads + i_h) * kKeyDim + 4 * lane;  // + node * row_stride
  const float* q_rows = a.q + (bos * a.heads + i_h) * kKeyDim + 4 * lane;
  const int row_stride = a.heads * kKeyDim;
  const uint16_t* v_column = a.v + (bos * a.value_heads + hv) * a.value_dim + column;  // + node * token_stride
  uint16_t* o_column = a.o + (bos * a.value_heads + hv) * a.value_dim + column;
  const int token_stride = a.value_heads * a.value_dim;
  const float* decay_head = a.decay + bos * a.value_heads + hv;  // + node * value_heads
  const float* beta_head = a.beta + bos * a.value_heads + hv;
  const int32_t* order = a.order + bos;
  const int32_t* replay_len = a.replay_len + bos;
  const int32_t* restore_slot = a.restore_slot + bos;
  const int32_t* save_slot = a.save_slot + bos;
  const int32_t* replay = a.replay + bos * a.nodes;
  // kept branch states of this column: + slot * slot_stride
  float* saved_column = a.saved + ((static_cast<int64_t>(b) * a.max_saved * a.value_heads + hv) * a.value_dim + column) * kKeyDim;
  const int64_t slot_stride = static_cast<int64_t>(a.value_heads) * a.value_dim * kKeyDim;
  // two buffers of this warp's staged k and q rows (32 float4 each): node j computes from buffer j & 1
  float4* staged = smem + warp * 128;

  const int64_t slot = a.state_indices[b];
  PoolT* pool_column = static_cast<PoolT*>(a.pool) + ((slot * a.value_heads + hv) * a.value_dim + column) * kKeyDim;
  float h[4 * M];
  load_column<P, PoolT>(h, pool_column, run0);

  const int n = a.num_nodes[b];
  auto stage = [&](int buffer, int node) {
    cp_async16(staged + buffer * 64 + lane, k_rows + node * row_stride);
    cp_async16(staged + buffer * 64 + 32 + lane, q_rows + node * row_stride);
    asm volatile("cp.async.commit_group;\n" ::);
  };
  int next_node = n > 0 ? order[0] : 0;
  if (n > 0) stage(0, next_node);
  float next_v = bf16_to_float(v_column[next_node * token_stride]);
  float next_decay = decay_head[next_node * a.value_heads], next_beta = beta_head[next_node * a.value_heads];
  for (int j = 0; j < n; ++j) {
    const int node = next_node;
    const float v = next_v, decay = next_decay, beta = next_beta;
    cp_async_wait_all();
    __syncwarp();  // node j's rows are in; every lane is done reading the other buffer
    if (j + 1 < n) {
      next_node = order[j + 1];
      stage((j + 1) & 1, next_node);
      next_v = bf16_to_float(v_column[next_node * token_stride]);
      next_decay = decay_head[next_node * a.value_heads];
      next_beta = beta_head[next_node * a.value_heads];
    }
    const int n_replay = replay_len[j];
    if (n_replay >= 0) {  // restart: the deepest kept state on the path (or the committed one), then replays
      const int source = a.max_saved > 0 ? restore_slot[j] : -1;
      if (source >= 0) {
        load_saved_column<P>(h, saved_column + source * slot_stride, run0);
      } else {
        load_column<P, PoolT>(h, pool_column, run0);
      }
      for (int d = 0; d < n_replay; ++d) {
        const int ancestor = replay[j * a.nodes + d];
        const float4* k_runs = reinterpret_cast<const float4*>(k_rows - 4 * lane + ancestor * row_stride);
        gdn_update<P>(h, k_runs, bf16_to_float(v_column[ancestor * token_stride]), decay_head[ancestor * a.value_heads],
                      beta_head[ancestor * a.value_heads], run0);
      }
    }
    const float4* rows = staged + (j & 1) * 64;
    gdn_update<P>(h, rows, v, decay, beta, run0);
    if (!a.write_state) {
      const float out = column_dot<P>(h, rows + 32, run0);
      if (run0 == 0) o_column[node * token_stride] = __bfloat16_as_ushort(__float2bfloat16_rn(out));
    }
    const int keep = a.max_saved > 0 ? save_slot[j] : -1;
    if (keep >= 0) {
      float* dst = saved_column + keep * slot_stride;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        *reinterpret_cast<float4*>(dst + 4 * (run0 + P * m)) = make_float4(h[4 * m], h[4 * m + 1], h[4 * m + 2], h[4 * m + 3]);
      }
    }
  }
  if (a.write_state) {
    store_column<P, PoolT>(pool_column, h, run0);
    return;
  }
  for (int j = n; j < a.nodes; ++j) {
    if (run0 == 0) o_column[j * token_stride] = 0;
  }
}

template <int P>
cudaError_t launch_for(const PathVerifyArgs& args, int warps_per_block, cudaStream_t stream) {
  const int warps = (args.value_dim / (32 / P)) * args.batch * args.value_heads;
  const dim3 grid((warps + warps_per_block - 1) / warps_per_block);
  const size_t smem = static_cast<size_t>(warps_per_block) * 128 * sizeof(float4);
  if (args.pool_bf16) {
    path_verify_lanes_kernel<P, uint16_t><<<grid, 32 * warps_per_block, smem, stream>>>(args);
  } else {
    path_verify_lanes_kernel<P, float><<<grid, 32 * warps_per_block, smem, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t path_verify_lanes_launch(const PathVerifyArgs& args, int lanes_per_column, int warps_per_block,
                                     cudaStream_t stream) {
  switch (lanes_per_column) {
    case 4: return launch_for<4>(args, warps_per_block, stream);
    case 8: return launch_for<8>(args, warps_per_block, stream);
    case 16: return launch_for<16>(args, warps_per_block, stream);
    case 32: return launch_for<32>(args, warps_per_block, stream);
    default: return cudaErrorInvalidValue;
  }
}
