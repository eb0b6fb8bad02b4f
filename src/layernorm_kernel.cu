// LayerNorm over the last dim, forward and backward (LightSeq2-style fused row kernels).
//
// Shapes: inp, out, dout, dinp [rows, hidden]; gamma, beta, dgamma, dbeta [hidden]; mean, rstd
// [rows]. VEC = 4 (4-element vector accesses) when hidden % 4 == 0 and every pointer is aligned to
// them, else 1 (scalar accesses, any hidden size); the backward of bfloat16 rows takes VEC = 8
// (16-byte accesses) when hidden % 8 == 0 and the rows are 16-byte aligned too.
// Storage: inp, out, dout and dinp are T, float or bfloat16 (the activations); gamma and beta are
// float32 (the master weights themselves: two rows read once per block from cache, so a bfloat16
// copy would save nothing), and so are mean, rstd, dgamma, dbeta and all the math.
//
// Forward: y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps), var biased.
//   Accuracy: statistics are taken of z = x - x[row, 0] (exact when x is near x[row, 0]), so a row
//   with mean 100 and std 0.01 keeps float32 precision in z - mean(z) instead of losing it to the
//   rounding of 100. Each thread reduces its values to (count, mean, sum of squared deviations)
//   exactly from its registers; one team reduction merges the triples (Chan et al.), which gives
//   mean and variance together without the cancellation of E[x^2] - E[x]^2; var >= 0 by
//   construction and clamped anyway. Saved: mean = x[row, 0] + mean(z), rstd.
//   layernorm_fw_rows<VEC, LANES, ITERS>: a team of LANES threads per row holds the row in
//     registers (lane l: vectors l, l + LANES, ...; see fused_utils.cuh), so x is read once.
//     LANES <= 32: 128-thread blocks with several rows, shuffle reductions; LANES > 32: one row
//     per block. Buckets (capacity LANES * ITERS * VEC elements):
//       VEC 4: 4..64 (1..16 lanes x 1), 128/256/512/768/1024 (32 lanes x 1/2/4/6/8),
//              2048/4096/8192/12288/16384 (128/256/512/768/1024 threads x 4);
//       VEC 1: 1..32 (1..32 lanes x 1), 64..512 (32 lanes x 2..16),
//              1024/2048/4096/8192/16384 (128/256/512/1024/1024 threads x 8/8/8/8/16).
//   layernorm_fw_stream<VEC>: hidden > 16384, one 512-thread block per row, statistics merged
//     chunk by chunk, then a second read of the row to write it.
//
// Backward: with xhat = (x - mean) * rstd and g = dout * gamma,
//   dinp = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)), dgamma = sum_rows dout * xhat,
//   dbeta = sum_rows dout. An addend (inp's gradient from its other uses: the residual stream's) is
//   added to dinp before its one rounding, read in the second pass.
//   The saved mean is float32, so x - mean would carry its rounding (1e-5 at mean 100, a 1e-3
//   error in xhat at std 0.01); the kernel recomputes the residual d = mean_j(x - mean) and uses
//   xhat = (x - mean - d) * rstd. The three row sums (x - mean, g, g * (x - mean)) go through one
//   team reduction.
//   layernorm_bw_rows<VEC, LANES, ITERS>: a persistent grid of `parts` blocks; block p handles
//     rows p * teams + t, stepping by parts * teams, with a team of LANES threads per row (teams of
//     <= 32 lanes share 256-thread blocks; LANES > 32: the block is the team). Each thread owns the
//     same columns in every row, so it accumulates dgamma/dbeta for them in registers while it
//     writes dinp; at the end the block's teams are summed (shuffles, then shared memory across
//     warps, one of the two at a time) into row p of workspace partial[parts][2 * hidden] (dgamma
//     then dbeta). x and dout are read once, and held as loaded (bfloat16 two to a register)
//     until each pass widens them. Buckets (VEC 8, bfloat16): 8..128 (1..16 lanes x 1),
//     256/512/768 (32 lanes x 1/2/3): a warp or less per row, so no barrier per row, and 16-byte
//     loads; the 512 and 768 buckets (16 and 24 columns a thread) run 512 threads an SM at up to
//     128 registers and load gamma again for the second pass; longer rows take the VEC 4 buckets.
//     (VEC 4): 4..64 (1..16 lanes x 1), 128/256 (32 lanes x 1/2), 512/768/1024/2048/4096/8192
//     (64/96/128/256/512/1024 threads x 2); (VEC 1): 1..32 (1..32 lanes x 1), 64/128 (32 lanes x
//     2/4), 256/512 (64/128 threads x 4), 1024/2048/4096/8192 (128/256/512/1024 threads x 8).
//   hidden > 8192: layernorm_bw_dinp_stream<VEC> (one block per row, two reads; it also stores d
//     per row in the workspace) and layernorm_bw_params_stream (32 x 32 threads per tile of 32
//     columns and a slab of rows: each thread sums a column down its rows, the tile is transposed
//     through shared memory and each warp shuffle-reduces one column into partial[slab]).
//   layernorm_bw_params_reduce: dgamma/dbeta = column sums of partial, in a fixed order (the
//     result is deterministic): 32 x 32 threads per 32 columns, each thread sums every 32nd part,
//     then the same transpose + warp shuffle.
// The row math both directions share (vector loads and stores, Held, Stats, the backward's terms
// and row sums, the argument structs) is in layernorm/row_math.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>

