// What the two wide kernels (w12_wide.cu: decoded fragments as wgmma's register operand; w12_wide_ss.cu: decoded
// weights through shared memory) share: the activation image's geometry and its writer, and the launch of the second.
#pragma once
#include "w12_common.cuh"

namespace w12 {

// Bytes of one k16 step of a slab's B image: [k half q][token group][8 rows][16 bytes] (descriptor leading offset
// MT * 128 between the k halves, stride offset 128 between token groups); a chunk is 8 steps (u, s) in order.
template <int MT>
__host__ __device__ constexpr int wide_step_bytes() { return MT * 256; }
template <int MT>
__host__ __device__ constexpr int wide_chunk_bytes() { return 8 * wide_step_bytes<MT>(); }

// x [m, ldx] -> every slab's chunk images (w12_wide.cu, w12_wide_permute_kernel) at `image`, `token_tiles` x 8 rows a
// slab, launched to overlap the kernel before it where args.overlap_prior asks.
cudaError_t launch_wide_image(const W12MmaArgs& args, int token_tiles, int slabs, void* image, cudaStream_t stream);

// The decoded-weight wide kernel (w12_wide_ss.cu): `wide.groups` tile groups of 64 rows a block, or the most its slab
// allows (wide_ss_groups: at most 128 accumulators a thread), whichever is fewer.
int wide_ss_groups(int token_tiles, int groups);
cudaError_t launch_wide_ss(const W12MmaArgs& args, const W12Wide& wide, cudaStream_t stream);

// The class-split kernel (w12_wgmma.cu; W12Wide::decoded == kWideClassSplit, slabs of 6, 8, 12 or 16 token tiles):
// blocks of `wide.groups` warpgroups of one K class of one split, their sums in args.partial (slabs x splits x warps_k x
// n_padded / 16 x token_tiles x 128 floats; none for one K class and one split), summed in the partition's order by
// a second kernel.
cudaError_t launch_wgmma_split(const W12MmaArgs& args, const W12Wide& wide, cudaStream_t stream);

}  // namespace w12
