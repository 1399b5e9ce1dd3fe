// The wide W12 kernel (sm_90a; 33-256 rows in one launch): warpgroup MMAs with slabs of 48-256 token rows (wgmma
// N = 48 ... 256), so each weight chunk is decoded once per slab and read from memory once per launch: the slabs of one
// tile group are neighbouring blocks, so a second slab's weight reads hit L2. Design reasons: docs/kernels/w12.md ("The
// wide kernel").
//
// A block is `groups` warpgroups (4 consecutive 16-row tiles each) of ONE K class of ONE split, so blocks stay small
// enough for several to share a multiprocessor whatever the partition; the K classes and splits of a tile group are
// the blocks of one thread-block cluster (along y), and the cluster's first block sums their partial sums through
// distributed shared memory in the partition's order: classes in class order within each split, then splits in split
// order, as the per-warp and warpgroup kernels do. So each row's bits equal those of every other kernel at every row
// count. (Splits beyond a cluster of 8 blocks go through the workspace, summed in split order by split_reduce_kernel.)
// With multicast the cluster also spans 2 or 4 neighbouring tile groups along x, which share each activation copy.
//
// Main loop, per warp: its tile's next chunks of weights arrive in its own cp.async ring (`stages` chunks, one to five
// ahead); the block's first thread brings each chunk's activation image (written by w12_wide_permute_kernel) into a
// ring of `slots` with one bulk copy, refilling a slot once every warp released it. Per 32-column block the warp
// decodes and patches the two k16 A fragments into one of two register sets and issues their MMAs, so the tensor
// cores run block b's MMAs while the warp decodes block b + 1 (a wait on all but the latest group frees a set).
#include "w12_wide.cuh"
#include "w12_wide_ptx.cuh"

namespace w12 {
namespace {

constexpr int kWideStageBytes = kBlocksPerChunk * kStagedBlockWords * 16;  // a warp's chunk of weights, staged

// What a launch fixes beyond W12MmaArgs (no bit depends on any of it).
struct WideLaunch {
  int slots;       // activation slots of the block (2-kMaxWideSlots)
  int stages;      // weight stages a warp (2-kMaxWideStages)
  int slabs;       // token slabs of MT * 8 rows
  int cluster;     // blocks a cluster along y: K classes x splits (or K classes alone; splits then through args.partial)
  int splits;      // K splits of the partition
  int multicast;   // blocks a cluster along x: neighbouring tile groups that share each activation copy
};

// Shared memory of a block (bytes): the main loop's (activation slots, weight stages, mbarriers, escape scratch) or the
// epilogue's partial sums, which reuse it, whichever is larger.
template <int MT, int LOW_BITS>
__host__ __device__ __forceinline__ size_t wide_smem_bytes(int groups, int slots, int stages) {
  const size_t warps = 4 * groups;
  const size_t loop = (size_t)slots * wide_chunk_bytes<MT>() + warps * stages * kWideStageBytes + 16 * slots +
                      (LOW_BITS == 0 ? warps * kEscapeScratchBytes : 0);
  const size_t sums = warps * 32 * MT * 16;
  return loop > sums ? loop : sums;
}

// Keeps the compiler from moving any access to the accumulators across the warpgroup MMAs that write them (an access
// inside an MMA's pipeline stage makes ptxas serialize every wgmma).
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void cp_async_wait_pending(int pending) {
  switch (pending) {
    case 1: ptx::cp_async_wait<1>(); break;
    case 2: ptx::cp_async_wait<2>(); break;
    case 3: ptx::cp_async_wait<3>(); break;
    case 4: ptx::cp_async_wait<4>(); break;
    default: ptx::cp_async_wait<5>(); break;
  }
}

// x [m, ldx] -> for each slab of MT * 8 token rows, each 128-column chunk's B image (wide_chunk_bytes<MT>() apiece,
// rows past m zero): image [slabs][chunks][8 steps][2 k halves][MT groups][8 rows][16 bytes]. Thread p copies piece p
// (8 columns 32u + 8t .. + 7 of one token row): its four words go to steps (u, 0) and (u, 1), k halves 0 and 1.
template <int MT>
__global__ void w12_wide_permute_kernel(const __nv_bfloat16* x, int m, int ldx, int chunks, int slabs, uint32_t* image) {
  allow_next_grid();  // the GEMM's prologue reads only its weights
  wait_for_prior_grid();
  const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  constexpr int kPieces = MT * 8 * 16;  // a slab's chunk
  if (p >= (long long)slabs * chunks * kPieces) return;
  const int slab_chunk = (int)(p / kPieces), piece = (int)(p % kPieces);
  const int slab = slab_chunk / chunks, chunk = slab_chunk % chunks;
  const int n = piece / 16, u = (piece >> 2) & 3, t = piece & 3;
  const int row = slab * MT * 8 + n;
  uint4 v = make_uint4(0, 0, 0, 0);
  if (row < m) v = __ldg(reinterpret_cast<const uint4*>(x + (size_t)row * ldx + chunk * 128 + u * 32 + 8 * t));
  constexpr int kHalf = MT * 128, kStep = wide_step_bytes<MT>();
  uint32_t* at = image + ((size_t)slab_chunk * wide_chunk_bytes<MT>() + 2 * u * kStep + (n >> 3) * 128 + (n & 7) * 16 +
                          4 * t) / 4;
  at[0] = v.x;
  at[kHalf / 4] = v.y;
  at[kStep / 4] = v.z;
  at[(kStep + kHalf) / 4] = v.w;
}

// args: the partition and the GEMM (W12MmaArgs), m up to 256; launch: slots, stages, slabs, cluster (WideLaunch);
// x_image: [slabs][chunks][wide_chunk_bytes<MT>()] from w12_wide_permute_kernel. Grid: (tile groups x slabs, K classes
// x splits), cluster (1, launch.cluster, 1); block: 4 x groups warps.
template <int MT, int LOW_BITS>
__global__ void w12_wide_kernel(W12MmaArgs args, WideLaunch launch, const uint4* x_image) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kChunkBytes = wide_chunk_bytes<MT>();
  constexpr int kAcc = MT * 4;  // accumulators a thread: 64 tile rows x 8 MT tokens over 128 threads
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int slab = blockIdx.x % launch.slabs;
  const int tile = (blockIdx.x / launch.slabs) * warps + warp;
  const int cls = blockIdx.y % args.warps_k, split = blockIdx.y / args.warps_k;
  const int first = split * args.chunks_per_split + cls;
  const int last = min((split + 1) * args.chunks_per_split, chunks);
  const int count = first < last ? (last - first + args.warps_k - 1) / args.warps_k : 0;