#include "includes/cuda_check.cuh"
#include "includes/dependent_launch.cuh"
#include "includes/device_info.cuh"
#include "includes/fused_utils.cuh"
#include "includes/launch_by_length.cuh"
#include "includes/reduce.cuh"
#include "includes/storage.cuh"
#include "includes/vec.cuh"
#include "layernorm/row_math.cuh"

namespace {

constexpr int kRowsPerPartMin = 16;  // rows a backward block sums before writing its partial
constexpr int kTile = 32;            // columns per block of the dgamma/dbeta column kernels

using fused::kStreamChunk;
using fused::kStreamThreads;
using fused::Team;

using namespace mt_ln;  // layernorm/row_math.cuh

// ---- forward, row in registers ---------------------------------------------------------------
template <class T, int VEC, int LANES, int ITERS>
__global__ void __launch_bounds__(fused::kTeamBlockThreads<LANES>)
    layernorm_fw_rows(const FwArgs<T> a) {
  mt::join_prior_grids();
  __shared__ Stats scratch[32];
  const auto [lane, row, active, offset] = fused::team_row<LANES>(a.rows, a.hidden);
  const int n = active ? a.hidden : 0;
  const T* x = a.inp + offset;
  const float pivot = mt::to_float(*x);

  // Loads are not predicated (a dead vector re-reads the row's first one) so that all of them
  // issue before the first use instead of waiting on scarce predicate registers.
  float z[ITERS][VEC];
  bool live[ITERS];
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = (it * LANES + lane) * VEC;
    live[it] = j < n;
    load_vec<VEC>(z[it], x + (live[it] ? j : 0));
  }
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
#pragma unroll
    for (int c = 0; c < VEC; ++c) z[it][c] = live[it] ? z[it][c] - pivot : 0.f;
  }
  const Stats st = fused::team_allreduce<LANES>(local_stats<ITERS, VEC>(z, live), StatsMerge{},
                                                Stats{0.f, 0.f, 0.f}, scratch);
  const float var = fmaxf(st.m2 * a.inv_hidden, 0.f);
  const float r = rsqrtf(var + a.eps);
  if (!active) return;
  if (lane == 0) {
    a.mean[row] = pivot + st.mean;
    a.rstd[row] = r;
  }
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = live[it] ? (it * LANES + lane) * VEC : 0;
    float g[VEC], b[VEC];
    load_vec<VEC>(g, a.gamma + j);
    load_vec<VEC>(b, a.beta + j);
#pragma unroll
    for (int c = 0; c < VEC; ++c) z[it][c] = fmaf((z[it][c] - st.mean) * r, g[c], b[c]);
    if (live[it]) store_vec<VEC>(a.out + offset + j, z[it]);
  }
}

