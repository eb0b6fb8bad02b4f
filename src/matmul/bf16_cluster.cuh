// The Hopper kernel for tiles whose consumer warpgroups issue m64n96 products (bf16_wgmma.cuh's pipeline:
// its K loop, consume_k_tiles, and its epilogues, store_unit), with B in 128-byte-swizzled boxes:
//   - 192 x 96, one block at a time (Tile192x96), a consumer warpgroup per 64 rows: the planner's tiles
//     for GPT-2's fc weight gradient (768 x 3072 x 4096, 128 tiles) and fc proj's as its transpose.
//   - 192 x 192, one block at a time (Tile192x192), a K-major B: a consumer warpgroup per 96-row half of
//     B, three m64n96 products a k16 step on the whole A tile, 4 ring slots of 48 KB (the 96-column halves
//     of an MN-major B would need two boxes each, 56 KB slots, 3 of them: GPT-2's qkv product 28.0 us
//     against 26.2 as its transpose with 4; bf16_notes.md, eighteenth session). The planner's tiles for
//     GPT-2's qkv product as its transpose (2304 x 4096 x 768, 264 tiles in two waves on 132 SMs).
//   - 64 x 96 in clusters of 8 (Clustered64x96), for products with few tiles and a long K such as the
//     attention projection's weight gradient (768 x 768 x 4096): the blocks load each operand tile once
//     for the blocks that share it, with TMA multicast. A cluster covers 4 row tiles x 2 column tiles
//     (256 x 192 of the output); block rank r takes row tile r / 2 and column tile r % 2 of the cluster's.
//     The two blocks of a row tile share its A tile, each TMA-loading half of every K tile's A (K-major:
//     32 of its 64 rows; MN-major: 32 of its 64 k) into both; the four blocks of a column tile share its
//     B tile, each loading a quarter (K-major: 24 of its 96 rows; MN-major: 16 of its 64 k of both boxes)
//     into all four. A block's `full` barrier counts the whole K tile's bytes, whichever block loaded
//     them; its `empty` barrier counts the consumers of the five blocks its own loads reach, each of which
//     releases the slot in every block that loads into it. So each block reads 7 KB a K tile from L2
//     where an unclustered 64 x 96 block reads 20: 96 tiles of 768 x 768 x 4096 took 19.5-23 us without
//     clusters against the 15.1 of 72 unclustered 64 x 128 tiles on an H100 (bf16_notes.md, sixteenth
//     session), 13.3 with them; cuBLAS runs this product the same way (`nvjet_sm90_tst_96x64_64x8_2x4`).
// An MN-major B lies in two [64 k][64 columns] boxes (8 KB each, the second holding columns 64..95 in the
// first 64 bytes of its 128-byte rows, loaded through a map of 32-column boxes under the 128-byte swizzle)
// read by one m64n96 product a k16 step; a K-major one in one [96 rows][64 k] box. Where 192 x 96 tiles had
// B in three 32-column boxes under the 64-byte swizzle (bf16_wgmma.cuh's kernel until the seventeenth
// session), fc dW took 29.3-29.7 us and fc proj dW 29.4-29.6, against 29.0 and 28.9-29.1 here; loading 64
// columns in the second box, half unused, took the clustered attn proj dW 14.1 us against 13.7-13.8.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "../includes/dependent_launch.cuh"
#include "../includes/ptx.cuh"
#include "../includes/tma.cuh"
#include "bf16_wgmma.cuh"

