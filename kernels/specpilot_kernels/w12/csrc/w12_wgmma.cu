#include "w12_wide.cuh"
#include "w12_wide_ptx.cuh"

namespace w12 {
namespace {

// Warpgroup MMA (sm_90a; 9-64 rows): the weights stay the A operand in registers, decoded and patched exactly as
// above (a warp's m16n8k16 A fragments are its slice of wgmma's register A), and the activations become the B operand,
// read by the tensor cores from shared memory: no activation registers and no per-warp activation loads. A warpgroup
// is 4 consecutive tiles of one K class, so each warp still sums its tile's chunks in the partition's order, and a
// k16 wgmma gives the same bits as four warps' m16n8k16 (the GPU tests compare the two kernels).
//
// B must hold the activations in the K order the weight fragments were permuted to (k-slot 2t + h + 8q of the chunk's
// k16 step (u, s) is column 32u + 8t + 4s + 2q + h), and no bulk or TMA copy permutes 4-byte words. So a small kernel
// first writes each chunk's activations (MT * 8 token rows, rows past m zero) in exactly the shared-memory image B
// wants (w12_permute_x_kernel, a few hundred KB), and each K class then brings a chunk in with one bulk copy into a
// ring of slots (full and empty mbarriers), issued by one thread up to three chunks ahead: no thread stages activations
// and no warp waits at a barrier for the others.
//
// Weights (STAGED): a warp's next chunk in registers, loaded once the MMAs are issued, leaves the load little to hide
// behind: the next decode waits for it. Each warp instead copies its chunks into its own shared-memory ring of
// wgmma_weight_stages() chunks (cp.async), stages - 1 ahead of the one it decodes, and frees the registers that would
// hold them. The launch keeps weights in registers where the ring's shared memory would leave room for fewer resident
// blocks (e.g. three K classes a block at 64 rows).

// Bytes of one k16 step of B in shared memory: [k half q][token group][8 rows][16 bytes], so the descriptor's
// leading offset (between the two k halves) is MT * 128 and its stride offset (between token groups) 128. A chunk is
// 8 steps (u, s) in order.
template <int MT>
__host__ __device__ constexpr int wgmma_step_bytes() { return MT * 256; }
template <int MT>
__host__ __device__ constexpr int wgmma_chunk_bytes() { return 8 * wgmma_step_bytes<MT>(); }
// Activation slots a K class: chunk i + slots - 1 is copied while chunks i .. i + slots - 2 are read. Four, but three
// from 64 rows on, where four of 16 KB a class would leave three K classes no room (and the class-split kernel's
// 96-128-row slabs, 24-32 KB a chunk, room for the weight ring).
template <int MT>
__host__ __device__ constexpr int wgmma_slots() { return MT >= 8 ? 3 : 4; }
// Each warp's own ring of weight chunks (view words, then the nibble run, as the staged per-warp kernel lays a step
// out), filled by cp.async: chunk i + stages - 1 is in flight while chunk i is decoded. Three a warp at 9-16 rows, where
// few token rows leave each chunk's decode little MMA time to hide a load behind; two at 17-32, where fewer requests
// queued serve the memory system better, and at 64 rows, where 3 KB more a warp would leave two blocks of 8 warps no
// room beside their activation slots.
template <int MT>
__host__ __device__ constexpr int wgmma_weight_stages() { return MT == 2 ? 3 : 2; }
constexpr int kWgmmaStageBytes = kBlocksPerChunk * kStagedBlockWords * 16;

// x [m, ldx] -> each 128-column chunk's B image (wgmma_chunk_bytes<MT>() apiece, rows past m zero). Thread p copies
// piece p of the chunk's MT * 8 rows x 16 pieces (8 columns 32u + 8t .. + 7 of token row n): its four words go to
// steps (u, 0) and (u, 1), k halves 0 and 1, k-slots 2t and 2t + 1.
template <int MT>
__global__ void w12_permute_x_kernel(const __nv_bfloat16* x, int m, int ldx, int chunks, uint32_t* image) {
  allow_next_grid();  // the GEMM's prologue reads only its weights
  wait_for_prior_grid();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= chunks * MT * 8 * 16) return;
  const int chunk = p / (MT * 8 * 16), n = (p / 16) % (MT * 8), u = (p >> 2) & 3, t = p & 3;
  uint4 v = make_uint4(0, 0, 0, 0);
  if (n < m) v = __ldg(reinterpret_cast<const uint4*>(x + (size_t)n * ldx + chunk * 128 + u * 32 + 8 * t));
  constexpr int kHalf = MT * 128, kStep = wgmma_step_bytes<MT>();
  uint32_t* at = image + ((size_t)chunk * wgmma_chunk_bytes<MT>() + 2 * u * kStep + (n >> 3) * 128 + (n & 7) * 16 + 4 * t) / 4;
  at[0] = v.x;
  at[kHalf / 4] = v.y;
  at[kStep / 4] = v.z;
  at[(kStep + kHalf) / 4] = v.w;
}

// The main loop and epilogue of both warpgroup kernels below. SPLIT (the class-split kernel): the block is one K class
// of one split (blockIdx.y = split x warps_k + class) and one slab of MT x 8 token rows (blockIdx.x % slabs), and each
// warp stores its tile's sums to `sums` for w12_split_sums_kernel instead of reducing them here.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // wgmma, bulk copies and mbarriers
// STAGES: the warp's weight ring (0: weights in registers).
template <int MT, int LOW_BITS, bool CLUSTER, int STAGES, bool SPLIT>
__device__ __forceinline__ void wgmma_body(const W12MmaArgs& args, const uint4* x_image, int slabs, float* sums) {
  constexpr bool STAGED = STAGES > 0;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warp_n = warp % args.warps_n;  // warps_n = 4 x warpgroups a K class
  const int classes = SPLIT ? 1 : args.warps_k;  // K classes a block
  const int warp_k = SPLIT ? 0 : warp / args.warps_n;
  const int slab = SPLIT ? blockIdx.x % slabs : 0;
  const int tile = (SPLIT ? blockIdx.x / slabs : blockIdx.x) * args.warps_n + warp_n;
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int split = SPLIT ? blockIdx.y / args.warps_k : blockIdx.y;
  const int first = split * args.chunks_per_split + (SPLIT ? blockIdx.y % args.warps_k : warp_k);
  const int last = min((split + 1) * args.chunks_per_split, chunks);
  constexpr int kChunkBytes = wgmma_chunk_bytes<MT>();
  constexpr int kWgmmaSlots = wgmma_slots<MT>();
  extern __shared__ uint4 shared_words[];
  constexpr int kStages = STAGES;
  uint8_t* class_slots = reinterpret_cast<uint8_t*>(shared_words + (SPLIT ? 0 : epilogue_words<MT, 1>(args, blockDim.x)));
  // [classes][slots] chunk images, [warps][stages] weight chunks, then [classes][slots] full and [classes][slots]
  // empty mbarriers
  uint8_t* weight_stages = class_slots + (size_t)classes * kWgmmaSlots * kChunkBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(weight_stages + (size_t)(blockDim.x / 32) * kStages * kWgmmaStageBytes);
  // the warp's escape scratch, after the mbarriers (2 x classes x slots of 8 bytes: a multiple of 16)
  const uint32_t scratch = ptx::shared_address(bars + 2 * classes * kWgmmaSlots) + warp * kEscapeScratchBytes;
  const uint32_t slots = ptx::shared_address(class_slots) + warp_k * kWgmmaSlots * kChunkBytes;
  const uint32_t warp_stages =  // the warp's first stage (stage_step's layout of a chunk)
      ptx::shared_address(weight_stages) + warp * kStages * kWgmmaStageBytes;
  const uint32_t full = ptx::shared_address(bars) + warp_k * kWgmmaSlots * 8;
  const uint32_t empty = full + classes * kWgmmaSlots * 8;
  if (SPLIT) x_image += (size_t)slab * chunks * (kChunkBytes / 16);  // the slab's chunk images
  if (threadIdx.x == 0) {
    for (int i = 0; i < classes * kWgmmaSlots; ++i) {
      const uint32_t f = ptx::shared_address(bars + i);
      ptx::mbarrier_init(f, 1);
      ptx::mbarrier_init(f + classes * kWgmmaSlots * 8, args.warps_n);  // one arrival a warp of the class
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  float d[MT * 4];
#pragma unroll
  for (int i = 0; i < MT * 4; ++i) d[i] = 0.f;

  // A K class has chunks or not as a whole (the wgmma is collective), so warps past the last tile run too, repeating it.
  if (first < last) {
    const OneTile one(args, min(tile, tiles - 1), first, lane);  // past the last tile: repeat it, store nothing
    const uint32_t base_lo = one.base_lo, base_hi = one.base_hi;
    const uint4* view_next = one.view;
    const uint2* nibs_next = one.nibs;
    const size_t advance = (size_t)args.warps_k * kBlocksPerChunk * 32;
    const int count = (last - first + args.warps_k - 1) / args.warps_k;
    // Weights in registers (!STAGED): the next chunk's, loaded while this one's MMAs run.
    uint4 v_next[kBlocksPerChunk];
    uint2 n_next[kBlocksPerChunk];
    // Weights staged (STAGED): the warp's chunk i of weights into its stage i % stages (stage_step); one commit group
    // a chunk, empty past the last, so chunk i is always group i.
    auto copy_weights = [&](bool any, uint32_t stage) {
      if (any) {
        stage_step<kBlocksPerChunk, LOW_BITS>(warp_stages + stage, view_next, nibs_next, lane);
        view_next += advance;
        nibs_next += advance;
      }
      ptx::cp_async_commit();
    };
    if constexpr (STAGED) {
#pragma unroll
      for (int i = 0; i < kStages - 1; ++i) copy_weights(i < count, i * kWgmmaStageBytes);
    } else {
      load_step_registers<kBlocksPerChunk, LOW_BITS>(v_next, n_next, view_next, nibs_next);
      view_next += advance;
      nibs_next += advance;
    }
    // the escape table after the first weights are in flight: its loads' latency (the table is stored to shared memory
    // before the warp goes on) then hides behind theirs
    EscapeStream esc;
    if (LOW_BITS == 0) esc.begin(args, min(tile, tiles - 1), first, last, args.warps_k, scratch, 0, lane);
    // stage offsets of chunk i (read this iteration) and of chunk i - 1 (refilled with chunk i + stages - 1)
    uint32_t stage = 0, previous = STAGED ? (kStages - 1) * kWgmmaStageBytes : 0;

    // The class's copier: its first thread puts chunk i + slots - 1 into the slot of chunk i - 1 once every warp of
    // the class has released it.
    const bool copier = threadIdx.x == warp_k * args.warps_n * 32;
    auto copy_chunk = [&](int i) {
      const uint32_t slot = i % kWgmmaSlots;
      ptx::mbarrier_arrive_expecting(full + 8 * slot, kChunkBytes);
      ptx::bulk_copy_to_shared(slots + slot * kChunkBytes, x_image + (size_t)(first + i * args.warps_k) * (kChunkBytes / 16),
                          kChunkBytes, full + 8 * slot);
    };
    if (copier) {
      wait_before_reading_x(args);  // the image is the permute kernel's output
      for (int i = 0; i < min(count, kWgmmaSlots - 1); ++i) copy_chunk(i);
    }
    // Descriptors: the low word holds the step's address >> 4 (slot 0's first step plus the offset, which cannot carry
    // out of its 14 bits) and the leading offset, the high word the stride offset.
    const uint32_t desc_lo0 = ((slots & 0x3FFFF) >> 4) | ((MT * 128 >> 4) << 16);
    constexpr uint64_t kDescHi = (uint64_t)(128 >> 4) << 32;
    uint32_t slot = 0, phase = 0;
    // The escape overlay (EscapeStream::patch): staged, the stage the chunk was just decoded from (free until the next
    // chunk's copy refills it), all but two of the chunk's fragment groups at once; else the warp's scratch, one.
    constexpr int kOverlayGroups = STAGED ? kWgmmaStageBytes / kEscapeOverlayBytes : 1;
    uint32_t overlay = scratch;
    for (int i = 0; i < count; ++i) {
      uint32_t a[kBlocksPerChunk][8];
      if (LOW_BITS == 0) {  // this chunk's escapes were fetched with its weights; fetch the next chunk's
        esc.advance();
        if (i + 1 < count) esc.fetch(args, i + 1, first, args.warps_k);
      }
      if constexpr (STAGED) {
        // chunk i + stages - 1 into the stage chunk i - 1 left (read by every lane before the last iteration's
        // __syncwarp), then wait for chunk i's own group
        copy_weights(i + kStages - 1 < count, previous);
        ptx::cp_async_wait<kStages - 1 < 0 ? 0 : kStages - 1>();
        __syncwarp();
#pragma unroll
        for (int u = 0; u < kBlocksPerChunk; ++u) {
          uint4 v;
          uint2 nb;
          read_staged_block<kBlocksPerChunk, LOW_BITS>(warp_stages + stage, u, lane, v, nb);
          decode_block(a[u], v, nb, base_lo, base_hi);
        }
        __syncwarp();  // every lane has read the stage (the overlay below)
        overlay = warp_stages + stage;
        previous = stage;
        stage = stage == (kStages - 1) * kWgmmaStageBytes ? 0 : stage + kWgmmaStageBytes;
      } else {  // decoded, the chunk's weights leave their registers for the next chunk's loads
#pragma unroll
        for (int u = 0; u < kBlocksPerChunk; ++u) decode_block(a[u], v_next[u], n_next[u], base_lo, base_hi);
      }
      if (LOW_BITS == 0)
        esc.template patch<kBlocksPerChunk, false, false, kOverlayGroups>(a, 0, args, i, first, args.warps_k, overlay,
                                                                          lane);
      ptx::mbarrier_wait(full + 8 * slot, phase);  // the chunk's activations have landed
      const uint32_t desc_lo = desc_lo0 + slot * (kChunkBytes >> 4);
      ptx::wgmma_fence();
#pragma unroll
      for (int u = 0; u < kBlocksPerChunk; ++u)
#pragma unroll
        for (int s = 0; s < 2; ++s)
          wide_wgmma<8 * MT>(d, &a[u][4 * s], kDescHi | (desc_lo + (2 * u + s) * (wgmma_step_bytes<MT>() >> 4)));
      ptx::wgmma_commit();
      if (!STAGED && i + 1 < count) {
        load_step_registers<kBlocksPerChunk, LOW_BITS>(v_next, n_next, view_next, nibs_next);
        view_next += advance;
        nibs_next += advance;
      }
      ptx::wgmma_wait<0>();  // the A registers and the slot are free again
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(empty + 8 * slot);
      if (copier && i + kWgmmaSlots - 1 < count) {
        if (i >= 1) ptx::mbarrier_wait(empty + 8 * ((i - 1) % kWgmmaSlots), ((i - 1) / kWgmmaSlots) & 1);
        copy_chunk(i + kWgmmaSlots - 1);
      }
      if (++slot == kWgmmaSlots) {
        slot = 0;
        phase ^= 1;
      }
    }
  }
  if constexpr (SPLIT) {
    // the sums are stored only once the kernel before is done (it may still read the memory they go to); a first row
    // region lets the next kernel start only after waiting (reduce_and_store)
    epilogue_grid_order(args);
    if (tile >= tiles) return;
    if (!sums) {  // one K class, no split: the sums are y
#pragma unroll
      for (int i = 0; i < MT * 4; ++i) {
        const int n = tile * 16 + (lane >> 2) + 8 * ((i & 3) >> 1);
        const int m = slab * MT * 8 + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
        if (n < args.n && m < args.m) args.y[(size_t)m * args.n + n] = __float2bfloat16_rn(d[i]);
      }
      return;
    }
    // [slab][split x warps_k + class][tile][accumulator][lane]: 128 contiguous bytes a warp store
    float* mine = sums + (((size_t)slab * gridDim.y + blockIdx.y) * tiles + tile) * (MT * 4 * 32) + lane;
#pragma unroll
    for (int i = 0; i < MT * 4; ++i) mine[i * 32] = d[i];
  } else {
    float acc[1][MT][4];
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[0][j][q] = d[4 * j + q];
    reduce_and_store<1, MT, CLUSTER>(acc, args, warp, warp_n, warp_k, lane, tile, true);
  }
}
#endif

template <int MT, int LOW_BITS, bool CLUSTER, bool STAGED>
__global__ void w12_wgmma_kernel(W12MmaArgs args, const uint4* x_image) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  wgmma_body<MT, LOW_BITS, CLUSTER, STAGED ? wgmma_weight_stages<MT>() : 0, false>(args, x_image, 1, nullptr);
#else
  __trap();  // the host launches warpgroup MMAs on sm_90a only
#endif
}

// The class-split kernel (33-256 rows through the wide launch, W12Wide::decoded == kWideClassSplit): the warpgroup
// kernel's main loop in blocks of `warps_n / 4` warpgroups of ONE K class of ONE split and one slab, so every block of
// the grid is resident at once where the kernel above, holding all K classes of a tile group in one block, runs 1.2-2
// rounds of one block a multiprocessor (27B-class shapes at 33-64 rows); no cluster. sums: [slabs][splits x warps_k]
// [n_padded / 16][MT x 4][32] fp32, summed by w12_split_sums_kernel, or nullptr for a partition of one K class and one
// split, whose sums are y. x_image: w12_wide_permute_kernel's slabs.
// Up to 64 rows a slab, 4 warpgroups a block at most (128 registers a thread); 96 and 128, 2 (their 48-64 accumulators).
template <int MT>
__host__ __device__ constexpr int split_max_groups() { return MT <= 8 ? 4 : 2; }

template <int MT, int LOW_BITS, int STAGES>
__global__ void __launch_bounds__(128 * split_max_groups<MT>())
    w12_wgmma_split_kernel(W12MmaArgs args, const uint4* x_image, int slabs, float* sums) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  wgmma_body<MT, LOW_BITS, false, STAGES, true>(args, x_image, slabs, sums);
#else
  __trap();  // the host launches warpgroup MMAs on sm_90a only
#endif
}

// y = the class-split kernel's sums in the partition's order: each split's K classes in class order, then the splits in
// split order (the order of reduce_and_store and split_reduce_kernel), rounded once. One thread an output.
template <int MT>
__global__ void w12_split_sums_kernel(const float* sums, __nv_bfloat16* y, int m, int n, int tiles, int classes,
                                      int splits, int slabs) {
  allow_next_grid();  // the next kernel's prologue reads only its weights
  wait_for_prior_grid();
  const int per_item = tiles * MT * 4 * 32;  // one class and split of one slab
  const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= (long long)slabs * per_item) return;
  const int slab = (int)(e / per_item), r = (int)(e % per_item);
  const int tile = r / (MT * 128), i = (r / 32) % (MT * 4), lane = r % 32;
  const int col = tile * 16 + (lane >> 2) + 8 * ((i & 3) >> 1);
  const int row = slab * MT * 8 + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
  if (col >= n || row >= m) return;
  const float* at = sums + (size_t)slab * classes * splits * per_item + r;
  float acc = 0.f;
  for (int s = 0; s < splits; ++s) {
    float sum = at[(size_t)s * classes * per_item];
    for (int c = 1; c < classes; ++c) sum += at[(size_t)(s * classes + c) * per_item];
    acc = s == 0 ? sum : acc + sum;
  }
  y[(size_t)row * n + col] = __float2bfloat16_rn(acc);
}

