"""Probe variants of the W12 kernel for session 15 (diagnostics: wrong bits allowed in a, b)."""
import shutil, sys
from pathlib import Path
SRC = Path("kernels/specpilot_kernels/w12/csrc")

def variant(name, edits):
    d = Path(".gpu") / name
    if d.exists(): shutil.rmtree(d)
    shutil.copytree(SRC, d)
    cu = (d / "w12_mma.cu").read_text()
    for old, new in edits:
        assert cu.count(old) == 1, (name, old[:60], cu.count(old))
        cu = cu.replace(old, new)
    (d / "w12_mma.cu").write_text(cu)

COPY = """      mbarrier_arrive_expecting(full + 8 * slot, kChunkBytes);
      bulk_copy_to_shared(slots + slot * kChunkBytes, x_image + (size_t)(first + i * args.warps_k) * (kChunkBytes / 16),
                          kChunkBytes, full + 8 * slot);"""
# a: a quarter of each activation chunk copied (L2 -> SM traffic of activations / 4; wrong bits)
variant("v21a", [(COPY, COPY.replace("kChunkBytes);", "kChunkBytes / 4);").replace("kChunkBytes, full", "kChunkBytes / 4, full"))])
# b: no decode (the staged words go to the MMA as they are; wrong bits)
DEC = "          decode_block<LOW_BITS>(a[u], v, nb, base_lo, base_hi);\n        }\n        previous = stage;"
variant("v21b", [(DEC, "          a[u][0] = v.x; a[u][1] = v.y; a[u][2] = v.z; a[u][3] = v.w;\n"
                       "          a[u][4] = nb.x; a[u][5] = nb.y; a[u][6] = v.x ^ nb.y; a[u][7] = v.y ^ nb.x;\n        }\n        previous = stage;")])
# c: L2 eviction priorities: weights evict_first (streamed once), the activation image evict_last (read by every block)
BULK = """  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar) : "memory");"""
BULK_HINT = """  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar), "l"(policy) : "memory");"""
STAGE = """  const uint32_t mine = words + lane * 16;  // this lane's first view piece (its nibble words: i words past the view)
#pragma unroll
  for (int u = 0; u < BLOCKS; ++u)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(mine + u * 32 * 16), "l"(view + u * 32));"""
STAGE_HINT = """  const uint32_t mine = words + lane * 16;  // this lane's first view piece (its nibble words: i words past the view)
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#pragma unroll
  for (int u = 0; u < BLOCKS; ++u)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(mine + u * 32 * 16), "l"(view + u * 32), "l"(policy));"""
RUN = """      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(mine + (BLOCKS * 32 + i) * 16), "l"(run + i));"""
RUN_HINT = """      asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(mine + (BLOCKS * 32 + i) * 16), "l"(run + i), "l"(policy));"""
variant("v21c", [(BULK, BULK_HINT), (STAGE, STAGE_HINT), (RUN, RUN_HINT)])