namespace bf16mm {

// Tiles BM x 96 HALVES in clusters of ROW_TILES x COL_TILES blocks: the COL_TILES blocks of a row share its
// A tile, each loading 1 / COL_TILES of it; the ROW_TILES blocks of a column share its B tile, each
// loading 1 / ROW_TILES of it. A consumer warpgroup per 64 rows where HALVES is 1 (BM 64 or 192); where
// it is 2 (192 x 192, one block, a K-major B), one per 96-row half of B, each over all BM rows: BM / 64
// m64n96 products a k16 step, on the same A tile and its half of B.
template <int BM_, int ROW_TILES, int COL_TILES = 2, int HALVES = 1>
struct ClusterConfig {
  static_assert(COL_TILES == 1 || COL_TILES == 2, "a row's blocks: one, or a pair");
  static_assert(HALVES == 1 || (ROW_TILES == 1 && COL_TILES == 1), "192-wide tiles run one block a cluster");
  static constexpr int BM = BM_, BN = 96 * HALVES, kHalves = HALVES;
  static constexpr int kRowTiles = ROW_TILES, kColTiles = COL_TILES, kBlocks = kRowTiles * kColTiles;
  static constexpr int kConsumers = HALVES == 1 ? BM / 64 : HALVES;
  static constexpr int kRowBlocks = HALVES == 1 ? 1 : BM / 64;  // a consumer warpgroup's 64-row blocks
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kConsumerRegs = consumer_regs(kConsumers);
  static constexpr int kABytes = BM * kTmaBK * 2;
  // a 96-column B: MN-major, two boxes (the second padded); K-major (192-wide tiles' halves), 96 rows
  static constexpr int kHalfBytes = HALVES == 1 ? 2 * kTmaBoxBytes : 96 * 128;
  static constexpr int kBBytes = HALVES * kHalfBytes;
  static constexpr int kSlotBytes = kABytes + kBBytes;
  static constexpr int kLoadBytes = kABytes + BN * kTmaBK * 2;  // what lands in a slot per K tile
  // a warpgroup's staging: 64 rows, or 32 with three consumers (a fifth ring slot for 192 x 96)
  static constexpr int kStageRows = kConsumers == 3 ? 32 : 64;
  static constexpr int kStageBytes = kStageRows * kStageRowBytes;
  // The staging in the ring slot of a unit's last K tile, held until the epilogue has read it (the block's
  // last unit's, for good), where that buys the ring a slot: 64 x 96 tiles, 9 slots of 24 KB against 8
  // beside 16 KB of staging. GPT-2's attention projection's weight gradient (96 tiles, K 4096, its operands
  // read from DRAM) 12.9-13.0 -> 12.5 us (H200, cuBLAS 12.7-12.9; bf16_notes.md, twenty-third session).
  static constexpr bool kStagingInRing = kConsumers * kStageBytes <= kSlotBytes &&
                                         ring_slots(0, 0, kSlotBytes) > ring_slots(kConsumers, kStageBytes, kSlotBytes);
  static constexpr int kStages =
      kStagingInRing ? ring_slots(0, 0, kSlotBytes) : ring_stages(kConsumers, kStageBytes, kSlotBytes);
  // `empty` arrivals: one from each consumer warpgroup of every block its loads reach (its row partner
  // and its column's ROW_TILES blocks, itself among them)
  static constexpr int kReleases = kConsumers * (kColTiles - 1 + kRowTiles);
  static constexpr int kSmemBytes = ring_smem_bytes(kStages, kSlotBytes, kStagingInRing ? 0 : kConsumers, kStageBytes);
  static_assert(kStages >= 4 && kSmemBytes <= kTmaSmemLimit, "ring and staging must fit");
  // A's part a block loads: K-major, BM / COL_TILES of its rows; MN-major, 64 / COL_TILES of the k of each
  // 64-row box. B's, of each half: K-major, 96 / ROW_TILES of its rows; MN-major, 64 / ROW_TILES of the k
  // of both boxes.
  static constexpr int kAPartRows = BM / kColTiles, kAPartK = kTmaBK / kColTiles;
  static constexpr int kBPartRows = 96 / kRowTiles, kBPartK = kTmaBK / kRowTiles;
};
using Clustered64x96 = ClusterConfig<64, 4, 2>;  // 8 blocks: 256 x 192 of the output
using Tile192x96 = ClusterConfig<192, 1, 1>;     // a cluster of one block
using Tile192x192 = ClusterConfig<192, 1, 1, 2>;  // K-major B only

// Unit u of a clustered product (batch matrix, K split, then the cluster's part of the output) as
// block `rank` of the cluster takes it; p.tiles_m and p.tiles_n count BM x BN tiles.
template <class C>
__device__ __forceinline__ Unit cluster_unit_of(const Params& p, int u, int rank) {
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

// Clustered units of a product (the launch's grid is C::kBlocks blocks a unit, at most).
template <class C>
__host__ __device__ inline long long cluster_units(const Params& p) {
  return static_cast<long long>(p.batch) * p.splits * ((p.tiles_m + C::kRowTiles - 1) / C::kRowTiles) *
         ((p.tiles_n + C::kColTiles - 1) / C::kColTiles);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A consumer warpgroup's release of a ring slot in the blocks that load into it, one arrival each
// (CUTLASS's sm90 TMA pipeline spreads them over the warpgroup the same way, once every warp's wait for
// the products has returned): lane 0 of warp q < ROW_TILES at block q of its column (ranks i, i + 2, ..,
// its own among them), lane 1 of warp 0 at its row partner (in a one-block cluster: lane 0 of warp 0, a
// local arrival). Twenty arrivals, one per consumer warp and block, took 13.8-13.9 us over 768 x 768 x
// 4096 against 13.3-13.4 for these five (H100, bf16_notes.md).
template <class C>
struct ClusterRelease {
  bool arrives;
  int target;
  __device__ __forceinline__ ClusterRelease(int lane, int wq, int rank)
      : arrives((lane == 0 && wq < C::kRowTiles) || (lane == 1 && wq == 0 && C::kColTiles == 2)),
        target(lane == 0 ? rank % C::kColTiles + C::kColTiles * wq : rank ^ 1) {}
  __device__ __forceinline__ void operator()(uint32_t empty) const {
    if constexpr (C::kBlocks == 1) {
      if (arrives) tma::mbar_arrive(empty);
    } else {
      if (arrives) tma::mbar_arrive_cluster(empty, target);
    }
  }
};

// A TMA load of part of an operand tile into the blocks of `mask` (multicast), or, in a one-block
// cluster, into this block alone.
template <class C>
__device__ __forceinline__ void load_part(uint32_t dst, const CUtensorMap& map, uint32_t bar, int c0, int c1, int c2,
                                          uint16_t mask) {
  if constexpr (C::kBlocks == 1) {
    tma::tma_load(dst, map, bar, c0, c1, c2);
  } else {
    tma::tma_load_multicast(dst, map, bar, c0, c1, c2, mask);
  }
}
#endif

// b2_map: an MN-major B's columns 64..95 of a tile, in 32-column boxes (unused for a K-major B).
template <class C, bool A_KMAJOR, bool B_KMAJOR, int KIND>
__global__ void __launch_bounds__(C::kThreads, 1)
    matmul_bf16_cluster_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                               const __grid_constant__ CUtensorMap b2_map, const __grid_constant__ CUtensorMap out_map,
                               const TmaParams tp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(C::kHalves == 1 || B_KMAJOR, "192-wide tiles: B's halves start on swizzle atoms only K-major");
  constexpr int S = C::kStages;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (mt::shared_address(smem_raw) + 1023) & ~1023u;
  // one C::kStageBytes buffer per consumer warpgroup, here or in a ring slot (kStagingInRing)
  const uint32_t staging = base + S * C::kSlotBytes;
  const uint32_t bars = staging + (C::kStagingInRing ? 0 : C::kConsumers * C::kStageBytes);
  using Ring = RingPos<S>;
  const Params& p = tp.p;
  const int units = static_cast<int>(cluster_units<C>(p));
  const int rank = static_cast<int>(tma::cluster_rank());
  const int first = blockIdx.x / C::kBlocks, step = gridDim.x / C::kBlocks;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  if (threadIdx.x == 0) {
    Ring::init(bars, C::kReleases);
    tma::prefetch_tensormap(a_map);
    tma::prefetch_tensormap(b_map);
    if (!B_KMAJOR) tma::prefetch_tensormap(b2_map);
    if (KIND == kTmaStores) tma::prefetch_tensormap(out_map);
  }
  tma::cluster_sync();  // every block's barriers ready before any loads into or arrives on them
  mt::join_prior_grids();

  if (warp < 4) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (threadIdx.x != 0) return;
    const int half = rank % C::kColTiles, part = rank / C::kColTiles;
    const uint16_t row_mask = static_cast<uint16_t>(((1u << C::kColTiles) - 1) << (C::kColTiles * part));
    uint16_t col_mask = 0;
    for (int q = 0; q < C::kRowTiles; ++q) col_mask |= static_cast<uint16_t>(1u << (half + C::kColTiles * q));
    Ring pos;
    for (int u = first; u < units; u += step) {
      const Unit w = cluster_unit_of<C>(p, u, rank);
      const int ba = tp.a_batched ? w.bi : 0, bb = tp.b_batched ? w.bi : 0;
      for (int kt = 0; kt < w.k_tiles; ++kt, pos.step()) {
        const int k0 = (w.kt0 + kt) * kTmaBK;
        const uint32_t full = Ring::full(bars, pos.slot), slot = base + pos.slot * C::kSlotBytes;
        tma::mbar_wait(Ring::empty(bars, pos.slot), pos.phase ^ 1);
        tma::mbar_expect_tx(full, C::kLoadBytes);
        if constexpr (A_KMAJOR) {  // rows kAPartRows h.. of [BM rows][64 k]
          load_part<C>(slot + half * C::kAPartRows * 128, a_map, full, k0, w.row0 + C::kAPartRows * half, ba,
                       row_mask);
        } else {  // k kAPartK h.. of each [64 k][64 rows]
#pragma unroll
          for (int i = 0; i < C::BM / 64; ++i) {
            load_part<C>(slot + i * kTmaBoxBytes + half * C::kAPartK * 128, a_map, full, w.row0 + 64 * i,
                         k0 + C::kAPartK * half, ba, row_mask);
          }
        }
#pragma unroll
        for (int h = 0; h < C::kHalves; ++h) {
          const uint32_t b = slot + C::kABytes + h * C::kHalfBytes;
          const int col = w.col0 + 96 * h;
          if constexpr (B_KMAJOR) {  // rows kBPartRows q.. of [96 rows][64 k]
            load_part<C>(b + part * C::kBPartRows * 128, b_map, full, k0, col + C::kBPartRows * part, bb, col_mask);
          } else {  // k kBPartK q.. of both boxes
            const uint32_t at = part * C::kBPartK * 128;
            const int k = k0 + C::kBPartK * part;
            load_part<C>(b + at, b_map, full, col, k, bb, col_mask);
            load_part<C>(b + kTmaBoxBytes + at, b2_map, full, col + 64, k, bb, col_mask);
          }
        }
      }
    }
    // The other blocks' consumers arrive on this block's barriers until they have released every slot (but
    // the last K tile's, which holds the last unit's staging where kStagingInRing: never released).
    for (int i = 0; i < S - (C::kStagingInRing ? 1 : 0); ++i, pos.step()) {
      tma::mbar_wait(Ring::empty(bars, pos.slot), pos.phase ^ 1);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs));
  // the warpgroup index broadcast from lane 0, as bf16_wgmma.cuh's kernel does; its first row block and
  // its half of B
  const int cw = C::kConsumers == 1 ? 0 : __shfl_sync(0xffffffffu, warp / 4, 0) - 1;
  const int block0 = C::kHalves == 1 ? cw : 0, half = C::kHalves == 1 ? 0 : cw;
  const int wq = warp % 4, g = lane / 4, t = lane % 4;
  constexpr int RB = C::kRowBlocks;
  float acc[RB][96 / 2];  // row block i's m64n96 sums
#pragma unroll
  for (int i = 0; i < RB; ++i) {
#pragma unroll
    for (int j = 0; j < 96 / 2; ++j) acc[i][j] = 0.f;
  }
  Ring pos;
  int box = 0;
  const void* prefetch = epilogue_reads(p);
  const ClusterRelease<C> release(lane, wq, rank);
  for (int u = first; u < units; u += step) {
    const Unit w = cluster_unit_of<C>(p, u, rank);
    const int row0 = w.row0 + 64 * block0, col0 = w.col0 + 96 * half;
    if (prefetch != nullptr) {
#pragma unroll 1
      for (int i = 0; i < RB; ++i) prefetch_tile<96>(p, prefetch, w.bi, row0 + 64 * i, col0);
    }
    const uint32_t a_at = block0 * kTmaBoxBytes, b_at = C::kABytes + half * C::kHalfBytes;
    const uint32_t held = consume_k_tiles<A_KMAJOR, B_KMAJOR, 96, S, C::kSlotBytes, C::kStagingInRing>(
        acc, a_at, b_at, base, bars, w.k_tiles, pos, release);
    const uint32_t stage = (C::kStagingInRing ? base + (pos.slot + S - 1) % S * C::kSlotBytes : staging) +
                           cw * C::kStageBytes;  // in the ring: the slot of the unit's last K tile
#pragma unroll
    for (int i = 0; i < RB; ++i) {
      store_unit<KIND, C::BM == 192, 96, C::kStageBytes, C::kStageRows>(tp, acc[i], out_map, stage, 1 + cw, w,
                                                                          row0 + 64 * i, col0, wq, g, t, box);
    }
    if (C::kStagingInRing && u + step < units) {  // the slot takes the next unit's loads
      staging_read(threadIdx.x % 128 == 0, 1 + cw);
      release(held);
    }
  }
  if (KIND == kTmaStores && threadIdx.x % 128 == 0) tma::bulk_wait_all();  // the staging outlives its stores
#endif
}

}  // namespace bf16mm
