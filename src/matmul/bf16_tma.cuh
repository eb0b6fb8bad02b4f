// Host side of matmul_bf16_kernel.cu's Hopper path (bf16_wgmma.cuh): which products take it, their
// tensor maps, the tile width and K splits, and the launch.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <type_traits>

#include "../includes/device_info.cuh"
#include "../includes/launch_utils.cuh"
#include "../includes/layout.cuh"
#include "../includes/tma.cuh"
#include "../includes/vec.cuh"
#include "bf16_cluster.cuh"
#include "bf16_common.cuh"
#include "bf16_wgmma.cuh"

namespace bf16mm {

using tma::encode_tiled;

// The planner's view of the tile shapes (bf16 wgmma on an H100: ~5.6 TFLOP/s per SM with 128 x 256
// tiles, a little less with narrower ones, whose B tiles bring fewer products per byte). 192 columns
// fit widths such as 768 and 2304 to 132 SMs in fewer waves than 256; 192 x 96 tiles cut 768 x 3072
// (GPT-2's fc weight gradient) into 128 tiles where 128 x 192 makes 96, and their K tiles in 5 ring
// slots keep more bytes in flight: 35.6 -> 32.7-33.7 us on an H100 (bf16_notes.md, v24). The 128-row
// shapes come first (kTmaRowsShapes), and only they serve
//   - products with more rows than columns: a 96-wide MN-major B read by M / 192 blocks at once loads
//     slowly (fc proj dW, 3072 x 768: 35.1 -> 40.6 us at 192 x 96 with B in 32-row boxes, 38.4 in
//     bf16_cluster.cuh's; as its transpose, runs_transposed, 29.0);
//   - products that run beside other work (a Linear's weight gradient on the side stream, beside its
//     input gradient): 96 tiles leave that work 36 SMs, 128 leave it 4 (GPT-2's step on an H100, B 4
//     9.93-10.00 -> 10.01-10.04 ms with the side stream's fc dW on 192 x 96).
// 64 x 128 tiles (one consumer warpgroup) run a product with few tiles and a long K unsplit: 72 tiles of
// 768 x 768 x 4096 (GPT-2's attention projection weight gradient) take 15.1 us where 128 x 128 tiles in
// 3 K splits take 17.3, 6.5 of it writing and adding the partial sums (bf16_notes.md, fourteenth
// session); on fewer SMs each takes in its operands faster (~100 GB/s against ~85), hence its rate.
// 192 x 192 tiles (two consumer warpgroups, each over a 96-row half of a K-major B: the K loop at ~6.8
// TFLOP/s per SM on an H100, against ~6.1 for 128 x 256, but a slower epilogue; bf16_notes.md, eighteenth
// session) are planned only for a K-major B, and reached by a product with more rows than columns as its
// transpose (runs_transposed). Their rate here is what the whole tile delivers: at 6.0e12 the LM head's
// logits (4096 x 50257 x 768) took them, 485 -> 518 us. The 96-wide tiles and these run on
// bf16_cluster.cuh's kernel: 192 x 96 and 192 x 192 one block at a time, and the last shape, not planned,
// 64 x 96 in 8-block clusters sharing their operand tiles, for a product the planner gives unsplit 64 x
// 128 tiles, where clusters fit.
constexpr TileShape kTmaShapes[] = {{128, 256, kTmaBK, 1, 5.6e12}, {128, 192, kTmaBK, 1, 5.4e12},
                                    {128, 128, kTmaBK, 1, 4.8e12}, {192, 128, kTmaBK, 1, 5.2e12},
                                    {192, 96, kTmaBK, 1, 5.0e12},  {64, 128, kTmaBK, 1, 4.0e12},
                                    {192, 192, kTmaBK, 1, 5.5e12, true}, {64, 96, kTmaBK, 1, 4.0e12}};
constexpr int kTmaShapeCount = 8, kTmaPlannedShapes = 7, kTmaRowsShapes = 3;
constexpr int kWideShape = 4, kNarrowShape = 5, kHalvesShape = 6, kClusterShape = 7;

// One operand as TMA reads it: element (i, o) of batch matrix b at base[i + o * outer_stride +
// b * batch_stride] (elements), i along the unit-stride dim; batch_stride 0: one matrix for every b.
struct Operand {
  const __nv_bfloat16* base;
  long long inner, outer, outer_stride, batch_stride;
};

// Tensor map of op in boxes of box_inner (64: 128 bytes, or 32) x box_outer (tma::encode_operand).
inline bool encode(CUtensorMap* map, const Operand& op, long long batches, int box_outer, int box_inner = 64,
                   bool swizzle128 = false) {
  return tma::encode_operand(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, op.base, op.inner, op.outer, op.outer_stride,
                             op.batch_stride, batches, box_inner, box_outer, swizzle128);
}

// Whether TMA reads an operand whose element (i, o) sits at i * unit + o * other along the unit dim i:
// unit stride 1 and 16-byte rows.
inline bool tma_major(int unit, int other) { return unit == 1 && other % 8 == 0; }

// Whether the TMA kernel's body was built for the current device (see its comment).
inline bool tma_available() {
  static int cached[mt::kMaxDevicesCached] = {0};  // 0 unknown, 1 yes, 2 no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (device < mt::kMaxDevicesCached && cached[device] != 0) return cached[device] == 1;
  cudaFuncAttributes attr{};
  const auto kernel = matmul_bf16_tma_kernel<true, true, 128, 256, kStagedAny>;
  const bool yes = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess &&
                   attr.maxThreadsPerBlock >= TmaConfig<128, 256>::kThreads && encode_tiled() != nullptr;
  cudaGetLastError();  // a missing image is an answer here, not an error for the next launch
  if (device < mt::kMaxDevicesCached) cached[device] = yes ? 1 : 2;
  return yes;
}

// The operands of p as TMA would read them (K-major or MN-major each), or false where it cannot: several
// batch dims, a layout without a unit-stride dim, K = 0.
struct TmaLayout {
  Operand a, b;
  bool a_kmajor, b_kmajor;
};

inline bool tma_layout(const Params& p, TmaLayout* out) {
  if (p.K == 0) return false;
  int batch_dim = -1;  // the one batch dim with more than one matrix, if any
  if (!mt::at_most_one_dim(p.a_batch, &batch_dim)) return false;
  const long long a_bs = batch_dim >= 0 ? p.a_batch.strides[batch_dim] : 0;
  const long long b_bs = batch_dim >= 0 ? p.b_batch.strides[batch_dim] : 0;
  out->a_kmajor = tma_major(p.a_k_stride, p.a_row_stride);
  out->b_kmajor = tma_major(p.b_k_stride, p.b_col_stride);
  if (!out->a_kmajor && !tma_major(p.a_row_stride, p.a_k_stride)) return false;
  if (!out->b_kmajor && !tma_major(p.b_col_stride, p.b_k_stride)) return false;
  out->a = out->a_kmajor ? Operand{p.a, p.K, p.M, p.a_row_stride, a_bs} : Operand{p.a, p.M, p.K, p.a_k_stride, a_bs};
  out->b = out->b_kmajor ? Operand{p.b, p.K, p.N, p.b_col_stride, b_bs} : Operand{p.b, p.N, p.K, p.b_k_stride, b_bs};
  return true;
}

// The tile shape MINITORCH_BF16_TMA_SHAPE names (an index into kTmaShapes) for every product, or -1:
// a knob for tests and measurements, read at each plan so that a test may set it in its process.
inline int forced_tma_shape() {
  const char* forced = std::getenv("MINITORCH_BF16_TMA_SHAPE");
  if (forced == nullptr) return -1;
  char* end = nullptr;
  const long i = std::strtol(forced, &end, 10);
  return end != forced && *end == '\0' && i >= 0 && i < kTmaShapeCount ? static_cast<int>(i) : -1;
}

// beside: the product runs beside other work, which wants the SMs its tiles leave (above); l: p's
// operands as TMA reads them (tma_layout). A shape that reads a K-major B only (192 x 192) is planned, or
// forced, only for such a product.
inline Plan tma_plan(const Params& p, const TmaLayout& l, int sms, int max_splits, bool beside) {
  const int forced = forced_tma_shape();
  if (forced >= 0 && (!kTmaShapes[forced].k_major_b || l.b_kmajor)) {
    Plan plan = plan_product(kTmaShapes + forced, 1, p.M, p.N, p.K, p.batch, sms, max_splits);
    plan.shape = forced;
    return plan;
  }
  const int shapes = p.M > p.N || beside ? kTmaRowsShapes : kTmaPlannedShapes;
  return plan_product(kTmaShapes, shapes, p.M, p.N, p.K, p.batch, sms, max_splits, l.b_kmajor);
}

// The kernel's tensor maps of A, B and, where the epilogue stores through TMA, the output; b2: a
// clustered product's MN-major B columns 64..95 (bf16_cluster.cuh).
struct TmaMaps {
  CUtensorMap a, b, b2, out;
};

// Tensor map of q's bf16 output seen as `rows` x `cols` matrices with rows q.ldc apart (q.batch of them),
// in 4 KB boxes of box_cols columns (64: 128-byte rows, or 32).
inline bool encode_output(CUtensorMap* map, const Params& q, int cols, int rows, int box_cols) {
  const long long matrix = q.batch > 1 ? static_cast<long long>(rows) * q.ldc : 0;
  return tma::encode_operand(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, q.out, cols, rows, q.ldc, matrix, q.batch,
                             box_cols, 2048 / box_cols);
}

// Whether the epilogue of p (its plan's tiles BN wide, `splits` K splits) stores through TMA
// (store_tile_tma), encoding the output's map if so, in boxes of 32 rows x 64 columns, or 64 x 32 where
// BN is no multiple of 64: a bf16 output with no epilogue or + bias, whole 32-column pieces, no
// accumulation or split partial sums, and an output TMA can address (16-byte aligned base and rows).
inline bool tma_store_output(const Params& p, int bn, int splits, CUtensorMap* map) {
  if (!p.out_bf16 || p.accumulate || splits > 1 || (p.epilogue != kNone && p.epilogue != kBias) || bn % 32 != 0 ||
      p.ldc % 8 != 0) {
    return false;
  }
  return encode_output(map, p, p.N, p.M, bn % 64 == 0 ? 64 : 32);
}

template <bool A_KMAJOR, bool B_KMAJOR, int BM, int BN, int KIND>
int launch_tma_kernel(const TmaMaps& maps, const TmaParams& tp, int grid, cudaStream_t stream) {
  using Cfg = TmaConfig<BM, BN>;
  return mt::launch_with_shared_memory<matmul_bf16_tma_kernel<A_KMAJOR, B_KMAJOR, BM, BN, KIND>, true>(
      dim3(static_cast<unsigned>(grid)), Cfg::kThreads, Cfg::kSmemBytes, stream, maps.a, maps.b, maps.out, tp);
}

// The kernels' instance for a launch's epilogue (EpilogueKind), each holding only the code it runs. As one
// instance (the store a runtime choice, twice the code), a product that followed another kernel waited on
// its instruction fetches: GPT-2's attention projection, launched after another product and an L2 flush,
// took 17.0-17.3 us against 13.5-13.6 apart (cuBLAS 13.3-13.5), and the training step (B 4) 9.28-9.29 ms
// against 9.16-9.17. The plain sums apart from the other staged epilogues took the weight gradients into
// float32 after another product 31.4 -> 29.0 us (qkv) and 19.2 -> 17.0 (attn proj), the step 9.24-9.25 ->
// 9.21 ms (H200; benchmarks/bench_matmul_cold.py, bf16_notes.md, twenty-second session). `launch` takes the
// kind as a std::integral_constant, for its kernel's template argument.
template <class Launch>
int with_epilogue_kind(const TmaParams& tp, Launch launch) {
  switch (epilogue_kind(tp.store, tp.p.epilogue)) {
    case kTmaStores: return launch(std::integral_constant<int, kTmaStores>{});
    case kStagedPlain: return launch(std::integral_constant<int, kStagedPlain>{});
    default: return launch(std::integral_constant<int, kStagedAny>{});
  }
}

// The TMA kernel's instance for tp's epilogue.
template <bool A_KMAJOR, bool B_KMAJOR, int BM, int BN>
int launch_tma_instance(const TmaMaps& maps, const TmaParams& tp, int grid, cudaStream_t stream) {
  return with_epilogue_kind(tp, [&](auto kind) {
    return launch_tma_kernel<A_KMAJOR, B_KMAJOR, BM, BN, decltype(kind)::value>(maps, tp, grid, stream);
  });
}

// How many clusters of the clustered kernel C fit on the current device at once (its blocks take an SM
// each, a cluster's in one GPC), once per device; 0 where none do.
template <class C>
inline int cluster_capacity() {
  static std::atomic<int> cached[mt::kMaxDevicesCached] = {};  // 0 unknown, else clusters + 1
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= mt::kMaxDevicesCached) return 0;
  if (cached[device].load() == 0) {
    const auto kernel = matmul_bf16_cluster_kernel<C, false, true, kStagedAny>;  // an instance every C has
    static std::atomic<unsigned long long> configured{0};
    cudaLaunchAttribute attributes[2];
    const cudaLaunchConfig_t config = mt::dependent_config(dim3(C::kBlocks * 16), dim3(C::kThreads), C::kSmemBytes,
                                                           C::kBlocks, nullptr, attributes);
    int clusters = 0;
    if (mt::allow_shared_memory(kernel, C::kSmemBytes, &configured) != cudaSuccess ||
        cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
      clusters = 0;
    }
    cudaGetLastError();  // no clusters is an answer here, not an error for the next launch
    cached[device].store(clusters + 1);
  }
  return cached[device].load() - 1;
}

