// The cp.async staging shared by the mma.sync and wgmma kernels: operand tiles of ROWS x kBK in shared
// memory stream through a STAGES-deep cp.async ring, and the output tile leaves through shared memory.
// Each operand tile keeps the global memory's contiguous dim contiguous in shared memory, so 16-byte
// copies work for transposed views too:
//   k-contiguous tile:    [rows][32 + 8]   (a thread reads k = 2t, 2t + 1 of a row as one float2),
//   rows-contiguous tile: [32][rows + 4]   (k = 2t and 2t + 1 from two rows).
// Reading k = 2t, 2t + 1 into the fragment slots of k = t, t + 4 (fragment layout in
// includes/mma_tf32.cuh) permutes k the same way in A and B, which leaves the product unchanged and
// makes every fragment read free of bank conflicts.
// 16-byte copies need the contiguous dim at stride 1, 16-byte aligned rows and base; a chunk that
// crosses the matrix edge goes as 4-byte copies of its valid part and zero-fills the rest. Other
// layouts take 4-byte copies.
#pragma once

#include <cuda_runtime.h>

#include "../includes/layout.cuh"
#include "../includes/ptx.cuh"
#include "../includes/vec.cuh"
#include "epilogue.cuh"
#include "params.cuh"

namespace {

// Stages a chunk of 4 elements src[0], src[step], .. whose first `valid` (0..4) lie inside the matrix
// into dst[0..4), zero-filling the rest: one 16-byte copy when `vec` (unit step, 16-byte aligned) and
// the chunk is whole or empty, else a 4-byte copy per element. A chunk cut by the matrix edge never
// takes a 16-byte copy of fewer source bytes: that copy would read only the valid ones, but
// compute-sanitizer's initcheck reports it as a 16-byte read, so the never-written padding after a
// row (the fused classifier's logits rows, padded to 4 floats) showed up as uninitialized reads.
// base: any address inside the matrix (the copies of absent elements name it but read nothing).
__device__ __forceinline__ void copy_chunk(float* dst, const float* src, long long step, int valid, bool vec,
                                           const float* base) {
  if (vec && valid % 4 == 0) {
    mt::cp_async_16(dst, valid > 0 ? src : base, valid > 0);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) mt::cp_async_4(dst + e, e < valid ? src + e * step : base, e < valid);
  }
}

// One operand tile of ROWS x kBK in shared memory; X[row, k] = x[row * row_stride + k * k_stride].
// The tile is cut into chunks of 4 elements along its contiguous dim, THREADS chunks per pass.
template <int ROWS, bool K_CONTIG, int THREADS>
struct OperandTile {
  static constexpr int kStride = K_CONTIG ? kBK + 8 : ROWS + 4;
  static constexpr int kFloats = K_CONTIG ? ROWS * kStride : kBK * kStride;
  static constexpr int kChunks = ROWS * kBK / 4;
  static_assert(kChunks % THREADS == 0, "tile must split evenly over the threads");

  // Rows row0.. and k k0.. of X; rows >= rows and k >= k_end read as zeros. Any strides.
  __device__ __forceinline__ static void load(float* tile, const float* x, int row0, int rows, int k0, int k_end,
                                              int row_stride, int k_stride, bool vec) {
    // Rolled: unrolled, the compiler keeps every chunk's address live across the K loop.
#pragma unroll 1
    for (int i = 0; i < kChunks / THREADS; ++i) {
      const int c = threadIdx.x + i * THREADS;
      const int r = K_CONTIG ? c / (kBK / 4) : (c % (ROWS / 4)) * 4;
      const int k = K_CONTIG ? (c % (kBK / 4)) * 4 : c / (ROWS / 4);
      float* dst = tile + (K_CONTIG ? r * kStride + k : k * kStride + r);
      const int gr = row0 + r, gk = k0 + k;
      // Elements of this chunk inside the matrix along its contiguous dim, and whether the other
      // index is inside.
      const int along = K_CONTIG ? k_end - gk : rows - gr;
      const bool inside = K_CONTIG ? gr < rows : gk < k_end;
      const int valid = inside ? max(0, min(4, along)) : 0;
      const float* src = x + (static_cast<long long>(gr) * row_stride + static_cast<long long>(gk) * k_stride);
      copy_chunk(dst, src, K_CONTIG ? k_stride : row_stride, valid, vec, x);
    }
  }

  // The same for a K tile inside the matrix (k0 + kBK <= k_end) with 16-byte copies, at a few
  // instructions per chunk: a thread's chunks share their position along the contiguous dim and step
  // by a fixed number of lines, so only the row bound varies.
  __device__ __forceinline__ static void load_interior(float* tile, const float* x, int row0, int rows, int k0,
                                                       int row_stride, int k_stride) {
    constexpr int kPerLine = K_CONTIG ? kBK / 4 : ROWS / 4;  // chunks along the contiguous dim
    constexpr int kLines = THREADS / kPerLine;                // lines (rows, or k) one pass covers
    static_assert(THREADS % kPerLine == 0, "a pass must cover whole lines");
    const int line0 = threadIdx.x / kPerLine, along = (threadIdx.x % kPerLine) * 4;
    float* dst = tile + line0 * kStride + along;
    if (K_CONTIG) {
      const float* src = x + static_cast<long long>(row0 + line0) * row_stride + k0 + along;
#pragma unroll
      for (int i = 0; i < kChunks / THREADS; ++i) {
        const bool inside = row0 + line0 + i * kLines < rows;
        mt::cp_async_16(dst + i * kLines * kStride, inside ? src + static_cast<long long>(i * kLines) * row_stride : x,
                        inside);
      }
    } else {
      const int valid = max(0, min(4, rows - row0 - along));
      const float* src = x + row0 + along + static_cast<long long>(k0 + line0) * k_stride;
      // A thread's chunks all hold `valid` elements: the test stays out of the loop, whose whole chunks
      // keep their one copy each.
      if (valid % 4 == 0) {
#pragma unroll
        for (int i = 0; i < kChunks / THREADS; ++i) {
          const float* line = src + static_cast<long long>(i * kLines) * k_stride;
          mt::cp_async_16(dst + i * kLines * kStride, valid > 0 ? line : x, valid > 0);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kChunks / THREADS; ++i) {
          const float* line = src + static_cast<long long>(i * kLines) * k_stride;
          copy_chunk(dst + i * kLines * kStride, line, 1, valid, false, x);
        }
      }
    }
  }

