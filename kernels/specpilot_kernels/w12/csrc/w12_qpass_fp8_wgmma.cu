// The FP8 Q pass on warpgroup MMAs (sm_90a): y = x @ Wq^T with Wq the exact pass's 8-bit view, read in place.
//
// At tree rows the per-warp kernels of w12_qpass_fp8.cu are bound by issuing instructions, not by the view's bytes:
// sm_90 runs E4M3 mma.sync at a fraction of its FP8 tensor-core rate (the midpoint a second MMA), and the f16 kind
// converts each activation fragment once per weight tile. Here a warpgroup of 4 warps owns 4 consecutive 16-row tiles
// (a warp one tile) and issues wgmma.m64nNk16 (N = 8 x token tiles) with f16 operands: A is the per-warp f16 kind's
// m16n8k16 fragment (the view's bytes converted exactly in registers, the midpoint one bit of each half), a warp's
// slice of wgmma's register A; B is the activations' f16 image in shared memory (every E4M3 number is an f16), so no
// activation registers, no per-warp activation loads or conversions, and one instruction where the per-warp kernel
// issues N / 8 MMAs a tile. fp32 sums, as the per-warp kernels keep them. (E4M3 operands on m64nNk32 were tried: on
// the H200 their sums missed the emulation by up to 13 times the contract's slack, 2**-8 relative + 1e-5 of the
// largest, the FP8 tensor cores summing with fewer bits than fp32 even over 128 products a wgmma group.)
//
// Both operands come in by the copy engine: a block's first thread puts each 128-column chunk's B image (written by
// the quantizer in exactly the order wgmma reads it, qpass_fp8_quantize_wgmma) and each tile's 2 KB of view for that
// chunk (contiguous in the view) into a ring of kQpassWgmmaStages slots, stages - 1 chunks ahead (full and empty
// mbarriers, as the exact warpgroup kernel), so the weights' reads stay in flight without registers; each warp then
// reads its tile's fragments from the slot (16 bytes a lane a block, conflict-free). Splits of K over blocks: each
// warp's tile partial into the workspace, the last warp of a tile to arrive sums them in split order (a counter a
// tile, left zero), as the per-warp kernel does. A tile's sums depend on its splits alone.
#include <cuda_fp8.h>

#include "pdl.cuh"
#include "ptx.cuh"
#include "w12_qpass_fp8.cuh"
#include "w12_qpass_fp8_kernel.cuh"  // the E4M3 -> f16 conversion and midpoint bit, the PDL launch

