// Per-device facts that launchers use to size grids, queried once per device and cached.
#pragma once

#include <cuda_runtime.h>

namespace mt {

constexpr int kMaxDevicesCached = 64;

// Number of streaming multiprocessors of the current device (0 on error, which callers treat as
// "launch failed" through the error code they return).
inline cudaError_t sm_count(int* out) {
  static int cached[kMaxDevicesCached] = {0};
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  if (device < kMaxDevicesCached && cached[device] > 0) {
    *out = cached[device];
    return cudaSuccess;
  }
  int count = 0;
  status = cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  if (status != cudaSuccess) return status;
  if (device < kMaxDevicesCached) cached[device] = count;
  *out = count;
  return cudaSuccess;
}

// Shared memory a block may opt in to on the current device, in bytes (queried once per device).
inline cudaError_t shared_memory_optin(int* out) {
  static int cached[kMaxDevicesCached] = {0};
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  if (device < kMaxDevicesCached && cached[device] > 0) {
    *out = cached[device];
    return cudaSuccess;
  }
  int bytes = 0;
  status = cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (status != cudaSuccess) return status;
  if (device < kMaxDevicesCached) cached[device] = bytes;
  *out = bytes;
  return cudaSuccess;
}

}  // namespace mt

namespace mt {

// Blocks for a grid-stride launch: enough to cover `work_items` with `threads`-thread blocks, at
// most one full wave (every SM holding as many blocks of `kernel` as fit at once), so no block
// starts after the others have drained their share. `*resident_cache` (a static of the call site,
// 0 at first) keeps the occupancy query to one per kernel.
template <class Kernel>
inline cudaError_t grid_stride_blocks(Kernel kernel, int threads, long long work_items, int* resident_cache,
                                      int* blocks) {
  int sms = 0;
  cudaError_t status = sm_count(&sms);
  if (status != cudaSuccess) return status;
  if (*resident_cache <= 0) {
    int resident = 0;
    status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, 0);
    if (status != cudaSuccess) return status;
    *resident_cache = resident > 0 ? resident : 1;
  }
  long long needed = (work_items + threads - 1) / threads;
  const long long wave = static_cast<long long>(sms) * *resident_cache;
  if (needed > wave) needed = wave;
  *blocks = needed < 1 ? 1 : static_cast<int>(needed);
  return cudaSuccess;
}

}  // namespace mt