  extern __shared__ uint4 shared_words[];
  uint8_t* base = reinterpret_cast<uint8_t*>(shared_words);
  const uint32_t slots_s = ptx::shared_address(base);
  const uint32_t stages_s = slots_s + launch.slots * kChunkBytes;
  const uint32_t warp_stages = stages_s + warp * launch.stages * kWideStageBytes;
  const uint32_t full = stages_s + warps * launch.stages * kWideStageBytes;  // [slots] mbarriers, then [slots] empty ones
  const uint32_t empty = full + 8 * launch.slots;
  const uint32_t scratch = full + 16 * launch.slots + warp * kEscapeScratchBytes;
  // Multicast: the x-neighbours of a cluster (same K class and split, neighbouring tile groups) read the same
  // activations; the first of them (the leader) copies each chunk into all of their slots, once all of their warps
  // released it. Ranks run x first: rank = x + y * multicast.
  const int cx = launch.multicast;
  const uint32_t rank = launch.cluster * cx > 1 ? ptx::cluster_rank() : 0;
  const int xr = (int)rank % cx, yr = (int)rank / cx;
  const bool leader = xr == 0;
  const uint32_t leader_rank = rank - xr;
  if (threadIdx.x == 0) {
    for (int i = 0; i < launch.slots; ++i) {
      ptx::mbarrier_init(full + 8 * i, 1);
      ptx::mbarrier_init(empty + 8 * i, warps * cx);  // one arrival a warp of each block sharing the slot
    }
    ptx::fence_mbarrier_init();
  }
  if (cx > 1)
    ptx::cluster_sync();  // every barrier initialized before a leader's copy or a warp's arrival reaches it
  else
    __syncthreads();

  float d[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) d[i] = 0.f;

