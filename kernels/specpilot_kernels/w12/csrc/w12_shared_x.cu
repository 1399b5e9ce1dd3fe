// Shared activations (17-32 rows, sm_90+, one tile a warp). The warps of a block that share a K class (warp_k) read
// the same chunks in the same rounds: round r is chunks first + r * warps_k ... + warps_k - 1 of the block's split.
// A producer warp (the block's last) copies each round's activations (MT * 8 token rows of warps_k * 128 columns,
// rows past m repeat earlier ones) into a slot of a shared-memory ring by bulk copies that complete on the slot's
// mbarrier, and refills a slot once every consumer warp has counted it released; the consumers read their
// activations with 16-byte shared loads (rows g and g + 1 of a quarter-warp on disjoint banks) instead of 8-line
// global loads, one copy a block instead of one a warp. The producer waits for nothing else, so the warps drift apart
// by up to ring - 1 rounds with no block barrier. Every warp sums its chunks as w12_mma_kernel's does, so no bit changes.
#include "w12_common.cuh"

namespace w12 {
namespace {

// Bytes from the ring's start to the warps' escape scratch: the slots, their mbarriers and release counters, rounded
// to 16 bytes.
template <int MT>
__host__ __device__ __forceinline__ uint32_t escape_scratch_offset(int warps_k, int ring) {
  return ((uint32_t)ring * (MT * 8 * shared_x_pitch(warps_k) + 12) + 15) & ~15u;
}

template <int MT, int LOW_BITS, int STEP_BLOCKS, bool CLUSTER>
__global__ void w12_shared_x_kernel(W12MmaArgs args, int ring) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int consumers = args.warps_n * args.warps_k;
  const bool producer = warp == consumers;
  const int warp_n = warp % args.warps_n;
  const int warp_k = producer ? args.warps_k : warp / args.warps_n;  // the producer owns no K class
  const int tile = blockIdx.x * args.warps_n + warp_n;
  const int g = lane >> 2, t = lane & 3;
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const bool active = tile < tiles && !producer;

