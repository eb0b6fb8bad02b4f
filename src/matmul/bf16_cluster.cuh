// The Hopper kernel's clustered form (bf16_wgmma.cuh's pipeline, one consumer warpgroup), for products
// with few tiles and a long K, such as GPT-2's attention projection weight gradient (768 x 768 x 4096):
// 64 x 96 tiles whose blocks run in clusters of 8 and load each operand tile once for the blocks that
// share it, with TMA multicast. A cluster covers 4 row tiles x 2 column tiles (256 x 192 of the output);
// block rank r takes row tile r / 2 and column tile r % 2 of the cluster's.
//   - The two blocks of a row tile (ranks 2 j, 2 j + 1) share its A tile: each TMA-loads half of every K
//     tile's A (K-major: 32 of its 64 rows; MN-major: 32 of its 64 k) into both.
//   - The four blocks of a column tile (ranks i, i + 2, i + 4, i + 6) share its B tile: each loads a
//     quarter (K-major: 24 of its 96 rows; MN-major: 16 of its 64 k of both boxes) into all four.
// A block's `full` barrier counts the whole K tile's bytes, whichever block loaded them; its `empty`
// barrier counts the consumers of the five blocks its own loads reach (its partner's and its column's
// four), each of which releases the slot in every block that loads into it. So each block reads
// 7 KB a K tile from L2 where an unclustered 64 x 96 block reads 20: 96 tiles of 768 x 768 x 4096 took
// 19.5-23 us without clusters against the 15.1 of 72 unclustered 64 x 128 tiles on an H100 (bf16_notes.md,
// sixteenth session); cuBLAS runs this product the same way (`nvjet_sm90_tst_96x64_64x8_2x4`).
//
// Shared memory as bf16_wgmma.cuh's, with B always in 128-byte-swizzled boxes: an MN-major B as two
// [64 k][64 columns] boxes (8 KB each, the second holding columns 64..95 in the first 64 bytes of its
// 128-byte rows, loaded through a map of 32-column boxes under the 128-byte swizzle; loading 64 columns
// there, half of them unused, took 14.1 us against 13.7-13.8), a K-major one as one [96 rows][64 k] box;
// 8 ring slots of 24 KB.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "../includes/dependent_launch.cuh"
#include "../includes/ptx.cuh"
#include "../includes/tma.cuh"
#include "bf16_wgmma.cuh"

