// The Tensor Memory Accelerator's plumbing shared by the Hopper (sm_90a) kernels: the shared-memory
// mbarriers that count a stage's bytes in, the tiled bulk tensor load and store, and the driver's
// tensor-map encoder, looked up once at run time (the libraries do not link libcuda), and the tensor map
// of a matmul operand or output that both matmul kernels go through.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "vec.cuh"

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

// The same box written at dst into every block of the cluster in cta_mask (the same shared-memory offset
// in each), its bytes counted on the barrier at offset bar in each of them.
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap& map, uint32_t bar, int c0, int c1,
                                                   int c2, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
}

// This block's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// One arrival on the barrier at offset bar of the cluster's block `rank` (this block's own or another's).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

// Every thread of the cluster's blocks: what each wrote before (its barriers' initialization) is seen by
// the others after.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// Box (c0, c1, c2) of the tensor map from shared memory at src, as a bulk-async group of the thread's
// once bulk_commit closes it; shared-memory writes before it need fence_async_shared and a barrier.
__device__ __forceinline__ void tma_store(const CUtensorMap& map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(&map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Until at most N of the thread's newest bulk groups still read their shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Until every bulk group of the thread's is complete (its writes done).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Makes the thread's shared-memory writes visible to the async proxy (a TMA store that reads them).
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// One K tile of an operand (ROWS rows from row0, the K tile from k0, batch matrix `batch`) into shared
// memory at dst: one box [ROWS][k] when the operand is K-major, else ROWS / BOX boxes [k][BOX rows],
// box_bytes apart.
template <bool K_MAJOR, int ROWS, int BOX>
__device__ __forceinline__ void load_operand_tile(uint32_t dst, const CUtensorMap& map, uint32_t bar, int k0, int row0,
                                                  int batch, int box_bytes) {
  static_assert(ROWS % BOX == 0, "whole boxes");
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

// Tensor map of a matmul operand (both matmul kernels) whose element (i, o) of batch matrix b sits at
// base[i + o * outer_stride + b * batch_stride] (elements of elem_bytes; i along the unit-stride dim,
// batch_stride 0: one matrix for every b), in boxes of box_inner x box_outer, swizzled by the box row
// (128 or 64 bytes) or, with swizzle128, by 128 bytes whatever the row (a 64-byte box row then lands in
// the first half of a 128-byte line, as an H100 showed), zeros read outside. The L2 promotion is 128
// bytes, a box row, rather than 256
// (H100: the bf16 LM head's input gradient, K 50,257, 563 -> 403 us and its weight gradient 477 -> 418
// us; the TF32 ones 1.171 -> 1.010 and 0.945 -> 0.876 ms; the other products the same). False where
// TMA cannot address the operand (16-byte alignment of the base and strides) or the driver refuses it.
inline bool encode_operand(CUtensorMap* map, CUtensorMapDataType dtype, int elem_bytes, const void* base,
                           long long inner, long long outer, long long outer_stride, long long batch_stride,
                           long long batches, int box_inner, int box_outer, bool swizzle128 = false) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = encode_tiled();
  const long long per16 = 16 / elem_bytes;  // elements in 16 bytes
  if (fn == nullptr || !mt::is_aligned16(base) || outer_stride % per16 != 0 || batch_stride % per16 != 0) return false;
  const long long matrix = (outer * outer_stride + per16 - 1) / per16 * per16;  // any valid stride: one matrix
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer),
                              static_cast<cuuint64_t>(batch_stride != 0 ? batches : 1)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(outer_stride * elem_bytes),
                                 static_cast<cuuint64_t>((batch_stride != 0 ? batch_stride : matrix) * elem_bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_inner), static_cast<cuuint32_t>(box_outer), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return fn(map, dtype, 3, const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle128 || box_inner * elem_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace tma