  const int pitch = shared_x_pitch(args.warps_k);
  const int slot_bytes = MT * 8 * pitch;
  extern __shared__ uint4 shared_words[];
  uint8_t* ring_ptr = reinterpret_cast<uint8_t*>(shared_words + epilogue_words<MT, 1>(args, blockDim.x));
  uint64_t* full = reinterpret_cast<uint64_t*>(ring_ptr + (size_t)ring * slot_bytes);
  int* released = reinterpret_cast<int*>(full + ring);
  const uint32_t ring_s = ptx::shared_address(ring_ptr);
  const uint32_t full_s = ptx::shared_address(full);
  const int first0 = blockIdx.y * args.chunks_per_split;
  const int last = min(first0 + args.chunks_per_split, chunks);
  const int rounds = (last - first0 + args.warps_k - 1) / args.warps_k;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ring; ++s) {
      ptx::mbarrier_init(full_s + 8 * s, 1);
      released[s] = 0;
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  float acc[1][MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.f;

  if (producer) {
    wait_before_reading_x(args);  // the activations may be the previous kernel's output
    for (int r = 0; r < rounds; ++r) {
      const int slot = r % ring;
      if (r >= ring) {  // every consumer has released round r - ring from this slot
        const int need = (r / ring) * consumers;
        while (true) {
          int seen;
          asm volatile("ld.volatile.shared.s32 %0, [%1];" : "=r"(seen) : "r"(ptx::shared_address(released + slot))
                       : "memory");
          if (seen >= need) break;
          __nanosleep(32);
        }
        ptx::fence_proxy_async_shared();  // the consumers' reads before the copies' writes
      }
      const int c0 = first0 + r * args.warps_k;
      const uint32_t row_bytes = (uint32_t)min(args.warps_k, last - c0) * 256;
      const uint32_t bar = full_s + 8 * slot;
      if (lane == 0) ptx::mbarrier_arrive_expecting(bar, row_bytes * MT * 8);
      __syncwarp();
      for (int row = lane; row < MT * 8; row += 32) {
        // rows past m feed only token columns nobody stores; each takes a distinct real row, not all the last one:
        // copies of one row at once queue on the same L2 lines (docs/kernels/w12.md, shared activations)
        const __nv_bfloat16* src = args.x + (size_t)(row % args.m) * args.ldx + (size_t)c0 * 128;
        ptx::bulk_copy_to_shared(ring_s + slot * slot_bytes + row * pitch, src, row_bytes, bar);
      }
    }
  } else {
    static_assert(STEP_BLOCKS == 4 || STEP_BLOCKS == 2, "a step is a chunk or half of one");
    constexpr int kBlocks = STEP_BLOCKS;
    constexpr int kStepsPerChunk = kBlocksPerChunk / kBlocks;
    const int first = first0 + warp_k;
    const OneTile one(args, min(tile, tiles - 1), first, lane);  // past the last tile: repeat it, store nothing
    const uint32_t base_lo = one.base_lo, base_hi = one.base_hi;
    const uint4* view_next = one.view;
    const uint2* nibs_next = one.nibs;
    const uint32_t scratches = ptx::shared_address(ring_ptr) + escape_scratch_offset<MT>(args.warps_k, ring);
    const uint32_t scratch = scratches + warp * kEscapeScratchBytes;
    // The escape overlay (EscapeStream::patch, MT fragment groups at once): the warp's own slot of the epilogue's
    // reduction (reduce_and_store writes it only after the main loop), or with one K class, which has no reduction, the
    // warp's region after every warp's scratch.
    const uint32_t overlay = args.warps_k > 1 ? ptx::shared_address(shared_words) + warp * MT * kEscapeOverlayBytes
                                              : scratches + (blockDim.x / 32) * kEscapeScratchBytes +
                                                    warp * MT * kEscapeOverlayBytes;
    EscapeStream esc;
    if (LOW_BITS == 0 && active) esc.begin(args, min(tile, tiles - 1), first, last, args.warps_k, scratch, 0, lane);
    uint4 v_next[kBlocks];
    uint2 n_next[kBlocks];
    int load_part = 0;
    auto load_step = [&]() {
      load_step_registers<kBlocks, LOW_BITS>(v_next, n_next, view_next, nibs_next);
      const size_t advance = step_advance<kBlocks>(load_part, args.warps_k);
      view_next += advance;
      nibs_next += advance;
      load_part = (load_part + 1) & (kStepsPerChunk - 1);
    };
    if (active && first < last) load_step();
    uint32_t phase = 0;
    for (int r = 0, slot = 0; r < rounds; ++r) {
      ptx::mbarrier_wait(full_s + 8 * slot, phase);
      const int chunk = first + r * args.warps_k;
      if (active && chunk < last) {
        if (LOW_BITS == 0) {
          esc.advance();
          if (chunk + args.warps_k < last) esc.fetch(args, r + 1, first, args.warps_k);
        }
        // lane (g, t)'s 16 bytes of token row g of this warp's chunk; token tile j is 8 rows further
        const uint32_t xs = ring_s + slot * slot_bytes + g * pitch + warp_k * 256 + 16 * t;
#pragma unroll
        for (int part = 0; part < kStepsPerChunk; ++part) {
          uint4 v[kBlocks];
          uint2 nb[kBlocks];
#pragma unroll
          for (int u = 0; u < kBlocks; ++u) {
            v[u] = v_next[u];
            nb[u] = n_next[u];
          }
          if (part + 1 < kStepsPerChunk || chunk + args.warps_k < last) load_step();
          uint32_t a[kBlocks][8];
#pragma unroll
          for (int u = 0; u < kBlocks; ++u) decode_block(a[u], v[u], nb[u], base_lo, base_hi);
          if (LOW_BITS == 0)  // escape-heavy chunks: the ring kernel has the registers for their second round early
            esc.template patch<kBlocks, true, false, MT>(a, part * kBlocks, args, r, first, args.warps_k, overlay, lane);
#pragma unroll
          for (int u = 0; u < kBlocks; ++u) {
            uint4 xb[MT];
#pragma unroll
            for (int j = 0; j < MT; ++j)
              xb[j] = ptx::ld_shared16(xs + j * 8 * pitch + (part * kBlocks + u) * 64);
#pragma unroll
            for (int s = 0; s < 2; ++s) {
              const uint32_t frag[4] = {a[u][4 * s], a[u][4 * s + 1], a[u][4 * s + 2], a[u][4 * s + 3]};
#pragma unroll
              for (int j = 0; j < MT; ++j) ptx::mma_bf16_16816(acc[0][j], frag, s ? xb[j].z : xb[j].x, s ? xb[j].w : xb[j].y);
            }
          }
        }
      }
      // Released: this warp's reads of the slot are done (their values fed the MMAs above). No fence: one would also
      // wait for the weight loads in flight.
      __syncwarp();
      if (lane == 0) atomicAdd(released + slot, 1);
      if (++slot == ring) {
        slot = 0;
        phase ^= 1;
      }
    }
  }
  reduce_and_store<1, MT, CLUSTER>(acc, args, warp, warp_n, warp_k, lane, tile, active);
#else
  __trap();  // the host launches shared activations on sm_90+ only
#endif
}

// The shared-activation kernel's launch: tiles_per_block tiles of the partition's warps_k warps and the producer a
// block; the ring after the epilogue's shared memory.
template <int MT, int LOW_BITS, int STEP_BLOCKS, bool CLUSTER = false>
cudaError_t launch_ring(const W12MmaArgs& args, const W12SharedActivations& shared_x, cudaStream_t stream) {
  if constexpr (!CLUSTER) {
    if (args.cluster_splits > 1) return launch_ring<MT, LOW_BITS, STEP_BLOCKS, true>(args, shared_x, stream);
  }
  W12MmaArgs launched = args;
  launched.warps_n = shared_x.tiles;  // which tiles share a block changes no bit
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  dim3 grid((tiles + launched.warps_n - 1) / launched.warps_n,
            (chunks + args.chunks_per_split - 1) / args.chunks_per_split);
  dim3 block(32 * (launched.warps_n * args.warps_k + 1));
  // the epilogue's reduction (each warp's slot of it its escape overlay) and inbox, the ring, each warp's escape
  // scratch, and with one K class (no reduction) each warp's overlay
  const size_t smem = (size_t)epilogue_words<MT, 1>(launched, block.x) * 16 +
                      escape_scratch_offset<MT>(args.warps_k, shared_x.ring) +
                      (LOW_BITS == 0 ? (size_t)(block.x / 32) * (kEscapeScratchBytes +
                                                                 (args.warps_k > 1 ? 0 : MT * kEscapeOverlayBytes))
                                     : 0);
  auto kernel = w12_shared_x_kernel<MT, LOW_BITS, STEP_BLOCKS, CLUSTER>;
  int resident = 0;
  const cudaError_t err = resident_blocks(reinterpret_cast<const void*>(kernel), block.x, smem, &resident);
  if (err != cudaSuccess) return err;
  if (resident == 0) return cudaErrorLaunchOutOfResources;  // a ring or block too large for a multiprocessor
  return launch_overlapping(kernel, grid, block, smem, stream, args.overlap_prior, args.cluster_splits, launched,
                            shared_x.ring);
}

// The shared-activation kernel's instantiations: 17-24 rows (3 token tiles: narrow_token_tiles) and 25-32 (4), whole or
// half steps, one tile a warp.
#define W12_SHARED_X_KERNELS(X) X(3, 4) X(3, 2) X(4, 4) X(4, 2)

template <int LOW_BITS>
cudaError_t launch_low_bits(const W12MmaArgs& args, const W12SharedActivations& shared_x, cudaStream_t stream) {
  const int tiles8 = narrow_token_tiles(args.m);
#define W12_SHARED_X_CALL_IF(MT, STEP_BLOCKS) \
  if (tiles8 == MT && args.step_blocks == STEP_BLOCKS && args.tiles_per_warp == 1) \
    return launch_ring<MT, LOW_BITS, STEP_BLOCKS>(args, shared_x, stream);
  W12_SHARED_X_KERNELS(W12_SHARED_X_CALL_IF)
#undef W12_SHARED_X_CALL_IF
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_shared_x(const W12MmaArgs& args, int low_bits, const W12SharedActivations& shared_x,
                            cudaStream_t stream) {
  // exact weights only: the Q pass runs on the per-warp kernel (w12_warp.cu, decode_block_q)
  return low_bits == 0 ? launch_low_bits<0>(args, shared_x, stream) : cudaErrorNotSupported;
}

}  // namespace w12
