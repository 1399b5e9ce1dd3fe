// Probe: does wgmma m64n32k16 (A from registers, B from shared memory) give the same bits as four warps of
// mma.sync m16n8k16 over the same k16 steps? And which descriptor offsets describe a no-swizzle K-major B?
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <torch/extension.h>

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wgmma_n32(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// A [blocks][64][K], B [blocks][32][K] (token rows), out [2][blocks][64][32]: 0 = mma.sync, 1 = wgmma.
// smem B per k16 step: [kh 2][ng 4][8 rows][16 bytes] when kh_outer, else [ng 4][kh 2][8][16].
__global__ void probe(const __nv_bfloat16* A, const __nv_bfloat16* B, float* out, int K, int kh_outer, int lbo,
                      int sbo) {
  extern __shared__ uint4 smem[];
  const int blk = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const __nv_bfloat16* a = A + (size_t)blk * 64 * K;
  const __nv_bfloat16* b = B + (size_t)blk * 32 * K;
  const int steps = K / 16;
  // B into shared memory
  for (int i = threadIdx.x; i < steps * 32 * 2; i += blockDim.x) {
    const int s = i / 64, n = (i / 2) % 32, kh = i % 2;
    const uint4 v = *reinterpret_cast<const uint4*>(b + (size_t)n * K + s * 16 + kh * 8);
    const int ng = n / 8, r = n % 8;
    const int cm = kh_outer ? kh * 4 + ng : ng * 2 + kh;
    smem[s * 64 + cm * 8 + r] = v;
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  float acc[4][4] = {};
  float d[16] = {};
  const uint32_t sb = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  for (int s = 0; s < steps; ++s) {
    const int row = warp * 16 + g;
    auto pair = [&](int r, int c) { return *reinterpret_cast<const uint32_t*>(a + (size_t)r * K + s * 16 + c); };
    const uint32_t fr[4] = {pair(row, 2 * t), pair(row + 8, 2 * t), pair(row, 2 * t + 8), pair(row + 8, 2 * t + 8)};
    for (int j = 0; j < 4; ++j) {
      const int n = j * 8 + g;
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(b + (size_t)n * K + s * 16 + 2 * t);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(b + (size_t)n * K + s * 16 + 2 * t + 8);
      mma_bf16(acc[j], fr, b0, b1);
    }
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    wgmma_n32(d, fr, desc(sb + s * 1024, lbo, sbo));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  }
  for (int j = 0; j < 4; ++j)
    for (int q = 0; q < 4; ++q) {
      const int r = warp * 16 + g + 8 * (q >> 1), c = j * 8 + 2 * t + (q & 1);
      out[((size_t)blk * 64 + r) * 32 + c] = acc[j][q];
      out[((size_t)(gridDim.x + blk) * 64 + r) * 32 + c] = d[4 * j + q];
    }
}

torch::Tensor run(torch::Tensor A, torch::Tensor B, int64_t kh_outer, int64_t lbo, int64_t sbo) {
  const int blocks = A.size(0), K = A.size(2);
  auto out = torch::zeros({2, blocks, 64, 32}, A.options().dtype(torch::kFloat32));
  const int smem = K / 16 * 1024;
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  probe<<<blocks, 128, smem>>>(reinterpret_cast<const __nv_bfloat16*>(A.data_ptr()),
                               reinterpret_cast<const __nv_bfloat16*>(B.data_ptr()), out.data_ptr<float>(), K,
                               (int)kh_outer, (int)lbo, (int)sbo);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