# m: K classes of two blocks (a cluster of 2 along x) share each activation chunk: block 0's copier multicasts it into
# both blocks' slots; block 1's copier arms its own full barrier and tells block 0 (remote arrive) when its class has
# released a slot. Halves the activations' L2 -> SM traffic. Same bits.
HELPERS_AT = "// Bytes of a ring slot's token row:"
HELPERS = """__device__ __forceinline__ void bulk_copy_multicast(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                                    uint16_t mask) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "h"(mask) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_remote(uint32_t bar, uint32_t rank) {
  asm volatile("{\\n\\t.reg .b32 remote;\\n\\tmapa.shared::cluster.u32 remote, %0, %1;\\n\\t"
               "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\\n}" ::"r"(bar), "r"(rank) : "memory");
}
__device__ __forceinline__ void mbarrier_wait_cluster(uint32_t bar, uint32_t phase) {
  asm volatile(
      "{\\n\\t.reg .pred done;\\n"
      "W12_WAITC_%=:\\n\\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\\n\\t"
      "@!done bra W12_WAITC_%=;\\n}" ::"r"(bar), "r"(phase) : "memory");
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

"""
M_EDITS = [
    (HELPERS_AT, HELPERS + HELPERS_AT),
    ("""  const uint32_t empty = full + args.warps_k * kWgmmaSlots * 8;
  if (threadIdx.x == 0) {""", """  const uint32_t empty = full + args.warps_k * kWgmmaSlots * 8;
  const uint32_t peer_empty = empty + args.warps_k * kWgmmaSlots * 8;
  uint32_t pair_rank = 0, pair_size = 1;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(pair_rank));
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(pair_size));
  const bool paired = !CLUSTER && pair_size == 2;
  if (threadIdx.x == 0) {"""),
    ("""      mbarrier_init(f + args.warps_k * kWgmmaSlots * 8, args.warps_n);  // one arrival a warp of the class
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
""", """      mbarrier_init(f + args.warps_k * kWgmmaSlots * 8, args.warps_n);  // one arrival a warp of the class
      mbarrier_init(f + 2 * args.warps_k * kWgmmaSlots * 8, 1);  // the peer block's copier
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (paired) cluster_sync_all();
"""),
    ("""      mbarrier_arrive_expecting(full + 8 * slot, kChunkBytes);
      bulk_copy_to_shared(slots + slot * kChunkBytes, x_image + (size_t)(first + i * args.warps_k) * (kChunkBytes / 16),
                          kChunkBytes, full + 8 * slot);""", """      mbarrier_arrive_expecting(full + 8 * slot, kChunkBytes);
      if (!paired)
        bulk_copy_to_shared(slots + slot * kChunkBytes, x_image + (size_t)(first + i * args.warps_k) * (kChunkBytes / 16),
                            kChunkBytes, full + 8 * slot);
      else if (pair_rank == 0)
        bulk_copy_multicast(slots + slot * kChunkBytes, x_image + (size_t)(first + i * args.warps_k) * (kChunkBytes / 16),
                            kChunkBytes, full + 8 * slot, 3);"""),
    ("""        if (i >= 1) mbarrier_wait(empty + 8 * ((i - 1) % kWgmmaSlots), ((i - 1) / kWgmmaSlots) & 1);""",
     """        if (i >= 1) {
          const uint32_t s = (i - 1) % kWgmmaSlots, parity = ((i - 1) / kWgmmaSlots) & 1;
          mbarrier_wait(empty + 8 * s, parity);
          if (paired && pair_rank == 1) mbarrier_arrive_remote(peer_empty + 8 * s, 0);
          if (paired && pair_rank == 0) mbarrier_wait_cluster(peer_empty + 8 * s, parity);
        }"""),
    ("""  reduce_and_store<1, MT, CLUSTER>(acc, args, warp, warp_n, warp_k, lane, tile, true);
#else
  __trap();  // the host launches warpgroup MMAs on sm_90a only""", """  reduce_and_store<1, MT, CLUSTER>(acc, args, warp, warp_n, warp_k, lane, tile, true);
  if (paired) cluster_sync_all();
#else
  __trap();  // the host launches warpgroup MMAs on sm_90a only"""),
    ("""  if (cluster_y > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count++].val.clusterDim = {1, (unsigned)cluster_y, 1};
  }""", """  if (cluster_y > 1 || cluster_y < -1) {  // negative: a cluster of -cluster_y blocks along x
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    if (cluster_y > 0) attributes[count].val.clusterDim = {1, (unsigned)cluster_y, 1};
    else attributes[count].val.clusterDim = {(unsigned)-cluster_y, 1, 1};
    ++count;
  }"""),
    ("""                                (size_t)args.warps_k * wgmma_slots<MT>() * (wgmma_chunk_bytes<MT>() + 16);""",
     """                                (size_t)args.warps_k * wgmma_slots<MT>() * (wgmma_chunk_bytes<MT>() + 24);"""),
    ("""  return launch_overlapping(stage_weights ? staged : registers, grid, block, stage_weights ? smem_staged : smem_registers,
                            stream, args.overlap_prior, args.cluster_splits, launched, static_cast<const uint4*>(x_image));""",
     """  const int clusters = !CLUSTER && grid.x % 2 == 0 ? -2 : args.cluster_splits;
  return launch_overlapping(stage_weights ? staged : registers, grid, block, stage_weights ? smem_staged : smem_registers,
                            stream, args.overlap_prior, clusters, launched, static_cast<const uint4*>(x_image));"""),
]
variant("v21m", M_EDITS)

# c1: c with the policies made by non-volatile asm (the compiler may hoist them out of the loop)
def hoistable(edits):
    return [(o, n.replace('asm volatile("createpolicy', 'asm("createpolicy')) for o, n in edits]