// ---- forward, streaming (any hidden size) ----------------------------------------------------
template <int VEC, class T>
__device__ __forceinline__ void load_shifted_chunk(float (&z)[kStreamChunk][VEC],
                                                   bool (&live)[kStreamChunk], const T* x,
                                                   long long v0, long long vecs, float pivot) {
#pragma unroll
  for (int k = 0; k < kStreamChunk; ++k) {
    const long long v = v0 + k * kStreamThreads + threadIdx.x;
    live[k] = v < vecs;
    if (live[k]) load_vec<VEC>(z[k], x + v * VEC);
  }
#pragma unroll
  for (int k = 0; k < kStreamChunk; ++k) {
#pragma unroll
    for (int c = 0; c < VEC; ++c) z[k][c] = live[k] ? z[k][c] - pivot : 0.f;
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kStreamThreads) layernorm_fw_stream(const FwArgs<T> a) {
  mt::join_prior_grids();
  __shared__ Stats scratch[32];
  const unsigned row = blockIdx.x;
  const size_t offset = static_cast<size_t>(row) * a.hidden;
  const T* x = a.inp + offset;
  const float pivot = mt::to_float(*x);
  const long long vecs = a.hidden / VEC;
  constexpr long long kStep = static_cast<long long>(kStreamChunk) * kStreamThreads;

  Stats run = {0.f, 0.f, 0.f};
  for (long long v0 = 0; v0 < vecs; v0 += kStep) {
    float z[kStreamChunk][VEC];
    bool live[kStreamChunk];
    load_shifted_chunk<VEC>(z, live, x, v0, vecs, pivot);
    run = StatsMerge{}(run, local_stats<kStreamChunk, VEC>(z, live));
  }
  const Stats st = mt::block_allreduce(run, StatsMerge{}, Stats{0.f, 0.f, 0.f}, scratch);
  const float var = fmaxf(st.m2 * a.inv_hidden, 0.f);
  const float r = rsqrtf(var + a.eps);
  if (threadIdx.x == 0) {
    a.mean[row] = pivot + st.mean;
    a.rstd[row] = r;
  }
  for (long long v0 = 0; v0 < vecs; v0 += kStep) {
    float z[kStreamChunk][VEC];
    bool live[kStreamChunk];
    load_shifted_chunk<VEC>(z, live, x, v0, vecs, pivot);
#pragma unroll
    for (int k = 0; k < kStreamChunk; ++k) {
      if (live[k]) {
        const long long j = (v0 + k * kStreamThreads + threadIdx.x) * VEC;
        float g[VEC], b[VEC];
        load_vec<VEC>(g, a.gamma + j);
        load_vec<VEC>(b, a.beta + j);
#pragma unroll
        for (int c = 0; c < VEC; ++c) z[k][c] = fmaf((z[k][c] - st.mean) * r, g[c], b[c]);
        store_vec<VEC>(a.out + offset + j, z[k]);
      }
    }
  }
}

// ---- backward, rows in registers, dgamma/dbeta partials per block ----------------------------
template <int LANES>
constexpr int kBwBlockThreads = LANES > 32 ? LANES : 256;

// Blocks per SM the backward grid is sized for (and the register budget is capped for): about
// 1024 resident threads, i.e. at most 64 registers per thread, for up to 8 columns a thread; 512
// threads (128 registers) for the 16 or 24 columns of the 16-byte warp buckets, whose dgamma and
// dbeta accumulators alone take 2 registers a column.
template <int COLS>
constexpr int kBwThreadsPerSm = COLS <= 8 ? 1024 : 512;
template <int LANES, int COLS>
constexpr int kBwBlocksPerSm =
    kBwThreadsPerSm<COLS> / kBwBlockThreads<LANES> > 0 ? kBwThreadsPerSm<COLS> / kBwBlockThreads<LANES> : 1;

template <class T, int VEC, int LANES, int ITERS>
__global__ void __launch_bounds__(kBwBlockThreads<LANES>, kBwBlocksPerSm<LANES, ITERS * VEC>)
    layernorm_bw_rows(const BwArgs<T> a) {
  mt::join_prior_grids();
  constexpr int kThreads = kBwBlockThreads<LANES>;
  constexpr int kTeams = kThreads / LANES;
  __shared__ Sum3 scratch[32];
  const int lane = threadIdx.x % LANES;
  const unsigned team = threadIdx.x / LANES;
  const unsigned rows = static_cast<unsigned>(a.rows);

  float acc_g[ITERS][VEC];
  float acc_b[ITERS][VEC];
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
#pragma unroll
    for (int c = 0; c < VEC; ++c) acc_g[it][c] = acc_b[it][c] = 0.f;
  }

  // The loop bound is uniform across the block (base), so every team runs the same number of
  // reductions; a team past the last row takes part with zeros.
  for (unsigned base = blockIdx.x * kTeams; base < rows; base += gridDim.x * kTeams) {
    const unsigned row = base + team;
    const bool active = row < rows;
    const int n = active ? a.hidden : 0;
    const size_t offset = static_cast<size_t>(active ? row : 0) * a.hidden;
    const float mu = a.mean[active ? row : 0];
    const float rs = a.rstd[active ? row : 0];

    // x and dout as loaded (Held), and gamma: kept for the second pass up to 8 columns a thread,
    // loaded again (an L1 hit) by the 16-byte warp buckets, which have no registers to spare.
    constexpr bool kKeepGamma = ITERS * VEC <= 8;
    Held<T, VEC> dy_held[ITERS], x_held[ITERS];
    float gamma[ITERS][VEC];
    bool live[ITERS];
    const auto load_gamma = [&](int it) {
      const int j = (it * LANES + lane) * VEC;
      load_vec<VEC>(gamma[it], a.gamma + (j < n ? j : 0));
    };
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = (it * LANES + lane) * VEC;
      live[it] = j < n;
      const int jl = live[it] ? j : 0;  // unpredicated loads, as in the forward
      dy_held[it].load(a.dout + offset + jl);
      x_held[it].load(a.inp + offset + jl);
      load_gamma(it);
    }
    // Vector it's terms (as bw_terms), widened again in each pass. A dead vector holds a live one's
    // values (the loads are unpredicated), so once its dy is zero so is g = dy * gamma, with no
    // select: selecting g would let the compiler sink gamma's load into a branch behind the use of
    // the vectors before it, and so serialize the row's loads.
    const auto terms = [&](int it, float(&dy)[VEC], float(&z)[VEC], float(&g)[VEC]) {
      dy_held[it].unpack(dy);
      x_held[it].unpack(z);
#pragma unroll
      for (int c = 0; c < VEC; ++c) {
        dy[c] = live[it] ? dy[c] : 0.f;
        z[c] = live[it] ? z[c] - mu : 0.f;
        g[c] = dy[c] * gamma[it][c];
      }
    };
    Sum3 s = {0.f, 0.f, 0.f};
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      float dy[VEC], z[VEC], g[VEC];
      terms(it, dy, z, g);
      s.add<VEC>(z, g);
    }
    const BwRow r(fused::team_allreduce<LANES>(s, Sum3Op{}, Sum3{0.f, 0.f, 0.f}, scratch), rs, a.inv_hidden);
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      if constexpr (!kKeepGamma) load_gamma(it);
      float dy[VEC], z[VEC], g[VEC];
      terms(it, dy, z, g);
