// embedding_kernel.cu: the embedding lookup out[r, :] = weight[ids[r], :] and its scatter-add
// backward, and the same row gather over rows of their own strides (gather_rows: the first n floats
// of each row, e.g. the filled slots of KV cache rows, reordered by beam search).
//
//   forward    one thread per float4 (when dim, both row strides and both pointers allow it) or
//              float of the output, grid-stride; consecutive threads cover a row, so both the
//              gather from weight and the store to out are coalesced.
//   backward   deterministic (no atomics, the same bits every run, which CUDA-graph replays are
//              checked against): one block per (input position r, chunk of kColsPerBlock columns).
//              A block whose id already occurred at an earlier position exits; the block of an
//              id's first position (its "leader") sums grad_out over every position with that id,
//              in position order, and writes the row of grad_weight. Positions are scanned in tiles
//              of kBwThreads ids: the tile's matches are compacted in order into shared memory
//              (warp ballots, then a prefix over the warps), then summed column by column.
//
// Storage: rows are float32 or bfloat16 (storage codes of mt::with_storage), gathered from either into
// either (a bfloat16 row of a float32 master is rounded once); the backward reads float32 or bfloat16
// gradient rows and sums them in float32 into a float32 grad_weight. Ids are integral float32.
//
// The launchers follow cuda_check.cuh's contract: device pointers, sizes by value and a
// cudaStream_t in, an int cudaError_t out (cudaErrorInvalidValue for bad sizes).
#include <cmath>
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"
#include "includes/launch_utils.cuh"
#include "includes/storage.cuh"
#include "includes/vec.cuh"

#include <type_traits>

namespace {

// The row an id selects, or -1 when it is not an integer in [0, num_embeddings).
__device__ __forceinline__ int embedding_row(float id, int num_embeddings) {
  if (!(id >= 0.f && id < 2147483648.f) || id != floorf(id)) return -1;
  const int row = static_cast<int>(id);
  return row < num_embeddings ? row : -1;
}

// One thread per 4 elements (vec) or element of the output; consecutive threads cover a row. Row r of
// out starts at out + r * out_stride, row v of weight at weight + v * weight_stride (elements).
template <class TO, class TI>
__global__ void embedding_fw_kernel(TO* out, long long out_stride, const TI* weight, long long weight_stride,
                                    const float* ids, int rows, int num_embeddings, int dim, bool vec) {
  const int per_row = vec ? dim / 4 : dim;
  const long long total = static_cast<long long>(rows) * per_row;
  const long long stride = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < total; i += stride) {
    const long long r = i / per_row;
    const int c = static_cast<int>(i - r * per_row);
    const int row = embedding_row(ids[r], num_embeddings);
    if (vec) {
      mt::store4(out + r * out_stride + 4 * c,
                 row >= 0 ? mt::load4(weight + row * weight_stride + 4 * c) : make_float4(0.f, 0.f, 0.f, 0.f));
    } else {
      out[r * out_stride + c] = mt::from_float<TO>(row >= 0 ? mt::to_float(weight[row * weight_stride + c]) : 0.f);
    }
  }
}

template <class TO, class TI>
int launch_gather(TO* out, long long out_stride, const TI* weight, long long weight_stride, const float* ids,
                  int rows, int num_embeddings, int dim, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || num_embeddings < 0 || dim < 0 || out_stride < dim || weight_stride < 0);
  const long long total = static_cast<long long>(rows) * dim;
  if (total == 0) return 0;
  const bool vec = dim % 4 == 0 && out_stride % 4 == 0 && weight_stride % 4 == 0 && mt::is_aligned4(out) &&
                   mt::is_aligned4(weight);
  return mt::launch_grid_stride<embedding_fw_kernel<TO, TI>>(vec ? total / 4 : total, stream, out, out_stride, weight,
                                                             weight_stride, ids, rows, num_embeddings, dim, vec);
}

// launch_gather for the storage codes of out and of the rows read.
int gather_formats(int out_format, int in_format, void* out, long long out_stride, const void* in,
                   long long in_stride, const float* ids, int rows, int in_rows, int n, cudaStream_t stream) {
  return mt::with_storage(out_format, [&](auto* o) {
    return mt::with_storage(in_format, [&](auto* i) {
      using TI = std::remove_pointer_t<decltype(i)>;
      return launch_gather(static_cast<decltype(o)>(out), out_stride, static_cast<const TI*>(in), in_stride, ids, rows,
                           in_rows, n, stream);
    });
  });
}

constexpr int kBwThreads = 128;
constexpr int kBwColsPerThread = 4;
constexpr int kColsPerBlock = kBwThreads * kBwColsPerThread;

