// kv_cache_kernel.cu: the KV cache's append for decoding steps replayed from a CUDA graph, where
// every pointer and size is fixed at capture and what changes from step to step lives in device
// memory.
//
//   slot_write   buffer[r, s, 0:n] = values[r, 0:n] for every row r, at the slot s read from device
//                memory (a float holding an integer): a cache append at a position the graph does
//                not know. One thread per float of values, grid-stride.
//
// The launcher follows cuda_check.cuh's contract: device pointers, sizes by value and a
// cudaStream_t in, an int cudaError_t out (cudaErrorInvalidValue for bad sizes).
#include <cmath>
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"
#include "includes/launch_utils.cuh"

namespace {

// The integer a float in device memory holds, or -1 when it is not an integer in [0, count).
__device__ __forceinline__ int index_in(float x, int count) {
  if (!(x >= 0.f && x < static_cast<float>(count)) || x != floorf(x)) return -1;
  return static_cast<int>(x);
}

__global__ void slot_write_kernel(float* buffer, const float* values, const float* slot, int rows, int slots,
                                  int n, long long row_stride, long long slot_stride) {
  const int s = index_in(slot[0], slots);
  if (s < 0) return;
  float* base = buffer + static_cast<long long>(s) * slot_stride;
  const long long total = static_cast<long long>(rows) * n;
  const long long stride = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < total; i += stride) {
    const long long r = i / n;
    base[r * row_stride + (i - r * n)] = values[i];
  }
}

}  // namespace

extern "C" {

MT_DEFINE_ERROR_STRING()

// buffer[r * row_stride + s * slot_stride + c] = values[r * n + c] for r < rows, c < n, where
// s = slot[0] is read when the kernel runs; a slot that is not an integer in [0, slots) writes
// nothing (the device cannot raise).
int launch_slot_write(float* buffer, const float* values, const float* slot, int rows, int slots, int n,
                      long long row_stride, long long slot_stride, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || slots < 0 || n < 0 || row_stride < 0 || slot_stride < 0);
  const long long total = static_cast<long long>(rows) * n;
  if (total == 0 || slots == 0) return 0;
  return mt::launch_grid_stride<slot_write_kernel>(total, stream, buffer, values, slot, rows, slots, n,
                                                   row_stride, slot_stride);
}

}  // extern "C"
