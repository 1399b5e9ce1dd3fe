// The per-warp W12 kernel (mma.sync, sm_80+ including sm_90 and sm_120; 1-64 rows a launch): each warp owns one or two
// 16-row tiles and a K class of their chunks, holds its next step (a chunk or half of one) in registers while it
// decodes and multiplies the current one, and reads its activations through L1 (shared by the warps of a
// multiprocessor). Staged launches (up to 16 rows) copy the next step into the warp's own shared-memory double buffer
// instead (cp.async, L2 only): the same bytes in flight without the registers that hold them, so more warps fit a
// multiprocessor. The Q pass (LOW_BITS 1, 2) runs here alone: it loads the view plane only, decodes three instructions a
// register (decode_block_q), patches the zero codes from the escape list and scales each row's sums by its window.
#include "w12_common.cuh"

namespace w12 {
namespace {

// Fragment groups the escape patch takes at once: three staged (from the buffer half the step was read from; more made
// ptxas's count for the 1-8-row kernel cross 96 registers, a block of three warps less a multiprocessor), two in
// registers (more raised the count of 9-32 rows by 8-28 registers), one for the Q pass (whose patch touches only zero
// codes, so rare ones).
template <int LOW_BITS, bool STAGED>
__host__ __device__ constexpr int warp_overlay_groups() {
  return LOW_BITS != 0 ? 1 : STAGED ? 3 : 2;
}

template <int MT, int LOW_BITS, int STEP_BLOCKS, int TP, bool STAGED, bool CLUSTER>
__global__ void w12_mma_kernel(W12MmaArgs args) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warp_n = warp % args.warps_n;
  const int warp_k = warp / args.warps_n;
  const int first_tile = (blockIdx.x * args.warps_n + warp_n) * TP;
  const int g = lane >> 2, t = lane & 3;
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int kblocks = args.k_padded / 32;

  // TP consecutive 16-row tiles a warp (one activation load serves all of them); past the last tile a warp
  // repeats it and stores nothing.
  float acc[TP][MT][4];
#pragma unroll
  for (int p = 0; p < TP; ++p)
#pragma unroll
    for (int j = 0; j < MT; ++j) acc[p][j][0] = acc[p][j][1] = acc[p][j][2] = acc[p][j][3] = 0.f;

