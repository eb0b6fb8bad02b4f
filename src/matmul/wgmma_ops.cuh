// Hopper (sm_90a) warpgroup MMA instructions on TF32 operands, A from registers and B from shared
// memory, and the descriptors of the shared-memory B tiles they read. Defined only where the sm_90a
// instructions are compiled (__CUDA_ARCH_FEAT_SM90_ALL).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../includes/ptx.cuh"

namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Descriptor of a tile of 8-row x 16-byte core matrices (no swizzle) at p, with the byte offsets between
// core matrices along k (leading) and along the rows (stride).
__device__ __forceinline__ uint64_t smem_desc(const float* p, int leading_bytes, int stride_bytes) {
  return static_cast<uint64_t>((mt::shared_address(p) & 0x3ffff) >> 4) |
         static_cast<uint64_t>(leading_bytes >> 4) << 16 | static_cast<uint64_t>(stride_bytes >> 4) << 32;
}

// Descriptor of a K-major, 128-byte-swizzled tile at shared address addr (1024-byte aligned rows of 8):
// 8-row groups 1024 bytes apart; one k8 step further along k is addr + 32 bytes (descriptor + 2).
__device__ __forceinline__ uint64_t swizzled_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | 1ull << 16 | static_cast<uint64_t>(1024 >> 4) << 32 |
         1ull << 62;
}

#define MT_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MT_D16(i) MT_D4(i), MT_D4(i + 4), MT_D4(i + 8), MT_D4(i + 12)
// d = a b + (accumulate ? d : 0) for one m64nNk8 TF32 product (N = 128, 256, 192); returns before the
// product is done.
__device__ __forceinline__ void wgmma_m64n128k8(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc,
                                                int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : MT_D16(0), MT_D16(16), MT_D16(32), MT_D16(48)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_m64n256k8_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b_desc,
                                                   int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "
      "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "
      "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
      "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, "
      "%123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
      : MT_D16(0), MT_D16(16), MT_D16(32), MT_D16(48), MT_D16(64), MT_D16(80), MT_D16(96), MT_D16(112)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_m64n192k8_rs(float (&d)[96], const uint32_t (&a)[4], uint64_t b_desc,
                                                   int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "
      "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "
      "%92, %93, %94, %95"
      "}, {%96, %97, %98, %99}, %100, p, 1, 1;\n}\n"
      : MT_D16(0), MT_D16(16), MT_D16(32), MT_D16(48), MT_D16(64), MT_D16(80)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}
#undef MT_D16
#undef MT_D4

template <int BN>
__device__ __forceinline__ void wgmma_rs(float (&d)[BN / 2], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  if constexpr (BN == 256) {
    wgmma_m64n256k8_rs(d, a, b_desc, accumulate);
  } else if constexpr (BN == 192) {
    wgmma_m64n192k8_rs(d, a, b_desc, accumulate);
  } else {
    wgmma_m64n128k8(d, a, b_desc, accumulate);
  }
}

// Register dependency on every accumulator after a wait, so no read of them moves above it.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
#endif

}  // namespace
