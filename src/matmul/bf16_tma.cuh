// Host side of matmul_bf16_kernel.cu's Hopper path (bf16_wgmma.cuh): which products take it, their
// tensor maps, the tile width and K splits, and the launch.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>

#include "../includes/device_info.cuh"
#include "../includes/launch_utils.cuh"
#include "../includes/layout.cuh"
#include "../includes/tma.cuh"
#include "../includes/vec.cuh"
#include "bf16_common.cuh"
#include "bf16_wgmma.cuh"

namespace bf16mm {

using tma::encode_tiled;

// The planner's view of the three tile widths (bf16 wgmma on an H100: ~5.6 TFLOP/s per SM with 256-wide
// tiles, a little less with narrower ones, whose B tiles bring fewer products per byte). 192 fits
// widths such as 768 and 2304 to 132 SMs in fewer waves than 256.
constexpr TileShape kTmaShapes[] = {{kTmaBM, 256, kTmaBK, 1, 5.6e12}, {kTmaBM, 192, kTmaBK, 1, 5.4e12},
                                    {kTmaBM, 128, kTmaBK, 1, 4.8e12}};
constexpr int kTmaShapeCount = 3;

// One operand as TMA reads it: element (i, o) of batch matrix b at base[i + o * outer_stride +
// b * batch_stride] (elements), i along the unit-stride dim; batch_stride 0: one matrix for every b.
struct Operand {
  const __nv_bfloat16* base;
  long long inner, outer, outer_stride, batch_stride;
};

// Tensor map of op in boxes of 64 (inner: 128 bytes) x box_outer (tma::encode_operand).
inline bool encode(CUtensorMap* map, const Operand& op, long long batches, int box_outer) {
  return tma::encode_operand(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, op.base, op.inner, op.outer, op.outer_stride,
                             op.batch_stride, batches, 64, box_outer);
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
  const bool yes = cudaFuncGetAttributes(&attr, matmul_bf16_tma_kernel<true, true, 256>) == cudaSuccess &&
                   attr.maxThreadsPerBlock >= kTmaThreads && encode_tiled() != nullptr;
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

inline Plan tma_plan(const Params& p, int sms, int max_splits) {
  return plan_product(kTmaShapes, kTmaShapeCount, p.M, p.N, p.K, p.batch, sms, max_splits);
}

// The kernel's tensor maps of A and B.
struct TmaMaps {
  CUtensorMap a, b;
};

template <bool A_KMAJOR, bool B_KMAJOR, int BN>
int launch_tma_instance(const TmaMaps& maps, const TmaParams& tp, int grid, cudaStream_t stream) {
  return mt::launch_with_shared_memory<matmul_bf16_tma_kernel<A_KMAJOR, B_KMAJOR, BN>, true>(
      dim3(static_cast<unsigned>(grid)), kTmaThreads, TmaConfig<BN>::kSmemBytes, stream, maps.a, maps.b, tp);
}

template <int BN>
int launch_tma_width(const TmaMaps& maps, const TmaParams& tp, const TmaLayout& l, int grid, cudaStream_t stream) {
  if (l.a_kmajor && l.b_kmajor) return launch_tma_instance<true, true, BN>(maps, tp, grid, stream);
  if (l.a_kmajor) return launch_tma_instance<true, false, BN>(maps, tp, grid, stream);
  if (l.b_kmajor) return launch_tma_instance<false, true, BN>(maps, tp, grid, stream);
  return launch_tma_instance<false, false, BN>(maps, tp, grid, stream);
}

constexpr int kNotTaken = -1;

// Runs p on the TMA path, splitting K where the plan asks and `workspace_bytes` of `workspace` hold the
// partial sums (else without splits). kNotTaken when the operands do not fit the path: the caller runs
// the generic kernel.
inline int launch_tma(const Params& p, void* workspace, long long workspace_bytes, int sms, cudaStream_t stream) {
  TmaLayout l;
  if (!tma_layout(p, &l)) return kNotTaken;
  Plan plan = tma_plan(p, sms, kMaxSplits);
  if (partial_bytes(plan, p.M, p.N, p.batch) > workspace_bytes || !mt::is_aligned16(workspace)) {
    plan = tma_plan(p, sms, 1);
  }
  const int bn = kTmaShapes[plan.shape].bn;
  const long long units = static_cast<long long>(p.batch) * plan.splits * ceil_div(p.M, kTmaBM) * ceil_div(p.N, bn);
  if (units > mt::kMaxInt) return kNotTaken;
  TmaMaps maps{};
  if (!encode(&maps.a, l.a, p.batch, l.a_kmajor ? kTmaBM : kTmaBK) || !encode(&maps.b, l.b, p.batch, l.b_kmajor ? bn : kTmaBK)) {
    return kNotTaken;
  }
  TmaParams tp{plan.splits > 1 ? partial_params(p, workspace) : p, l.a.batch_stride != 0, l.b.batch_stride != 0};
  tp.p.tiles_m = static_cast<int>(ceil_div(p.M, kTmaBM));
  tp.p.tiles_n = static_cast<int>(ceil_div(p.N, bn));
  tp.p.k_tiles = plan.k_tiles;
  tp.p.splits = plan.splits;
  tp.p.k_tiles_per_split = plan.k_tiles_per_split;
  const int grid = static_cast<int>(std::min<long long>(units, sms));
  const int status = bn == 256   ? launch_tma_width<256>(maps, tp, l, grid, stream)
                     : bn == 192 ? launch_tma_width<192>(maps, tp, l, grid, stream)
                                 : launch_tma_width<128>(maps, tp, l, grid, stream);
  return status != 0 || plan.splits == 1 ? status : reduce_splits(p, workspace, plan.splits, stream);
}

}  // namespace bf16mm