  if (first_tile < tiles) {
    const int first = blockIdx.y * args.chunks_per_split + warp_k;
    const int last = min((int)(blockIdx.y + 1) * args.chunks_per_split, chunks);
    // A warp works in steps of STEP_BLOCKS 32-column blocks (a whole chunk or half of one): half steps hold fewer
    // registers (more warps a multiprocessor) at more instructions. Steps run in the chunk's block order, so
    // every accumulator sums in the same order at every step size and row count.
    static_assert(STEP_BLOCKS == 4 || STEP_BLOCKS == 2, "a step is a chunk or half of one");
    constexpr int kBlocks = STEP_BLOCKS;
    constexpr int kStepsPerChunk = kBlocksPerChunk / kBlocks;
    // Running pointers (one 64-bit add per step; block offsets are immediates): weights of the next step to
    // load and activations of the current one, where registers allow: up to two token tiles in whole steps, four
    // in half steps; whole steps of four tiles and eight tiles would need more registers than the instructions they
    // save are worth, and recompute the activation addresses.
    constexpr bool kRunningX = MT <= 2 ? kStepsPerChunk == 1 : MT <= 4 && kStepsPerChunk == 2;
    const __nv_bfloat16* x_rows[MT];
#pragma unroll
    for (int j = 0; j < MT; ++j)
      x_rows[j] = args.x + (size_t)min(j * 8 + g, args.m - 1) * args.ldx + (kRunningX ? first * 128 + 8 * t : 0);

    constexpr int kStageWords = TP * kBlocks * kStagedBlockWords;  // 16-byte words a step
    extern __shared__ uint4 shared_words[];
    // the warp's escape scratch, after every warp's staged weights
    const uint32_t scratches = ptx::shared_address(shared_words + epilogue_words<MT, TP>(args, blockDim.x) +
                                                   (STAGED ? (blockDim.x / 32) * 2 * kStageWords : 0));
    const uint32_t scratch = scratches + warp * kEscapeScratchBytes;
    // The escape overlay (EscapeStream::patch): staged, the buffer half the step was just read from (free until the
    // next step's load refills it); else the warp's own region after every warp's scratch, or for one group the
    // scratch's own.
    constexpr int kOverlayGroups = warp_overlay_groups<LOW_BITS, STAGED>();
    const uint32_t own_overlay = kOverlayGroups == 1 ? scratch
                                                     : scratches + (blockDim.x / 32) * kEscapeScratchBytes +
                                                           warp * (STAGED ? 0 : kOverlayGroups * kEscapeOverlayBytes);
    uint32_t base_lo[TP], base_hi[TP];
    const uint4* view_next[TP];
    const uint2* nibs_next[TP];
    EscapeStream esc[TP];  // per tile
#pragma unroll
    for (int p = 0; p < TP; ++p) {
      const int tile = min(first_tile + p, tiles - 1);
      base_lo[p] = uint32_t(args.base[tile * 16 + g]) * 0x00800080u;  // base << 7, both lanes (exact weights)
      base_hi[p] = uint32_t(args.base[tile * 16 + g + 8]) * 0x00800080u;
      const size_t start = ((size_t)tile * kblocks + (size_t)first * kBlocksPerChunk) * 32 + lane;
      view_next[p] = reinterpret_cast<const uint4*>(args.view) + start;
      nibs_next[p] = reinterpret_cast<const uint2*>(args.nibbles) + start;
      esc[p].begin(args, tile, first, last, args.warps_k, scratch, p, lane);
    }

    // Weights are read once: no L1 allocation, so L1 keeps the activations. The next step loads while this
    // one is decoded and multiplied: into registers, or (STAGED) into the other half of the warp's shared-memory
    // double buffer. A buffer half holds, per tile, the step's view pieces (each lane copies and reads its own) and
    // its nibble words (copied as one contiguous run, read by other lanes: __syncwarp before reading and refilling).
    const uint32_t stage_base = ptx::shared_address(shared_words + epilogue_words<MT, TP>(args, blockDim.x) +
                                                    warp * 2 * kStageWords);
    // The Q pass's register steps are two thirds the bytes (view only): it keeps two steps in flight, not one, so a
    // warp has as many bytes on their way as the exact pass's (the register path only; the host never stages Q).
    constexpr int kAhead = LOW_BITS != 0 && !STAGED ? 2 : 1;
    uint4 v_next[kAhead][TP][kBlocks];  // [0]: the next step, [1]: the one after (Q pass)
    uint2 n_next[kAhead][TP][kBlocks];
    const int total_steps = first < last ? (last - first + args.warps_k - 1) / args.warps_k * kStepsPerChunk : 0;
    int loaded = 0;     // steps loaded so far (kAhead 2)
    int load_part = 0;  // which step of its chunk the next load is
    int stage = 0;      // the buffer half the next load fills
    auto load_step = [&]() {
#pragma unroll
      for (int p = 0; p < TP; ++p) {
        if constexpr (STAGED) {
          stage_step<kBlocks, LOW_BITS>(
              stage_base + (uint32_t)((stage * kStageWords + p * kBlocks * kStagedBlockWords) * 16), view_next[p],
              nibs_next[p], lane);
        } else {
          load_step_registers<kBlocks, LOW_BITS>(v_next[kAhead - 1][p], n_next[kAhead - 1][p], view_next[p],
                                                 nibs_next[p]);
        }
      }
      ++loaded;
      if (STAGED) {
        ptx::cp_async_commit();
        stage ^= 1;
      }
      const size_t advance = step_advance<kBlocks>(load_part, args.warps_k);
#pragma unroll
      for (int p = 0; p < TP; ++p) {
        view_next[p] += advance;
        nibs_next[p] += advance;
      }
      load_part = (load_part + 1) & (kStepsPerChunk - 1);
    };
    if (first < last) load_step();
    if constexpr (kAhead == 2) {  // the first step moves up, the second loads behind it
#pragma unroll
      for (int p = 0; p < TP; ++p)
#pragma unroll
        for (int u = 0; u < kBlocks; ++u) v_next[0][p][u] = v_next[1][p][u];
      if (loaded < total_steps) load_step();
    }
    // Everything above reads only the weights. Activations (and the outputs below) may belong to the kernel before
    // this one in the stream: wait for it here, when it was launched to overlap (sm_90+: programmatic dependent
    // launch; without it this returns at once).
    wait_before_reading_x(args);
    for (int chunk = first, ordinal = 0; chunk < last; chunk += args.warps_k, ++ordinal) {
      // this chunk's escapes were fetched with its weights; fetch the next chunk's
#pragma unroll
      for (int p = 0; p < TP; ++p) {
        esc[p].advance();
        if (chunk + args.warps_k < last) esc[p].fetch(args, ordinal + 1, first, args.warps_k);
      }
#pragma unroll
      for (int part = 0; part < kStepsPerChunk; ++part) {
        uint4 v[TP][kBlocks];
        uint2 nb[TP][kBlocks];
        uint32_t overlay = own_overlay;
        if constexpr (STAGED) {
          ptx::cp_async_wait<0>();
          __syncwarp();
          overlay = stage_base + (uint32_t)((stage ^ 1) * kStageWords * 16);
#pragma unroll
          for (int p = 0; p < TP; ++p) {
            const uint32_t words =
                stage_base + (uint32_t)(((stage ^ 1) * kStageWords + p * kBlocks * kStagedBlockWords) * 16);
#pragma unroll
            for (int u = 0; u < kBlocks; ++u) read_staged_block<kBlocks, LOW_BITS>(words, u, lane, v[p][u], nb[p][u]);
          }
          __syncwarp();  // every lane has read the half the next load refills
        } else {
#pragma unroll
          for (int p = 0; p < TP; ++p)
#pragma unroll
            for (int u = 0; u < kBlocks; ++u) {
              v[p][u] = v_next[0][p][u];
              nb[p][u] = n_next[0][p][u];
              if constexpr (kAhead == 2) v_next[0][p][u] = v_next[1][p][u];
            }
        }
        if constexpr (kAhead == 1) {
          if (part + 1 < kStepsPerChunk || chunk + args.warps_k < last) load_step();
        } else if (loaded < total_steps) {
          load_step();
        }
        // activations of this step: one 16-byte load per token row and 32-column block. Lanes past the last
        // row read it again: their MMA columns are outputs that are never stored (no predicates, no zeroing).
        uint4 xv[kBlocks][MT];
#pragma unroll
        for (int u = 0; u < kBlocks; ++u)
#pragma unroll
          for (int j = 0; j < MT; ++j)
            xv[u][j] = __ldg(reinterpret_cast<const uint4*>(
                x_rows[j] + (kRunningX ? u * 32 : (chunk * kBlocksPerChunk + part * kBlocks + u) * 32 + 8 * t)));
        if (kRunningX) {  // to the chunk's other half, or to the warp's next chunk
          const int x_advance = part == kStepsPerChunk - 1 ? args.warps_k * 128 - (kStepsPerChunk - 1) * kBlocks * 32
                                                           : kBlocks * 32;
#pragma unroll
          for (int j = 0; j < MT; ++j) x_rows[j] += x_advance;
        }

#pragma unroll
        for (int p = 0; p < TP; ++p) {
          uint32_t a[kBlocks][8];
#pragma unroll
          for (int u = 0; u < kBlocks; ++u) {
            if constexpr (LOW_BITS == 0)
              decode_block(a[u], v[p][u], nb[p][u], base_lo[p], base_hi[p]);
            else
              decode_block_q<LOW_BITS>(a[u], v[p][u]);
          }
          esc[p].template patch<kBlocks, false, LOW_BITS != 0, kOverlayGroups>(a, part * kBlocks, args, ordinal, first,
                                                                                args.warps_k, overlay, lane);
#pragma unroll
          for (int u = 0; u < kBlocks; ++u) {
#pragma unroll
            for (int s = 0; s < 2; ++s) {
              const uint32_t frag[4] = {a[u][4 * s], a[u][4 * s + 1], a[u][4 * s + 2], a[u][4 * s + 3]};
#pragma unroll
              for (int j = 0; j < MT; ++j)
                ptx::mma_bf16_16816(acc[p][j], frag, s ? xv[u][j].z : xv[u][j].x, s ? xv[u][j].w : xv[u][j].y);
            }
          }
        }
      }
    }
    if constexpr (LOW_BITS != 0) {  // the Q pass's sums times their rows' windows (decode_block_q), before any reduction
#pragma unroll
      for (int p = 0; p < TP; ++p) {
        const int tile = min(first_tile + p, tiles - 1);
        const float lo = qpass_row_scale(args.base[tile * 16 + g]), hi = qpass_row_scale(args.base[tile * 16 + g + 8]);
#pragma unroll
        for (int j = 0; j < MT; ++j) {
          acc[p][j][0] *= lo;
          acc[p][j][1] *= lo;
          acc[p][j][2] *= hi;
          acc[p][j][3] *= hi;
        }
      }
    }
  }

