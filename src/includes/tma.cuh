// The Tensor Memory Accelerator's plumbing shared by the Hopper (sm_90a) kernels: the shared-memory
// mbarriers that count a stage's bytes in, the tiled bulk tensor load, and the driver's tensor-map
// encoder, looked up once at run time (the libraries do not link libcuda).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tma {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// After one thread initialized the barriers: makes them visible to the async proxy (the TMA units).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Starts fetching a tensor map's descriptor, so that the first load finds it cached.
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap& map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map)) : "memory");
}

// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Box (c0, c1, c2) of the tensor map into shared memory at dst; completion counted on bar.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap& map, uint32_t bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// One K tile of an operand (ROWS rows from row0, the K tile from k0, batch matrix `batch`) into shared
// memory at dst: one box [ROWS][k] when the operand is K-major, else ROWS / BOX boxes [k][BOX rows],
// box_bytes apart.
template <bool K_MAJOR, int ROWS, int BOX>
__device__ __forceinline__ void load_operand_tile(uint32_t dst, const CUtensorMap& map, uint32_t bar, int k0, int row0,
                                                  int batch, int box_bytes) {
  if constexpr (K_MAJOR) {
    tma_load(dst, map, bar, k0, row0, batch);
  } else {
#pragma unroll
    for (int i = 0; i < ROWS / BOX; ++i) tma_load(dst + i * box_bytes, map, bar, row0 + BOX * i, k0, batch);
  }
}
#endif

// cuTensorMapEncodeTiled, or nullptr where the driver has none (then no TMA path runs).
inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static bool looked = false;
  if (!looked) {
    looked = true;
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }
    cudaGetLastError();  // no entry point means no TMA path, not an error for the next launch
  }
  return fn;
}

// The L2 promotion of every operand tensor map (both matmul kernels): 128 bytes, a box row, rather than
// 256. H100, against 256: the bf16 LM head's input gradient (K 50,257) 563 -> 403 us and its weight
// gradient 477 -> 418 us; the TF32 ones 1.171 -> 1.010 and 0.945 -> 0.876 ms; the other products the same.
constexpr CUtensorMapL2promotion kOperandL2Promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;

}  // namespace tma
