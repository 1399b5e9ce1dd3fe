// The decoded-weight wide W12 kernel (sm_90a; 33-256 rows in one launch): decoder warps decode each chunk of weights
// once into shared memory as BF16 (wgmma's A operand layout), and one MMA warpgroup multiplies it with a slab of token
// rows with both operands in shared memory, so decoding costs once a weight a slab whatever the rows, and the MMA
// warpgroup issues its asynchronous MMAs back to back while the decoders work on the next chunk. Design reasons:
// docs/kernels/w12.md ("The decoded-weight wide kernel").
//
// A block is `TG` tile groups (4 consecutive 16-row tiles each, one decoder warpgroup apiece: warp w decodes tile w
// exactly as every other kernel does, escapes patched in its registers) of ONE K class of ONE split, plus the MMA
// warpgroup, whose thread 0 also brings each chunk's activation image (w12_wide_permute_kernel) into a ring by bulk
// copies. The K classes and splits of a tile group are the blocks of one cluster along y, summed in the partition's
// order by its first block (as w12_wide.cu does). A k16 step of A holds the same weights at the same k slots as the
// register fragment of the other kernels, and chunks run in the same order, so each row's bits are theirs.
#include "w12_wide.cuh"
#include "w12_wide_ss_ptx.cuh"

namespace w12 {
namespace {

constexpr int kDecodedStepBytes = 64 * 16 * 2;                     // one tile group's k16 step of A: 64 rows x 16 BF16
constexpr int kDecodedChunkBytes = 8 * kDecodedStepBytes;          // ... of a 128-column chunk
constexpr int kMaxDecodedSlots = 3;
constexpr int kPrefetchChunks = 3;  // a decoder warp's chunks in L2 ahead of its register loads

// MMA warpgroups a block (W): one, or two where one thread cannot hold the TG tile groups' accumulators (TG x MT x 4 >
// 128 a thread); each takes TG / W tile groups.
template <int MT, int TG>
__host__ __device__ constexpr int ss_mma_groups() { return TG * MT * 4 > 128 ? 2 : 1; }
template <int MT, int TG>
__host__ __device__ constexpr int ss_threads() { return 128 * (TG + ss_mma_groups<MT, TG>()); }
// Registers a thread: every thread starts with the launch bound's share (blocks a multiprocessor: 2 where one tile group
// of at most 128 token rows leaves room, else 1); the decoders give theirs down to ss_decoder_registers (their escape
// patch needs about 96 without spills) and the MMA warpgroups take what that frees.
template <int MT, int TG>
__host__ __device__ constexpr int ss_blocks_per_sm() { return TG == 1 && MT <= 16 ? 2 : 1; }
template <int MT, int TG>
__host__ __device__ constexpr int ss_launch_registers() {
  return 65536 / (ss_threads<MT, TG>() * ss_blocks_per_sm<MT, TG>()) / 8 * 8 > 248
             ? 248
             : 65536 / (ss_threads<MT, TG>() * ss_blocks_per_sm<MT, TG>()) / 8 * 8;
}
template <int MT, int TG>
__host__ __device__ constexpr int ss_decoder_registers() { return TG < 4 ? 96 : MT * 16 > 96 ? 80 : 88; }
template <int MT, int TG>
__host__ __device__ constexpr int ss_mma_registers() {
  return ((TG + ss_mma_groups<MT, TG>()) * ss_launch_registers<MT, TG>() - TG * ss_decoder_registers<MT, TG>()) /
                     ss_mma_groups<MT, TG>() / 8 * 8 >
                 240
             ? 240
             : ((TG + ss_mma_groups<MT, TG>()) * ss_launch_registers<MT, TG>() - TG * ss_decoder_registers<MT, TG>()) /
                   ss_mma_groups<MT, TG>() / 8 * 8;
}
// Token rows a warpgroup MMA instruction takes: the slab, or its halves where the slab's accumulators pass the launch
// bound's registers (ptxas checks each instruction against the bound, not against the raised count).
template <int MT, int TG>
__host__ __device__ constexpr int ss_mma_n() { return MT * 4 + 32 > ss_launch_registers<MT, TG>() ? MT * 4 : MT * 8; }

// Shared memory (bytes): `slots` activation slots, `stages` decoded slots of TG tile groups, escape scratch a decoder
// warp, 4 mbarriers a slot; or the epilogue's partial sums, which reuse it, whichever is larger.
template <int MT, int TG>
__host__ __device__ __forceinline__ size_t ss_smem_bytes(int slots, int stages) {
  const size_t loop = (size_t)slots * wide_chunk_bytes<MT>() + (size_t)stages * TG * kDecodedChunkBytes +
                      (size_t)4 * TG * kEscapeScratchBytes + 16 * (slots + stages);
  const size_t sums = (size_t)TG * 4 * 32 * MT * 16;
  return loop > sums ? loop : sums;
}

// No-swizzle K-major descriptor: start, leading offset (between the two 8-column core matrices of a k16 step), stride
// offset 128 (between 8-row groups).
__device__ __forceinline__ uint64_t descriptor(uint32_t at, uint32_t leading) {
  return (uint64_t)(128 >> 4) << 32 | ((at & 0x3FFFF) >> 4) | ((leading >> 4) << 16);
}

template <int N>
__device__ __forceinline__ void fence_sums(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // the kernel's parts (cluster instructions: device code of sm_90a only)

// The decoder warps' part of the epilogue: the block and cluster barriers the MMA warpgroup's sums pass.
__device__ __forceinline__ void ss_epilogue_others(const W12MmaArgs& args, int cluster) {
  epilogue_grid_order(args);
  if (cluster > 1) {
    __syncthreads();
    ptx::cluster_sync();
    ptx::cluster_sync();
  }
}

// An MMA warpgroup's epilogue (its TGW tile groups): the cluster's partial sums in the partition's order (its first block), then the stores.
template <int MT, int TGW>
__device__ __forceinline__ void ss_epilogue(float (&d)[TGW][MT * 4], const W12MmaArgs& args, uint32_t x_s, int cluster,
                                            int slab, int split, int first_tile) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tiles = args.n_padded / 16;
  epilogue_grid_order(args);
  const uint32_t mine = x_s + ((warp * TGW * MT) * 32 + lane) * 16;  // MMA warps' sums: [warp][group][j][lane]
  if (cluster > 1) {  // every block's partial sums into its own shared memory (the loop's, now free)
    __syncthreads();
#pragma unroll
    for (int p = 0; p < TGW; ++p)
#pragma unroll
      for (int j = 0; j < MT; ++j)
        ptx::st_shared16(mine + (p * MT + j) * 32 * 16, __float_as_uint(d[p][4 * j]), __float_as_uint(d[p][4 * j + 1]),
                         __float_as_uint(d[p][4 * j + 2]), __float_as_uint(d[p][4 * j + 3]));
    ptx::cluster_sync();
    const uint32_t rank = ptx::cluster_rank();
    if (rank == 0) {  // classes in class order within each split of the cluster, then the splits in split order
      const int cluster_splits = cluster / args.warps_k;
      for (int sp = 0; sp < cluster_splits; ++sp) {
#pragma unroll
        for (int p = 0; p < TGW; ++p)
#pragma unroll
          for (int j = 0; j < MT; ++j) {
            const uint32_t at = mine + (p * MT + j) * 32 * 16;
            float4 sum = sp == 0 ? make_float4(d[p][4 * j], d[p][4 * j + 1], d[p][4 * j + 2], d[p][4 * j + 3])
                                 : ptx::ld_cluster16(ptx::map_to_block(at, sp * args.warps_k));
            for (int c = 1; c < args.warps_k; ++c) {
              const float4 o = ptx::ld_cluster16(ptx::map_to_block(at, sp * args.warps_k + c));
              sum.x += o.x, sum.y += o.y, sum.z += o.z, sum.w += o.w;
            }
            if (sp == 0) {
              d[p][4 * j] = sum.x, d[p][4 * j + 1] = sum.y, d[p][4 * j + 2] = sum.z, d[p][4 * j + 3] = sum.w;
            } else {
              d[p][4 * j] += sum.x, d[p][4 * j + 1] += sum.y, d[p][4 * j + 2] += sum.z, d[p][4 * j + 3] += sum.w;
            }
          }
      }
    }
    ptx::cluster_sync();  // no block leaves while the first one may still read its shared memory
    if (rank != 0) return;
  }
  const int m0 = slab * MT * 8;
  const int out_split = cluster > 1 ? split / (cluster / args.warps_k) : split;
#pragma unroll
  for (int p = 0; p < TGW; ++p) {
    const int tile = first_tile + ((warp >> 2) * TGW + p) * 4 + (warp & 3);
    if (tile >= tiles) break;
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int n = tile * 16 + g + 8 * (q >> 1);
        const int m = m0 + j * 8 + 2 * t + (q & 1);
        if (n < args.n && m < args.m) {
          if (args.partial)
            args.partial[((size_t)out_split * args.m + m) * args.n + n] = d[p][4 * j + q];
          else
            args.y[(size_t)m * args.n + n] = __float2bfloat16_rn(d[p][4 * j + q]);
        }
      }
  }
}

#endif

// args: the partition and the GEMM (W12MmaArgs); launch as w12_wide.cu's (slots: activation slots, stages: decoded
// slots); x_image: [slabs][chunks][wide_chunk_bytes<MT>()]. Grid: (blocks of TG tile groups x slabs, K classes x
// splits), cluster (1, cluster, 1); block: ss_threads threads, the MMA warpgroups first.
template <int MT, int TG>
__global__ void __launch_bounds__(ss_threads<MT, TG>(), ss_blocks_per_sm<MT, TG>())
    w12_wide_ss_kernel(W12MmaArgs args, int slots, int stages, int slabs, int cluster, const uint4* x_image) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kChunkBytes = wide_chunk_bytes<MT>();
  constexpr int kAcc = MT * 4;
  constexpr int W = ss_mma_groups<MT, TG>(), TGW = TG / W;  // MMA warpgroups, tile groups each
  constexpr int kN = ss_mma_n<MT, TG>();                     // token rows an MMA instruction
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int slab = blockIdx.x % slabs;
  const int first_tile = (blockIdx.x / slabs) * TG * 4;
  const int cls = blockIdx.y % args.warps_k, split = blockIdx.y / args.warps_k;
  const int first = split * args.chunks_per_split + cls;
  const int last = min((split + 1) * args.chunks_per_split, chunks);
  const int count = first < last ? (last - first + args.warps_k - 1) / args.warps_k : 0;

