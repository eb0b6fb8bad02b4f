// The bf16 TMA kernel's epilogues that store through TMA (bf16_wgmma.cuh): a consumer warpgroup writes
// its tile's sums as bf16 into swizzled boxes of its staging buffer with stmatrix, and one of its threads
// stores each box with cp.async.bulk.tensor while the warpgroup goes on.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "../includes/tma.cuh"
#include "bf16_common.cuh"

namespace bf16mm {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Barrier of one consumer warpgroup (128 threads; ids 1 and 2, 0 being __syncthreads).
__device__ __forceinline__ void warpgroup_sync(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }

// The hand-off of a warpgroup's staging boxes to TMA stores, shared by store_tile_tma and
// store_tile_tma_t. Before the warpgroup writes boxes again, its issuing thread waits until at most
// PENDING of its bulk stores still read their boxes (one group a box), then the warpgroup syncs.
template <int PENDING>
__device__ __forceinline__ void boxes_free(bool issuer, int bar_id) {
  if (issuer) tma::bulk_wait_read<PENDING>();
  warpgroup_sync(bar_id);
}

// Once a warpgroup's epilogue has read its staging for the last time (its bulk stores' reads done, every
// thread past its own reads), so that the staging's memory may take TMA loads again.
__device__ __forceinline__ void staging_read(bool issuer, int bar_id) {
  if (issuer) tma::bulk_wait_read<0>();
  tma::fence_async_shared();
  warpgroup_sync(bar_id);
}

// After the warpgroup wrote its boxes: the writes made visible to the async proxy, then the warpgroup
// syncs, and the issuing thread may store them.
__device__ __forceinline__ void boxes_written(int bar_id) {
  tma::fence_async_shared();
  warpgroup_sync(bar_id);
}

// The hand-off of a tile's PIECES pieces of PER_PIECE boxes each, in a staging of NB boxes used in turn
// (box: the warpgroup's running count of them): write(piece, first box) writes a piece's boxes and
// store(piece, first box), on the issuing thread, stores them, a bulk group a box. Where the staging holds
// the whole tile, every piece is written before one hand-off (64 x 96 tiles: three pieces, whose epilogue
// took 1,379 cycles with a hand-off each; on an H200 GPT-2's attention projection's weight gradient, its
// operands in L2, 11.53 -> 11.39 us, and its qkv product, 96-column halves of 192 x 192 tiles through the
// transposed stores, 25.2-25.3 -> 24.9-25.0; bf16_notes.md, twenty-third session); else a piece at a time,
// its boxes written while the stores of the one before drain.
template <int PIECES, int PER_PIECE, int NB, class Write, class Store>
__device__ __forceinline__ void hand_off_pieces(bool issuer, int bar_id, int& box, const Write& write,
                                                const Store& store) {
  constexpr bool kWhole = PIECES * PER_PIECE <= NB;
  const int box0 = box;
#pragma unroll
  for (int piece = 0; piece < PIECES; ++piece) {
    if (!kWhole || piece == 0) boxes_free<kWhole ? NB - PIECES * PER_PIECE : NB - PER_PIECE>(issuer, bar_id);
    write(piece, box);
    if (!kWhole) {
      boxes_written(bar_id);
      if (issuer) store(piece, box);
    }
    box += PER_PIECE;
  }
  if (kWhole) {
    boxes_written(bar_id);
    if (issuer) {
#pragma unroll
      for (int piece = 0; piece < PIECES; ++piece) store(piece, box0 + PER_PIECE * piece);
    }
  }
}

// stmatrix.x4 (TRANS: each 8 x 8 matrix stored transposed): lane l gives the shared address of row l % 8
// of matrix l / 8 (of its column l % 8 with TRANS), and m[i] is the thread's pair of matrix i: row g,
// columns 2 t and 2 t + 1, the layout of a wgmma accumulator's 8 x 8 blocks.
template <bool TRANS>
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&m)[4]) {
  if constexpr (TRANS) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(m[0]),
                 "r"(m[1]), "r"(m[2]), "r"(m[3])
                 : "memory");
  } else {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(m[0]), "r"(m[1]),
                 "r"(m[2]), "r"(m[3])
                 : "memory");
  }
}

// Where the byte at offset o of a TMA box (from a 1024-byte aligned start) lies under the swizzle of
// SW-byte spans (128 or 64): its 16-byte chunk index XOR the 128-byte line's index mod SW / 16.
template <int SW>
__device__ __forceinline__ uint32_t swizzled(uint32_t o) {
  return o ^ (((o >> 7) & (SW / 16 - 1)) << 4);
}