  // Fragment words for k = k8 + 2t and k8 + 2t + 1 of tile row `row`.
  __device__ __forceinline__ static float2 pair(const float* tile, int row, int k8, int t) {
    if (K_CONTIG) return *reinterpret_cast<const float2*>(tile + row * kStride + k8 + 2 * t);
    return make_float2(tile[(k8 + 2 * t) * kStride + row], tile[(k8 + 2 * t + 1) * kStride + row]);
  }
};

// The block's outputs leave through shared memory: each thread puts its C fragments into a
// [BM][BN + 8] tile (float2 writes without bank conflicts), then rows go out as chunks of 4 columns,
// a warp covering 128 consecutive columns.
template <int BN>
__device__ __forceinline__ void put_fragment(float* tile, int row, int col, const float* c) {
  *reinterpret_cast<float2*>(tile + row * (BN + 8) + col) = make_float2(c[0], c[1]);
  *reinterpret_cast<float2*>(tile + (row + 8) * (BN + 8) + col) = make_float2(c[2], c[3]);
}

template <int BM, int BN, int THREADS>
__device__ __forceinline__ void store_tile(const MatmulParams& p, const float* tile, int bi, int row0, int col0) {
  const long long mat = static_cast<long long>(bi) * p.M * p.ldc;
  float* out = p.out + blockIdx.y * p.split_stride + mat;
  float* pre = p.pre_act != nullptr ? p.pre_act + mat : nullptr;
  for (int c = threadIdx.x; c < BM * BN / 4; c += THREADS) {
    const int r = c / (BN / 4), cc = (c % (BN / 4)) * 4;
    const int row = row0 + r, col = col0 + cc;
    if (row < p.M && col < p.N) {
      const float4 v = mt::load_float4(tile + r * (BN + 8) + cc);
      store_run<4>(p, out, pre, static_cast<long long>(row) * p.ldc + col, col, {v.x, v.y, v.z, v.w}, min(4, p.N - col));
    }
  }
}

// Stages K tile k0.. of both operands (rows row0.. of A, columns col0.. of B).
template <class ATile, class BTile>
__device__ __forceinline__ void load_k_tile(const MatmulParams& p, const float* A, const float* B, float* a_dst,
                                            float* b_dst, int row0, int col0, int k0, int k_end) {
  const bool interior = k0 + kBK <= k_end;
  if (p.a_vec && interior) {
    ATile::load_interior(a_dst, A, row0, p.M, k0, p.a_row_stride, p.a_k_stride);
  } else {
    ATile::load(a_dst, A, row0, p.M, k0, k_end, p.a_row_stride, p.a_k_stride, p.a_vec);
  }
  if (p.b_vec && interior) {
    BTile::load_interior(b_dst, B, col0, p.N, k0, p.b_col_stride, p.b_k_stride);
  } else {
    BTile::load(b_dst, B, col0, p.N, k0, k_end, p.b_col_stride, p.b_k_stride, p.b_vec);
  }
}

// What a block computes: the BM x BN output tile at (row0, col0) over its split's K tiles.
struct BlockWork {
  int row0, col0, kt_begin, k_tiles, k_end;

  __device__ BlockWork(const MatmulParams& p, int BM, int BN) {
    int tm, tn;
    tile_coords(blockIdx.x, p.tiles_m, p.tiles_n, &tm, &tn);
    row0 = tm * BM, col0 = tn * BN;
    kt_begin = blockIdx.y * p.k_tiles_per_split;
    k_tiles = max(0, min(p.k_tiles_per_split, (p.K + kBK - 1) / kBK - kt_begin));
    k_end = min(p.K, (kt_begin + k_tiles) * kBK);
  }
};

// Queues the copies of K tile kt of the block's work into ring slot kt % STAGES (none past the last
// tile) and commits a group either way, so that cp_async_wait<STAGES - 2> always means "tile kt landed".
template <class ATile, class BTile, int STAGES>
__device__ __forceinline__ void load_ring_stage(const MatmulParams& p, const BlockWork& w, const float* A, const float* B,
                                                float* a_smem, float* b_smem, int kt) {
  if (kt < w.k_tiles) {
    const int slot = kt % STAGES;
    load_k_tile<ATile, BTile>(p, A, B, a_smem + slot * ATile::kFloats, b_smem + slot * BTile::kFloats, w.row0, w.col0,
                              (w.kt_begin + kt) * kBK, w.k_end);
  }
  mt::cp_async_commit();
}

}  // namespace
