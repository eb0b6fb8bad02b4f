// Batched, broadcasting float32 matrix product on the tensor cores, with a fused epilogue:
//   out[i] = epilogue(A[i] @ B[i])   for every batch index i,
// A[i][r, k] = a[a_off(i) + r * a_row_stride + k * a_k_stride], B[i][k, c] = b[b_off(i) + k * b_k_stride +
// c * b_col_stride] (any strides: transposed views are read in place), out[i] [M, N] with rows ldc apart.
// Epilogues: none, + bias[c], gelu(x + bias[c]) (tanh form, as minitorch.operators.gelu), relu(x + bias[c]);
// the pre-activation x + bias can be stored too, and out += result instead of out = result.
//
// Precision. "highest" is 3xTF32 (includes/mma_tf32.cuh): each operand element is split once per
// fragment load into hi + lo, and a b ~= lo_a hi_b + hi_a lo_b + hi_a hi_b. The tensor core's adder
// truncates, so a sum over long K drifts; each K tile of 32 is summed in fresh accumulators that are
// then added in float32, which keeps the error at float32 level for any K. "high" is one TF32 product
// with the operands rounded to nearest TF32 (as cuBLAS's TF32 mode), accumulated in the tensor core.
//
// The kernels, each in a header of src/matmul/ (matmul/NOTES.md keeps the history of their design):
//   mma.cuh      mma.sync kernel (sm_80+), operands staged through tiles.cuh's cp.async ring;
//   wgmma.cuh    sm_90a: the same staging, products on wgmma (big tiles the TMA path cannot read);
//   tma_*.cuh    sm_90a: products whose operands TMA can read (a unit-stride dim, 16-byte strides, at
//                most one batch dim), on a warp-specialized TMA + wgmma kernel that also shares out
//                few-tile products by stream-K;
//   split_k.cuh  K splits of few-tile products for the first two (plan.cuh plans them).
// This file keeps the C ABI and the choice between them.
#include <cuda_runtime.h>

#include <algorithm>

#include "includes/cuda_check.cuh"
#include "includes/device_info.cuh"
#include "includes/launch_utils.cuh"
#include "includes/layout.cuh"
#include "includes/mma_tf32.cuh"
#include "includes/vec.cuh"
#include "matmul/mma.cuh"
#include "matmul/params.cuh"
#include "matmul/plan.cuh"
#include "matmul/split_k.cuh"
#include "matmul/tma_launch.cuh"
#include "matmul/tma_plan.cuh"
#include "matmul/wgmma.cuh"

