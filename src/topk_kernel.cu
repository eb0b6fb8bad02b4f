// topk_kernel.cu: the k largest entries of every row of a [rows, width] matrix, best first, the
// larger index first among equal values (the order of minitorch.fused.topk's composed reference).
//
// One block of kThreads threads per row, two phases:
//   1. thread t keeps the best MAXK of the entries it strides over (t, t + kThreads, ...) in a list
//      sorted best first, in registers (MAXK, a power of two >= k, is a template size, so every
//      list index is static): an entry better than the list's last replaces it and bubbles up.
//   2. k rounds of a block-wide arg-best over the threads' list heads (warp shuffles, then one
//      value per warp through shared memory); the thread that owned the winner advances its head.
// An entry among the row's best k is among its thread's best k, so the merge is exact. The row is
// read once; a row of beam search ([beam * vocab] = 32,000 floats) is 125 entries per thread.
//
// The launcher follows cuda_check.cuh's contract: device pointers, sizes by value and a
// cudaStream_t in, an int cudaError_t out (cudaErrorInvalidValue for bad sizes).
#include <cmath>
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"
#include "includes/reduce.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxK = 32;  // the largest k the kernel takes (the Python entry composes beyond it)

// (v, i) comes before (w, j): larger value first, then larger index. An empty entry is (-inf, -1).
__device__ __forceinline__ bool before(float v, int i, float w, int j) { return v > w || (v == w && i > j); }

__device__ __forceinline__ void keep_better(float& v, int& i, float w, int j) {
  if (before(w, j, v, i)) {
    v = w;
    i = j;
  }
}

template <int MAXK>
__global__ void __launch_bounds__(kThreads)
topk_rows_kernel(float* values, float* indices, const float* scores, int width, int k) {
  __shared__ float warp_v[kWarps];
  __shared__ int warp_i[kWarps];
  const float* row = scores + static_cast<long long>(blockIdx.x) * width;
  float lv[MAXK];
  int li[MAXK];
#pragma unroll
  for (int j = 0; j < MAXK; ++j) {
    lv[j] = -INFINITY;
    li[j] = -1;
  }
  for (int c = threadIdx.x; c < width; c += kThreads) {
    const float x = row[c];
    if (!before(x, c, lv[MAXK - 1], li[MAXK - 1])) continue;
    lv[MAXK - 1] = x;
    li[MAXK - 1] = c;
#pragma unroll
    for (int j = MAXK - 1; j > 0; --j) {
      if (before(lv[j], li[j], lv[j - 1], li[j - 1])) {
        const float tv = lv[j];
        const int ti = li[j];
        lv[j] = lv[j - 1];
        li[j] = li[j - 1];
        lv[j - 1] = tv;
        li[j - 1] = ti;
      }
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int head = 0;
  for (int round = 0; round < k; ++round) {
    float v = -INFINITY;
    int i = -1;
#pragma unroll
    for (int j = 0; j < MAXK; ++j) {
      if (j == head) {
        v = lv[j];
        i = li[j];
      }
    }
    const int mine = i;  // this thread's head index, to know whether it won
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      keep_better(v, i, __shfl_xor_sync(mt::kFullWarpMask, v, offset), __shfl_xor_sync(mt::kFullWarpMask, i, offset));
    }
    if (lane == 0) {
      warp_v[warp] = v;
      warp_i[warp] = i;
    }
    __syncthreads();
    v = warp_v[0];
    i = warp_i[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) keep_better(v, i, warp_v[w], warp_i[w]);
    __syncthreads();
    if (i >= 0 && mine == i) ++head;  // column indices are distinct across threads
    if (threadIdx.x == 0) {
      values[static_cast<long long>(blockIdx.x) * k + round] = v;
      indices[static_cast<long long>(blockIdx.x) * k + round] = static_cast<float>(i);
    }
  }
}

template <int MAXK>
int launch(float* values, float* indices, const float* scores, int rows, int width, int k, cudaStream_t stream) {
  topk_rows_kernel<MAXK><<<rows, kThreads, 0, stream>>>(values, indices, scores, width, k);
  return mt_launch_status();
}

}  // namespace

extern "C" {

MT_DEFINE_ERROR_STRING()

int minitorch_topk_max_k() { return kMaxK; }

// values[r, 0:k] and indices[r, 0:k] (as floats) of the k best entries of scores[r, :] (contiguous
// [rows, width]), best first; 1 <= k <= min(width, kMaxK), width < 2^24 (indices exact in float32).
int launch_topk_rows(float* values, float* indices, const float* scores, int rows, int width, int k,
                     cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || width < 1 || width >= (1 << 24) || k < 1 || k > width || k > kMaxK);
  if (rows == 0) return 0;
  if (k <= 4) return launch<4>(values, indices, scores, rows, width, k, stream);
  if (k <= 8) return launch<8>(values, indices, scores, rows, width, k, stream);
  if (k <= 16) return launch<16>(values, indices, scores, rows, width, k, stream);
  return launch<32>(values, indices, scores, rows, width, k, stream);
}

}  // extern "C"