#pragma unroll
      for (int c = 0; c < VEC; ++c) {
        const float xhat = r.xhat(z[c]);
        acc_g[it][c] = fmaf(dy[c], xhat, acc_g[it][c]);
        acc_b[it][c] += dy[c];
        g[c] = r.dinp(xhat, g[c]);
      }
      if (a.addend != nullptr && live[it]) {
        Held<T, VEC> held;
        held.load(a.addend + offset + (it * LANES + lane) * VEC);
        float add[VEC];
        held.unpack(add);
#pragma unroll
        for (int c = 0; c < VEC; ++c) g[c] += add[c];
      }
      if (live[it]) {
        store_vec<VEC>(a.dinp + offset + (it * LANES + lane) * VEC, g);
      }
    }
  }

  float* part = a.partial + static_cast<size_t>(blockIdx.x) * 2 * a.hidden;
  if constexpr (LANES > 32) {
    // The block is one team: each column has exactly one owner thread.
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = (it * LANES + lane) * VEC;
      if (j < a.hidden) {
        store_vec<VEC>(part + j, acc_g[it]);
        store_vec<VEC>(part + a.hidden + j, acc_b[it]);
      }
    }
  } else {
    // Lanes l, l + LANES, ... of a warp own the same columns: fold them onto lanes < LANES.
#pragma unroll
    for (int o = LANES; o < 32; o *= 2) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
#pragma unroll
        for (int c = 0; c < VEC; ++c) {
          acc_g[it][c] += __shfl_xor_sync(mt::kFullWarpMask, acc_g[it][c], o);
          acc_b[it][c] += __shfl_xor_sync(mt::kFullWarpMask, acc_b[it][c], o);
        }
      }
    }
    // Then sum the warps, in warp order, through shared memory: dgamma, then dbeta through the
    // same buffer (both at once would pass the 48 KB of static shared memory at 768 columns).
    // Threads store their columns 4 at a time, column c at c ^ ((c >> 3) & 4): with VEC 8 the
    // lanes of a quarter warp are 32 bytes apart, and the swizzle sends them to distinct banks; it
    // permutes only within aligned groups of 32 columns, which the column-wise reads then take
    // conflict-free.
    constexpr int kWarps = kThreads / 32;
    constexpr int kCap = LANES * ITERS * VEC;
    constexpr int kChunk = VEC < 4 ? VEC : 4;
    static_assert(kCap < 32 || kCap % 8 == 0, "the swizzle stays inside the buffer");
    __shared__ alignas(16) float warp_part[kWarps][kCap];
    const int warp = threadIdx.x / 32;
    const auto slot = [](int col) { return col ^ ((col >> 3) & 4); };
    const auto sum_warps = [&](const float(&acc)[ITERS][VEC], float* out) {
      if (threadIdx.x % 32 < LANES) {
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
#pragma unroll
          for (int h = 0; h < VEC; h += kChunk) {
            float chunk[kChunk];
#pragma unroll
            for (int c = 0; c < kChunk; ++c) chunk[c] = acc[it][h + c];
            store_vec<kChunk>(&warp_part[warp][slot((it * LANES + lane) * VEC + h)], chunk);
          }
        }
      }
      __syncthreads();
      for (int col = threadIdx.x; col < a.hidden; col += kThreads) {
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) sum += warp_part[w][slot(col)];
        out[col] = sum;
      }
    };
    sum_warps(acc_g, part);
    __syncthreads();  // every thread has read the dgamma sums before the buffer takes dbeta's
    sum_warps(acc_b, part + a.hidden);
  }
}

