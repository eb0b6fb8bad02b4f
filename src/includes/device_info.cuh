// Per-device facts that launchers use to size grids, queried once per device and cached.
#pragma once

#include <cuda_runtime.h>

namespace mt {

constexpr int kMaxDevicesCached = 64;

// The current device's value of attr into *out, queried once per device: cached[device] keeps it
// (one array per attribute, 0 = not asked yet).
inline cudaError_t cached_attribute(cudaDeviceAttr attr, int (&cached)[kMaxDevicesCached], int* out) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  if (device < kMaxDevicesCached && cached[device] > 0) {
    *out = cached[device];
    return cudaSuccess;
  }
  int value = 0;
  status = cudaDeviceGetAttribute(&value, attr, device);
  if (status != cudaSuccess) return status;
  if (device < kMaxDevicesCached) cached[device] = value;
  *out = value;
  return cudaSuccess;
}

// Number of streaming multiprocessors of the current device (0 on error, which callers treat as
// "launch failed" through the error code they return).
inline cudaError_t sm_count(int* out) {
  static int cached[kMaxDevicesCached] = {0};
  return cached_attribute(cudaDevAttrMultiProcessorCount, cached, out);
}

// Shared memory a block may opt in to on the current device, in bytes.
inline cudaError_t shared_memory_optin(int* out) {
  static int cached[kMaxDevicesCached] = {0};
  return cached_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, cached, out);
}

// Bytes of L2 cache of the current device.
inline cudaError_t l2_cache_bytes(int* out) {
  static int cached[kMaxDevicesCached] = {0};
  return cached_attribute(cudaDevAttrL2CacheSize, cached, out);
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
