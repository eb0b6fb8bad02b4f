// Thin wrappers of PTX instructions that CUDA C++ does not expose directly.
//
//   cp_async_16 / cp_async_4   global -> shared copies that bypass registers (sm_80+), with zero fill:
//                              `valid == false` writes zeros and reads nothing (tile edges, padding);
//   cp_async_commit            closes the group of copies this thread issued since the last commit;
//   cp_async_wait<N>           waits until at most N of this thread's groups are still in flight.
//                              Other threads see the data only after a barrier that follows the wait.
//   fast_exp2                  2^x in one MUFU.EX2 (results below 2^-126 flush to 0).
#pragma once

#include <cuda_runtime.h>

namespace mt {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes; dst and src 16-byte aligned.
__device__ __forceinline__ void cp_async_16(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

// 4 bytes; dst and src 4-byte aligned.
__device__ __forceinline__ void cp_async_4(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = 2^(x log2(e))

// 2^x by the hardware's approximation (ex2.approx.ftz.f32, ~2 ulp).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace mt