template <class C, bool A_KMAJOR, bool B_KMAJOR, int KIND>
int launch_cluster_kernel(const TmaMaps& maps, const TmaParams& tp, int grid, cudaStream_t stream) {
  constexpr auto kernel = matmul_bf16_cluster_kernel<C, A_KMAJOR, B_KMAJOR, KIND>;
  static std::atomic<unsigned long long> configured{0};
  MT_RETURN_IF_ERROR(mt::allow_shared_memory(kernel, C::kSmemBytes, &configured));
  return mt::launch_dependent_in_clusters(kernel, dim3(static_cast<unsigned>(grid)), dim3(C::kThreads), C::kSmemBytes,
                                          C::kBlocks, stream, maps.a, maps.b, maps.b2, maps.out, tp);
}

// The clustered kernel's instance for tp's epilogue.
template <class C, bool A_KMAJOR, bool B_KMAJOR>
int launch_cluster_instance(const TmaMaps& maps, const TmaParams& tp, int grid, cudaStream_t stream) {
  return with_epilogue_kind(tp, [&](auto kind) {
    return launch_cluster_kernel<C, A_KMAJOR, B_KMAJOR, decltype(kind)::value>(maps, tp, grid, stream);
  });
}

// The operand maps of bf16_cluster.cuh's kernel C: A and B in the parts its blocks load (ClusterConfig),
// an MN-major B's columns 64..95 in 32-column boxes under the 128-byte swizzle.
template <class C>
inline bool cluster_maps(const TmaLayout& l, long long batch, TmaMaps* maps) {
  if (!encode(&maps->a, l.a, batch, l.a_kmajor ? C::kAPartRows : C::kAPartK)) return false;
  if (l.b_kmajor) return encode(&maps->b, l.b, batch, C::kBPartRows);
  return encode(&maps->b, l.b, batch, C::kBPartK) && encode(&maps->b2, l.b, batch, C::kBPartK, 32, true);
}