// The warpgroup kernel's launch: `groups` warpgroups of 4 tiles for each of the partition's K classes a block; each
// class's activation slots and their mbarriers after the epilogue's shared memory. The permute kernel writes the
// chunks' B images to `x_image` first.
// The warpgroup kernel's instantiations: 9-16, 17-32 and 33-64 rows (2, 4 and 8 token tiles: wgmma N = 16, 32, 64).
#define W12_WGMMA_KERNELS(X) X(2) X(4) X(8)

template <int MT, int LOW_BITS, bool CLUSTER = false>
cudaError_t launch_groups(const W12MmaArgs& args, int groups, void* x_image, bool x_image_written, cudaStream_t stream,
                          int* launched_groups) {
  if constexpr (!CLUSTER) {
    if (args.cluster_splits > 1)
      return launch_groups<MT, LOW_BITS, true>(args, groups, x_image, x_image_written, stream, launched_groups);
  }
  W12MmaArgs launched = args;
  launched.warps_n = 4 * groups;  // which tiles share a block changes no bit
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  dim3 grid((tiles + launched.warps_n - 1) / launched.warps_n,
            (chunks + args.chunks_per_split - 1) / args.chunks_per_split);
  dim3 block(32 * launched.warps_n * args.warps_k);
  // the epilogue's shared memory, each class's activation slots and mbarriers, (exact weights) each warp's escape
  // scratch; the staged kernel adds each warp's weight ring
  const size_t smem_registers = (size_t)epilogue_words<MT, 1>(launched, block.x) * 16 +
                                (size_t)args.warps_k * wgmma_slots<MT>() * (wgmma_chunk_bytes<MT>() + 16) +
                                (LOW_BITS == 0 ? (size_t)(block.x / 32) * kEscapeScratchBytes : 0);
  const size_t smem_staged = smem_registers + (size_t)(block.x / 32) * wgmma_weight_stages<MT>() * kWgmmaStageBytes;
  auto registers = w12_wgmma_kernel<MT, LOW_BITS, CLUSTER, false>;
  auto staged = w12_wgmma_kernel<MT, LOW_BITS, CLUSTER, true>;
  int resident = 0, resident_staged = 0;
  cudaError_t err = resident_blocks(reinterpret_cast<const void*>(registers), block.x, smem_registers, &resident);
  if (err == cudaSuccess)
    err = resident_blocks(reinterpret_cast<const void*>(staged), block.x, smem_staged, &resident_staged);
  if (err != cudaSuccess) return err;
  // Weights staged in shared memory wherever that keeps as many blocks resident as registers do (their shared memory
  // may leave room for fewer; the same bits either way).
  const bool stage_weights = resident_staged > 0 && resident_staged >= resident;
  resident = max(resident, resident_staged);
  if (resident == 0) {  // more registers or shared memory than a multiprocessor has: fewer warpgroups a block, or none
    if (groups > 1)
      return launch_groups<MT, LOW_BITS, CLUSTER>(args, groups / 2, x_image, x_image_written, stream, launched_groups);
    return cudaErrorNotSupported;  // the caller runs the per-warp kernel instead (the same bits)
  }
  if (!x_image_written) {
    const int pieces = chunks * MT * 8 * 16;
    err = launch_overlapping(w12_permute_x_kernel<MT>, dim3((pieces + 255) / 256), dim3(256), 0, stream,
                             args.overlap_prior != kOverlapNone, 1, args.x, args.m, args.ldx, chunks,
                             static_cast<uint32_t*>(x_image));
    if (err != cudaSuccess) return err;
  }
  *launched_groups = groups;
  return launch_overlapping(stage_weights ? staged : registers, grid, block, stage_weights ? smem_staged : smem_registers,
                            stream, args.overlap_prior, args.cluster_splits, launched, static_cast<const uint4*>(x_image));
}