// Two float32 sums as a bf16 pair (the lower column in the low half).
__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The epilogue of a bf16 output with no epilogue or + bias (no accumulation, no K splits) through TMA
// stores, so that the warpgroup goes on to its next tile while its stores drain: per piece of BOXC
// columns the warp writes its sums (+ bias) as bf16 with stmatrix, four 8 x 8 blocks an instruction,
// into the piece's boxes (4 KB each: 32 rows x 64 columns with the 128-byte swizzle, or, where BN is no
// multiple of 64 (192 x 96), 64 rows x 32 columns with the 64-byte swizzle) in its warpgroup's staging,
// and one thread stores them with cp.async.bulk.tensor (hand_off_pieces). Before a piece's boxes are
// written again the stores that read them must be done: without it the stores' drain (a wave's outputs
// evicting dirty lines from L2) held the tensor cores idle: qkv fwd 29.1 us, 21.4 without any stores.
template <int BN, int STAGE_BYTES>
__device__ __forceinline__ void store_tile_tma(const Params& p, const float (&acc)[BN / 2], const CUtensorMap& out_map,
                                               uint32_t stage, int bar_id, int bi, int row0, int col0, int wq, int t,
                                               int& box) {
  constexpr int BOXC = BN % 64 == 0 ? 64 : 32, BOXR = 2048 / BOXC, PER_PIECE = 64 / BOXR;
  constexpr int NB = STAGE_BYTES / 4096;
  static_assert(BN % BOXC == 0 && NB >= PER_PIECE, "whole pieces, a piece's boxes at a time");
  const int q = threadIdx.x % 32 / 8;
  const int row = wq * 16 + 8 * (q % 2) + threadIdx.x % 8;  // the lane's stmatrix row of the warpgroup's 64
  const uint32_t row_at = row % BOXR * 2 * BOXC + 16 * (q / 2);
  const __nv_bfloat16* bias = p.epilogue == kBias ? static_cast<const __nv_bfloat16*>(p.bias) : nullptr;
  const auto write = [&](int piece, int first) {
    const uint32_t buf = stage + (first + row / BOXR) % NB * 4096;
#pragma unroll
    for (int j = 0; j < BOXC / 8; j += 2) {
      uint32_t m[4];  // matrix 2 h + e: rows 8 e.. of the warp's 16, columns 8 (j + h)..
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int jj = BOXC / 8 * piece + j + h, c = col0 + BOXC * piece + 8 * (j + h) + 2 * t;
        float b0 = 0.f, b1 = 0.f;
        if (bias != nullptr) {
          if (c < p.N) b0 = __bfloat162float(bias[c]);
          if (c + 1 < p.N) b1 = __bfloat162float(bias[c + 1]);
        }
        m[2 * h] = bf16_pair(acc[4 * jj] + b0, acc[4 * jj + 1] + b1);
        m[2 * h + 1] = bf16_pair(acc[4 * jj + 2] + b0, acc[4 * jj + 3] + b1);
      }
      stmatrix_x4<false>(buf + swizzled<2 * BOXC>(row_at + 16 * j), m);
    }
  };
  const auto store = [&](int piece, int first) {
#pragma unroll
    for (int h = 0; h < PER_PIECE; ++h) {
      const int rr = row0 + BOXR * h, c = col0 + BOXC * piece;
      if (rr < p.M && c < p.N) tma::tma_store(out_map, stage + (first + h) % NB * 4096, c, rr, bi);
      tma::bulk_commit();
    }
  };
  hand_off_pieces<BN / BOXC, PER_PIECE, NB>(threadIdx.x % 128 == 0, bar_id, box, write, store);
}

// store_tile_tma for a product run as its transpose (launch_tma: C = A B with more rows than columns
// as D = C^T = B^T A^T, whose 192-row tiles cut C's 3072 x 768 weight gradient into 128 where C's own
// 128-row tiles make 96): D's rows are the output's columns. Per 32 columns of D the warp writes its
// sums as bf16 with stmatrix.trans into one box of 32 output rows x 64 output columns (D's 32 columns x
// the warpgroup's 64 rows, 4 KB, 128-byte swizzle: D's element (i, j) at byte 128 j + 16 ((i / 8) ^
// (j % 8)) + 2 (i % 8)), and one thread stores it through the output's map (inner dim the output's
// columns). NB boxes in turn, as store_tile_tma's.
template <int BN, int STAGE_BYTES>
__device__ __forceinline__ void store_tile_tma_t(const Params& p, const float (&acc)[BN / 2], const CUtensorMap& out_map,
                                                 uint32_t stage, int bar_id, int bi, int row0, int col0, int wq,
                                                 int& box) {
  constexpr int NB = STAGE_BYTES / 4096;
  static_assert(BN % 32 == 0 && NB >= 2, "whole 32-column pieces");
  const int q = threadIdx.x % 32 / 8;
  // the lane's stmatrix row: D column 8 (q / 2) + lane % 8 of a 16-column pair, D rows 8 (q % 2).. of the warp's 16
  const uint32_t row_at = (8 * (q / 2) + threadIdx.x % 8) * 128 + 16 * (2 * wq + q % 2);
  const auto write = [&](int piece, int first) {
    const uint32_t buf = stage + first % NB * 4096;
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
      uint32_t m[4];  // matrix 2 h + e: D rows 8 e.. of the warp's 16, D columns 8 (j + h)..
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int jj = 4 * piece + j + h;
        m[2 * h] = bf16_pair(acc[4 * jj], acc[4 * jj + 1]);
        m[2 * h + 1] = bf16_pair(acc[4 * jj + 2], acc[4 * jj + 3]);
      }
      stmatrix_x4<true>(buf + swizzled<128>(row_at + 8 * 128 * j), m);
    }
  };
  const auto store = [&](int piece, int first) {
    const int c = row0, r = col0 + 32 * piece;  // the box's first output column (D row) and row
    if (c < p.M && r < p.N) tma::tma_store(out_map, stage + first % NB * 4096, c, r, bi);
    tma::bulk_commit();
  };
  hand_off_pieces<BN / 32, 1, NB>(threadIdx.x % 128 == 0, bar_id, box, write, store);
}

#endif

}  // namespace bf16mm
