// Host side of the W12 GEMM: which kernel family runs a launch (w12_mma_launch), the fixed-order reduction of K splits
// through a workspace, and the occupancy query every family's launch asks.
#include "w12_common.cuh"

namespace w12 {
namespace {

// K splits summed in split order (split 0, then 1, 2, ...: the Triton reduction's order), rounded once.
// partial: [splits][m][ld], y: [m][ld], both summed and written in their first `columns` columns.
__global__ void split_reduce_kernel(const float* partial, __nv_bfloat16* y, int m, int columns, int ld, int splits) {
  allow_next_grid();  // the next kernel's prologue reads only its weights
  wait_for_prior_grid();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m * columns) return;
  const size_t at = (size_t)(i / columns) * ld + i % columns;
  float acc = partial[at];
  for (int s = 1; s < splits; ++s) acc += partial[(size_t)s * m * ld + at];
  y[at] = __float2bfloat16_rn(acc);
}

}  // namespace

// Blocks of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory) that fit a multiprocessor of the
// current device, 0 when none does (more shared memory than a block may have counts as none). Asked of the runtime
// once per kernel, device and block shape: the query is a sizeable part of an eager call's host time on the
// host. The kernel's dynamic shared-memory limit only ever rises, to the largest size asked for, so a smaller size asked
// later cannot refuse a larger launch whose answer is already known.
cudaError_t resident_blocks(const void* kernel, int threads, size_t smem, int* resident) {
  struct Shape {
    const void* kernel;
    int device, threads;
    size_t smem;
    int resident;
  };
  struct Limit {
    const void* kernel;
    int device;
    size_t smem;
  };
  static thread_local Shape known[64];
  static thread_local int known_count = 0;
  static thread_local Limit limits[64];
  static thread_local int limit_count = 0;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  for (int i = 0; i < min(known_count, 64); ++i)
    if (known[i].kernel == kernel && known[i].device == device && known[i].threads == threads && known[i].smem == smem) {
      *resident = known[i].resident;
      return cudaSuccess;
    }
  Limit* limit = nullptr;
  for (int i = 0; i < min(limit_count, 64); ++i)
    if (limits[i].kernel == kernel && limits[i].device == device) limit = &limits[i];
  if (!limit) {  // the kernel's limit as the runtime has it (an entry pushed out of the table may have raised it)
    cudaFuncAttributes attributes;
    err = cudaFuncGetAttributes(&attributes, kernel);
    if (err != cudaSuccess) return err;
    limit = &limits[limit_count++ % 64];
    *limit = {kernel, device, (size_t)attributes.maxDynamicSharedSizeBytes};
  }
  *resident = 0;
  if (smem > limit->smem) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
      cudaGetLastError();  // more than a block may have: no block fits (not remembered: the limit stays as it was)
      return cudaSuccess;
    }
    limit->smem = smem;
  }
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(resident, kernel, threads, smem);
  if (err != cudaSuccess) return err;
  known[known_count++ % 64] = {kernel, device, threads, smem, *resident};
  return cudaSuccess;
}

cudaError_t launch_split_sums(const W12MmaArgs& args, int splits, cudaStream_t stream) {
  const int columns = min(args.n, args.n_padded);  // a row region's: its rows of W
  const int total = args.m * columns;
  return launch_overlapping(split_reduce_kernel, dim3((total + 255) / 256), dim3(256), 0, stream, args.overlap_prior, 1,
                            (const float*)args.partial, args.y, args.m, columns, args.n, splits);
}

}  // namespace w12

using namespace w12;

cudaError_t w12_mma_launch(const W12MmaArgs& args, int low_bits, cudaStream_t stream, W12SharedActivations shared_x,
                           int* launched_warpgroups, W12Wide wide) {
  const bool is_wide = wide.groups > 0;
  if (args.m < 1 || args.m > (is_wide ? kMaxWideRows : kMaxRows) || args.warps_n * args.warps_k < 1 ||
      args.warps_n * args.warps_k > kMaxWarpsPerBlock)
    return cudaErrorInvalidValue;
  if (shared_x.ring != 0 &&
      (args.m <= 16 || args.m > 32 || args.tiles_per_warp != 1 || args.staged_weights || shared_x.ring < 2 ||
       shared_x.ring > kMaxSharedXRing || shared_x.tiles < 1 || shared_x.tiles * args.warps_k > kMaxWarpsPerBlock))
    return cudaErrorInvalidValue;
  if (shared_x.warpgroups != 0 && (args.m <= 8 || shared_x.ring != 0 || args.staged_weights || shared_x.warpgroups < 0 ||
                                   4 * shared_x.warpgroups * args.warps_k > kMaxWgmmaWarpsPerBlock || !shared_x.x_image))
    return cudaErrorInvalidValue;
  static thread_local int major_of[16] = {};
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  int& major = major_of[device & 15];
  if (major == 0 && (status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) != cudaSuccess)
    return status;
  if (launched_warpgroups) *launched_warpgroups = 0;
  if (is_wide) {  // 33-256 rows, sm_90a: reduces its K classes and splits itself (checked by launch_wide)
    if (major != 9) return cudaErrorNotSupported;
    const cudaError_t err = launch_wide(args, low_bits, wide, stream);
    if (err == cudaSuccess && launched_warpgroups) *launched_warpgroups = wide.groups;
    return err;
  }
  const int splits = (args.k_padded / 128 + args.chunks_per_split - 1) / args.chunks_per_split;
  W12MmaArgs launched = args;
  launched.cluster_splits = 1;
  // sm_90+: K splits meet in a cluster (up to kMaxClusterSplits, one tile a warp)
  if (args.partial && splits <= kMaxClusterSplits && args.tiles_per_warp == 1 && major >= 9) {
    launched.partial = nullptr;
    launched.cluster_splits = splits;
  }
  if (major < 9) shared_x.ring = 0;  // bulk copies and mbarrier transactions: sm_90+ (the same bits without)
  if (major != 9) shared_x.warpgroups = 0;  // wgmma: sm_90a only (the same bits without)
  cudaError_t err = cudaErrorNotSupported;
  if (shared_x.warpgroups > 0) err = launch_wgmma(launched, low_bits, shared_x, stream);  // 9-64 rows
  if (err == cudaErrorNotSupported) {  // no warpgroup block fits a multiprocessor: per-warp, the same bits
    shared_x.warpgroups = 0;
    err = shared_x.ring > 0 ? launch_shared_x(launched, low_bits, shared_x, stream) : launch_warp(launched, low_bits, stream);
  }
  if (launched_warpgroups) *launched_warpgroups = err == cudaSuccess ? shared_x.warpgroups : 0;
  if (err != cudaSuccess || !launched.partial) return err;
  return launch_split_sums(launched, splits, stream);
}