  if (count > 0) {  // a K class has chunks or not as a whole; warps past the last tile repeat it and store nothing
    const OneTile one(args, min(tile, tiles - 1), first, lane);
    const uint4* view_next = one.view;
    const uint2* nibs_next = one.nibs;
    EscapeStream esc;
    if (LOW_BITS == 0) esc.begin(args, min(tile, tiles - 1), first, last, args.warps_k, scratch, 0, lane);
    const size_t advance = (size_t)args.warps_k * kBlocksPerChunk * 32;
    // the warp's chunk i of weights into stage i % stages; one commit group a chunk (empty past the last)
    auto copy_weights = [&](bool any, int stage) {
      if (any) {
        stage_step<kBlocksPerChunk, LOW_BITS>(warp_stages + stage * kWideStageBytes, view_next, nibs_next, lane);
        view_next += advance;
        nibs_next += advance;
      }
      ptx::cp_async_commit();
    };
    for (int i = 0; i < launch.stages - 1; ++i) copy_weights(i < count, i);

    const uint4* image = x_image + (size_t)slab * chunks * (kChunkBytes / 16);
    const bool copier = threadIdx.x == 0;
    const uint16_t sharers = (uint16_t)(((1u << cx) - 1) << (yr * cx));
    // chunk i into its slot: this block expects its bytes; the leader copies (to every sharer with multicast)
    auto copy_chunk = [&](int i) {
      const uint32_t slot = i % launch.slots;
      ptx::mbarrier_arrive_expecting(full + 8 * slot, kChunkBytes);
      if (!leader) return;
      const uint4* from = image + (size_t)(first + i * args.warps_k) * (kChunkBytes / 16);
      if (cx > 1)
        bulk_copy_multicast(slots_s + slot * kChunkBytes, from, kChunkBytes, full + 8 * slot, sharers);
      else
        ptx::bulk_copy_to_shared(slots_s + slot * kChunkBytes, from, kChunkBytes, full + 8 * slot);
    };
    if (copier) {  // every slot starts empty: the first chunks into all of them
      wait_before_reading_x(args);  // the image is the permute kernel's output
      for (int i = 0; i < min(count, launch.slots); ++i) copy_chunk(i);
    }
    const uint32_t desc_lo0 = ((slots_s & 0x3FFFF) >> 4) | ((MT * 128 >> 4) << 16);
    constexpr uint64_t kDescHi = (uint64_t)(128 >> 4) << 32;
    uint32_t a[2][1][8];  // two register sets of one block's A fragments: block b's MMAs run while b + 1 is decoded
    int slot = 0, stage = 0, previous = launch.stages - 1;
    uint32_t phase = 0;
    for (int i = 0; i < count; ++i) {
      if (LOW_BITS == 0) {  // this chunk's escapes were fetched with its weights; fetch the next chunk's
        esc.advance();
        if (i + 1 < count) esc.fetch(args, i + 1, first, args.warps_k);
      }
      // chunk i + stages - 1 into the stage chunk i - 1 left (every lane read it before the last __syncwarp), then wait
      // for chunk i's own copy group
      copy_weights(i + launch.stages - 1 < count, previous);
      cp_async_wait_pending(launch.stages - 1);
      __syncwarp();
      const uint32_t words = warp_stages + stage * kWideStageBytes;
      ptx::mbarrier_wait(full + 8 * slot, phase);  // the chunk's activations have landed
      const uint32_t desc_lo = desc_lo0 + slot * (kChunkBytes >> 4);
#pragma unroll
      for (int u = 0; u < kBlocksPerChunk; ++u) {
        uint32_t(&set)[1][8] = a[u & 1];
        // free this register set: all but the latest group done (block u - 2's MMAs, of this chunk or the last)
        ptx::wgmma_wait<1>();
        fence_accumulators(d);
        if (u == 1 && i > 0) {  // chunk i - 1's MMAs are done: release its slot, which then takes chunk i - 1 + slots
          __syncwarp();
          const int released = (i - 1) % launch.slots;
          if (cx == 1) {
            if (lane == 0) ptx::mbarrier_arrive(empty + 8 * released);
            if (copier && i - 1 + launch.slots < count) {
              ptx::mbarrier_wait(empty + 8 * released, ((i - 1) / launch.slots) & 1);
              copy_chunk(i - 1 + launch.slots);
            }
          } else if (i - 1 + launch.slots < count) {  // only releases a refill waits for: none reaches a finished block
            if (copier && !leader) copy_chunk(i - 1 + launch.slots);  // expects the bytes before releasing
            if (lane == 0) mbarrier_arrive_remote(ptx::map_to_block(empty + 8 * released, leader_rank));
            if (copier && leader) {
              ptx::mbarrier_wait(empty + 8 * released, ((i - 1) / launch.slots) & 1);
              copy_chunk(i - 1 + launch.slots);
            }
          }
        }
        uint4 v;
        uint2 nb;
        read_staged_block<kBlocksPerChunk, LOW_BITS>(words, u, lane, v, nb);
        decode_block(set[0], v, nb, one.base_lo, one.base_hi);
        if (LOW_BITS == 0) esc.template patch<1>(set, u, args, i, first, args.warps_k, scratch, lane);
        ptx::wgmma_fence();
#pragma unroll
        for (int s = 0; s < 2; ++s)
          wide_wgmma<8 * MT>(d, &set[0][4 * s], kDescHi | (desc_lo + (2 * u + s) * (wide_step_bytes<MT>() >> 4)));
        ptx::wgmma_commit();
        fence_accumulators(d);
      }
      previous = stage;
      stage = stage + 1 == launch.stages ? 0 : stage + 1;
      if (++slot == launch.slots) {
        slot = 0;
        phase ^= 1;
      }
    }
    ptx::wgmma_wait<0>();
    fence_accumulators(d);
  }

