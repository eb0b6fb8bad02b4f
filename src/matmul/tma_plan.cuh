// The TMA path's plan: tile width, data-parallel units, K splits or stream-K, the operand copy of
// "high" weight gradients, and the workspace all of that needs.
#pragma once

#include <algorithm>

#include "../includes/launch_utils.cuh"
#include "params.cuh"
#include "tma_work.cuh"

namespace tma {

// The work plan: tile width, data-parallel units (tiles, or tiles x K splits), stream-K K tiles, grid.
struct Plan {
  int bn, k_tiles, splits, k_tiles_per_split, dp_units, grid;  // bn 0: no plan (too many tiles)
  long long sk_iters;
};

// Least estimated time over tile widths and ways to share the work. One K tile of one output tile
// costs 2 x 128 x BN x 32 flops at an SM's rate (TF32 ~3 TFLOP/s at BN 256, 2.9 at 192, 2.6 at 128;
// "highest" does three products, ~1). BN 192 fits widths such as 768 and 4096 to the 132 SMs in fewer
// waves than 256 (768 x 4096: 132 tiles against 96). Data-parallel work takes ceil(units / sms) waves
// of its units' K tiles; K splits add their partial products' traffic (written and read once,
// ~2.5 TB/s). Stream-K (where allowed) keeps all but the last whole wave of tiles data-parallel and
// gives every block the same share of the rest's K tiles; it adds the time a finishing block takes to
// read the partial tiles of the blocks sharing its tile (and to write its own), at one SM's share of L2
// bandwidth (~100 GB/s): the blocks do this side by side. A plan must win by 3% to replace the simpler
// one before it.
inline Plan plan(int rows, int cols, int K, long long batch, int sms, int precision, bool transform, bool stream_k,
                 int max_splits) {
  const long long k_tiles = ceil_div(K, kBK);
  Plan best{};
  double best_cost = 1e300;
  const auto consider = [&](double cost, const Plan& pl) {
    if (cost < best_cost * 0.97) best_cost = cost, best = pl;
  };
  for (const int bn : {256, 192, 128}) {
    if (bn > 128 && (precision != kHigh || transform)) continue;
    const double rate = precision == kHighest ? 1.0e12 : bn == 256 ? 3.0e12 : bn == 192 ? 2.9e12 : 2.6e12;
    const double k_tile_time = 2.0 * kBM * bn * kBK / rate;
    const long long tiles = ceil_div(rows, kBM) * ceil_div(cols, bn) * batch;
    if (tiles * max_splits > INT32_MAX) continue;
    const int kt = static_cast<int>(k_tiles);
    for (int s = 1; s <= max_splits; ++s) {
      const long long per_split = ceil_div(k_tiles, s);
      if (s > 1 && (per_split < 4 || ceil_div(k_tiles, per_split) < s)) break;
      const long long units = tiles * s;
      consider(ceil_div(units, sms) * per_split * k_tile_time + (s > 1 ? 8.0 * s * batch * rows * cols / 2.5e12 : 0.0),
               Plan{bn, kt, s, static_cast<int>(per_split), static_cast<int>(units),
                    static_cast<int>(std::min<long long>(units, sms)), 0});
    }
    if (!stream_k || tiles % sms == 0) continue;
    const long long dp = tiles / sms > 0 ? (tiles / sms - 1) * sms : 0, shared = tiles - dp;
    const long long iters = shared * k_tiles;
    const int grid = static_cast<int>(std::min<long long>(iters, sms));
    const double parts = static_cast<double>(ceil_div(grid, shared) + 1) * kBM * bn * 4;
    consider((dp / sms * k_tiles + ceil_div(iters, grid)) * k_tile_time + parts / 1e11,
             Plan{bn, kt, 1, kt, static_cast<int>(dp), grid, iters});
  }
  return best;
}

// Stream-K serves "highest" only. "high" runs close to the memory system's limits, and blocks that
// start their shares at scattered K positions re-read the operands from DRAM: on the GPT-2 products it
// ran up to 35% slower than K splits, whose blocks move through K together.
inline bool uses_stream_k(int precision) { return precision == kHighest; }

// Whether TMA reads an operand whose element (i, o) sits at i * unit + o * other along the unit dim i:
// unit stride 1 and 16-byte rows.
inline bool tma_major(int unit, int other) { return unit == 1 && other % 4 == 0; }

// Whether "high" copies one operand K-major first: weight gradients x^T @ dy, where neither operand is
// K-major. The copy (one read and write of the smaller operand) costs far less than transposing every
// staged B tile in the transform warps, which hold "high" to ~60% of its rate; "highest" runs at a third
// of that rate, where the transform keeps up, and skips the copy.
inline bool copies_operand(int precision, bool a_mmajor, bool b_nmajor) { return precision == kHigh && a_mmajor && b_nmajor; }

// Floats of the K-major copy of the smaller operand: [mats][rows][K rounded up to 4].
inline long long copy_floats(int M, int N, int K, long long mats) { return mats * std::min(M, N) * ceil_div(K, 4) * 4; }

// Floats of workspace that this path may use at these sizes and layouts: the operand copy, then what
// the plan of either orientation shares its work through (stream-K's partial tiles, or K splits).
inline long long workspace_floats(const MatmulParams& p, int precision, int sms) {
  const bool a_mmajor = tma_major(p.a_row_stride, p.a_k_stride), b_nmajor = tma_major(p.b_col_stride, p.b_k_stride);
  const bool copy = copies_operand(precision, a_mmajor, b_nmajor);
  long long most = 0;
  for (int swap = 0; swap < 2; ++swap) {
    const Plan pl = plan(swap ? p.N : p.M, swap ? p.M : p.N, p.K, p.batch, sms, precision, a_mmajor && b_nmajor && !copy,
                         uses_stream_k(precision), kMaxSplits);
    if (pl.sk_iters > 0) most = std::max(most, stream_k_floats(sms));
    if (pl.splits > 1) most = std::max(most, pl.splits * static_cast<long long>(p.batch) * p.M * p.N);
  }
  return most + (copy ? copy_floats(p.M, p.N, p.K, p.batch) : 0);
}

}  // namespace tma