C_EDITS = [(BULK, BULK_HINT), (STAGE, STAGE_HINT), (RUN, RUN_HINT)]
variant("v21c1", hoistable(C_EDITS))
# c2: c1 + a 256-byte L2 prefetch size on the weights' copies
variant("v21c2", [(o, n.replace("cp.async.cg.shared.global.L2::cache_hint", "cp.async.cg.shared.global.L2::cache_hint.L2::256B"))
                  for o, n in hoistable(C_EDITS)])
# c3: c1 with the weights' hint only (the activation image without one)
variant("v21c3", hoistable([(STAGE, STAGE_HINT), (RUN, RUN_HINT)]))
# c4: c1 + the register-held weights (per-warp kernel) read evict_first too
REG = """    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                 : "l"(view + u * 32));
    if (LOW_BITS == 0) {
      asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];"
                   : "=r"(nb[u].x), "=r"(nb[u].y) : "l"(nibs + u * 32));"""
REG_HINT = """    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                 : "l"(view + u * 32), "l"(policy));
    if (LOW_BITS == 0) {
      asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0,%1}, [%2], %3;"
                   : "=r"(nb[u].x), "=r"(nb[u].y) : "l"(nibs + u * 32), "l"(policy));"""
variant("v21c4", hoistable(C_EDITS) + [(REG, REG_HINT)])

# u (probe, valid only where every non-cluster warpgroup launch has one K class): c3 with warp_k known to be 0 at compile
# time outside clusters, so the descriptors may live in uniform registers
WK = """  const int warp_k = warp / args.warps_n;
  const int tile = blockIdx.x * args.warps_n + warp_n;
  const int tiles = args.n_padded / 16;
  const int chunks = args.k_padded / 128;
  const int first = blockIdx.y * args.chunks_per_split + warp_k;"""
variant("v21u", hoistable([(STAGE, STAGE_HINT), (RUN, RUN_HINT)]) + [(WK, WK.replace("const int warp_k = warp / args.warps_n;", "const int warp_k = CLUSTER ? warp / args.warps_n : 0;"))])

# c5: the candidate: c's weight hint only (evict_first, the policy made where it is used: a few uniform moves)
variant("v21c5", [(STAGE, STAGE_HINT), (RUN, RUN_HINT)])
# s: c5 + the odd blocks of a warpgroup launch outside clusters start 600 ns late (do two blocks on a multiprocessor
# keep in step, decoding at the same time?)
START = """  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warp_n = warp % args.warps_n;  // warps_n = 4 x warpgroups a K class"""
variant("v21s", [(STAGE, STAGE_HINT), (RUN, RUN_HINT),
                 (START, START.replace("  const int lane = threadIdx.x & 31;", "  if (!CLUSTER && (blockIdx.x & 1)) __nanosleep(600);\n  const int lane = threadIdx.x & 31;"))])

# p: c5 + an L2 prefetch of the warp's chunk `kStages` ahead (one past the ring), p2: two past it: more bytes in flight
# without more shared memory
CW = """        copy_weights(i + kStages - 1 < count, previous);"""
def prefetch_ahead(extra):
    lines = []
    for e in range(extra):
        adv = " + advance" * e
        lines.append(f"""        if (i + kStages + {e} < count) {{  // lanes 0-15: the view's 16 lines, 16-23: the nibbles' 8
          const char* line = lane < 16 ? reinterpret_cast<const char*>(view_next - lane{adv}) + 128 * lane
                                       : reinterpret_cast<const char*>(nibs_next - lane{adv}) + 128 * (lane - 16);
          if (lane < 24) asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
        }}""")
    return CW + "\n" + "\n".join(lines)
variant("v21p1", [(STAGE, STAGE_HINT), (RUN, RUN_HINT), (CW, prefetch_ahead(1))])
variant("v21p2", [(STAGE, STAGE_HINT), (RUN, RUN_HINT), (CW, prefetch_ahead(2))])

# r2: c5 with a weight ring of 2 chunks a warp at every row count (one chunk in flight while one is decoded: fewer
# requests outstanding, as the per-warp register kernel has)
STAGES = "constexpr int wgmma_weight_stages() { return MT == 8 ? 2 : 3; }"
variant("v21r2", [(STAGE, STAGE_HINT), (RUN, RUN_HINT), (STAGES, STAGES.replace("MT == 8 ? 2 : 3", "2"))])
# r2n: r2 without the hint
variant("v21r2n", [(STAGES, STAGES.replace("MT == 8 ? 2 : 3", "2"))])
