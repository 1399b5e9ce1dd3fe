// GDN tree path-verify with lanes along V: each lane holds whole runs of one value column of the FP32
// state, so the sums over K are mostly in-thread and each column's arithmetic is done once, not by all
// 32 lanes as in the Triton kernel's tile (4 columns x 128 K over 32 lanes).
//
// The results are the Triton kernel's bit for bit. That kernel (like SGLang 0.5.23's) splits K into L
// "lanes" of RUN consecutive elements (FP32 pools: 32 x 4; bf16 pools, whose loads are 8 elements wide:
// 16 x 8), sums a run's products in the order 1, 0, 2, 3, .. RUN-1 (a product, then FMAs; read off its
// sm_90 PTX) and combines the L lanes by a butterfly (xor L/2, .., 2, 1). Here lane l of that reduction
// is a (lane, run) pair: with P lanes per column, lane r of a column holds l = r + P*m for m < L/P, so
// the butterfly's first stages pair runs inside the thread and its last log2(P) stages are shuffles;
// every addition has the same two operands as before (IEEE addition commutes).
//
// A block is W warps of one (request, value head). It first copies everything its steps read into shared
// memory (the schedule row, the prepared k and q rows of the nodes it visits, its columns of their v,
// decay, beta), so the step loop waits on no global load except kept-state restores. The schedule is path_verify.py's
// tree_schedule (depth-first order, kept branch states, restarts).
#include <cuda_bf16.h>

#include "path_verify_lanes.cuh"
#include "ptx.cuh"

namespace {

constexpr int kKeyDim = 128;

__device__ __forceinline__ float bf16_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ uint16_t float_to_bf16(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

__device__ __forceinline__ void cp_async16(void* smem, const void* global) {
  ptx::cp_async16(ptx::shared_address(smem), global);
}

// The products of one run of K (RUN elements from `first`), summed in the Triton kernel's order.
template <int RUN>
__device__ __forceinline__ float run_dot(const float* h, const float* w) {
  float s = __fmul_rn(w[1], h[1]);
  s = __fmaf_rn(w[0], h[0], s);
#pragma unroll
  for (int j = 2; j < RUN; ++j) s = __fmaf_rn(w[j], h[j], s);
  return s;
}

// sum over K of h * w for this lane's column (w: a 128-float row in shared memory): runs, then the
// butterfly (in-thread stages, then shuffles among the column's P lanes).
template <int P, int RUN>
__device__ __forceinline__ float column_dot(const float* h, const float* w, int run0) {
  constexpr int M = kKeyDim / RUN / P;
  float part[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float wr[RUN];
#pragma unroll
    for (int j = 0; j < RUN; j += 4) {
      const float4 x = *reinterpret_cast<const float4*>(w + RUN * (run0 + P * m) + j);
      wr[j] = x.x;
      wr[j + 1] = x.y;
      wr[j + 2] = x.z;
      wr[j + 3] = x.w;
    }
    part[m] = run_dot<RUN>(h + RUN * m, wr);
  }
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

// four consecutive state elements of a pool, kept state or shared row, as FP32
template <typename T>
__device__ __forceinline__ float4 load4(const T* p);

template <>
__device__ __forceinline__ float4 load4<float>(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

template <>
__device__ __forceinline__ float4 load4<uint16_t>(const uint16_t* p) {
  const uint2 bits = *reinterpret_cast<const uint2*>(p);
  return make_float4(__uint_as_float(bits.x << 16), __uint_as_float(bits.x & 0xffff0000u),
                     __uint_as_float(bits.y << 16), __uint_as_float(bits.y & 0xffff0000u));
}

template <typename T>
__device__ __forceinline__ void store4(T* p, float4 x);

template <>
__device__ __forceinline__ void store4<float>(float* p, float4 x) {
  *reinterpret_cast<float4*>(p) = x;
}

template <>
__device__ __forceinline__ void store4<uint16_t>(uint16_t* p, float4 x) {
  const uint32_t lo = float_to_bf16(x.x) | (static_cast<uint32_t>(float_to_bf16(x.y)) << 16);
  const uint32_t hi = float_to_bf16(x.z) | (static_cast<uint32_t>(float_to_bf16(x.w)) << 16);
  *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
}

// this lane's runs of one column ([.., V, 128] row-major in K)
template <int P, int RUN, typename T>
__device__ __forceinline__ void load_column(float* h, const T* column, int run0) {
  constexpr int M = kKeyDim / RUN / P;
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int j = 0; j < RUN; j += 4) {
      const float4 x = load4<T>(column + RUN * (run0 + P * m) + j);
      h[RUN * m + j] = x.x;
      h[RUN * m + j + 1] = x.y;
      h[RUN * m + j + 2] = x.z;
      h[RUN * m + j + 3] = x.w;
    }
  }
}

template <int P, int RUN, typename T>
__device__ __forceinline__ void store_column(T* column, const float* h, int run0) {
  constexpr int M = kKeyDim / RUN / P;
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int j = 0; j < RUN; j += 4) {
      store4<T>(column + RUN * (run0 + P * m) + j,
                make_float4(h[RUN * m + j], h[RUN * m + j + 1], h[RUN * m + j + 2], h[RUN * m + j + 3]));
    }
  }
}

