// The work of the TMA path's persistent blocks (tma_kernel.cuh): which output tiles, K splits and
// stream-K shares of K tiles a block takes, in which order, and the stream-K workspace (partial tiles
// and the flags that say a part is written).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "params.cuh"

namespace tma {

constexpr int kBM = 128;  // rows of a block tile

// What the kernel needs beyond the epilogue's MatmulParams (which keep the output's orientation).
// Work: the data-parallel units [0, dp_units) are output tiles, or (tile, K split) pairs whose partial
// products split_k_reduce adds up later (block c takes units c, c + grid, ...); then the K tiles of
// tiles [dp_units, tiles) (no K splits then) are dealt out in equal contiguous shares, one per block
// (stream-K), so that every block gets the same number of K tiles however few output tiles there are.
// A tile shared by several blocks is finished by the block holding its first K tiles: the others leave
// their partial sums in `partials` and raise their `flags` (to this launch's token).
struct Params {
  MatmulParams p;
  int rows, cols;     // the kernel's product: rows x cols
  bool transposed;    // kernel element (r, c) is output element (c, r)
  bool a_batched, b_batched;
  int tiles_m, tiles_n, k_tiles;  // tiles of one batch matrix; K tiles of one tile
  int splits, k_tiles_per_split;
  int dp_units;
  long long sk_iters;  // the K tiles of the stream-K tiles (those after the data-parallel units)
  float* partials;     // block c's partial tile at partials + c * kBM * BN, in the consumers' register order
  unsigned long long* flags;  // flags[8 c + w] = token once consumer warp w of block c wrote its part
  unsigned long long token;   // this launch's flag value (see launch_token)
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

// A block's piece of one tile: K tiles [kt0, kt0 + k_tiles), of K split `split`. kWhole: all of the
// tile's (or split's) K tiles; kHead: the first ones, and the block finishes the tile with the later
// blocks' parts; kTail: a later part, left in partials.
enum Role { kWhole, kHead, kTail };
struct Segment {
  int tile, split, kt0, k_tiles, role;
};

// First stream-K K tile of block c (c = gridDim.x: the end).
__device__ __forceinline__ long long sk_begin(const Params& tp, int c) {
  return static_cast<long long>(c) * tp.sk_iters / gridDim.x;
}

// The block whose stream-K share holds K tile i: the largest c with sk_begin(c) <= i.
__device__ __forceinline__ int sk_block(const Params& tp, long long i) {
  return static_cast<int>(((i + 1) * gridDim.x + tp.sk_iters - 1) / tp.sk_iters - 1);
}

// A block's walk over its work, in order: its data-parallel units, then its stream-K share (at most a
// kTail first and a kHead last). The producer, transform and consumer warps all walk it:
//   for (Walk wk = walk_start(tp); next_segment(tp, wk, sg);) ...
struct Walk {
  int u;             // the next data-parallel unit
  long long i, end;  // the stream-K K tiles left
};

__device__ __forceinline__ Walk walk_start(const Params& tp) {
  return Walk{static_cast<int>(blockIdx.x), sk_begin(tp, blockIdx.x), sk_begin(tp, blockIdx.x + 1)};
}

__device__ __forceinline__ bool next_segment(const Params& tp, Walk& wk, Segment& sg) {
  if (wk.u < tp.dp_units) {
    // Unit u: batch matrix, then K split, then tile: the blocks of a wave work on the same K range.
    const int per_batch = tp.tiles_m * tp.tiles_n;
    const int bi = wk.u / (per_batch * tp.splits), rem = wk.u - bi * per_batch * tp.splits;
    const int split = rem / per_batch, kt0 = split * tp.k_tiles_per_split;
    sg = Segment{bi * per_batch + rem - split * per_batch, split, kt0, min(tp.k_tiles_per_split, tp.k_tiles - kt0), kWhole};
    wk.u += gridDim.x;
    return true;
  }
  if (wk.i >= wk.end) return false;
  const int t = static_cast<int>(wk.i / tp.k_tiles);
  const int kt0 = static_cast<int>(wk.i - static_cast<long long>(t) * tp.k_tiles);
  const int n = static_cast<int>(min(static_cast<long long>(tp.k_tiles - kt0), wk.end - wk.i));
  sg = Segment{tp.dp_units + t, 0, kt0, n, kt0 > 0 ? kTail : n < tp.k_tiles ? kHead : kWhole};
  wk.i += n;
  return true;
}

// Stream-K's workspace: a partial tile (up to 128 x 256) per block, then 8 flags (64-bit) per block.
constexpr long long kPartialFloats = kBM * 256;
inline long long stream_k_floats(int sms) { return sms * (kPartialFloats + 16); }

// The flags' value for one stream-K launch: never 0, and different for every launch of a process (a
// 64-bit count through the splitmix64 finalizer, a bijection). The workspace is not cleared before a
// launch (a memset cost attn proj dW "highest" ~1.5 us of 57): a flag counts as raised only when it
// holds this launch's token, which memory left by other work holds with probability 2^-64, and a head
// clears each flag it waited on, so a launch replayed from a CUDA graph (same token, same workspace)
// finds them cleared.
inline unsigned long long launch_token() {
  static std::atomic<unsigned long long> count{0};
  unsigned long long z = ++count * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z != 0 ? z : 1;
}

}  // namespace tma