  // Epilogue. The next kernel may start its prologue; outputs are written only once the kernel before is done.
  epilogue_grid_order(args);
  if (cx > 1) ptx::cluster_sync();  // every sharer is past its loop: no copy or arrival still targets its shared memory
  if (launch.cluster > 1) {  // every block's partial sums into its own shared memory (the loop's, now free)
    __syncthreads();
    const uint32_t mine = slots_s + ((warp * MT) * 32 + lane) * 16;
#pragma unroll
    for (int j = 0; j < MT; ++j) ptx::st_shared16(mine + j * 32 * 16, __float_as_uint(d[4 * j]), __float_as_uint(d[4 * j + 1]),
                                                  __float_as_uint(d[4 * j + 2]), __float_as_uint(d[4 * j + 3]));
    ptx::cluster_sync();
    if (yr == 0) {  // classes in class order within each split of the cluster, then the splits in split order
      const int cluster_splits = launch.cluster / args.warps_k;
      for (int sp = 0; sp < cluster_splits; ++sp) {
#pragma unroll
        for (int j = 0; j < MT; ++j) {
          float4 sum = sp == 0 ? make_float4(d[4 * j], d[4 * j + 1], d[4 * j + 2], d[4 * j + 3])
                               : ptx::ld_cluster16(ptx::map_to_block(mine, xr + sp * args.warps_k * cx) + j * 32 * 16);
          for (int c = 1; c < args.warps_k; ++c) {
            const float4 o = ptx::ld_cluster16(ptx::map_to_block(mine, xr + (sp * args.warps_k + c) * cx) + j * 32 * 16);
            sum.x += o.x, sum.y += o.y, sum.z += o.z, sum.w += o.w;
          }
          if (sp == 0) {
            d[4 * j] = sum.x, d[4 * j + 1] = sum.y, d[4 * j + 2] = sum.z, d[4 * j + 3] = sum.w;
          } else {
            d[4 * j] += sum.x, d[4 * j + 1] += sum.y, d[4 * j + 2] += sum.z, d[4 * j + 3] += sum.w;
          }
        }
      }
    }
    ptx::cluster_sync();  // no block leaves while the first one may still read its shared memory
    if (yr != 0) return;
  }
  if (tile >= tiles) return;
  const int m0 = slab * MT * 8;
  const int out_split = launch.cluster > 1 ? split / (launch.cluster / args.warps_k) : split;
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int n = tile * 16 + g + 8 * (q >> 1);
      const int m = m0 + j * 8 + 2 * t + (q & 1);
      if (n < args.n && m < args.m) {
        if (args.partial)
          args.partial[((size_t)out_split * args.m + m) * args.n + n] = d[4 * j + q];
        else
          args.y[(size_t)m * args.n + n] = __float2bfloat16_rn(d[4 * j + q]);
      }
    }
#else
  __trap();  // the host launches the wide kernel on sm_90a only
#endif
}

// The wide kernel's instantiations: token tiles of 8 rows a slab (wgmma N = 8 x MT).
#define W12_WIDE_KERNELS(X) X(6) X(8) X(12) X(16) X(24) X(32)

