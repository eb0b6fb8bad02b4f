// Programmatic dependent launch (Hopper and later): a kernel launched as "dependent" may start
// while the kernel before it in the stream is still running, so that its blocks are placed on the
// SMs the earlier kernel's last blocks leave, and have set up their shared memory and barriers, by
// the time that kernel ends: a training step's ~300 kernel boundaries a stream each cost a drain, a
// launch and a prologue otherwise.
//
// The contract, for every kernel launched with launch_dependent (or a launcher's dependent form):
//   - it calls wait_for_prior_grids() before its first read or write of global memory (a read of
//     its parameters, __grid_constant__ tensor maps included, is not one): that wait returns when
//     the kernels it depends on have finished and their writes are visible;
//   - it may call allow_dependents() (at its start, as these kernels do) so that the kernel after
//     it may launch early in turn; that kernel's own wait still orders it after this one's end.
// A kernel with the calls, launched plainly, runs as before (both are no-ops without a dependency).
// Dependent launches are used on GPUs of compute capability 9.0 and later, unless the environment
// sets MINITORCH_DEPENDENT_LAUNCH=0 (then every launch waits for the kernel before it, as plain ones).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "cuda_check.cuh"
#include "device_info.cuh"

namespace mt {

__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Both, at the start of a kernel launched as dependent: its own dependents may launch, then it waits.
__device__ __forceinline__ void join_prior_grids() {
  allow_dependents();
  wait_for_prior_grids();
}

// Whether launches on the current device may be dependent ones (see the top of the file).
inline bool dependent_launch_enabled() {
  static const bool allowed = [] {
    const char* env = std::getenv("MINITORCH_DEPENDENT_LAUNCH");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  if (!allowed) return false;
  static int cached[kMaxDevicesCached] = {0};
  int major = 0;
  return cached_attribute(cudaDevAttrComputeCapabilityMajor, cached, &major) == cudaSuccess && major >= 9;
}

// The launch configuration of a dependent launch (where enabled) in clusters of cluster_x blocks along x
// (1: no clusters); `attributes` must outlive the configuration's use.
inline cudaLaunchConfig_t dependent_config(dim3 grid, dim3 block, size_t smem_bytes, unsigned cluster_x,
                                           cudaStream_t stream, cudaLaunchAttribute (&attributes)[2]) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attributes;
  if (dependent_launch_enabled()) {
    attributes[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[config.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attributes[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attributes[config.numAttrs++].val.clusterDim = {cluster_x, 1, 1};
  }
  return config;
}

// kernel<<<grid, block, smem_bytes, stream>>>(args...) in clusters of cluster_x blocks along x (1: none),
// as a dependent launch where enabled; returns the launch status as the launchers do (0 when queued).
template <class... Params, class... Args>
int launch_dependent_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                                 unsigned cluster_x, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attributes[2];
  const cudaLaunchConfig_t config = dependent_config(grid, block, smem_bytes, cluster_x, stream, attributes);
  cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);  // an error is the thread's last one
  return mt_launch_status();
}

// kernel<<<grid, block, smem_bytes, stream>>>(args...), as a dependent launch where enabled.
template <class... Params, class... Args>
int launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                     Args&&... args) {
  return launch_dependent_in_clusters(kernel, grid, block, smem_bytes, 1, stream, std::forward<Args>(args)...);
}

}  // namespace mt
