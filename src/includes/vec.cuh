// 16-byte vector helpers for float kernels.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace mt {

// float4 loads/stores need 16-byte aligned addresses; launchers check the base pointers with this
// and fall back to scalar code otherwise.
__host__ __device__ __forceinline__ bool is_aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

__device__ __forceinline__ float4 load_float4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

__device__ __forceinline__ void store_float4(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}

// Component-wise f(x, y) on two float4 values.
template <class F>
__device__ __forceinline__ float4 apply4(const F& f, float4 x, float4 y) {
  return make_float4(f(x.x, y.x), f(x.y, y.y), f(x.z, y.z), f(x.w, y.w));
}

}  // namespace mt