// The plan with the planner's 64 x 128 tiles, unsplit, as 64 x 96 ones in clusters of 8 where they fit;
// the clustered shape, forced where clusters cannot run, as 64 x 128.
inline Plan clustered(Plan plan) {
  const bool fit = cluster_capacity<Clustered64x96>() > 0;
  if (plan.shape == kNarrowShape && plan.splits == 1 && fit && forced_tma_shape() < 0) plan.shape = kClusterShape;
  if (plan.shape == kClusterShape && !fit) plan.shape = kNarrowShape;
  return plan;
}

template <int BM, int BN>
int launch_tma_shape(const TmaMaps& maps, const TmaParams& tp, const TmaLayout& l, int grid, cudaStream_t stream) {
  if (l.a_kmajor && l.b_kmajor) return launch_tma_instance<true, true, BM, BN>(maps, tp, grid, stream);
  if (l.a_kmajor) return launch_tma_instance<true, false, BM, BN>(maps, tp, grid, stream);
  if (l.b_kmajor) return launch_tma_instance<false, true, BM, BN>(maps, tp, grid, stream);
  return launch_tma_instance<false, false, BM, BN>(maps, tp, grid, stream);
}

constexpr int kNotTaken = -1;

// The output map (where the epilogue stores through TMA) and kernel parameters of q under `plan`, whose
// consumer warpgroups store pieces store_cols wide; store: kStoreTransposed for a transpose, else the
// epilogue's choice (tma_store_output). False where TMA cannot address a transposed output.
inline bool tma_params(const Params& q, const TmaLayout& l, const Plan& plan, int store_cols, bool transposed,
                       void* workspace, TmaMaps* maps, TmaParams* tp) {
  int store = kStoreStaged;
  if (transposed) {  // the output's columns are q's rows; boxes of 32 rows x 64 columns
    if (!encode_output(&maps->out, q, q.M, q.N, 64)) return false;
    store = kStoreTransposed;
  } else if (tma_store_output(q, store_cols, plan.splits, &maps->out)) {
    store = kStoreTma;
  }
  const TileShape& s = kTmaShapes[plan.shape];
  *tp = TmaParams{plan.splits > 1 ? partial_params(q, workspace) : q, l.a.batch_stride != 0, l.b.batch_stride != 0,
                  store};
  tp->p.tiles_m = static_cast<int>(ceil_div(q.M, s.bm));
  tp->p.tiles_n = static_cast<int>(ceil_div(q.N, s.bn));
  tp->p.k_tiles = plan.k_tiles;
  tp->p.splits = plan.splits;
  tp->p.k_tiles_per_split = plan.k_tiles_per_split;
  return true;
}

