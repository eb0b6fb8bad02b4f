// Batched, broadcasting bf16 matrix product on the tensor cores with float32 sums and a fused epilogue:
//   out[i] = epilogue(A[i] @ B[i])   for every batch index i,
// A[i][r, k] = a[a_off(i) + r * a_row_stride + k * a_k_stride], B[i][k, c] = b[b_off(i) + k * b_k_stride +
// c * b_col_stride] (any strides: transposed views are read in place), out[i] [M, N] in float32 or bf16
// with rows ldc apart. Epilogues (matmul/bf16_common.cuh): none, + bias, GELU (tanh form) or ReLU of
// x + bias with the pre-activation stored, out += result, and the backward ones: x times GELU's or
// ReLU's derivative at a pre-activation read beside the output.
//
// Two kernels:
//   matmul/bf16_wgmma.cuh (sm_90a builds, on products whose operands TMA can read: a unit-stride dim,
//     rows 16-byte multiples, 16-byte aligned bases, at most one batch dim): a persistent,
//     warp-specialized kernel, TMA loads into a 128-byte-swizzled ring, wgmma with both operands read
//     from shared memory K-major or MN-major as they lie in memory (no transposing copy);
//   matmul/bf16_mma.cuh (everything else, and GPUs without sm_90a code): mma.sync m16n8k16 with a
//     cp.async ring, any strides and sizes.
// Both split K over several blocks where a product has too few output tiles to fill the GPU (the
// planner in bf16_common.cuh weighs waves against the partial sums' traffic); the partial sums go to the
// caller's workspace and split_k_reduce adds them in a fixed order and runs the epilogue, so results
// are the same bits on every run. A launch allocates, clears and synchronizes nothing: with the same
// workspace it can be captured in a CUDA graph and replayed.
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"
#include "includes/device_info.cuh"
#include "includes/launch_utils.cuh"
#include "includes/layout.cuh"
#include "includes/vec.cuh"
#include "matmul/bf16_common.cuh"
#include "matmul/bf16_mma.cuh"
#include "matmul/bf16_tma.cuh"

namespace {

using bf16mm::Params;
using bf16mm::Plan;

Plan generic_plan(const Params& p, int sms) {
  return bf16mm::plan_product(bf16mm::kMmaShapes, 2, p.M, p.N, p.K, p.batch, sms, bf16mm::kMaxSplits);
}

// Params of a product from the launcher's arguments (without the output, bias and epilogue).
Params product_params(int M, int N, int K, long long batch, int a_row_stride, int a_k_stride, int b_k_stride,
                      int b_col_stride) {
  Params p{};
  p.M = M, p.N = N, p.K = K, p.batch = static_cast<int>(batch);
  p.a_row_stride = a_row_stride, p.a_k_stride = a_k_stride, p.b_k_stride = b_k_stride, p.b_col_stride = b_col_stride;
  return p;
}

// Whether x (element i at x + i * bytes) can be read or written w elements at a time from i a multiple of w.
bool aligned(const void* x, int w, int bytes) {
  return x == nullptr || reinterpret_cast<std::uintptr_t>(x) % (w * bytes) == 0;
}

}  // namespace

