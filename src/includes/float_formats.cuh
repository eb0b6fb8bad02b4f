// The float storage formats of minitorch (codes as minitorch/cuda/convert.py's STORAGE_CODES:
// 0 float32, 1 bfloat16, 2 float16) and their conversions through float32, which holds every value of
// the three exactly: to_float widens exactly; from_float<T> rounds to nearest, ties to even
// (__float2bfloat16_rn / __float2half_rn: NaN stays NaN, infinities stay infinite, finite values
// beyond the range become infinities).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace mt {

__device__ __forceinline__ float to_float(float x) { return x; }
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

template <class T>
struct Tag {
  using type = T;
};

// f(Tag<T>{}) for the element type T of a float format code; cudaErrorInvalidValue for another code.
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

}  // namespace mt