namespace {

// Whether 16-byte copies can stage an operand: its contiguous dim at stride 1, the other stride and
// every batch stride multiples of 4, and a 16-byte aligned base.
bool vec_operand(const float* x, int contiguous_stride, int other_stride, const MtLayout& batch) {
  if (contiguous_stride != 1 || other_stride % 4 != 0 || !mt::is_aligned16(x)) return false;
  for (int d = 0; d < batch.ndim; ++d) {
    if (batch.shape[d] > 1 && batch.strides[d] % 4 != 0) return false;
  }
  return true;
}

template <class Cfg, int PREC>
struct MmaKernels {
  template <bool A_KC, bool B_KC>
  static int launch(const MatmulParams& p, dim3 grid, cudaStream_t stream) {
    return mt::launch_with_shared_memory<matmul_mma_kernel<Cfg, A_KC, B_KC, PREC>>(
        grid, Cfg::kThreads, mma_smem_bytes<Cfg, A_KC, B_KC>(), stream, p);
  }
};

template <int PREC>
struct WgmmaKernels {
  template <bool A_KC, bool B_KC>
  static int launch(const MatmulParams& p, dim3 grid, cudaStream_t stream) {
    return mt::launch_with_shared_memory<matmul_wgmma_kernel<PREC, A_KC, B_KC>>(
        grid, kWgThreads, wgmma_smem_bytes<PREC, A_KC, B_KC>(), stream, p);
  }
};

// Launches Kernels' instance for the operand layouts on BM x BN tiles. A tile is k-contiguous unless
// the operand's rows (columns for B) are its unit-stride dim.
template <class Kernels, int BM, int BN>
int launch_tiles(MatmulParams p, int splits, cudaStream_t stream) {
  const bool a_kc = !(p.a_row_stride == 1 && p.a_k_stride != 1);
  const bool b_kc = !(p.b_col_stride == 1 && p.b_k_stride != 1);
  p.tiles_m = static_cast<int>(ceil_div(p.M, BM));
  p.tiles_n = static_cast<int>(ceil_div(p.N, BN));
  p.a_vec = a_kc ? vec_operand(p.a, p.a_k_stride, p.a_row_stride, p.a_batch)
                 : vec_operand(p.a, p.a_row_stride, p.a_k_stride, p.a_batch);
  p.b_vec = b_kc ? vec_operand(p.b, p.b_k_stride, p.b_col_stride, p.b_batch)
                 : vec_operand(p.b, p.b_col_stride, p.b_k_stride, p.b_batch);
  const dim3 grid(p.tiles_m * p.tiles_n, splits, min(p.batch, kMaxGridZ));
  if (a_kc && b_kc) return Kernels::template launch<true, true>(p, grid, stream);
  if (a_kc) return Kernels::template launch<true, false>(p, grid, stream);
  if (b_kc) return Kernels::template launch<false, true>(p, grid, stream);
  return Kernels::template launch<false, false>(p, grid, stream);
}

// Whether the wgmma kernel's body was built for the current device (see its comment).
bool wgmma_available() {
  static int cached[mt::kMaxDevicesCached] = {0};  // 0 unknown, 1 yes, 2 no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (device < mt::kMaxDevicesCached && cached[device] != 0) return cached[device] == 1;
  cudaFuncAttributes attr{};
  const bool yes = cudaFuncGetAttributes(&attr, matmul_wgmma_kernel<kHighest, true, true>) == cudaSuccess &&
                   attr.maxThreadsPerBlock >= kWgThreads;
  cudaGetLastError();  // a missing image is an answer here, not an error for the next launch
  if (device < mt::kMaxDevicesCached) cached[device] = yes ? 1 : 2;
  return yes;
}

int launch_products(const MatmulParams& p, int precision, TileConfig config, int splits, cudaStream_t stream) {
  if (config == kBigTiles && wgmma_available()) {
    return precision == kHighest ? launch_tiles<WgmmaKernels<kHighest>, kWgBM, kWgBN>(p, splits, stream)
                                 : launch_tiles<WgmmaKernels<kHigh>, kWgBM, kWgBN>(p, splits, stream);
  }
  if (config == kBigTiles) {
    return precision == kHighest ? launch_tiles<MmaKernels<BigMma, kHighest>, 128, 128>(p, splits, stream)
                                 : launch_tiles<MmaKernels<BigMma, kHigh>, 128, 128>(p, splits, stream);
  }
  return precision == kHighest ? launch_tiles<MmaKernels<SmallMma, kHighest>, 64, 64>(p, splits, stream)
                               : launch_tiles<MmaKernels<SmallMma, kHigh>, 64, 64>(p, splits, stream);
}

}  // namespace