// Blocks (or clusters) for q's `units` units with room for `slots` at once. Where there are more units than
// slots and q's operands exceed L2, so that its waves read them from DRAM, the fewest blocks that take as many
// waves, every block running the same number of units or one fewer: then each wave is a whole number of the
// tile order's columns (tile_coords), and the 512 tiles of 128 x 256 of a 4096^3 product run on 128 blocks, 4
// each, in waves of 16 x 8 tiles, where 132 blocks' waves straddled the groups of 16 tile rows: 172.2 -> 170.9
// us on an H200, cuBLAS 170.9. Else one per unit up to `slots`: GPT-2's products, whose operands L2 holds,
// gained nothing from whole waves, and its step lost 0.03 ms (bf16_notes.md, twenty-first session).
inline int persistent_grid(const Params& q, long long units, int slots) {
  const long long operands = 2LL * q.batch * (static_cast<long long>(q.M) + q.N) * q.K;
  int l2 = 0;
  if (units <= slots || mt::l2_cache_bytes(&l2) != cudaSuccess || operands <= l2) {
    return static_cast<int>(std::min<long long>(units, slots));
  }
  return static_cast<int>(ceil_div(units, ceil_div(units, std::max(slots, 1))));
}

// q (`units` units of work) on the TMA kernel's BM x BN tiles, a block per SM at most (persistent_grid); the
// arguments as run_tma's.
template <int BM, int BN>
inline int run_tiles(const Params& q, const TmaLayout& l, const Plan& plan, bool transposed, void* workspace,
                     long long units, int sms, cudaStream_t stream) {
  TmaMaps maps{};
  TmaParams tp;
  if (!encode(&maps.a, l.a, q.batch, l.a_kmajor ? BM : kTmaBK) ||
      !encode(&maps.b, l.b, q.batch, l.b_kmajor ? BN : kTmaBK) ||
      !tma_params(q, l, plan, BN, transposed, workspace, &maps, &tp)) {
    return kNotTaken;
  }
  return launch_tma_shape<BM, BN>(maps, tp, l, persistent_grid(q, units, sms), stream);
}