namespace {

constexpr int kBlocksPerChunk = 4;  // 32-column blocks a chunk: 128 columns (k_padded % 128 == 0)
constexpr int kTileChunkBytes = kBlocksPerChunk * 512;  // one tile's view bytes a chunk, contiguous in the view

// B image bytes of one wgmma's K (16 columns of f16) for T token tiles: [k half][token tile j][8 rows][16 bytes], so
// the descriptor's leading offset (between the k halves) is T x 128 and its stride offset (between token tiles) 128.
template <int T>
constexpr int kStepImageBytes = T * 256;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d (64 x N fp32, N / 2 a thread) += a (64 x 16 f16 from registers: each warp's m16n8k16 A fragment of its 16 rows)
// * b (16 x N f16 in shared memory, K-major, described by desc): the f16 warpgroup MMA.
template <int N>
__device__ __forceinline__ void wgmma_f16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc);
template <>
__device__ __forceinline__ void wgmma_f16<8>(float (&d)[4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
template <>
__device__ __forceinline__ void wgmma_f16<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
template <>
__device__ __forceinline__ void wgmma_f16<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, 1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
template <>
__device__ __forceinline__ void wgmma_f16<40>(float (&d)[20], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n40k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19}, {%20,%21,%22,%23}, %24, 1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
template <>
__device__ __forceinline__ void wgmma_f16<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
// Pins registers at this point of the program: the wgmma's operands written before wgmma_fence, its sums read after
// the wgmma_wait that completes them (the compiler sees neither dependency).
template <int R>
__device__ __forceinline__ void fence_registers(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void fence_registers(uint32_t (&a)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(a[i])::"memory");
}
#endif

// T token tiles of 8 rows (wgmma N = 8T); MID: the dropped bits at their midpoint. A block is blockDim.x / 128
// warpgroups of 4 tiles sharing each chunk's B image; gridDim.y splits K.
template <int T, bool MID>
__global__ void __launch_bounds__(128 * kQpassWgmmaMaxGroups) qpass_fp8_wgmma_kernel(QpassFp8Args args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int SUMS = 4 * T;  // a thread's fp32 sums (wgmma N / 2)
  constexpr int kImageBytes = kBlocksPerChunk * 2 * kStepImageBytes<T>;  // two k16 steps a 32-column block
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int tile = blockIdx.x * warps + warp;
  const int chunks = args.k_padded / 128, per = (chunks + args.splits - 1) / args.splits;
  const int c0 = min(chunks, (int)blockIdx.y * per), count = min(chunks, c0 + per) - c0;  // block-uniform
  const int slot_bytes = kImageBytes + warps * kTileChunkBytes;
  extern __shared__ __align__(1024) uint8_t ring[];  // [stages][B image | warps x tile chunk], then the mbarriers
  const uint32_t slots = ptx::shared_address(ring);
  const uint32_t full = slots + kQpassWgmmaStages * slot_bytes, empty = full + 8 * kQpassWgmmaStages;
  const size_t tile_stride = (size_t)(args.k_padded / 32) * 512;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kQpassWgmmaStages; ++s) {
      ptx::mbarrier_init(full + 8 * s, 1);
      ptx::mbarrier_init(empty + 8 * s, warps);  // one arrival a warp
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  const bool copier = threadIdx.x == 0;
  // chunk i's weights into its slot (the slot's phase expects them and the image): past the last tile, the last
  // tile again (its warp stores nothing)
  auto copy_weights = [&](int i) {
    const uint32_t slot = slots + (i % kQpassWgmmaStages) * slot_bytes, bar = full + 8 * (i % kQpassWgmmaStages);
    ptx::mbarrier_arrive_expecting(bar, slot_bytes);
    for (int w = 0; w < warps; ++w) {
      const int t = min(blockIdx.x * warps + w, args.tiles - 1);
      ptx::bulk_copy_to_shared(slot + kImageBytes + w * kTileChunkBytes,
                               args.view + t * tile_stride + (size_t)(c0 + i) * kTileChunkBytes, kTileChunkBytes,
                               bar);
    }
  };
  auto copy_image = [&](int i) {
    ptx::bulk_copy_to_shared(slots + (i % kQpassWgmmaStages) * slot_bytes,
                             args.x_image + (size_t)(c0 + i) * kImageBytes, kImageBytes,
                             full + 8 * (i % kQpassWgmmaStages));
  };
  const int ahead = min(count, kQpassWgmmaStages - 1);
  if (copier)
    for (int i = 0; i < ahead; ++i) copy_weights(i);
  if (args.overlap_prior) wait_for_prior_grid();  // x_image and x_scale are the quantizer's
  if (copier)
    for (int i = 0; i < ahead; ++i) copy_image(i);

  // descriptor of a wgmma's B in a slot: address >> 4 (14 bits), leading offset T x 128 (between the k halves),
  // stride offset 128 (between token tiles)
  constexpr uint64_t kDescOffsets = ((uint64_t)(T * 128 >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
  constexpr int kSteps = 2 * kBlocksPerChunk;  // k16 wgmmas a chunk
  float acc[SUMS] = {};
  uint32_t phase = 0;
  for (int i = 0; i < count; ++i) {
    const int s = i % kQpassWgmmaStages;
    const uint32_t slot = slots + s * slot_bytes;
    ptx::mbarrier_wait(full + 8 * s, phase);
    uint32_t a[kSteps][4];
#pragma unroll
    for (int u = 0; u < kBlocksPerChunk; ++u) {
      const uint4 v = ptx::ld_shared16(slot + kImageBytes + warp * kTileChunkBytes + u * 512 + lane * 16);
      // view word: two bytes of row g, two of row g + 8; k16 step 0 takes words x, y, step 1 words z, w
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const uint32_t h = qpass_fp8_detail::e4m3x2_to_f16x2(w[2 * q + r / 2] >> (16 * (r % 2)));
          a[2 * u + q][r] = MID ? qpass_fp8_detail::f16x2_midpoint(h) : h;
        }
    }
#pragma unroll
    for (int u = 0; u < kSteps; ++u) fence_registers(a[u]);
    fence_registers(acc);
    ptx::wgmma_fence();
#pragma unroll
    for (int u = 0; u < kSteps; ++u)
      wgmma_f16<8 * T>(acc, a[u], kDescOffsets | (((slot + u * kStepImageBytes<T>) & 0x3FFFF) >> 4));
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();  // the slot and the A registers are free again
    fence_registers(acc);
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(empty + 8 * s);
    // the copier refills the slot chunk i - 1 left once every warp has released it (one iteration behind: no wait
    // for the slowest warp on the chunk just read)
    if (copier && i + kQpassWgmmaStages - 1 < count) {
      if (i >= 1) ptx::mbarrier_wait(empty + 8 * ((i - 1) % kQpassWgmmaStages), ((i - 1) / kQpassWgmmaStages) & 1);
      copy_weights(i + kQpassWgmmaStages - 1);
      copy_image(i + kQpassWgmmaStages - 1);
    }
    if (s == kQpassWgmmaStages - 1) phase ^= 1;
  }
  allow_next_grid();
  if (tile >= args.tiles) return;
  if (args.splits > 1) {  // the K splits of the warp's tile: the last to arrive sums them in split order
    float* part = args.workspace + (size_t)tile * args.splits * SUMS * 32 + lane;
#pragma unroll
    for (int c = 0; c < SUMS; ++c) part[((size_t)blockIdx.y * SUMS + c) * 32] = acc[c];
    __threadfence();  // the partial is visible before the count says so
    int arrived = 0;
    if (lane == 0) arrived = atomicAdd(args.counters + tile, 1);
    if (__shfl_sync(0xFFFFFFFFu, arrived, 0) != args.splits - 1) return;
    __threadfence();
    const float* all = args.workspace + (size_t)tile * args.splits * SUMS * 32 + lane;
#pragma unroll
    for (int c = 0; c < SUMS; ++c) {
      float sum = __ldcg(all + c * 32);
      for (int q = 1; q < args.splits; ++q) sum += __ldcg(all + ((size_t)q * SUMS + c) * 32);
      acc[c] = sum;
    }
    if (lane == 0) args.counters[tile] = 0;  // ready for the next launch
  }
  // d[4j + c]: row g + 8 (c / 2) of the warp's tile, token 8j + 2t + c % 2 (the m16n8 accumulator layout)
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = tile * 16 + g + 8 * half;
    if (row >= args.n) continue;
    const float window = __uint_as_float((uint32_t)(args.base[row] + 7) << 23);  // 2**(base - 120), exact
#pragma unroll
    for (int j = 0; j < T; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int token = 8 * j + 2 * t + c;
        if (token < args.m)
          args.y[(size_t)token * args.ldy + row] =
              __float2bfloat16_rn(acc[4 * j + 2 * half + c] * window * args.x_scale[token]);
      }
  }
#else
  __trap();  // the host launches warpgroup MMAs on sm_90a only
#endif
}

template <int T, bool MID>
cudaError_t launch_wgmma(const QpassFp8Args& args, cudaStream_t stream) {
  const int warps = 4 * args.groups_per_block;
  const size_t image_bytes = (size_t)kBlocksPerChunk * 2 * kStepImageBytes<T>;
  const size_t smem = (size_t)kQpassWgmmaStages * (image_bytes + warps * kTileChunkBytes) + 16 * kQpassWgmmaStages;
  auto kernel = qpass_fp8_wgmma_kernel<T, MID>;
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid((args.tiles + warps - 1) / warps, args.splits);
  return qpass_fp8_detail::launch(kernel, grid, dim3(32 * warps), smem, stream, args.overlap_prior, args);
}

// The instantiated warpgroup kernels: the per-warp kernel's token tiles (wgmma N = 8 .. 64) x both modes.
#define QPASS_WGMMA_KERNELS(X)                                                                                   \
  X(1, false) X(1, true) X(2, false) X(2, true) X(4, false) X(4, true) X(5, false) X(5, true) X(8, false) X(8, true)

}  // namespace

cudaError_t qpass_fp8_gemm_wgmma(const QpassFp8Args& args, bool midpoint, cudaStream_t stream) {
  const int tiles8 = (args.m + 7) / 8;
  const int built = tiles8 <= 2 ? tiles8 : tiles8 <= 4 ? 4 : tiles8 <= 5 ? 5 : 8;
  if (args.m < 1 || args.m > kQpassFp8MaxRows || args.warps_k != 1 || args.tiles_per_warp != 1 ||
      args.groups_per_block < 1 || args.groups_per_block > kQpassWgmmaMaxGroups || args.k_padded % 128 ||
      args.splits < 1 || (args.splits > 1 && (args.workspace == nullptr || args.counters == nullptr)))
    return cudaErrorInvalidValue;
#define QPASS_WGMMA_CALL_IF(T, MID) \
  if (built == T && midpoint == MID) return launch_wgmma<T, MID>(args, stream);
  QPASS_WGMMA_KERNELS(QPASS_WGMMA_CALL_IF)
#undef QPASS_WGMMA_CALL_IF
  return cudaErrorInvalidValue;
}