// One recurrence step of this lane's column from the node's k row (shared memory); h updated in place.
template <int P, int RUN>
__device__ __forceinline__ void gdn_update(float* h, const float* k_row, float v, float decay, float beta, int run0) {
  constexpr int M = kKeyDim / RUN / P;
#pragma unroll
  for (int i = 0; i < RUN * M; ++i) h[i] = __fmul_rn(h[i], decay);
  const float u = __fmul_rn(__fsub_rn(v, column_dot<P, RUN>(h, k_row, run0)), beta);
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int j = 0; j < RUN; j += 4) {
      const float4 w = *reinterpret_cast<const float4*>(k_row + RUN * (run0 + P * m) + j);
      h[RUN * m + j] = __fmaf_rn(w.x, u, h[RUN * m + j]);
      h[RUN * m + j + 1] = __fmaf_rn(w.y, u, h[RUN * m + j + 1]);
      h[RUN * m + j + 2] = __fmaf_rn(w.z, u, h[RUN * m + j + 2]);
      h[RUN * m + j + 3] = __fmaf_rn(w.w, u, h[RUN * m + j + 3]);
    }
  }
}

// Shared memory of a block, for T nodes and C columns (all offsets 16-byte aligned).
struct StagedLayout {
  int k, q, v, decay, beta, order, replay_len, restore_slot, save_slot, bytes;
  __host__ __device__ StagedLayout(int nodes, int columns) {
    const auto align16 = [](int x) { return (x + 15) / 16 * 16; };
    k = 0;
    q = k + nodes * kKeyDim * 4;
    v = q + nodes * kKeyDim * 4;
    decay = v + align16(nodes * columns * 2);
    beta = decay + align16(nodes * 4);
    order = beta + align16(nodes * 4);
    replay_len = order + align16(nodes * 4);
    restore_slot = replay_len + align16(nodes * 4);
    save_slot = restore_slot + align16(nodes * 4);
    bytes = save_slot + align16(nodes * 4);
  }
};