  reduce_and_store<TP, MT, CLUSTER>(acc, args, warp, warp_n, warp_k, lane, first_tile, true);
}

template <int MT, int LOW_BITS, int STEP_BLOCKS, int TP, bool STAGED, bool CLUSTER = false>
cudaError_t launch_plan(const W12MmaArgs& args, cudaStream_t stream) {
  if constexpr (TP == 1 && !CLUSTER) {  // one tile a warp: K splits may meet in a cluster
    if (args.cluster_splits > 1) return launch_plan<MT, LOW_BITS, STEP_BLOCKS, TP, STAGED, true>(args, stream);
  }
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int tiles_per_block = args.warps_n * TP;
  dim3 grid((tiles + tiles_per_block - 1) / tiles_per_block, (chunks + args.chunks_per_split - 1) / args.chunks_per_split);
  dim3 block(32 * args.warps_n * args.warps_k);
  // the epilogue's reduction and inbox, then (STAGED) each warp's double buffer, then each warp's escape scratch,
  // then (not STAGED, more than one group) each warp's escape overlay
  const size_t smem = (size_t)epilogue_words<MT, TP>(args, block.x) * 16 +
                      (STAGED ? (size_t)(block.x / 32) * 2 * TP * STEP_BLOCKS * kStagedBlockWords * 16 : 0) +
                      (size_t)(block.x / 32) * kEscapeScratchBytes +
                      (STAGED || warp_overlay_groups<LOW_BITS, false>() == 1
                           ? 0
                           : (size_t)(block.x / 32) * warp_overlay_groups<LOW_BITS, false>() * kEscapeOverlayBytes);
  auto kernel = w12_mma_kernel<MT, LOW_BITS, STEP_BLOCKS, TP, STAGED, CLUSTER>;
  int resident = 0;
  const cudaError_t err = resident_blocks(reinterpret_cast<const void*>(kernel), block.x, smem, &resident);
  if (err != cudaSuccess) return err;
  if (resident == 0 && args.warps_n > 1) {  // registers for fewer warps than the block: fewer tiles a block
    W12MmaArgs fewer = args;                // (which tiles share a block changes no bit)
    fewer.warps_n = args.warps_n / 2;
    return launch_plan<MT, LOW_BITS, STEP_BLOCKS, TP, STAGED, CLUSTER>(fewer, stream);
  }
  return launch_overlapping(kernel, grid, block, smem, stream, args.overlap_prior, args.cluster_splits, args);
}


// The per-warp kernel's instantiations, one line each (the CALL_IF list of Marlin): token tiles of 8 rows (3 for 17-24
// rows, 4 for 25-32: narrow_token_tiles), 32-column blocks a step (4: a chunk, 2: half of one), 16-row tiles a warp,
// weights staged through shared memory. Staged launches run whole steps of one tile up to 16 rows; half steps pay off
// from 17 rows on, where registers limit the warps, and two tiles a warp (one activation load for both) on grids with
// warps to spare. Every 17-32-row plan (STEP_PLANS in mma.py) exists for 3 and 4 token tiles.
#define W12_WARP_KERNELS(X) \
  X(1, 4, 1, true)          \
  X(2, 4, 1, true)          \
  X(1, 4, 1, false)         \
  X(2, 4, 1, false)         \
  X(3, 4, 1, false)         \
  X(4, 4, 1, false)         \
  X(8, 4, 1, false)         \
  X(3, 2, 1, false)         \
  X(4, 2, 1, false)         \
  X(3, 2, 2, false)         \
  X(4, 2, 2, false)         \
  X(8, 2, 2, false)

template <int LOW_BITS>
cudaError_t launch_low_bits(const W12MmaArgs& args, cudaStream_t stream) {
  const int tiles8 = narrow_token_tiles(args.m);
  const bool staged = args.staged_weights != 0;
  // the Q pass is never staged (two register steps in flight instead): no staged Q kernels are built
#define W12_WARP_CALL_IF(MT, STEP_BLOCKS, TP, STAGED)                                                          \
  if constexpr (LOW_BITS == 0 || !(STAGED))                                                                 \
    if (tiles8 == MT && args.step_blocks == STEP_BLOCKS && args.tiles_per_warp == TP && staged == STAGED) \
      return launch_plan<MT, LOW_BITS, STEP_BLOCKS, TP, STAGED>(args, stream);
  W12_WARP_KERNELS(W12_WARP_CALL_IF)
#undef W12_WARP_CALL_IF
  return cudaErrorInvalidValue;  // a plan not built for this many token tiles
}

}  // namespace

cudaError_t launch_warp(const W12MmaArgs& args, int low_bits, cudaStream_t stream) {
  return low_bits == 0 ? launch_low_bits<0>(args, stream)
         : low_bits == 1 ? launch_low_bits<1>(args, stream)
                         : launch_low_bits<2>(args, stream);
}

}  // namespace w12
