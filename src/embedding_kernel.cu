// embedding_kernel.cu: the embedding lookup out[r, :] = weight[ids[r], :] and its scatter-add
// backward, and the same row gather over rows of their own strides (gather_rows: the first n floats
// of each row, e.g. the filled slots of KV cache rows, reordered by beam search).
//
//   forward    one thread per float4 (when dim, both row strides and both pointers allow it) or
//              float of the output, grid-stride; consecutive threads cover a row, so both the
//              gather from weight and the store to out are coalesced.
//   backward   deterministic (no float atomics, the same bits every run, which CUDA-graph replays
//              are checked against): the positions are sorted by row (CUB's radix sort, stable, so
//              a row's positions stay in position order), then one block per (sorted position,
//              chunk of kColsPerBlock columns): the block of each run's first position sums grad_out
//              over the run, in position order, and adds the sum to the row of grad_weight. Work and
//              time grow with the positions, not with their square (each position's block used to
//              scan every other id: 56 us for GPT-2's 4,096, ~16x that for 16,384).
//
// Storage: rows are float32 or bfloat16 (storage codes of mt::with_storage), gathered from either into
// either (a bfloat16 row of a float32 master is rounded once); the backward reads float32 or bfloat16
// gradient rows and sums them in float32 into a float32 grad_weight. Ids are integral float32.
//
// The launchers follow cuda_check.cuh's contract: device pointers, sizes by value and a
// cudaStream_t in, an int cudaError_t out (cudaErrorInvalidValue for bad sizes).
#include <cmath>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
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

// The sort key of position r, its row (num_embeddings for an invalid id: sorted last and skipped),
// beside the position itself: the radix sort's input.
__global__ void embedding_keys_kernel(int* keys, int* positions, const float* ids, int rows, int num_embeddings) {
  for (long long r = mt::grid_stride_first(); r < rows; r += mt::grid_stride_step()) {
    const int row = embedding_row(ids[r], num_embeddings);
    keys[r] = row >= 0 ? row : num_embeddings;
    positions[r] = static_cast<int>(r);
  }
}

// One block per (sorted position b, chunk of kColsPerBlock columns): the block of a run's first
// position sums grad_out over the run's positions (ascending: the sort is stable) and adds the sum to
// the row of grad_weight; the other blocks exit.
template <class TG>
__global__ void __launch_bounds__(kBwThreads)
embedding_bw_runs_kernel(float* grad_weight, const TG* grad_out, const int* keys, const int* positions, int rows,
                         int num_embeddings, int dim) {
  const int b = blockIdx.x;
  const int row = keys[b];
  if (row >= num_embeddings || (b > 0 && keys[b - 1] == row)) return;
  int lo = b + 1, hi = rows;  // the run's end: the first key above row (the keys ascend)
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (keys[mid] == row) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const int col0 = blockIdx.y * kColsPerBlock + threadIdx.x;
  float acc[kBwColsPerThread] = {};
#pragma unroll 4
  for (int i = b; i < lo; ++i) {
    const TG* g = grad_out + static_cast<long long>(positions[i]) * dim;
#pragma unroll
    for (int j = 0; j < kBwColsPerThread; ++j) {
      const int c = col0 + j * kBwThreads;
      if (c < dim) acc[j] += mt::to_float(g[c]);
    }
  }
  float* out = grad_weight + static_cast<long long>(row) * dim;
#pragma unroll
  for (int j = 0; j < kBwColsPerThread; ++j) {
    const int c = col0 + j * kBwThreads;
    if (c < dim) out[c] += acc[j];
  }
}

// The backward's workspace: keys and positions before and after the sort, then the sort's own storage.
struct BwWorkspace {
  int *keys, *sorted_keys, *positions, *sorted_positions;
  void* sort_storage;
  size_t sort_bytes;
};

constexpr size_t kWorkspaceAlign = 256;