  extern __shared__ uint4 shared_words[];
  const uint32_t x_s = ptx::shared_address(shared_words);          // [slots][kChunkBytes]
  const uint32_t a_s = x_s + slots * kChunkBytes;                  // [stages][TG][kDecodedChunkBytes]
  const uint32_t scratch_s = a_s + stages * TG * kDecodedChunkBytes;  // [4 TG decoder warps][kEscapeScratchBytes]
  const uint32_t bars = scratch_s + 4 * TG * kEscapeScratchBytes;
  const uint32_t x_full = bars, x_empty = bars + 8 * slots;
  const uint32_t a_full = bars + 16 * slots, a_empty = a_full + 8 * stages;
  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i) {
      ptx::mbarrier_init(x_full + 8 * i, 1);
      ptx::mbarrier_init(x_empty + 8 * i, 4 * W);  // one arrival an MMA warp
    }
    for (int i = 0; i < stages; ++i) {
      ptx::mbarrier_init(a_full + 8 * i, 4 * TG);  // one arrival a decoder warp, after its lanes' stores and fences
      ptx::mbarrier_init(a_empty + 8 * i, 4 * W);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  if (warp >= 4 * W) {  // a decoder warp: tile group (warp - 4 W) / 4, its tile (warp & 3)
    registers_fewer<ss_decoder_registers<MT, TG>()>();
    const int group = (warp - 4 * W) >> 2, w = warp & 3;
    const int tile = min(first_tile + group * 4 + w, tiles - 1);  // past the last tile: repeat it (stored by nobody)
    if (count > 0) {
      const uint32_t scratch = scratch_s + (warp - 4 * W) * kEscapeScratchBytes;
      const OneTile one(args, tile, first, lane);
      EscapeStream esc;
      esc.begin(args, tile, first, last, args.warps_k, scratch, 0, lane);
      const size_t advance = (size_t)args.warps_k * kBlocksPerChunk * 32;
      const uint4* view = one.view;
      const uint2* nibs = one.nibs;
      uint4 v[kBlocksPerChunk];
      uint2 nb[kBlocksPerChunk];
      load_step_registers<kBlocksPerChunk, 0>(v, nb, view, nibs);
      // chunk j's view and nibble runs (2 KB and 1 KB) into L2, kPrefetchChunks chunks ahead of the register loads:
      // the proxy fence that hands a chunk to the MMAs waits for every load in flight, so the loads must hit L2
      const uint4* view_run = one.view - lane;
      const uint2* nibs_run = one.nibs - lane;
      auto prefetch = [&](int j) {
        if (lane == 0 && j < count) {
          prefetch_to_l2(view_run + j * advance, kBlocksPerChunk * 32 * 16);
          prefetch_to_l2(nibs_run + j * advance, kBlocksPerChunk * 32 * 8);
        }
      };
      for (int j = 1; j <= kPrefetchChunks; ++j) prefetch(j);
      // this lane's words of A in a step: rows g (row group 2w) and g + 8 (2w + 1), k slots 2t, 2t + 1 (k half 0)
      // and 2t + 8, 2t + 9 (k half 1); k halves 1024 bytes apart, row groups 128
      const uint32_t mine = a_s + group * kDecodedChunkBytes + (2 * w) * 128 + g * 16 + 4 * t;
      int stage = 0;
      uint32_t phase = 0;
      for (int i = 0; i < count; ++i) {
        prefetch(i + 1 + kPrefetchChunks);
        esc.advance();
        if (i + 1 < count) esc.fetch(args, i + 1, first, args.warps_k);
        view += advance;
        nibs += advance;
        if (i >= stages) ptx::mbarrier_wait(a_empty + 8 * stage, phase ^ 1);  // chunk i - stages' MMAs are done
        const uint32_t at = mine + stage * TG * kDecodedChunkBytes;
#pragma unroll
        for (int u = 0; u < kBlocksPerChunk; ++u) {
          uint32_t a[1][8];
          decode_block(a[0], v[u], nb[u], one.base_lo, one.base_hi);
          // the next chunk's block u into the registers just decoded (read once; the last block's after the fence)
          if (u + 1 < kBlocksPerChunk && i + 1 < count) {
            v[u] = ptx::load_streaming16(view + u * 32);
            nb[u] = ptx::load_streaming8(nibs + u * 32);
          }
          esc.template patch<1>(a, u, args, i, first, args.warps_k, scratch, lane);
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            const uint32_t step = at + (2 * u + s) * kDecodedStepBytes;
            ptx::st_shared4(step, a[0][4 * s]);
            ptx::st_shared4(step + 128, a[0][4 * s + 1]);
            ptx::st_shared4(step + 1024, a[0][4 * s + 2]);
            ptx::st_shared4(step + 1024 + 128, a[0][4 * s + 3]);
          }
        }
        ptx::fence_proxy_async_shared();  // every lane's stores before the MMAs' (async proxy) reads
        __syncwarp();
        if (lane == 0) ptx::mbarrier_arrive(a_full + 8 * stage);
        if (i + 1 < count) {
          v[kBlocksPerChunk - 1] = ptx::load_streaming16(view + (kBlocksPerChunk - 1) * 32);
          nb[kBlocksPerChunk - 1] = ptx::load_streaming8(nibs + (kBlocksPerChunk - 1) * 32);
        }
        if (++stage == stages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    ss_epilogue_others(args, cluster);
  } else {  // an MMA warpgroup: tile groups own .. own + TGW - 1
    registers_more<ss_mma_registers<MT, TG>()>();
    const int own = (warp >> 2) * TGW;
    float d[TGW][kAcc];
#pragma unroll
    for (int p = 0; p < TGW; ++p)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) d[p][i] = 0.f;
    if (count > 0) {
      const uint4* image = x_image + (size_t)slab * chunks * (kChunkBytes / 16);
      auto copy_chunk = [&](int i) {  // chunk i's activations into slot i % slots
        const uint32_t slot = i % slots;
        ptx::mbarrier_arrive_expecting(x_full + 8 * slot, kChunkBytes);
        ptx::bulk_copy_to_shared(x_s + slot * kChunkBytes, image + (size_t)(first + i * args.warps_k) * (kChunkBytes / 16),
                                 kChunkBytes, x_full + 8 * slot);
      };
      if (threadIdx.x == 0) {
        wait_before_reading_x(args);  // the image is the permute kernel's output
        for (int i = 0; i < min(count, slots); ++i) copy_chunk(i);
      }
      int slot = 0, stage = 0;
      uint32_t x_phase = 0, a_phase = 0;
      for (int i = 0; i < count; ++i) {
        ptx::mbarrier_wait(x_full + 8 * slot, x_phase);
        ptx::mbarrier_wait(a_full + 8 * stage, a_phase);
        ptx::wgmma_fence();
#pragma unroll
        for (int st = 0; st < 8; ++st) {
          const uint32_t b = x_s + slot * kChunkBytes + st * wide_step_bytes<MT>();
#pragma unroll
          for (int p = 0; p < TGW; ++p) {
            const uint64_t a =
                descriptor(a_s + (stage * TG + own + p) * kDecodedChunkBytes + st * kDecodedStepBytes, 1024);
#pragma unroll
            for (int h = 0; h < 8 * MT / kN; ++h)  // token rows h kN .. (h + 1) kN - 1: 16 bytes x 8 rows a group
              wgmma_ss<kN>(*reinterpret_cast<float(*)[kN / 2]>(&d[p][h * kN / 2]), a,
                           descriptor(b + h * (kN / 8) * 128, MT * 128));
          }
        }
        ptx::wgmma_commit();
#pragma unroll
        for (int p = 0; p < TGW; ++p) fence_sums(d[p]);
        ptx::wgmma_wait<1>();  // chunk i - 1's MMAs are done: release its slots
#pragma unroll
        for (int p = 0; p < TGW; ++p) fence_sums(d[p]);
        if (i > 0) {
          const int x_prev = (i - 1) % slots, a_prev = (i - 1) % stages;
          __syncwarp();
          if (lane == 0) {
            ptx::mbarrier_arrive(a_empty + 8 * a_prev);
            ptx::mbarrier_arrive(x_empty + 8 * x_prev);
          }
          if (threadIdx.x == 0 && i - 1 + slots < count) {
            ptx::mbarrier_wait(x_empty + 8 * x_prev, ((i - 1) / slots) & 1);
            copy_chunk(i - 1 + slots);
          }
          __syncwarp();  // converged again before the next warpgroup MMAs
        }
        if (++slot == slots) {
          slot = 0;
          x_phase ^= 1;
        }
        if (++stage == stages) {
          stage = 0;
          a_phase ^= 1;
        }
      }
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int p = 0; p < TGW; ++p) fence_sums(d[p]);
    }
    ss_epilogue<MT, TGW>(d, args, x_s, cluster, slab, split, first_tile);
  }
#else
  __trap();  // the host launches the wide kernel on sm_90a only
#endif
}

