// The plan of the mma.sync and wgmma kernels: tile configuration and K splits of a product.
#pragma once

#include "params.cuh"

namespace {

enum TileConfig { kSmallTiles = 0, kBigTiles = 1 };

struct Plan {
  TileConfig config;
  int splits;
  int k_tiles_per_split;
};

// Picks the configuration and split count with the least estimated time: waves of blocks times the
// K each block covers, in units of a big tile's time per K element, plus the split-K traffic. Small
// tiles run at about 60% of the big ones' rate per output; a split writes and re-reads the outputs
// once, costing about as much as 100 K elements of the tile's product ("highest" at ~100 TFLOP/s
// against 3 TB/s). The plan depends only on the sizes and the GPU, so matmul_workspace_floats and
// launch_matmul agree on it.
Plan plan_matmul(int M, int N, int K, long long batch, int sms) {
  const long long k_tiles = ceil_div(K, kBK);
  Plan best{kBigTiles, 1, static_cast<int>(k_tiles)};
  double best_cost = 1e300;
  for (int config = kSmallTiles; config <= kBigTiles; ++config) {
    const int tile = config == kBigTiles ? 128 : 64;
    const int per_sm = config == kBigTiles ? 1 : 2;
    const double tile_cost = config == kBigTiles ? 1.0 : 0.5 / 0.6;
    const long long tiles = ceil_div(M, tile) * ceil_div(N, tile) * batch;
    for (int s = 1; s <= kMaxSplits; ++s) {
      const long long per_split = ceil_div(k_tiles, s);
      if (s > 1 && (per_split < 4 || ceil_div(k_tiles, per_split) < s)) break;
      const long long waves = ceil_div(tiles * s, static_cast<long long>(sms) * per_sm);
      const double cost = waves * tile_cost * (per_split * kBK) +
                          (s > 1 ? 100.0 * s * tiles * tile_cost / (static_cast<double>(sms) * per_sm) : 0.0);
      if (cost < best_cost * 0.97) {
        best_cost = cost;
        best = {static_cast<TileConfig>(config), s, static_cast<int>(per_split)};
      }
    }
  }
  return best;
}

long long plan_workspace(const Plan& plan, int M, int N, long long batch) {
  return plan.splits > 1 ? plan.splits * batch * M * N : 0;
}

}  // namespace
