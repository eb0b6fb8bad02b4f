// embedding_kernel.cu: the embedding lookup out[r, :] = weight[ids[r], :] and its scatter-add
// backward.
//
//   forward    one thread per float4 (when dim % 4 == 0 and the pointers are 16-byte aligned) or
//              float of the output, grid-stride; consecutive threads cover a row, so both the
//              gather from weight and the store to out are coalesced.
//   backward   one thread per element of grad_out, grid-stride, atomicAdd into grad_weight (rows
//              that repeat an id add up in any order).
//
// The launchers follow cuda_check.cuh's contract: device pointers, sizes by value and a
// cudaStream_t in, an int cudaError_t out (cudaErrorInvalidValue for bad sizes).
#include <cmath>
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"
#include "includes/launch_utils.cuh"
#include "includes/vec.cuh"

namespace {

// The row an id selects, or -1 when it is not an integer in [0, num_embeddings).
__device__ __forceinline__ int embedding_row(float id, int num_embeddings) {
  if (!(id >= 0.f && id < 2147483648.f) || id != floorf(id)) return -1;
  const int row = static_cast<int>(id);
  return row < num_embeddings ? row : -1;
}

// One thread per float4 (vec) or float of the output; consecutive threads cover a row.
__global__ void embedding_fw_kernel(float* out, const float* weight, const float* ids, int rows,
                                    int num_embeddings, int dim, bool vec) {
  const int per_row = vec ? dim / 4 : dim;
  const long long total = static_cast<long long>(rows) * per_row;
  const long long stride = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < total; i += stride) {
    const long long r = i / per_row;
    const int c = static_cast<int>(i - r * per_row);
    const int row = embedding_row(ids[r], num_embeddings);
    if (vec) {
      reinterpret_cast<float4*>(out)[i] =
          row >= 0 ? reinterpret_cast<const float4*>(weight)[static_cast<long long>(row) * per_row + c]
                   : make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
      out[i] = row >= 0 ? weight[static_cast<long long>(row) * dim + c] : 0.f;
    }
  }
}

__global__ void embedding_bw_kernel(float* grad_weight, const float* grad_out, const float* ids,
                                    int rows, int num_embeddings, int dim) {
  const long long total = static_cast<long long>(rows) * dim;
  const long long stride = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < total; i += stride) {
    const long long r = i / dim;
    const int c = static_cast<int>(i - r * dim);
    const int row = embedding_row(ids[r], num_embeddings);
    if (row >= 0) atomicAdd(grad_weight + static_cast<long long>(row) * dim + c, grad_out[i]);
  }
}

}  // namespace

extern "C" {

MT_DEFINE_ERROR_STRING()

// out[r, :] = weight[ids[r], :] for r < rows; weight [num_embeddings, dim] and out contiguous.
// ids hold integral floats; a row whose id is not an integer in [0, num_embeddings) is written as
// zeros (the device cannot raise, and checking on the host would need a copy).
int launch_embedding_fw(float* out, const float* weight, const float* ids, int rows,
                        int num_embeddings, int dim, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || num_embeddings < 0 || dim < 0);
  const long long total = static_cast<long long>(rows) * dim;
  if (total == 0) return 0;
  const bool vec = dim % 4 == 0 && mt::is_aligned16(out) && mt::is_aligned16(weight);
  return mt::launch_grid_stride<embedding_fw_kernel>(vec ? total / 4 : total, stream, out, weight, ids,
                                                     rows, num_embeddings, dim, vec);
}

// grad_weight[ids[r], :] += grad_out[r, :] (atomicAdd; the caller zero-fills grad_weight). Rows with
// an invalid id (see launch_embedding_fw) are skipped.
int launch_embedding_bw(float* grad_weight, const float* grad_out, const float* ids, int rows,
                        int num_embeddings, int dim, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || num_embeddings < 0 || dim < 0);
  const long long total = static_cast<long long>(rows) * dim;
  if (total == 0) return 0;
  return mt::launch_grid_stride<embedding_bw_kernel>(total, stream, grad_weight, grad_out, ids, rows,
                                                     num_embeddings, dim);
}

}  // extern "C"