// ---- backward, streaming (any hidden size) ---------------------------------------------------
template <int VEC, class T>
__device__ __forceinline__ void load_bw_chunk(float (&dy)[kStreamChunk][VEC],
                                              float (&z)[kStreamChunk][VEC],
                                              float (&g)[kStreamChunk][VEC],
                                              bool (&live)[kStreamChunk], const BwArgs<T>& a,
                                              size_t offset, long long v0, long long vecs,
                                              float mu) {
#pragma unroll
  for (int k = 0; k < kStreamChunk; ++k) {
    const long long v = v0 + k * kStreamThreads + threadIdx.x;
    live[k] = v < vecs;
    if (live[k]) {
      load_vec<VEC>(dy[k], a.dout + offset + v * VEC);
      load_vec<VEC>(z[k], a.inp + offset + v * VEC);
      load_vec<VEC>(g[k], a.gamma + v * VEC);
    }
  }
#pragma unroll
  for (int k = 0; k < kStreamChunk; ++k) bw_terms<VEC>(dy[k], z[k], g[k], live[k], mu);
}

template <class T, int VEC>
__global__ void __launch_bounds__(kStreamThreads) layernorm_bw_dinp_stream(const BwArgs<T> a) {
  __shared__ Sum3 scratch[32];
  const unsigned row = blockIdx.x;
  const size_t offset = static_cast<size_t>(row) * a.hidden;
  const float mu = a.mean[row];
  const float rs = a.rstd[row];
  const long long vecs = a.hidden / VEC;
  constexpr long long kStep = static_cast<long long>(kStreamChunk) * kStreamThreads;

  Sum3 s = {0.f, 0.f, 0.f};
  for (long long v0 = 0; v0 < vecs; v0 += kStep) {
    float dy[kStreamChunk][VEC], z[kStreamChunk][VEC], g[kStreamChunk][VEC];
    bool live[kStreamChunk];
    load_bw_chunk<VEC>(dy, z, g, live, a, offset, v0, vecs, mu);
#pragma unroll
    for (int k = 0; k < kStreamChunk; ++k) s.add<VEC>(z[k], g[k]);
  }
  const BwRow r(mt::block_allreduce(s, Sum3Op{}, Sum3{0.f, 0.f, 0.f}, scratch), rs, a.inv_hidden);
  if (threadIdx.x == 0) a.resid[row] = r.d;

  for (long long v0 = 0; v0 < vecs; v0 += kStep) {
    float dy[kStreamChunk][VEC], z[kStreamChunk][VEC], g[kStreamChunk][VEC];
    bool live[kStreamChunk];
    load_bw_chunk<VEC>(dy, z, g, live, a, offset, v0, vecs, mu);
#pragma unroll
    for (int k = 0; k < kStreamChunk; ++k) {
      if (live[k]) {
        const long long at = offset + (v0 + k * kStreamThreads + threadIdx.x) * VEC;
#pragma unroll
        for (int c = 0; c < VEC; ++c) g[k][c] = r.dinp(r.xhat(z[k][c]), g[k][c]);
        if (a.addend != nullptr) {
          float add[VEC];
          load_vec<VEC>(add, a.addend + at);
#pragma unroll
          for (int c = 0; c < VEC; ++c) g[k][c] += add[c];
        }
        store_vec<VEC>(a.dinp + at, g[k]);
      }
    }
  }
}

