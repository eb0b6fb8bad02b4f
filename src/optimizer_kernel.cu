// optimizer_kernel.cu: fused AdamW, updating a parameter and both moments in place in one pass.
//
// The update of torch.optim.AdamW (decoupled weight decay, bias-corrected moments), per element:
//   p <- p * (1 - lr * weight_decay)
//   m <- beta1 * m + (1 - beta1) * g
//   v <- beta2 * v + (1 - beta2) * g^2
//   p <- p - (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// It reads p, g, m, v and writes p, m, v: 28 bytes per parameter, the least any AdamW can move.
//
// Thread mapping: a grid-stride loop over float4 groups with one wave of resident blocks; each
// thread issues its loads for two groups (8 independent 16-byte loads) before the first use. A
// scalar path takes tensors that are not 16-byte aligned, and the last n % 4 elements.
#include <cmath>
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"
#include "includes/device_info.cuh"
#include "includes/vec.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 2;

struct AdamWCoefficients {
  float decay;         // 1 - lr * weight_decay
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^step)
  float inv_bc2_sqrt;  // 1 / sqrt(1 - beta2^step)
  float eps;
};

__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v, const AdamWCoefficients& c) {
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  p = p * c.decay - c.step_size * m / (sqrtf(v) * c.inv_bc2_sqrt + c.eps);
}

__device__ __forceinline__ void adamw_float4(float4& p, const float4& g, float4& m, float4& v,
                                             const AdamWCoefficients& c) {
  adamw_element(p.x, g.x, m.x, v.x, c);
  adamw_element(p.y, g.y, m.y, v.y, c);
  adamw_element(p.z, g.z, m.z, v.z, c);
  adamw_element(p.w, g.w, m.w, v.w, c);
}

__global__ void __launch_bounds__(kThreads)
adamw_vec_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ exp_avg,
                 float* __restrict__ exp_avg_sq, long long n, const AdamWCoefficients c) {
  float4* p4 = reinterpret_cast<float4*>(param);
  const float4* g4 = reinterpret_cast<const float4*>(grad);
  float4* m4 = reinterpret_cast<float4*>(exp_avg);
  float4* v4 = reinterpret_cast<float4*>(exp_avg_sq);
  const long long n4 = n >> 2;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  long long i = first;
  for (; i + (kUnroll - 1) * stride < n4; i += kUnroll * stride) {
    float4 p[kUnroll], g[kUnroll], m[kUnroll], v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      p[u] = p4[i + u * stride];
      g[u] = g4[i + u * stride];
      m[u] = m4[i + u * stride];
      v[u] = v4[i + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      adamw_float4(p[u], g[u], m[u], v[u], c);
      p4[i + u * stride] = p[u];
      m4[i + u * stride] = m[u];
      v4[i + u * stride] = v[u];
    }
  }
  for (; i < n4; i += stride) {
    float4 p = p4[i], m = m4[i], v = v4[i];
    adamw_float4(p, g4[i], m, v, c);
    p4[i] = p;
    m4[i] = m;
    v4[i] = v;
  }
  const long long tail = (n4 << 2) + first;  // the last n % 4 elements
  if (tail < n) adamw_element(param[tail], grad[tail], exp_avg[tail], exp_avg_sq[tail], c);
}

__global__ void __launch_bounds__(kThreads)
adamw_scalar_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ exp_avg,
                    float* __restrict__ exp_avg_sq, long long n, const AdamWCoefficients c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    adamw_element(param[i], grad[i], exp_avg[i], exp_avg_sq[i], c);
  }
}

}  // namespace

// ================================================================================================
// C ABI
// ================================================================================================
extern "C" {

MT_DEFINE_ERROR_STRING()

// One AdamW step (step = 1, 2, ... counts the updates so far, this one included) over n contiguous
// float32 elements: param, exp_avg and exp_avg_sq are updated in place, grad is read. The bias
// corrections are computed here in double precision. The hyperparameters arrive as doubles: with
// beta2 = 0.999 rounded to float first, 1 - beta2 would be off by 1.3e-5 relative, and so would v.
int launch_adamw(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, long long n, double lr,
                 double beta1, double beta2, double eps, double weight_decay, int step, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(n < 0 || step < 1);
  if (n == 0) return 0;
  MT_RETURN_IF_INVALID(param == nullptr || grad == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr);
  const double bc1 = 1.0 - std::pow(beta1, step);
  const double bc2 = 1.0 - std::pow(beta2, step);
  MT_RETURN_IF_INVALID(!(bc1 > 0.0) || !(bc2 > 0.0));  // beta == 1 would divide by zero
  AdamWCoefficients c;
  c.decay = static_cast<float>(1.0 - lr * weight_decay);
  c.beta1 = static_cast<float>(beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.step_size = static_cast<float>(lr / bc1);
  c.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  c.eps = static_cast<float>(eps);
  const bool vec = mt::is_aligned16(param) && mt::is_aligned16(grad) && mt::is_aligned16(exp_avg) &&
                   mt::is_aligned16(exp_avg_sq);
  int grid = 0;
  if (vec) {
    static int resident = 0;
    MT_RETURN_IF_ERROR(mt::grid_stride_blocks(adamw_vec_kernel, kThreads, (n + 3) / 4, &resident, &grid));
    adamw_vec_kernel<<<grid, kThreads, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, n, c);
  } else {
    static int resident = 0;
    MT_RETURN_IF_ERROR(mt::grid_stride_blocks(adamw_scalar_kernel, kThreads, n, &resident, &grid));
    adamw_scalar_kernel<<<grid, kThreads, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, n, c);
  }
  return mt_launch_status();
}

}  // extern "C"