template <int MT, int LOW_BITS>
cudaError_t launch_slabs(const W12MmaArgs& args, const W12Wide& wide, int groups, cudaStream_t stream) {
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int splits = (chunks + args.chunks_per_split - 1) / args.chunks_per_split;
  WideLaunch launch{wide.slots, wide.stages, (args.m + MT * 8 - 1) / (MT * 8), 0, splits, 1};
  // K classes and splits in one cluster where they fit 8 blocks; else the classes, and the splits through the workspace
  launch.cluster = args.warps_k * splits <= 8 ? args.warps_k * splits : args.warps_k;
  if (launch.cluster > 8 || launch.slots < 2 || launch.slots > kMaxWideSlots || launch.stages < 2 ||
      launch.stages > kMaxWideStages)
    return cudaErrorInvalidValue;
  if (launch.cluster < args.warps_k * splits && !args.partial) return cudaErrorInvalidValue;  // needs the workspace
  // tile groups sharing activation copies: one slab (neighbouring blocks are then neighbouring tile groups), at most
  // 16 blocks a cluster (more than 8: a non-portable cluster size)
  if (wide.multicast != 1 && wide.multicast != 2 && wide.multicast != 4) return cudaErrorInvalidValue;
  if (launch.slabs == 1 && wide.multicast * launch.cluster <= 16) launch.multicast = wide.multicast;
  W12MmaArgs launched = args;
  if (launch.cluster == args.warps_k * splits) launched.partial = nullptr;
  const int tile_groups = (tiles + 4 * groups - 1) / (4 * groups);
  const int cx = launch.multicast;
  // a grid of whole clusters: blocks past the last tile group compute its tiles again and store nothing
  dim3 grid((tile_groups + cx - 1) / cx * cx * launch.slabs, args.warps_k * splits);
  dim3 block(128 * groups);
  const size_t smem = wide_smem_bytes<MT, LOW_BITS>(groups, launch.slots, launch.stages);
  auto kernel = w12_wide_kernel<MT, LOW_BITS>;
  int resident = 0;
  cudaError_t err = resident_blocks(reinterpret_cast<const void*>(kernel), block.x, smem, &resident);
  if (err != cudaSuccess) return err;
  if (resident == 0) {  // more registers or shared memory than a multiprocessor has: fewer warpgroups a block
    if (groups > 1) return launch_slabs<MT, LOW_BITS>(args, wide, groups / 2, stream);
    return cudaErrorNotSupported;
  }
  if (!wide.x_image_written) {
    const long long pieces = (long long)launch.slabs * chunks * MT * 8 * 16;
    err = launch_overlapping(w12_wide_permute_kernel<MT>, dim3((unsigned)((pieces + 255) / 256)), dim3(256), 0, stream,
                             args.overlap_prior != kOverlapNone, 1, args.x, args.m, args.ldx, chunks, launch.slabs,
                             static_cast<uint32_t*>(wide.x_image));
    if (err != cudaSuccess) return err;
  }
  if (cx * launch.cluster > 8 &&
      (err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)) != cudaSuccess)
    return err;
  err = launch_overlapping(kernel, grid, block, smem, stream, args.overlap_prior, ClusterShape(cx, launch.cluster),
                           launched, launch, static_cast<const uint4*>(wide.x_image));
  if (err != cudaSuccess || !launched.partial) return err;
  return launch_split_sums(launched, splits, stream);
}

template <int LOW_BITS>
cudaError_t launch_low_bits(const W12MmaArgs& args, const W12Wide& wide, cudaStream_t stream) {
#define W12_WIDE_CALL_IF(MT) \
  if (wide.token_tiles == MT) return launch_slabs<MT, LOW_BITS>(args, wide, wide.groups, stream);
  W12_WIDE_KERNELS(W12_WIDE_CALL_IF)
#undef W12_WIDE_CALL_IF
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_wide_image(const W12MmaArgs& args, int token_tiles, int slabs, void* image, cudaStream_t stream) {
  const int chunks = args.k_padded / 128;
  const long long pieces = (long long)slabs * chunks * token_tiles * 8 * 16;
  const dim3 grid((unsigned)((pieces + 255) / 256));
#define W12_WIDE_IMAGE_IF(MT)                                                                                     \
  if (token_tiles == MT)                                                                                          \
    return launch_overlapping(w12_wide_permute_kernel<MT>, grid, dim3(256), 0, stream,                            \
                              args.overlap_prior != kOverlapNone, 1, args.x, args.m, args.ldx, chunks, slabs,     \
                              static_cast<uint32_t*>(image));
  W12_WIDE_KERNELS(W12_WIDE_IMAGE_IF)
#undef W12_WIDE_IMAGE_IF
  return cudaErrorInvalidValue;
}

cudaError_t launch_wide(const W12MmaArgs& args, int low_bits, const W12Wide& wide, cudaStream_t stream) {
  if (!wide.x_image || wide.groups < 1 || 4 * wide.groups > kMaxWideWarpsPerBlock) return cudaErrorInvalidValue;
  // exact weights only: the Q pass runs on the per-warp kernel (w12_warp.cu, decode_block_q)
  if (low_bits != 0) return cudaErrorNotSupported;
  if (wide.decoded == kWideClassSplit) return launch_wgmma_split(args, wide, stream);
  return wide.decoded ? launch_wide_ss(args, wide, stream) : launch_low_bits<0>(args, wide, stream);
}

}  // namespace w12