// q on bf16_cluster.cuh's kernel C (its consumer warpgroups store pieces of a half's columns, 96), as many
// clusters as the device holds at most (`sms` where a cluster is one block; persistent_grid); the arguments as
// run_tma's.
template <class C>
inline int run_clustered(const Params& q, const TmaLayout& l, const Plan& plan, bool transposed, void* workspace,
                         int sms, cudaStream_t stream) {
  TmaMaps maps{};
  TmaParams tp;
  if (!cluster_maps<C>(l, q.batch, &maps) ||
      !tma_params(q, l, plan, C::BN / C::kHalves, transposed, workspace, &maps, &tp)) {
    return kNotTaken;
  }
  const int capacity = C::kBlocks == 1 ? sms : cluster_capacity<C>();
  const int grid = C::kBlocks * persistent_grid(q, cluster_units<C>(tp.p), capacity);
  if (l.a_kmajor && l.b_kmajor) return launch_cluster_instance<C, true, true>(maps, tp, grid, stream);
  if (l.b_kmajor) return launch_cluster_instance<C, false, true>(maps, tp, grid, stream);
  if constexpr (C::kHalves == 1) {
    if (l.a_kmajor) return launch_cluster_instance<C, true, false>(maps, tp, grid, stream);
    return launch_cluster_instance<C, false, false>(maps, tp, grid, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);  // tma_plan gives 192 x 192 tiles a K-major B only
}

// Runs q (p, or its transpose) on the TMA path with `plan`, read through layout l, its K split through
// `workspace` where the plan splits it; transposed: q is p's transpose, its output stored back transposed
// (store_tile_tma_t). kNotTaken where a tensor map cannot be made: the caller runs the generic kernel on p.
inline int run_tma(const Params& q, const TmaLayout& l, const Plan& plan, bool transposed, void* workspace, int sms,
                   cudaStream_t stream) {
  const TileShape& s = kTmaShapes[plan.shape];
  const long long units = static_cast<long long>(q.batch) * plan.splits * ceil_div(q.M, s.bm) * ceil_div(q.N, s.bn);
  if (units > mt::kMaxInt) return kNotTaken;
  int status = 0;
  switch (plan.shape) {
    case 0: status = run_tiles<128, 256>(q, l, plan, transposed, workspace, units, sms, stream); break;
    case 1: status = run_tiles<128, 192>(q, l, plan, transposed, workspace, units, sms, stream); break;
    case 2: status = run_tiles<128, 128>(q, l, plan, transposed, workspace, units, sms, stream); break;
    case 3: status = run_tiles<192, 128>(q, l, plan, transposed, workspace, units, sms, stream); break;
    case 4: status = run_clustered<Tile192x96>(q, l, plan, transposed, workspace, sms, stream); break;
    case 5: status = run_tiles<64, 128>(q, l, plan, transposed, workspace, units, sms, stream); break;
    case 6: status = run_clustered<Tile192x192>(q, l, plan, transposed, workspace, sms, stream); break;
    default: status = run_clustered<Clustered64x96>(q, l, plan, transposed, workspace, sms, stream); break;
  }
  return status != 0 || plan.splits == 1 ? status : reduce_splits(q, workspace, plan.splits, stream);
}

// p as its transpose: D = C^T = B^T A^T, N x M, A and B (and their batch layouts) trading places.
inline Params transposed_product(const Params& p) {
  Params t = p;
  t.M = p.N, t.N = p.M;
  t.a = p.b, t.b = p.a;
  t.a_row_stride = p.b_col_stride, t.a_k_stride = p.b_k_stride;
  t.b_k_stride = p.a_k_stride, t.b_col_stride = p.a_row_stride;
  t.a_batch = p.b_batch, t.b_batch = p.a_batch;
  return t;
}

// Output tiles of a product under a plan.
inline long long plan_tiles(const Params& p, const Plan& plan) {
  const TileShape& s = kTmaShapes[plan.shape];
  return static_cast<long long>(p.batch) * ceil_div(p.M, s.bm) * ceil_div(p.N, s.bn);
}

// Whether p (read through l) runs as its transpose t (plan in *plan; layout in *lt, l's operands traded),
// stored back transposed (store_tile_tma_t): a product with more rows than columns, which the planner keeps
// off 192-row tiles (tma_plan), with no epilogue or accumulation into a bf16 output TMA can address, not
// beside other work, whose transpose the planner gives 128- or 192-row tiles without K splits, where either
//   - those are 192 x 192 (the transpose's B, p's A, K-major) and estimated faster than p's own plan:
//     GPT-2's qkv product X W (4096 x 2304 x 768) in 264 tiles, two waves, where p's 128 x 192 tiles make
//     384 in three (26.3-26.9 -> 25.6-26.3 us on an H100, cuBLAS 25.6-26.3: bf16_notes.md, eighteenth
//     session); cuBLAS, column-major, runs it this way (`192x192_64x3_2x1_v_bz_coopB`);
//   - or the transpose makes one wave of more tiles than p's own plan, and either K is at least p's rows
//     and those tiles have 192 rows (a weight gradient's long K: GPT-2's 3072 x 768 weight gradient on
//     the 192 x 96 tiles of 768 x 3072, 128 tiles where 128 x 192 makes 96; 35.1 -> 32.5 us on an H100) or
//     both operands are K-major, so that the transpose reads them as p does: GPT-2's input gradients dY W^T
//     (4096 x 768, K 768-3072) on 132 tiles of 128 x 192 where p's make 128 (H200: qkv's 23.0-23.1 ->
//     22.6-22.8 us, attn proj's 10.9-11.0 -> 10.6-10.7; bf16_notes.md, twentieth session). The LM head's
//     input gradient (K 50257, the embedding MN-major) ran 401-410 -> 531-556 us on 128 x 192 tiles as
//     its transpose: it keeps its own plan. A Linear's input gradient in backward runs beside its weight
//     gradient (minitorch/cuda/matmul.py), where 132 tiles left that no SM and GPT-2's step lost 0.04 ms:
//     there it keeps its own 128 tiles.
inline bool runs_transposed(const Params& p, const TmaLayout& l, bool beside, int sms, Params* t, TmaLayout* lt,
                            Plan* plan) {
  if (beside || p.M <= p.N || p.epilogue != kNone || p.accumulate || !p.out_bf16 || p.ldc % 8 != 0 ||
      !mt::is_aligned16(p.out)) {
    return false;
  }
  *t = transposed_product(p);
  *lt = TmaLayout{l.b, l.a, l.b_kmajor, l.a_kmajor};
  *plan = tma_plan(*t, *lt, sms, 1, false);
  const int bm = kTmaShapes[plan->shape].bm;
  if (bm < 128) return false;
  const Plan own = tma_plan(p, l, sms, 1, false);
  if (plan->shape == kHalvesShape) return forced_tma_shape() == kHalvesShape || plan->cost < 0.97 * own.cost;
  const long long tiles = plan_tiles(*t, *plan);
  const bool long_k = p.K >= p.M && bm == 192, same_layouts = l.a_kmajor && l.b_kmajor;
  return (long_k || same_layouts) && tiles <= sms && tiles > plan_tiles(p, own);
}

// Runs p on the TMA path, splitting K where the plan asks and `workspace_bytes` of `workspace` hold the
// partial sums (else without splits), or as its transpose (runs_transposed); beside as tma_plan's.
// kNotTaken when the operands do not fit the path: the caller runs the generic kernel.
inline int launch_tma(const Params& p, void* workspace, long long workspace_bytes, int sms, bool beside,
                      cudaStream_t stream) {
  TmaLayout l, lt;
  if (!tma_layout(p, &l)) return kNotTaken;
  Params t;
  Plan plan;
  if (runs_transposed(p, l, beside, sms, &t, &lt, &plan)) return run_tma(t, lt, plan, true, nullptr, sms, stream);
  plan = tma_plan(p, l, sms, kMaxSplits, beside);
  if (partial_bytes(plan, p.M, p.N, p.batch) > workspace_bytes || !mt::is_aligned16(workspace)) {
    plan = tma_plan(p, l, sms, 1, beside);
  }
  return run_tma(p, l, clustered(plan), false, workspace, sms, stream);
}

}  // namespace bf16mm