// Sums a kTile x kTile tile of per-thread partials over threadIdx.y (shared-memory transpose, then
// one warp per column) and returns the column sum on lane 0 of warp threadIdx.y.
__device__ __forceinline__ float tile_column_sum(float v, float (&tile)[kTile][kTile + 1]) {
  tile[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  const float t = mt::warp_allreduce(tile[threadIdx.x][threadIdx.y], mt::SumOp{});
  __syncthreads();
  return t;
}

// grid (ceil(hidden / 32), slabs), block (32, 32): partial[slab] = sums over the slab's rows.
template <class T>
__global__ void __launch_bounds__(kTile * kTile) layernorm_bw_params_stream(const BwArgs<T> a,
                                                                            int rows_per_slab) {
  __shared__ float tile[kTile][kTile + 1];
  const long long col = static_cast<long long>(blockIdx.x) * kTile + threadIdx.x;
  const long long r0 = static_cast<long long>(blockIdx.y) * rows_per_slab;
  const long long r1 = r0 + rows_per_slab < a.rows ? r0 + rows_per_slab : a.rows;
  float sg = 0.f, sb = 0.f;
  if (col < a.hidden) {
#pragma unroll 4
    for (long long r = r0 + threadIdx.y; r < r1; r += kTile) {
      const size_t i = static_cast<size_t>(r) * a.hidden + col;
      const float dy = mt::to_float(a.dout[i]);
      const float xhat = (mt::to_float(a.inp[i]) - a.mean[r] - a.resid[r]) * a.rstd[r];
      sg = fmaf(dy, xhat, sg);
      sb += dy;
    }
  }
  const float tg = tile_column_sum(sg, tile);
  const float tb = tile_column_sum(sb, tile);
  const long long out_col = static_cast<long long>(blockIdx.x) * kTile + threadIdx.y;
  if (threadIdx.x == 0 && out_col < a.hidden) {
    float* part = a.partial + static_cast<size_t>(blockIdx.y) * 2 * a.hidden;
    part[out_col] = tg;
    part[a.hidden + out_col] = tb;
  }
}

// grid ceil(2 * hidden / 32), block (32, 32): dgamma | dbeta = sum over parts of partial.
__global__ void __launch_bounds__(kTile * kTile)
    layernorm_bw_params_reduce(float* dgamma, float* dbeta, const float* partial, int parts,
                               int hidden) {
  mt::join_prior_grids();
  __shared__ float tile[kTile][kTile + 1];
  const long long cols = 2ll * hidden;
  const long long col = static_cast<long long>(blockIdx.x) * kTile + threadIdx.x;
  float s = 0.f;
  if (col < cols) {
#pragma unroll 8
    for (int p = threadIdx.y; p < parts; p += kTile) s += partial[p * cols + col];
  }
  const float t = tile_column_sum(s, tile);
  const long long out_col = static_cast<long long>(blockIdx.x) * kTile + threadIdx.y;
  if (threadIdx.x == 0 && out_col < cols) {
    if (out_col < hidden) {
      dgamma[out_col] = t;
    } else {
      dbeta[out_col - hidden] = t;
    }
  }
}

// ---- launchers -------------------------------------------------------------------------------
// The size buckets (see the top of the file). The backward's rows stop at 8192 floats: it also keeps
// dgamma/dbeta partials per thread; its 16-byte (VEC 8, bfloat16) buckets stop at one warp's 768.
using FwVec4Buckets = fused::Buckets<4, Team<1, 1>, Team<2, 1>, Team<4, 1>, Team<8, 1>, Team<16, 1>, Team<32, 1>,
                                     Team<32, 2>, Team<32, 4>, Team<32, 6>, Team<32, 8>, Team<128, 4>, Team<256, 4>,
                                     Team<512, 4>, Team<768, 4>, Team<1024, 4>>;
using FwScalarBuckets = fused::Buckets<1, Team<1, 1>, Team<2, 1>, Team<4, 1>, Team<8, 1>, Team<16, 1>, Team<32, 1>,
                                       Team<32, 2>, Team<32, 4>, Team<32, 8>, Team<32, 16>, Team<128, 8>,
                                       Team<256, 8>, Team<512, 8>, Team<1024, 8>, Team<1024, 16>>;
using BwVec4Buckets = fused::Buckets<4, Team<1, 1>, Team<2, 1>, Team<4, 1>, Team<8, 1>, Team<16, 1>, Team<32, 1>,
                                     Team<32, 2>, Team<64, 2>, Team<96, 2>, Team<128, 2>, Team<256, 2>, Team<512, 2>,
                                     Team<1024, 2>>;
using BwScalarBuckets = fused::Buckets<1, Team<1, 1>, Team<2, 1>, Team<4, 1>, Team<8, 1>, Team<16, 1>, Team<32, 1>,
                                       Team<32, 2>, Team<32, 4>, Team<64, 4>, Team<128, 4>, Team<128, 8>,
                                       Team<256, 8>, Team<512, 8>, Team<1024, 8>>;
using BwVec8Buckets = fused::Buckets<8, Team<1, 1>, Team<2, 1>, Team<4, 1>, Team<8, 1>, Team<16, 1>, Team<32, 1>,
                                     Team<32, 2>, Team<32, 3>>;

// The forward kernels fused::LaunchRows launches.
template <class T>
struct FwKernels {
  template <int VEC, int LANES, int ITERS> static auto rows() { return layernorm_fw_rows<T, VEC, LANES, ITERS>; }
  template <int VEC> static auto stream() { return layernorm_fw_stream<T, VEC>; }
};

// A backward row kernel: how many rows a block takes per step, how many blocks fit an SM, and
// its launch (grid = parts).
template <class T>
struct BwRowsKernel {
  int teams;
  int blocks_per_sm;
  int (*launch)(const BwArgs<T>&, unsigned parts, cudaStream_t);
};

template <class T, int VEC, int LANES, int ITERS>
int launch_bw_rows(const BwArgs<T>& a, unsigned parts, cudaStream_t stream) {
  return mt::launch_dependent(layernorm_bw_rows<T, VEC, LANES, ITERS>, dim3(parts), dim3(kBwBlockThreads<LANES>), 0,
                              stream, a);
}

// The pick of fused::walk_buckets that names a backward bucket's kernel for a row of n elements:
// rows too long for the 16-byte buckets take the 8-byte ones, rows too long for registers none
// (launch == nullptr: the streaming path).
template <class T>
struct BwSelect {
  int n;

  template <int VEC, int LANES, int ITERS>
  BwRowsKernel<T> bucket() const {
    return {kBwBlockThreads<LANES> / LANES, kBwBlocksPerSm<LANES, ITERS * VEC>, &launch_bw_rows<T, VEC, LANES, ITERS>};
  }
  template <int VEC>
  BwRowsKernel<T> beyond() const {
    if constexpr (VEC == 8) {
      return fused::walk_buckets(n, *this, BwVec4Buckets{});
    } else {
      return {0, 0, nullptr};
    }
  }
};

// The bucket for a row of `n` elements accessed `vec` at a time (8 only for bfloat16).
template <class T>
BwRowsKernel<T> select_bw_rows(int n, int vec) {
  const BwSelect<T> pick{n};
  if constexpr (std::is_same_v<T, mt::bf16>) {
    if (vec == 8) return fused::walk_buckets(n, pick, BwVec8Buckets{});
  }
  return vec >= 4 ? fused::walk_buckets(n, pick, BwVec4Buckets{}) : fused::walk_buckets(n, pick, BwScalarBuckets{});
}

// How the backward splits its work: `parts` partial rows of dgamma/dbeta (blocks of the row kernel,
// or row slabs of the streaming column kernel) and the workspace that needs.
template <class T>
struct BwPlan {
  BwRowsKernel<T> rows_kernel;
  int parts;
  int rows_per_slab;  // streaming path
  long long workspace_floats;
};

template <class T>
int plan_bw(int rows, int hidden, int vec, BwPlan<T>* plan) {
  int sms = 0;
  MT_RETURN_IF_ERROR(mt::sm_count(&sms));
  plan->rows_kernel = select_bw_rows<T>(hidden, vec);
  if (plan->rows_kernel.launch != nullptr) {
    // Parts: as many blocks as stay resident, each summing at least kRowsPerPartMin rows so the
    // partials stay small next to the rows; but at least two per SM (rows permitting, two rows per
    // block) so that a mid-size input still fills the GPU.
    const long long by_rows = (static_cast<long long>(rows) + kRowsPerPartMin - 1) / kRowsPerPartMin;
    const long long fill = std::min((static_cast<long long>(rows) + 1) / 2, 2ll * sms);
    const long long resident = static_cast<long long>(sms) * plan->rows_kernel.blocks_per_sm;
    plan->parts = static_cast<int>(std::min(std::max(by_rows, fill), resident));
    plan->rows_per_slab = 0;
    plan->workspace_floats = static_cast<long long>(plan->parts) * 2 * hidden;
  } else {
    // Enough (tile, slab) blocks of 1024 threads for two per SM, slabs of at least 32 rows.
    const long long tiles = (static_cast<long long>(hidden) + kTile - 1) / kTile;
    const long long max_slabs = (static_cast<long long>(rows) + kTile - 1) / kTile;
    long long slabs = (2ll * sms + tiles - 1) / tiles;
    slabs = slabs < max_slabs ? slabs : max_slabs;
    plan->rows_per_slab = static_cast<int>((rows + slabs - 1) / slabs);
    plan->parts = static_cast<int>((rows + plan->rows_per_slab - 1) / plan->rows_per_slab);
    plan->workspace_floats = static_cast<long long>(plan->parts) * 2 * hidden + rows;
  }
  return static_cast<int>(cudaSuccess);
}

// The workspace must fit whichever path the launcher takes: a vector one, or a narrower one when a
// pointer turns out not to be aligned. The plan depends on the storage type only through VEC 8,
// which only bfloat16 rows take, so bfloat16's plans cover float32's.
int workspace_floats(int rows, int hidden, long long* floats) {
  *floats = 0;
  for (const int vec : {1, 4, 8}) {
    if (hidden % vec != 0) continue;
    BwPlan<mt::bf16> plan;
    MT_RETURN_IF_ERROR(static_cast<cudaError_t>(plan_bw(rows, hidden, vec, &plan)));
    *floats = std::max(*floats, plan.workspace_floats);
  }
  return static_cast<int>(cudaSuccess);
}

template <class T>
int layernorm_fw(T* out, float* mean, float* rstd, const T* inp, const float* gamma, const float* beta, int rows,
                 int hidden, float eps, cudaStream_t stream) {
  const FwArgs<T> a = {out, mean, rstd, inp, gamma, beta, rows, hidden, 1.f / static_cast<float>(hidden), eps};
  const bool vec4 = hidden % 4 == 0 && mt::is_aligned4(out) && mt::is_aligned4(inp) && mt::is_aligned16(gamma) &&
                    mt::is_aligned16(beta);
  const fused::LaunchRows<FwKernels<T>, FwArgs<T>, true> launch{a, rows, stream};
  return vec4 ? fused::walk_buckets(hidden, launch, FwVec4Buckets{})
              : fused::walk_buckets(hidden, launch, FwScalarBuckets{});
}

template <class T>
int layernorm_bw(T* dinp, float* dgamma, float* dbeta, const T* dout, const T* inp, const float* gamma,
                 const float* mean, const float* rstd, const T* addend, float* workspace, int rows, int hidden,
                 cudaStream_t stream) {
  const bool vec4 = hidden % 4 == 0 && mt::is_aligned4(dinp) && mt::is_aligned4(dout) && mt::is_aligned4(inp) &&
                    mt::is_aligned16(gamma) && mt::is_aligned16(workspace) &&
                    (addend == nullptr || mt::is_aligned4(addend));
  const bool vec8 = std::is_same_v<T, mt::bf16> && vec4 && hidden % 8 == 0 && mt::is_aligned16(dinp) &&
                    mt::is_aligned16(dout) && mt::is_aligned16(inp) && (addend == nullptr || mt::is_aligned16(addend));
  const int vec = vec8 ? 8 : vec4 ? 4 : 1;
  BwPlan<T> plan;
  MT_RETURN_IF_ERROR(static_cast<cudaError_t>(plan_bw(rows, hidden, vec, &plan)));
  BwArgs<T> a = {dinp, workspace, nullptr, dout, inp, gamma, mean, rstd, rows, hidden, 1.f / static_cast<float>(hidden),
                 addend};
  if (plan.rows_kernel.launch != nullptr) {
    MT_RETURN_IF_ERROR(static_cast<cudaError_t>(
        plan.rows_kernel.launch(a, static_cast<unsigned>(plan.parts), stream)));
  } else {
    a.resid = workspace + static_cast<size_t>(plan.parts) * 2 * hidden;
    if (vec >= 4) {
      layernorm_bw_dinp_stream<T, 4><<<static_cast<unsigned>(rows), kStreamThreads, 0, stream>>>(a);
    } else {
      layernorm_bw_dinp_stream<T, 1><<<static_cast<unsigned>(rows), kStreamThreads, 0, stream>>>(a);
    }
    MT_RETURN_IF_ERROR(cudaGetLastError());
    const dim3 grid(static_cast<unsigned>((hidden + kTile - 1) / kTile), static_cast<unsigned>(plan.parts));
    layernorm_bw_params_stream<T><<<grid, dim3(kTile, kTile), 0, stream>>>(a, plan.rows_per_slab);
    MT_RETURN_IF_ERROR(cudaGetLastError());
  }
  const unsigned reduce_blocks = static_cast<unsigned>((2ll * hidden + kTile - 1) / kTile);
  return mt::launch_dependent(layernorm_bw_params_reduce, dim3(reduce_blocks), dim3(kTile, kTile), 0, stream, dgamma,
                              dbeta, workspace, plan.parts, hidden);
}

}  // namespace