// The instantiations (token tiles of 8 rows a slab, tile groups a block): every group count the registers hold (4 up
// to 64 token rows, 2 beyond: above 128 rows with two MMA warpgroups), so a launch asking for more groups than its slab
// allows runs the most it does (no bit depends on it).
#define W12_WIDE_SS_KERNELS(X)                                                                            \
  X(6, 4) X(6, 2) X(6, 1) X(8, 4) X(8, 2) X(8, 1) X(12, 2) X(12, 1) X(16, 2) X(16, 1) X(24, 2) X(24, 1) X(32, 2) \
  X(32, 1)

template <int MT, int TG>
cudaError_t launch_ss(const W12MmaArgs& args, const W12Wide& wide, cudaStream_t stream) {
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int splits = (chunks + args.chunks_per_split - 1) / args.chunks_per_split;
  const int slabs = (args.m + MT * 8 - 1) / (MT * 8);
  const int cluster = args.warps_k * splits <= 8 ? args.warps_k * splits : args.warps_k;
  if (cluster > 8 || wide.slots < 2 || wide.slots > kMaxWideSlots || wide.stages < 2 || wide.stages > kMaxDecodedSlots ||
      wide.multicast != 1)
    return cudaErrorInvalidValue;
  if (cluster < args.warps_k * splits && !args.partial) return cudaErrorInvalidValue;  // needs the workspace
  W12MmaArgs launched = args;
  if (cluster == args.warps_k * splits) launched.partial = nullptr;
  const int blocks_n = (tiles + 4 * TG - 1) / (4 * TG);
  const dim3 grid(blocks_n * slabs, args.warps_k * splits);
  const dim3 block(ss_threads<MT, TG>());
  const size_t smem = ss_smem_bytes<MT, TG>(wide.slots, wide.stages);
  auto kernel = w12_wide_ss_kernel<MT, TG>;
  int resident = 0;
  cudaError_t err = resident_blocks(reinterpret_cast<const void*>(kernel), block.x, smem, &resident);
  if (err != cudaSuccess) return err;
  if (resident == 0) return cudaErrorNotSupported;
  if (!wide.x_image_written && (err = launch_wide_image(args, MT, slabs, wide.x_image, stream)) != cudaSuccess) return err;
  err = launch_overlapping(kernel, grid, block, smem, stream, args.overlap_prior, ClusterShape(cluster), launched,
                           wide.slots, wide.stages, slabs, cluster, static_cast<const uint4*>(wide.x_image));
  if (err != cudaSuccess || !launched.partial) return err;
  return launch_split_sums(launched, splits, stream);
}

}  // namespace

int wide_ss_groups(int token_tiles, int groups) {
  const int most = token_tiles <= 8 ? 4 : 2;
  return groups < most ? groups : most;
}

cudaError_t launch_wide_ss(const W12MmaArgs& args, const W12Wide& wide, cudaStream_t stream) {
  const int groups = wide_ss_groups(wide.token_tiles, wide.groups);
#define W12_WIDE_SS_CALL_IF(MT, TG) \
  if (wide.token_tiles == MT && groups == TG) return launch_ss<MT, TG>(args, wide, stream);
  W12_WIDE_SS_KERNELS(W12_WIDE_SS_CALL_IF)
#undef W12_WIDE_SS_CALL_IF
  return cudaErrorInvalidValue;
}

}  // namespace w12
