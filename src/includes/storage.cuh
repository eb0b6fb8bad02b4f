// Storage formats of the kernels' tensors: float32, bfloat16 and float16 values widened to float for
// the math and rounded back (to nearest, ties to even) when stored, one element or four at a time.
// Every kernel computes in float32 whatever its storage format (DESIGN.md "Numbers").
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace mt {

using bf16 = __nv_bfloat16;

__host__ __device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// Whether p can be read or written four elements of T at a time (load4 / store4).
template <class T>
__host__ __device__ __forceinline__ bool is_aligned4(const T* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & (4 * sizeof(T) - 1)) == 0;
}

// Four consecutive elements at p (aligned as is_aligned4 says) as float4: one 16-byte access for
// float, one 8-byte access for bfloat16.
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void store4(__nv_bfloat16* p, float4 v) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 raw;
  raw.x = *reinterpret_cast<const unsigned*>(&lo);
  raw.y = *reinterpret_cast<const unsigned*>(&hi);
  *reinterpret_cast<uint2*>(p) = raw;
}

template <class T>
struct Tag {
  using type = T;
};

// f(Tag<T>{}) for the element type T of a float format code of convert_kernel.cu: 0 float32,
// 1 bfloat16, 2 float16; cudaErrorInvalidValue for another code.
template <class F>
int with_float_format(int code, F f) {
  switch (code) {
    case 0:
      return f(Tag<float>{});
    case 1:
      return f(Tag<__nv_bfloat16>{});
    case 2:
      return f(Tag<__half>{});
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

// Calls f(T{}) -- a null pointer of the element type -- for a storage code: 0 float32, 1 bfloat16
// (the codes of minitorch/cuda/runtime.py STORAGE_CODES).
template <class F>
int with_storage(int code, F f) {
  switch (code) {
    case 0:
      return f(static_cast<float*>(nullptr));
    case 1:
      return f(static_cast<__nv_bfloat16*>(nullptr));
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace mt