MT_DEFINE_ERROR_STRING()

// format: the storage code (mt::with_storage: 0 float32, 1 bfloat16) of out and inp.
extern "C" int launch_layernorm(int format, void* out, float* mean, float* rstd, const void* inp, const float* gamma,
                                const float* beta, int rows, int hidden, float eps, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(out == nullptr || mean == nullptr || rstd == nullptr || inp == nullptr ||
                       gamma == nullptr || beta == nullptr);
  MT_RETURN_IF_INVALID(rows <= 0 || hidden <= 0 || !(eps > 0.f));  // eps > 0 as minitorch.fused.layernorm
  return mt::with_storage(format, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return layernorm_fw(static_cast<T*>(out), mean, rstd, static_cast<const T*>(inp), gamma, beta, rows, hidden, eps,
                        stream);
  });
}

// Floats of scratch launch_layernorm_bw needs for these sizes on the current device, or minus a
// cudaError_t code (e.g. -1 = cudaErrorInvalidValue for sizes <= 0).
extern "C" long long layernorm_bw_workspace_floats(int rows, int hidden) {
  if (rows <= 0 || hidden <= 0) return -static_cast<long long>(cudaErrorInvalidValue);
  long long floats = 0;
  const int status = workspace_floats(rows, hidden, &floats);
  return status != 0 ? -static_cast<long long>(status) : floats;
}

// format: the storage code of dinp, dout, inp and addend (as launch_layernorm's). addend: NULL, or a
// [rows, hidden] tensor added to dinp (inp's gradient from its other uses, summed in float32 before
// the one rounding).
extern "C" int launch_layernorm_bw(int format, void* dinp, float* dgamma, float* dbeta, const void* dout,
                                   const void* inp, const float* gamma, const float* mean, const float* rstd,
                                   const void* addend, float* workspace, int rows, int hidden, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(dinp == nullptr || dgamma == nullptr || dbeta == nullptr ||
                       dout == nullptr || inp == nullptr || gamma == nullptr || mean == nullptr ||
                       rstd == nullptr || workspace == nullptr);
  MT_RETURN_IF_INVALID(rows <= 0 || hidden <= 0);
  return mt::with_storage(format, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return layernorm_bw(static_cast<T*>(dinp), dgamma, dbeta, static_cast<const T*>(dout), static_cast<const T*>(inp),
                        gamma, mean, rstd, static_cast<const T*>(addend), workspace, rows, hidden, stream);
  });
}
