// Launcher checks, the shared-memory opt-in and the grid-stride launch shared by the kernels'
// launchers (combine.cu, embedding_kernel.cu, random_kernel.cu, matmul_kernel.cu, ...).
//
// A grid-stride kernel walks work items i = grid_stride_first(), += grid_stride_step(), over a grid
// of kGridStrideThreads-thread blocks that launch_grid_stride caps at one wave of resident blocks.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "cuda_check.cuh"
#include "dependent_launch.cuh"
#include "device_info.cuh"
#include "layout.cuh"

namespace mt {

// Kernels index elements with int, so sizes above this are refused.
constexpr long long kMaxInt = 2147483647LL;

constexpr int kGridStrideThreads = 256;

inline long long ceil_div(long long x, long long y) { return (x + y - 1) / y; }

inline bool same_shape(const MtLayout& x, const MtLayout& y) {
  if (x.ndim != y.ndim) return false;
  for (int d = 0; d < x.ndim; ++d) {
    if (x.shape[d] != y.shape[d]) return false;
  }
  return true;
}

inline bool valid_layout(const MtLayout& l) {
  if (l.ndim < 0 || l.ndim > MT_MAX_DIMS) return false;
  for (int d = 0; d < l.ndim; ++d) {
    if (l.shape[d] < 0) return false;
  }
  return true;
}

// Raises a kernel's dynamic shared-memory limit (needed above 48 KB) to bytes, once per device: each
// kernel (not each launcher template, which may serve several kernels) keeps its own done_devices.
template <class Kernel>
cudaError_t allow_shared_memory(Kernel kernel, int bytes, std::atomic<unsigned long long>* done_devices) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const unsigned long long bit = device < 64 ? 1ull << device : 0ull;
  if (bit != 0 && (done_devices->load() & bit) != 0) return cudaSuccess;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status == cudaSuccess) done_devices->fetch_or(bit);
  return status;
}

// Launches Kernel(args...) on `grid` blocks of `threads` threads with `bytes` of dynamic shared memory,
// raising the kernel's limit first (once per device and kernel: a static per Kernel instance);
// kDependent: as a dependent launch (the kernel keeps the contract of dependent_launch.cuh).
template <auto Kernel, bool kDependent = false, class... Args>
int launch_with_shared_memory(dim3 grid, int threads, int bytes, cudaStream_t stream, Args... args) {
  static std::atomic<unsigned long long> configured{0};
  MT_RETURN_IF_ERROR(allow_shared_memory(Kernel, bytes, &configured));
  if constexpr (kDependent) return launch_dependent(Kernel, grid, dim3(threads), bytes, stream, args...);
  Kernel<<<grid, threads, bytes, stream>>>(args...);
  return mt_launch_status();
}

__device__ __forceinline__ long long grid_stride_first() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ long long grid_stride_step() {
  return static_cast<long long>(gridDim.x) * blockDim.x;
}

// Launches Kernel(args...) over `work_items` grid-stride items on `stream` and returns the launch
// status. The occupancy query behind the grid size runs once per kernel (one static per Kernel).
// kDependent: as a dependent launch (the kernel keeps the contract of dependent_launch.cuh).
template <auto Kernel, bool kDependent = false, class... Args>
int launch_grid_stride(long long work_items, cudaStream_t stream, Args... args) {
  static int resident = 0;
  int grid = 0;
  MT_RETURN_IF_ERROR(grid_stride_blocks(Kernel, kGridStrideThreads, work_items, &resident, &grid));
  if constexpr (kDependent) return launch_dependent(Kernel, dim3(grid), dim3(kGridStrideThreads), 0, stream, args...);
  Kernel<<<grid, kGridStrideThreads, 0, stream>>>(args...);
  return mt_launch_status();
}

}  // namespace mt