// The class-split kernel's launch (exact weights): grid (tile groups x slabs, splits x warps_k), `groups` warpgroups a
// block, or fewer where that many fit no multiprocessor; the image (unless written) before it and the sums after.
// Weights staged through a ring of `wide.stages` (2 or 3) chunks a warp where that keeps as many blocks resident as
// registers do, else in registers.
template <int MT>
cudaError_t launch_split(const W12MmaArgs& args, const W12Wide& wide, int groups, cudaStream_t stream) {
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int splits = (chunks + args.chunks_per_split - 1) / args.chunks_per_split;
  const int slabs = (args.m + MT * 8 - 1) / (MT * 8);
  const bool direct = args.warps_k * splits == 1;  // one K class, no split: no sums to add
  if (!direct && !args.partial) return cudaErrorInvalidValue;  // the sums' workspace (w12_mma_launch's contract)
  if (groups > split_max_groups<MT>()) return launch_split<MT>(args, wide, split_max_groups<MT>(), stream);
  W12MmaArgs launched = args;
  launched.warps_n = 4 * groups;
  launched.cluster_splits = 1;
  const dim3 grid((tiles + launched.warps_n - 1) / launched.warps_n * slabs, args.warps_k * splits);
  const dim3 block(128 * groups);
  const size_t smem_registers =
      (size_t)wgmma_slots<MT>() * (wgmma_chunk_bytes<MT>() + 16) + (size_t)(block.x / 32) * kEscapeScratchBytes;
  if (wide.stages != 2 && wide.stages != 3) return cudaErrorInvalidValue;
  const size_t smem_staged = smem_registers + (size_t)(block.x / 32) * wide.stages * kWgmmaStageBytes;
  auto registers = w12_wgmma_split_kernel<MT, 0, 0>;
  auto staged = wide.stages == 3 ? w12_wgmma_split_kernel<MT, 0, 3> : w12_wgmma_split_kernel<MT, 0, 2>;
  int resident = 0, resident_staged = 0;
  cudaError_t err = resident_blocks(reinterpret_cast<const void*>(registers), block.x, smem_registers, &resident);
  if (err == cudaSuccess)
    err = resident_blocks(reinterpret_cast<const void*>(staged), block.x, smem_staged, &resident_staged);
  if (err != cudaSuccess) return err;
  const bool stage_weights = resident_staged > 0 && resident_staged >= resident;  // as launch_groups decides
  if (max(resident, resident_staged) == 0)
    return groups > 1 ? launch_split<MT>(args, wide, groups / 2, stream) : cudaErrorNotSupported;
  if (!wide.x_image_written && (err = launch_wide_image(args, MT, slabs, wide.x_image, stream)) != cudaSuccess) return err;
  err = launch_overlapping(stage_weights ? staged : registers, grid, block, stage_weights ? smem_staged : smem_registers,
                           stream, args.overlap_prior, 1, launched, static_cast<const uint4*>(wide.x_image), slabs,
                           direct ? nullptr : args.partial);
  if (err != cudaSuccess || direct) return err;
  const long long outputs = (long long)slabs * tiles * MT * 128;
  return launch_overlapping(w12_split_sums_kernel<MT>, dim3((unsigned)((outputs + 255) / 256)), dim3(256), 0, stream,
                            args.overlap_prior != kOverlapNone, 1, static_cast<const float*>(args.partial), args.y,
                            args.m, args.n, tiles, args.warps_k, splits, slabs);
}