extern "C" {

MT_DEFINE_ERROR_STRING()

// Bytes of scratch that launch_matmul_bf16 uses for a product of these sizes and operand strides on the
// current device (0: none). It depends on the sizes and on whether TMA can read the operands (16-byte
// strides), not on the pointers, the output dtype or the epilogue.
long long matmul_bf16_workspace_bytes(int M, int N, int K, int batch, int a_row_stride, int a_k_stride,
                                      int b_k_stride, int b_col_stride) {
  int sms = 0;
  if (M <= 0 || N <= 0 || K <= 0 || batch <= 0 || mt::sm_count(&sms) != cudaSuccess) return 0;
  const Params p = product_params(M, N, K, batch, a_row_stride, a_k_stride, b_k_stride, b_col_stride);
  const long long generic = bf16mm::partial_bytes(generic_plan(p, sms), M, N, batch);
  long long tma = 0;  // whether or not the product runs beside other work
  bf16mm::TmaLayout l;
  if (bf16mm::tma_available() && bf16mm::tma_layout(p, &l)) {
    for (const bool beside : {false, true}) {
      const bf16mm::Plan plan = bf16mm::tma_plan(p, l, sms, bf16mm::kMaxSplits, beside);
      tma = std::max(tma, bf16mm::partial_bytes(plan, M, N, batch));
    }
  }
  return std::max(generic, tma);
}

// out[i] = epilogue(A[i] @ B[i]) for every batch index i of a_batch / b_batch (same shape; their strides
// locate A[i] and B[i], 0 = broadcast); out[i] is [M, N] with rows ldc >= N elements apart, at
// out + i * M * ldc. a, b: bf16. out_dtype: 0 float32, 1 bf16; bias [N] and pre_act (like out) have the
// output's dtype. epilogue: 0 none, 1 + bias[c], 2 gelu(x + bias[c]), 3 relu(x + bias[c]) (bias may be
// NULL for 2 and 3), 4 x * gelu'(pre_act), 5 x * relu'(pre_act) (no bias), 6 and 7 as 2 and 3 keeping
// the derivative, 8 x * pre_act (no bias). pre_act (epilogues 2, 3; may be NULL): receives x + bias;
// (6, 7; may be NULL) receives gelu'(x + bias) or relu'(x + bias); (4, 5, 8; required) is read.
// accumulate (epilogues 0 and 1):
// out = result + addend, addend laid out as out (NULL: out itself, out += result). beside: the product
// runs beside other work on another stream (a weight gradient beside an input gradient), so its tiles
// leave SMs to that work (bf16_tma.cuh's tma_plan). workspace: device scratch of workspace_bytes bytes;
// with fewer than matmul_bf16_workspace_bytes(...) the product runs without K splits.
int launch_matmul_bf16(void* out, int out_dtype, int ldc, const void* a, const void* b, int M, int N, int K,
                       int a_row_stride, int a_k_stride, int b_k_stride, int b_col_stride, MtLayout a_batch,
                       MtLayout b_batch, const void* bias, int epilogue, void* pre_act, int accumulate,
                       const void* addend, int beside, void* workspace, long long workspace_bytes,
                       cudaStream_t stream) {
  MT_RETURN_IF_INVALID(M < 0 || N < 0 || K < 0 || ldc < N);
  MT_RETURN_IF_INVALID(out_dtype != bf16mm::kOutF32 && out_dtype != bf16mm::kOutBf16);
  MT_RETURN_IF_INVALID(!mt::valid_layout(a_batch) || !mt::valid_layout(b_batch) || !mt::same_shape(a_batch, b_batch));
  MT_RETURN_IF_INVALID(epilogue < bf16mm::kNone || epilogue > bf16mm::kScaleBack || (accumulate && epilogue > bf16mm::kBias));
  MT_RETURN_IF_INVALID(epilogue == bf16mm::kBias && bias == nullptr);
  const bool backward = bf16mm::backward_epilogue(epilogue);
  MT_RETURN_IF_INVALID(backward && (pre_act == nullptr || bias != nullptr));
  const long long batch = mt::layout_numel(a_batch);
  MT_RETURN_IF_INVALID(batch > mt::kMaxInt);
  if (batch == 0 || M == 0 || N == 0) return 0;
  int sms = 0;
  MT_RETURN_IF_ERROR(mt::sm_count(&sms));

  Params p = product_params(M, N, K, batch, a_row_stride, a_k_stride, b_k_stride, b_col_stride);
  p.a = static_cast<const __nv_bfloat16*>(a);
  p.b = static_cast<const __nv_bfloat16*>(b);
  p.out = out;
  p.bias = bias;
  p.pre_act = (bf16mm::forward_activation(epilogue) || backward) ? pre_act : nullptr;
  p.ldc = ldc;
  p.a_batch = a_batch;
  p.b_batch = b_batch;
  p.out_bf16 = out_dtype == bf16mm::kOutBf16;
  p.epilogue = epilogue;
  p.accumulate = accumulate;
  p.addend = accumulate ? (addend != nullptr ? addend : out) : nullptr;
  const int bytes = p.out_bf16 ? 2 : 4;
  const void* used_bias = epilogue != bf16mm::kNone && !backward ? bias : nullptr;
  const auto vec = [&](int w) {
    return ldc % w == 0 && aligned(out, w, bytes) && aligned(p.pre_act, w, bytes) && aligned(used_bias, w, bytes) &&
           aligned(p.addend, w, bytes);
  };
  p.vec2 = vec(2);
  p.vec4 = vec(4);

  if (bf16mm::tma_available()) {
    const int status = bf16mm::launch_tma(p, workspace, workspace_bytes, sms, beside != 0, stream);
    if (status != bf16mm::kNotTaken) return status;
  }
  Plan plan = generic_plan(p, sms);
  if (bf16mm::partial_bytes(plan, M, N, batch) > workspace_bytes || !mt::is_aligned16(workspace)) {
    plan = bf16mm::plan_product(bf16mm::kMmaShapes, 2, M, N, K, batch, sms, 1);
  }
  return bf16mm::launch_generic(p, plan, workspace, stream);
}

}  // extern "C"