inline size_t align_up(size_t bytes) { return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

// Bits of the sort keys 0 .. num_embeddings.
inline int key_bits(int num_embeddings) {
  int bits = 1;
  while (bits < 31 && (1u << bits) <= static_cast<unsigned>(num_embeddings)) ++bits;
  return bits;
}

// The workspace at base (null: only its size) for rows positions; its bytes in *bytes.
inline cudaError_t bw_workspace(void* base, int rows, int num_embeddings, BwWorkspace* w, size_t* bytes) {
  const size_t ints = align_up(static_cast<size_t>(rows) * sizeof(int));
  char* p = static_cast<char*>(base);
  w->keys = reinterpret_cast<int*>(p);
  w->sorted_keys = reinterpret_cast<int*>(p + ints);
  w->positions = reinterpret_cast<int*>(p + 2 * ints);
  w->sorted_positions = reinterpret_cast<int*>(p + 3 * ints);
  w->sort_storage = p == nullptr ? nullptr : p + 4 * ints;
  w->sort_bytes = 0;
  const cudaError_t status =
      cub::DeviceRadixSort::SortPairs(nullptr, w->sort_bytes, w->keys, w->sorted_keys, w->positions,
                                      w->sorted_positions, rows, 0, key_bits(num_embeddings));
  *bytes = 4 * ints + w->sort_bytes;
  return status;
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

// Bytes of workspace launch_embedding_bw needs for `rows` positions into a table of num_embeddings
// rows (-1 on an error).
long long embedding_bw_workspace_bytes(int rows, int num_embeddings) {
  if (rows < 0 || num_embeddings < 0) return -1;
  BwWorkspace w;
  size_t bytes = 0;
  return bw_workspace(nullptr, rows, num_embeddings, &w, &bytes) == cudaSuccess ? static_cast<long long>(bytes) : -1;
}

// grad_weight[v, :] += sum of grad_out[r, :] over the positions r with ids[r] == v, in position order
// (deterministic: the row's sum, then one addition to what grad_weight held), for every id v that
// occurs; the caller fills grad_weight first, with zeros or with the table's gradient from its other
// uses (a tied LM head's).
// Positions with an invalid id (see launch_embedding_fw) are skipped. grad_out is stored as
// grad_format says; grad_weight is float32 (the sums are float32). workspace: device memory of at
// least embedding_bw_workspace_bytes(rows, num_embeddings) bytes, 256-byte aligned.
int launch_embedding_bw(int grad_format, float* grad_weight, const void* grad_out, const float* ids, int rows,
                        int num_embeddings, int dim, void* workspace, long long workspace_bytes, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || num_embeddings < 0 || dim < 0);
  if (rows == 0 || dim == 0) return 0;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(mt::ceil_div(dim, kColsPerBlock)));
  MT_RETURN_IF_INVALID(grid.y > 65535);
  BwWorkspace w;
  size_t bytes = 0;
  MT_RETURN_IF_ERROR(bw_workspace(workspace, rows, num_embeddings, &w, &bytes));
  MT_RETURN_IF_INVALID(workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlign != 0 ||
                       workspace_bytes < static_cast<long long>(bytes));
  MT_RETURN_IF_ERROR(static_cast<cudaError_t>(
      mt::launch_grid_stride<embedding_keys_kernel>(rows, stream, w.keys, w.positions, ids, rows, num_embeddings)));
  MT_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(w.sort_storage, w.sort_bytes, w.keys, w.sorted_keys, w.positions,
                                                     w.sorted_positions, rows, 0, key_bits(num_embeddings), stream));
  return mt::with_storage(grad_format, [&](auto* t) {
    using TG = std::remove_pointer_t<decltype(t)>;
    embedding_bw_runs_kernel<<<grid, kBwThreads, 0, stream>>>(grad_weight, static_cast<const TG*>(grad_out),
                                                              w.sorted_keys, w.sorted_positions, rows,
                                                              num_embeddings, dim);
    return mt_launch_status();
  });
}

}  // extern "C"