template <int P, int RUN, typename PoolT>
__global__ void path_verify_lanes_kernel(PathVerifyArgs a) {
  constexpr int M = kKeyDim / RUN / P;  // runs per lane
  constexpr int kColumns = 32 / P;      // value columns per warp
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int block_columns = warps * kColumns;
  const int blocks_per_head = a.value_dim / block_columns;
  const int group = blockIdx.x % blocks_per_head;
  const int b = (blockIdx.x / blocks_per_head) % a.batch;
  const int hv = blockIdx.x / (blocks_per_head * a.batch);
  const int i_h = hv / (a.value_heads / a.heads);
  const int T = a.nodes;
  const int first_column = group * block_columns;
  const int run0 = lane % P;
  const int local_column = warp * kColumns + lane / P;
  const int column = first_column + local_column;
  const int64_t bos = static_cast<int64_t>(b) * T;
  const int token_stride = a.value_heads * a.value_dim;

  const StagedLayout layout(T, block_columns);
  float* s_k = reinterpret_cast<float*>(smem + layout.k);
  float* s_q = reinterpret_cast<float*>(smem + layout.q);
  uint16_t* s_v = reinterpret_cast<uint16_t*>(smem + layout.v);
  float* s_decay = reinterpret_cast<float*>(smem + layout.decay);
  float* s_beta = reinterpret_cast<float*>(smem + layout.beta);
  int* s_order = reinterpret_cast<int*>(smem + layout.order);
  int* s_replay_len = reinterpret_cast<int*>(smem + layout.replay_len);
  int* s_restore_slot = reinterpret_cast<int*>(smem + layout.restore_slot);
  int* s_save_slot = reinterpret_cast<int*>(smem + layout.save_slot);
  const int n = a.num_nodes[b];
  {  // stage the block's inputs: k, q rows by cp.async (16 bytes each), the rest by plain loads
    for (int i = threadIdx.x; i < T; i += blockDim.x) {
      s_order[i] = a.order[bos + i];
      s_replay_len[i] = a.replay_len[bos + i];
      s_restore_slot[i] = a.restore_slot[bos + i];
      s_save_slot[i] = a.save_slot[bos + i];
    }
    // the verify visits every node below n (in schedule order); the commit only its accepted path, order[:n]
    if (a.write_state) __syncthreads();
    const float* k_rows = a.k + (bos * a.heads + i_h) * kKeyDim;
    const float* q_rows = a.q + (bos * a.heads + i_h) * kKeyDim;
    for (int i = threadIdx.x; i < n * (kKeyDim / 4); i += blockDim.x) {
      const int node = a.write_state ? s_order[i / (kKeyDim / 4)] : i / (kKeyDim / 4), piece = i % (kKeyDim / 4);
      cp_async16(s_k + node * kKeyDim + 4 * piece, k_rows + static_cast<int64_t>(node) * a.heads * kKeyDim + 4 * piece);
      if (!a.write_state) {
        cp_async16(s_q + node * kKeyDim + 4 * piece, q_rows + static_cast<int64_t>(node) * a.heads * kKeyDim + 4 * piece);
      }
    }
    ptx::cp_async_commit();
    const uint16_t* v_rows = a.v + (bos * a.value_heads + hv) * a.value_dim + first_column;
    for (int i = threadIdx.x; i < n * block_columns; i += blockDim.x) {
      const int node = a.write_state ? s_order[i / block_columns] : i / block_columns, c = i % block_columns;
      s_v[node * block_columns + c] = v_rows[node * token_stride + c];
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const int node = a.write_state ? s_order[i] : i;
      s_decay[node] = a.decay[(bos + node) * a.value_heads + hv];
      s_beta[node] = a.beta[(bos + node) * a.value_heads + hv];
    }
    ptx::cp_async_wait_all();
    __syncthreads();
  }

  const int64_t slot = a.state_indices[b];
  PoolT* pool_column = static_cast<PoolT*>(a.pool) + ((slot * a.value_heads + hv) * a.value_dim + column) * kKeyDim;
  // kept branch states of this column: + slot * slot_stride
  float* saved_column = a.saved + ((static_cast<int64_t>(b) * a.max_saved * a.value_heads + hv) * a.value_dim + column) * kKeyDim;
  const int64_t slot_stride = static_cast<int64_t>(a.value_heads) * a.value_dim * kKeyDim;
  const int32_t* replay = a.replay + bos * T;
  uint16_t* o_column = a.o + (bos * a.value_heads + hv) * a.value_dim + column;
  float h[RUN * M];
  load_column<P, RUN, PoolT>(h, pool_column, run0);

  for (int j = 0; j < n; ++j) {
    const int node = s_order[j];
    const int n_replay = s_replay_len[j];
    if (n_replay >= 0) {  // restart: the deepest kept state on the path (or the committed one), then replays
      const int source = a.max_saved > 0 ? s_restore_slot[j] : -1;
      if (source >= 0) {
        load_column<P, RUN, float>(h, saved_column + source * slot_stride, run0);
      } else {
        load_column<P, RUN, PoolT>(h, pool_column, run0);
      }
      for (int d = 0; d < n_replay; ++d) {
        const int ancestor = replay[j * T + d];
        gdn_update<P, RUN>(h, s_k + ancestor * kKeyDim, bf16_to_float(s_v[ancestor * block_columns + local_column]),
                           s_decay[ancestor], s_beta[ancestor], run0);
      }
    }
    gdn_update<P, RUN>(h, s_k + node * kKeyDim, bf16_to_float(s_v[node * block_columns + local_column]), s_decay[node],
                       s_beta[node], run0);
    if (!a.write_state) {
      const float out = column_dot<P, RUN>(h, s_q + node * kKeyDim, run0);
      if (run0 == 0) o_column[node * token_stride] = float_to_bf16(out);
    }
    const int keep = a.max_saved > 0 ? s_save_slot[j] : -1;
    if (keep >= 0) store_column<P, RUN, float>(saved_column + keep * slot_stride, h, run0);
  }
  if (a.write_state) {
    store_column<P, RUN, PoolT>(pool_column, h, run0);
    return;
  }
  for (int j = n; j < T; ++j) {
    if (run0 == 0) o_column[j * token_stride] = 0;
  }
}

template <int P, int RUN, typename PoolT>
cudaError_t launch_for(const PathVerifyArgs& args, int warps_per_block, cudaStream_t stream) {
  const int block_columns = warps_per_block * (32 / P);
  if (args.value_dim % block_columns != 0) return cudaErrorInvalidValue;
  const dim3 grid(args.value_dim / block_columns * args.batch * args.value_heads);
  const int smem = StagedLayout(args.nodes, block_columns).bytes;
  auto kernel = path_verify_lanes_kernel<P, RUN, PoolT>;
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, 32 * warps_per_block, smem, stream>>>(args);
  return cudaGetLastError();
}

// FP32 pools: the Triton tile's runs are 4 elements (32 of them); bf16 pools: 8 (16 of them)
template <int P>
cudaError_t launch_pool(const PathVerifyArgs& args, int warps_per_block, cudaStream_t stream) {
  if (args.pool_bf16) {
    if constexpr (P <= 16) return launch_for<P, 8, uint16_t>(args, warps_per_block, stream);
    return cudaErrorInvalidValue;
  }
  return launch_for<P, 4, float>(args, warps_per_block, stream);
}

}  // namespace

cudaError_t path_verify_lanes_launch(const PathVerifyArgs& args, int lanes_per_column, int warps_per_block,
                                     cudaStream_t stream) {
  switch (lanes_per_column) {
    case 4: return launch_pool<4>(args, warps_per_block, stream);
    case 8: return launch_pool<8>(args, warps_per_block, stream);
    case 16: return launch_pool<16>(args, warps_per_block, stream);
    case 32: return launch_pool<32>(args, warps_per_block, stream);
    default: return cudaErrorInvalidValue;
  }
}
