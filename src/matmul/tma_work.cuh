// The work of the TMA path's persistent blocks (tma_kernel.cuh): which output tiles, K splits and
// stream-K shares of K tiles a block takes (stream_k.cuh's walk), and which tile is where.
#pragma once

#include <cuda_runtime.h>

#include "params.cuh"
#include "stream_k.cuh"

namespace tma {

constexpr int kBM = kSkRows;  // rows of a block tile

// What the kernel needs beyond the epilogue's MatmulParams (which keep the output's orientation): the
// product's orientation and operands, and its work (stream_k.cuh: data-parallel units, then stream-K
// shares of the later tiles' K tiles).
struct Params {
  MatmulParams p;
  int rows, cols;     // the kernel's product: rows x cols
  bool transposed;    // kernel element (r, c) is output element (c, r)
  bool a_batched, b_batched;
  int tiles_m, tiles_n, k_tiles;  // tiles of one batch matrix; K tiles of one tile
  int splits, k_tiles_per_split;
  int dp_units;
  long long sk_iters;  // the K tiles of the stream-K tiles (those after the data-parallel units)
  SkExchange sk;
};

struct Tile {
  int bi, row0, col0;
};

template <int BN>
__device__ __forceinline__ Tile tile_of(const Params& tp, int t) {
  const int per_batch = tp.tiles_m * tp.tiles_n;
  Tile w;
  w.bi = t / per_batch;
  int tm, tn;
  tile_coords(t - w.bi * per_batch, tp.tiles_m, tp.tiles_n, &tm, &tn);
  w.row0 = tm * kBM;
  w.col0 = tn * BN;
  return w;
}

}  // namespace tma