// The class-split kernel's instantiations: slabs of 6, 8, 12 and 16 token tiles (wgmma N = 48, 64, 96, 128).
#define W12_SPLIT_KERNELS(X) X(6) X(8) X(12) X(16)

template <int LOW_BITS>
cudaError_t launch_low_bits(const W12MmaArgs& args, W12SharedActivations& shared_x, cudaStream_t stream) {
  const int tiles8 = token_tiles(args.m);
  int* groups = &shared_x.warpgroups;
#define W12_WGMMA_CALL_IF(MT) \
  if (tiles8 == MT) return launch_groups<MT, LOW_BITS>(args, *groups, shared_x.x_image, shared_x.x_image_written, stream, groups);
  W12_WGMMA_KERNELS(W12_WGMMA_CALL_IF)
#undef W12_WGMMA_CALL_IF
  return cudaErrorNotSupported;  // up to 8 rows: the per-warp kernel
}

}  // namespace

cudaError_t launch_wgmma_split(const W12MmaArgs& args, const W12Wide& wide, cudaStream_t stream) {
#define W12_SPLIT_CALL_IF(MT) \
  if (wide.token_tiles == MT) return launch_split<MT>(args, wide, wide.groups, stream);
  W12_SPLIT_KERNELS(W12_SPLIT_CALL_IF)
#undef W12_SPLIT_CALL_IF
  return cudaErrorInvalidValue;
}

cudaError_t launch_wgmma(const W12MmaArgs& args, int low_bits, W12SharedActivations& shared_x, cudaStream_t stream) {
  // exact weights only: the Q pass runs on the per-warp kernel (w12_warp.cu, decode_block_q)
  return low_bits == 0 ? launch_low_bits<0>(args, shared_x, stream) : cudaErrorNotSupported;
}

}  // namespace w12