namespace bf16mm {

struct ClusterConfig {
  static constexpr int kBlocks = 8, kRowTiles = 4, kColTiles = 2;
  static constexpr int BM = 64, BN = 96;
  static constexpr int kThreads = 256;  // the producer warpgroup and one consumer
  static constexpr int kABytes = BM * kTmaBK * 2;
  static constexpr int kBBytes = 2 * kTmaBoxBytes;
  static constexpr int kSlotBytes = kABytes + kBBytes;
  static constexpr int kLoadBytes = kABytes + BN * kTmaBK * 2;  // what lands in a slot per K tile
  static constexpr int kStageBytes = 64 * kStageRowBytes;
  static constexpr int kStages = 8;
  static constexpr int kReleases = 5;  // `empty` arrivals: one from each block its loads reach
  static constexpr int kSmemBytes = kStages * kSlotBytes + kStageBytes + 16 * kStages + 1024;
  static_assert(kSmemBytes <= kTmaSmemLimit, "ring and staging must fit");
};

// Unit u of a clustered product (batch matrix, K split, then the cluster's 256 x 192 of the output) as
// block `rank` of the cluster takes it; p.tiles_m and p.tiles_n count 64 x 96 tiles.
__device__ __forceinline__ Unit cluster_unit_of(const Params& p, int u, int rank) {
  using C = ClusterConfig;
  const int groups_m = (p.tiles_m + C::kRowTiles - 1) / C::kRowTiles;
  const int groups_n = (p.tiles_n + C::kColTiles - 1) / C::kColTiles;
  const int per_batch = groups_m * groups_n;
  Unit w;
  w.bi = u / (per_batch * p.splits);
  const int rem = u - w.bi * per_batch * p.splits;
  w.split = rem / per_batch;
  int gm, gn;
  tile_coords(rem - w.split * per_batch, groups_m, groups_n, &gm, &gn);
  w.row0 = (gm * C::kRowTiles + rank / C::kColTiles) * C::BM;
  w.col0 = (gn * C::kColTiles + rank % C::kColTiles) * C::BN;
  w.kt0 = w.split * p.k_tiles_per_split;
  w.k_tiles = min(p.k_tiles_per_split, p.k_tiles - w.kt0);
  return w;
}

// Clustered units of a product (the launch's grid is 8 blocks a unit, at most).
__host__ __device__ inline long long cluster_units(const Params& p) {
  using C = ClusterConfig;
  return static_cast<long long>(p.batch) * p.splits * ((p.tiles_m + C::kRowTiles - 1) / C::kRowTiles) *
         ((p.tiles_n + C::kColTiles - 1) / C::kColTiles);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The consumer warpgroup's release of a ring slot in the five blocks that load into it, one arrival each
// (CUTLASS's sm90 TMA pipeline spreads them over the warpgroup the same way, once every warp's wait for
// the products has returned): lane 0 of warp q at block q of its column (ranks i, i + 2, i + 4, i + 6, its
// own among them), lane 1 of warp 0 at its row partner. Twenty arrivals, one per consumer warp and block,
// took 13.8-13.9 us over 768 x 768 x 4096 against 13.3-13.4 for these five (H100, bf16_notes.md).
struct ClusterRelease {
  bool arrives;
  int target;
  __device__ __forceinline__ ClusterRelease(int lane, int wq, int rank)
      : arrives(lane == 0 || (lane == 1 && wq == 0)), target(lane == 0 ? rank % 2 + 2 * wq : rank ^ 1) {}
  __device__ __forceinline__ void operator()(uint32_t empty) const {
    if (arrives) tma::mbar_arrive_cluster(empty, target);
  }
};
#endif

// b2_map: an MN-major B's columns 64..95 of a tile, in 32-column boxes (unused for a K-major B).
template <bool A_KMAJOR, bool B_KMAJOR>
__global__ void __launch_bounds__(ClusterConfig::kThreads, 1)
    matmul_bf16_cluster_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                               const __grid_constant__ CUtensorMap b2_map, const __grid_constant__ CUtensorMap out_map,
                               const TmaParams tp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = ClusterConfig;
  constexpr int S = Cfg::kStages;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (mt::shared_address(smem_raw) + 1023) & ~1023u;
  const uint32_t staging = base + S * Cfg::kSlotBytes;
  const uint32_t bars = staging + Cfg::kStageBytes;
  using Ring = RingPos<S>;
  const Params& p = tp.p;
  const int units = static_cast<int>(cluster_units(p));
  const int rank = static_cast<int>(tma::cluster_rank());
  const int first = blockIdx.x / Cfg::kBlocks, step = gridDim.x / Cfg::kBlocks;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      tma::mbar_init(Ring::full(bars, s), 1);
      tma::mbar_init(Ring::empty(bars, s), Cfg::kReleases);
    }
    tma::fence_barrier_init();
    tma::prefetch_tensormap(a_map);
    tma::prefetch_tensormap(b_map);
    if (!B_KMAJOR) tma::prefetch_tensormap(b2_map);
    if (tp.store != kStoreStaged) tma::prefetch_tensormap(out_map);
  }
  tma::cluster_sync();  // every block's barriers ready before any loads into or arrives on them
  mt::join_prior_grids();

  if (warp < 4) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (threadIdx.x != 0) return;
    const int half = rank % 2, quarter = rank / 2;
    const uint16_t row_mask = 3u << (2 * quarter), col_mask = 0x55u << half;
    Ring pos;
    for (int u = first; u < units; u += step) {
      const Unit w = cluster_unit_of(p, u, rank);
      const int ba = tp.a_batched ? w.bi : 0, bb = tp.b_batched ? w.bi : 0;
      for (int kt = 0; kt < w.k_tiles; ++kt, pos.step()) {
        const int k0 = (w.kt0 + kt) * kTmaBK;
        const uint32_t full = Ring::full(bars, pos.slot), slot = base + pos.slot * Cfg::kSlotBytes;
        tma::mbar_wait(Ring::empty(bars, pos.slot), pos.phase ^ 1);
        tma::mbar_expect_tx(full, Cfg::kLoadBytes);
        if constexpr (A_KMAJOR) {  // rows 32 h.. of [64 rows][64 k]
          tma::tma_load_multicast(slot + half * 4096, a_map, full, k0, w.row0 + 32 * half, ba, row_mask);
        } else {  // k 32 h.. of [64 k][64 rows]
          tma::tma_load_multicast(slot + half * 4096, a_map, full, w.row0, k0 + 32 * half, ba, row_mask);
        }
        const uint32_t b = slot + Cfg::kABytes;
        if constexpr (B_KMAJOR) {  // rows 24 q.. of [96 rows][64 k]
          tma::tma_load_multicast(b + quarter * 3072, b_map, full, k0, w.col0 + 24 * quarter, bb, col_mask);
        } else {  // k 16 q.. of both boxes
          tma::tma_load_multicast(b + quarter * 2048, b_map, full, w.col0, k0 + 16 * quarter, bb, col_mask);
          tma::tma_load_multicast(b + kTmaBoxBytes + quarter * 2048, b2_map, full, w.col0 + 64, k0 + 16 * quarter, bb,
                                  col_mask);
        }
      }
    }
    // The other blocks' consumers arrive on this block's barriers until they have released every slot.
    for (int i = 0; i < S; ++i, pos.step()) tma::mbar_wait(Ring::empty(bars, pos.slot), pos.phase ^ 1);
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(TmaConfig<Cfg::BM, Cfg::BN>::kConsumerRegs));
  const int wq = warp % 4, g = lane / 4, t = lane % 4;
  float acc[Cfg::BN / 2];
#pragma unroll
  for (int i = 0; i < Cfg::BN / 2; ++i) acc[i] = 0.f;
  Ring pos;
  int box = 0;
  const void* prefetch = epilogue_reads(p);
  for (int u = first; u < units; u += step) {
    const Unit w = cluster_unit_of(p, u, rank);
    if (prefetch != nullptr) prefetch_tile<Cfg::BN>(p, prefetch, w.bi, w.row0, w.col0);
    const ClusterRelease release(lane, wq, rank);
    consume_k_tiles<A_KMAJOR, B_KMAJOR, Cfg::BN, 64, S, Cfg::kABytes, Cfg::kSlotBytes>(acc, 0, base, bars, w.k_tiles,
                                                                                     pos, release);
    store_unit<false, Cfg::BN, Cfg::kStageBytes, 64>(tp, acc, out_map, staging, 0, w, wq, g, t, box);
  }
  if (tp.store != kStoreStaged && threadIdx.x % 128 == 0) tma::bulk_wait_all();  // the staging outlives its stores
#endif
}

}  // namespace bf16mm