template <class TG>
__global__ void __launch_bounds__(kBwThreads)
embedding_bw_kernel(float* grad_weight, const TG* grad_out, const float* ids, int rows, int num_embeddings,
                    int dim) {
  constexpr int kWarps = kBwThreads / 32;
  __shared__ int matches[kBwThreads];
  __shared__ int warp_counts[kWarps];
  const int r = blockIdx.x;
  const int row = embedding_row(ids[r], num_embeddings);
  if (row < 0) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int t0 = 0; t0 < r; t0 += kBwThreads) {  // leave the row to an earlier position with the same id
    const int q = t0 + threadIdx.x;
    if (__syncthreads_or(q < r && embedding_row(ids[q], num_embeddings) == row)) return;
  }
  float acc[kBwColsPerThread] = {};
  const int col0 = blockIdx.y * kColsPerBlock + threadIdx.x;
  for (int t0 = r; t0 < rows; t0 += kBwThreads) {
    const int q = t0 + threadIdx.x;
    const bool match = q < rows && embedding_row(ids[q], num_embeddings) == row;
    const unsigned ballot = __ballot_sync(0xffffffffu, match);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int offset = 0, total = 0;
    for (int w = 0; w < kWarps; ++w) {
      offset += w < warp ? warp_counts[w] : 0;
      total += warp_counts[w];
    }
    if (match) matches[offset + __popc(ballot & ((1u << lane) - 1u))] = q;
    __syncthreads();
    for (int m = 0; m < total; ++m) {
      const TG* g = grad_out + static_cast<long long>(matches[m]) * dim;
#pragma unroll
      for (int j = 0; j < kBwColsPerThread; ++j) {
        const int c = col0 + j * kBwThreads;
        if (c < dim) acc[j] += mt::to_float(g[c]);
      }
    }
    __syncthreads();
  }
  float* out = grad_weight + static_cast<long long>(row) * dim;
#pragma unroll
  for (int j = 0; j < kBwColsPerThread; ++j) {
    const int c = col0 + j * kBwThreads;
    if (c < dim) out[c] += acc[j];
  }
}

}  // namespace

extern "C" {

MT_DEFINE_ERROR_STRING()

// out[r, :] = weight[ids[r], :] for r < rows; weight [num_embeddings, dim] and out contiguous, stored
// as out_format and weight_format say. ids hold integral floats; a row whose id is not an integer in
// [0, num_embeddings) is written as zeros (the device cannot raise, and checking on the host would
// need a copy).
int launch_embedding_fw(int out_format, int weight_format, void* out, const void* weight, const float* ids, int rows,
                        int num_embeddings, int dim, cudaStream_t stream) {
  return gather_formats(out_format, weight_format, out, dim, weight, dim, ids, rows, num_embeddings, dim, stream);
}

// out[r * out_stride + c] = in[ids[r] * in_stride + c] for r < rows, c < n, ids as in
// launch_embedding_fw (an id outside [0, in_rows) gives zeros); out must not overlap in.
int launch_gather_rows(int out_format, int in_format, void* out, long long out_stride, const void* in,
                       long long in_stride, const float* ids, int rows, int in_rows, int n, cudaStream_t stream) {
  return gather_formats(out_format, in_format, out, out_stride, in, in_stride, ids, rows, in_rows, n, stream);
}

// grad_weight[v, :] += sum of grad_out[r, :] over the positions r with ids[r] == v, in position order
// (deterministic: the row's sum, then one addition to what grad_weight held), for every id v that
// occurs; the caller fills grad_weight first, with zeros or with the table's gradient from its other
// uses (a tied LM head's).
// Positions with an invalid id (see launch_embedding_fw) are skipped. grad_out is stored as
// grad_format says; grad_weight is float32 (the sums are float32).
int launch_embedding_bw(int grad_format, float* grad_weight, const void* grad_out, const float* ids, int rows,
                        int num_embeddings, int dim, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || num_embeddings < 0 || dim < 0);
  if (rows == 0 || dim == 0) return 0;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(mt::ceil_div(dim, kColsPerBlock)));
  MT_RETURN_IF_INVALID(grid.y > 65535);
  return mt::with_storage(grad_format, [&](auto* t) {
    using TG = std::remove_pointer_t<decltype(t)>;
    embedding_bw_kernel<<<grid, kBwThreads, 0, stream>>>(grad_weight, static_cast<const TG*>(grad_out), ids, rows,
                                                         num_embeddings, dim);
    return mt_launch_status();
  });
}

}  // extern "C"