// ================================================================================================
// C ABI
// ================================================================================================
extern "C" {

MT_DEFINE_ERROR_STRING()

// Floats of scratch that launch_matmul uses for a product of these sizes, operand strides (as
// launch_matmul's) and precision on the current device (0: none).
long long matmul_workspace_floats(int M, int N, int K, int batch, int a_row_stride, int a_k_stride, int b_k_stride,
                                  int b_col_stride, int precision) {
  int sms = 0;
  if (M <= 0 || N <= 0 || K <= 0 || batch <= 0 || mt::sm_count(&sms) != cudaSuccess) return 0;
  MatmulParams p{};
  p.M = M, p.N = N, p.K = K, p.batch = batch;
  p.a_row_stride = a_row_stride, p.a_k_stride = a_k_stride, p.b_k_stride = b_k_stride, p.b_col_stride = b_col_stride;
  return std::max(plan_workspace(plan_matmul(M, N, K, batch, sms), M, N, batch),
                  wgmma_available() ? tma::workspace_floats(p, precision, sms) : 0LL);
}

// out[i] = epilogue(A[i] @ B[i]) for every batch index i of a_batch / b_batch (same shape; their strides
// locate A[i] and B[i], 0 = broadcast); out[i] is [M, N] with rows ldc >= N floats apart, at out + i * M * ldc.
// precision: 0 "highest" (3xTF32), 1 "high" (one TF32 product). epilogue: 0 none, 1 + bias[c],
// 2 gelu(x + bias[c]), 3 relu(x + bias[c]) (bias may be NULL for 2 and 3). pre_act (epilogues 2, 3; may
// be NULL): receives x + bias. accumulate: out += result (epilogue 0 only). workspace: device scratch of
// workspace_floats floats; with fewer than matmul_workspace_floats(...) it runs without K splits, stream-K
// or the operand copy of the TMA path.
int launch_matmul(float* out, int ldc, const float* a, const float* b, int M, int N, int K, int a_row_stride,
                  int a_k_stride, int b_k_stride, int b_col_stride, MtLayout a_batch, MtLayout b_batch,
                  const float* bias, int epilogue, float* pre_act, int accumulate, int precision,
                  float* workspace, long long workspace_floats, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(M < 0 || N < 0 || K < 0 || ldc < N);
  MT_RETURN_IF_INVALID(!mt::valid_layout(a_batch) || !mt::valid_layout(b_batch) || !mt::same_shape(a_batch, b_batch));
  MT_RETURN_IF_INVALID(epilogue < kNone || epilogue > kBiasRelu || (accumulate && epilogue != kNone));
  MT_RETURN_IF_INVALID(precision != kHighest && precision != kHigh);
  MT_RETURN_IF_INVALID(epilogue == kBias && bias == nullptr);
  const long long batch = mt::layout_numel(a_batch);
  MT_RETURN_IF_INVALID(batch > (1LL << 31) - 1);
  if (batch == 0 || M == 0 || N == 0) return 0;
  int sms = 0;
  MT_RETURN_IF_ERROR(mt::sm_count(&sms));

  MatmulParams p{};
  p.a = a;
  p.b = b;
  p.out = out;
  p.bias = bias;
  p.pre_act = (epilogue == kBiasGelu || epilogue == kBiasRelu) ? pre_act : nullptr;
  p.M = M;
  p.N = N;
  p.K = K;
  p.ldc = ldc;
  p.a_row_stride = a_row_stride;
  p.a_k_stride = a_k_stride;
  p.b_k_stride = b_k_stride;
  p.b_col_stride = b_col_stride;
  p.a_batch = a_batch;
  p.b_batch = b_batch;
  p.batch = static_cast<int>(batch);
  p.epilogue = epilogue;
  p.accumulate = accumulate;
  p.out_vec = ldc % 4 == 0 && mt::is_aligned16(out) && (p.pre_act == nullptr || mt::is_aligned16(p.pre_act));

  if (wgmma_available()) {
    const int status = tma::launch(p, precision, workspace, workspace_floats, sms, stream);
    if (status != tma::kNotTaken) return status;
  }
  Plan plan = plan_matmul(M, N, K, batch, sms);
  const long long needed = plan_workspace(plan, M, N, batch);
  if (K == 0 || needed > workspace_floats || (needed > 0 && !mt::is_aligned16(workspace))) {
    plan.splits = 1;
    plan.k_tiles_per_split = static_cast<int>(ceil_div(K, kBK));
  }
  p.k_tiles_per_split = plan.k_tiles_per_split;
  const int status = launch_products(plan.splits > 1 ? partial_params(p, workspace) : p, precision, plan.config,
                                     plan.splits, stream);
  return status != 0 || plan.splits == 1 ? status : reduce_splits(p, workspace, plan.splits, sms, stream);
}

}  // extern "C"
