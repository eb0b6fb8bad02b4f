// The fused epilogue of every matmul kernel: + bias, GELU (tanh form, as minitorch.operators.gelu) or
// ReLU, the pre-activation kept on request, and out += result instead of out = result.
#pragma once

#include <cuda_runtime.h>

#include "../includes/vec.cuh"
#include "params.cuh"

namespace {

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.f + tanhf(kGeluC * (x + kGeluA * x * x * x)));
}

// Stores x[0..n) (n <= W) at out[idx..] for columns col.. after the epilogue; pre_act gets x + bias. A
// full run goes out as one W-wide store when p.out_vec (ldc % 4 == 0, 16-byte aligned outputs).
template <int W>
__device__ __forceinline__ void store_run(const MatmulParams& p, float* out, float* pre, long long idx, int col,
                                          const float (&v)[W], int n) {
  float x[W];
  const bool act = p.epilogue == kBiasGelu || p.epilogue == kBiasRelu;
#pragma unroll
  for (int j = 0; j < W; ++j) x[j] = v[j] + (p.epilogue != kNone && p.bias != nullptr && j < n ? p.bias[col + j] : 0.f);
  if (W > 1 && n == W && p.out_vec) {
    // x as one W-wide value at dst (W = 2 or 4).
    const auto store_vec = [&](float* dst) {
      if constexpr (W == 4) mt::store_float4(dst, make_float4(x[0], x[1], x[2], x[3]));
      if constexpr (W == 2) *reinterpret_cast<float2*>(dst) = make_float2(x[0], x[1]);
    };
    if (act && pre != nullptr) store_vec(pre + idx);
#pragma unroll
    for (int j = 0; j < W; ++j) x[j] = !act ? x[j] : p.epilogue == kBiasGelu ? gelu(x[j]) : fmaxf(x[j], 0.f);
    if (p.accumulate) {
      if constexpr (W == 4) {
        const float4 o = mt::load_float4(out + idx);
        x[0] += o.x, x[1] += o.y, x[2] += o.z, x[3] += o.w;
      }
      if constexpr (W == 2) {
        const float2 o = *reinterpret_cast<const float2*>(out + idx);
        x[0] += o.x, x[1] += o.y;
      }
    }
    store_vec(out + idx);
    return;
  }
#pragma unroll
  for (int j = 0; j < W; ++j) {
    if (j >= n) break;
    if (act && pre != nullptr) pre[idx + j] = x[j];
    const float y = !act ? x[j] : p.epilogue == kBiasGelu ? gelu(x[j]) : fmaxf(x[j], 0.f);
    out[idx + j] = p.accumulate ? out[idx + j] + y : y;
  }
}

}  // namespace
