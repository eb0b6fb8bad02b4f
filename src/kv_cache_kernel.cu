// kv_cache_kernel.cu: the KV cache's append and attention for decoding steps replayed from a CUDA
// graph, where every pointer and size is fixed at capture and what changes from step to step lives
// in device memory.
//
//   slot_write      buffer[r, s, 0:n] = values[r, 0:n] for every row r, at the slot s read from
//                   device memory (a float holding an integer): a cache append at a position the
//                   graph does not know. One thread per float of values, grid-stride.
//   slot_attention  one query per row attends over that row's cached keys and values at slots
//                   [pads[r], s] (s read from device memory; pads[r] the row's left padding), every
//                   head at once: out[r, h*D:(h+1)*D] = softmax_j(scale q_h . k_j,h) v_j,h. One block
//                   per row reads each cached slot once, as C contiguous floats (all heads), so the
//                   step moves only the filled slots of the cache: no [rows, H, 1, width] score
//                   tensor, no masked slots, no padding. Phase 1: a warp per slot forms the C
//                   products q . k, sums them within each head (shuffles inside aligned groups of
//                   gcd(D, 32) lanes, then shared atomics across groups) into a [H, span] score
//                   buffer in shared memory. Phase 2: a warp per head turns its scores into
//                   exp(x - max) and keeps 1 / sum. Phase 3: a warp per slot accumulates p * v per
//                   column in registers; the warps' partial sums meet in shared memory. fp32
//                   throughout; heads of D = 32 or D a multiple of 32 sum in a fixed order (others
//                   add groups with shared atomics, whose order may vary in the last bit).
//
// Both come for float32 and for bfloat16 tensors (the *_bf16 launchers: cache, values, q and out in
// bf16; slot and pads stay float32). The bf16 attention reads bf16 and computes in float32 as above,
// rounding only its output.
//
// The launcher follows cuda_check.cuh's contract: device pointers, sizes by value and a
// cudaStream_t in, an int cudaError_t out (cudaErrorInvalidValue for bad sizes).
#include <atomic>
#include <cmath>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"
#include "includes/launch_utils.cuh"
#include "includes/reduce.cuh"

namespace {

// The integer a float in device memory holds, or -1 when it is not an integer in [0, count).
__device__ __forceinline__ int index_in(float x, int count) {
  if (!(x >= 0.f && x < static_cast<float>(count)) || x != floorf(x)) return -1;
  return static_cast<int>(x);
}

template <class T>
__device__ __forceinline__ T from_float(float x) {
  return static_cast<T>(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

template <class T>
__global__ void slot_write_kernel(T* buffer, const T* values, long long values_stride, const float* slot,
                                  int rows, int slots, int n, long long row_stride, long long slot_stride) {
  const int s = index_in(slot[0], slots);
  if (s < 0) return;
  T* base = buffer + static_cast<long long>(s) * slot_stride;
  const long long total = static_cast<long long>(rows) * n;
  const long long stride = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < total; i += stride) {
    const long long r = i / n;
    base[r * row_stride + (i - r * n)] = values[r * values_stride + (i - r * n)];
  }
}

constexpr int kAttnWarps = 8;
constexpr int kAttnThreads = 32 * kAttnWarps;
constexpr int kAttnMaxChannels = 32 * 64;  // the largest NJ instance below

// Shared floats of a slot_attention block: scores [heads, width], 1 / sum [heads], warp partials [warps, C].
inline long long slot_attention_smem(int width, int heads, int channels) {
  return 4LL * (static_cast<long long>(heads) * width + heads + static_cast<long long>(kAttnWarps) * channels);
}

// NJ: columns per lane (32 * NJ >= C). q has row stride q_stride; cache rows have stride row_stride and
// slots stride C. The row attends over slots [max(pads[r], 0), min(slot, width - 1)]; none: zeros.
template <class T, int NJ>
__global__ void __launch_bounds__(kAttnThreads) slot_attention_kernel(
    T* out, const T* q, long long q_stride, const T* keys, const T* values, long long row_stride,
    const float* slot, const float* pads, int width, int heads, int head_dim, float scale) {
  extern __shared__ float smem[];
  const int C = heads * head_dim;
  float* scores = smem;
  float* inv_sum = scores + static_cast<long long>(heads) * width;
  float* partial = inv_sum + heads;
  const int row = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float s_value = slot[0], pad_value = pads[row];
  const int hi = !(s_value >= 0.f) ? -1
                 : s_value >= static_cast<float>(width - 1) ? width - 1
                                                             : static_cast<int>(s_value);
  const int lo = pad_value > 0.f ? static_cast<int>(pad_value) : 0;
  const int span = hi - lo + 1;
  T* out_row = out + static_cast<long long>(row) * C;
  if (span <= 0) {
    for (int c = threadIdx.x; c < C; c += kAttnThreads) out_row[c] = from_float<T>(0.f);
    return;
  }
  for (int i = threadIdx.x; i < heads * width; i += kAttnThreads) scores[i] = 0.f;
  float qr[NJ];
  int head_of[NJ];
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int c = lane + 32 * j;
    qr[j] = c < C ? static_cast<float>(q[static_cast<long long>(row) * q_stride + c]) * scale : 0.f;
    head_of[j] = c < C ? c / head_dim : 0;
  }
  // Lanes summed by shuffles: the largest power of two dividing both D and 32.
  const int group = min(head_dim & -head_dim, 32);
  __syncthreads();
  const T* key_row = keys + static_cast<long long>(row) * row_stride;
  for (int s = lo + warp; s <= hi; s += kAttnWarps) {
    const T* k = key_row + static_cast<long long>(s) * C;
    float part[NJ];
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int c = lane + 32 * j;
      part[j] = c < C ? qr[j] * static_cast<float>(k[c]) : 0.f;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      if (offset < group) {
#pragma unroll
        for (int j = 0; j < NJ; ++j) part[j] += __shfl_xor_sync(mt::kFullWarpMask, part[j], offset);
      }
    }
    if ((lane & (group - 1)) == 0) {
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        if (lane + 32 * j < C) atomicAdd(&scores[head_of[j] * width + (s - lo)], part[j]);
      }
    }
  }
  __syncthreads();
  for (int h = warp; h < heads; h += kAttnWarps) {
    float* x = scores + h * width;
    float m = -INFINITY;
    for (int i = lane; i < span; i += 32) m = fmaxf(m, x[i]);
    m = mt::warp_allreduce(m, mt::MaxOp{});
    float sum = 0.f;
    for (int i = lane; i < span; i += 32) {
      const float e = expf(x[i] - m);
      x[i] = e;
      sum += e;
    }
    sum = mt::warp_allreduce(sum, mt::SumOp{});
    if (lane == 0) inv_sum[h] = 1.f / sum;
  }
  __syncthreads();
  float acc[NJ];
#pragma unroll
  for (int j = 0; j < NJ; ++j) acc[j] = 0.f;
  const T* value_row = values + static_cast<long long>(row) * row_stride;
  for (int s = lo + warp; s <= hi; s += kAttnWarps) {
    const T* v = value_row + static_cast<long long>(s) * C;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int c = lane + 32 * j;
      if (c < C) acc[j] += scores[head_of[j] * width + (s - lo)] * static_cast<float>(v[c]);
    }
  }
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int c = lane + 32 * j;
    if (c < C) partial[warp * C + c] = acc[j];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += kAttnThreads) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) total += partial[w * C + c];
    out_row[c] = from_float<T>(total * inv_sum[c / head_dim]);
  }
}

template <class T, int NJ>
int launch_slot_attention_nj(T* out, const T* q, long long q_stride, const T* keys, const T* values,
                             long long row_stride, const float* slot, const float* pads, int rows, int width, int heads,
                             int head_dim, float scale, int smem, cudaStream_t stream) {
  static std::atomic<unsigned long long> configured{0};
  auto kernel = slot_attention_kernel<T, NJ>;
  int optin = 0;
  MT_RETURN_IF_ERROR(mt::shared_memory_optin(&optin));
  MT_RETURN_IF_ERROR(mt::allow_shared_memory(kernel, optin, &configured));  // any size up to the device's
  kernel<<<rows, kAttnThreads, smem, stream>>>(out, q, q_stride, keys, values, row_stride, slot, pads, width, heads,
                                               head_dim, scale);
  return mt_launch_status();
}

// buffer[r * row_stride + s * slot_stride + c] = values[r * values_stride + c] for r < rows, c < n, where
// s = slot[0] is read when the kernel runs; a slot that is not an integer in [0, slots) writes
// nothing (the device cannot raise).
template <class T>
int slot_write(T* buffer, const T* values, long long values_stride, const float* slot, int rows, int slots, int n,
               long long row_stride, long long slot_stride, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || slots < 0 || n < 0 || values_stride < 0 || row_stride < 0 || slot_stride < 0);
  const long long total = static_cast<long long>(rows) * n;
  if (total == 0 || slots == 0) return 0;
  return mt::launch_grid_stride<slot_write_kernel<T>>(total, stream, buffer, values, values_stride, slot, rows, slots,
                                                      n, row_stride, slot_stride);
}

// The shared memory slot_attention needs for these sizes, in bytes, or -1 when it cannot run them
// (C = heads * head_dim over kAttnMaxChannels, or more shared memory than the device gives a block).
long long smem_bytes(int width, int heads, int head_dim) {
  const long long channels = static_cast<long long>(heads) * head_dim;
  if (width < 1 || heads < 1 || head_dim < 1 || channels > kAttnMaxChannels) return -1;
  int limit = 0;
  if (mt::shared_memory_optin(&limit) != cudaSuccess) return -1;
  const long long need = slot_attention_smem(width, heads, static_cast<int>(channels));
  return need <= limit ? need : -1;
}

// out [rows, C] (contiguous) = each row's query q[r, 0:C] (row stride q_stride) attending over its
// keys and values at slots [max(pads[r], 0), min(slot[0], width - 1)] of caches laid out as
// [rows, slots, C] with row stride row_stride and slot stride C; C = heads * head_dim.
template <class T>
int slot_attention(T* out, const T* q, long long q_stride, const T* keys, const T* values, long long row_stride,
                   const float* slot, const float* pads, int rows, int width, int heads, int head_dim, float scale,
                   cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || q_stride < 0 || row_stride < 0);
  if (rows == 0) return 0;
  const long long smem = smem_bytes(width, heads, head_dim);
  MT_RETURN_IF_INVALID(smem < 0);
  const int channels = heads * head_dim, s = static_cast<int>(smem);
#define MT_SLOT_ATTENTION(NJ)                                                                                   \
  if (channels <= 32 * NJ)                                                                                      \
    return launch_slot_attention_nj<T, NJ>(out, q, q_stride, keys, values, row_stride, slot, pads, rows, width,  \
                                           heads, head_dim, scale, s, stream);
  MT_SLOT_ATTENTION(2)
  MT_SLOT_ATTENTION(4)
  MT_SLOT_ATTENTION(8)
  MT_SLOT_ATTENTION(16)
  MT_SLOT_ATTENTION(32)
  MT_SLOT_ATTENTION(64)
#undef MT_SLOT_ATTENTION
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace

extern "C" {

MT_DEFINE_ERROR_STRING()

// slot_write of float32 (launch_slot_write) or bfloat16 (launch_slot_write_bf16) tensors.
int launch_slot_write(float* buffer, const float* values, long long values_stride, const float* slot, int rows,
                      int slots, int n, long long row_stride, long long slot_stride, cudaStream_t stream) {
  return slot_write(buffer, values, values_stride, slot, rows, slots, n, row_stride, slot_stride, stream);
}

int launch_slot_write_bf16(__nv_bfloat16* buffer, const __nv_bfloat16* values, long long values_stride,
                           const float* slot, int rows, int slots, int n, long long row_stride,
                           long long slot_stride, cudaStream_t stream) {
  return slot_write(buffer, values, values_stride, slot, rows, slots, n, row_stride, slot_stride, stream);
}

long long slot_attention_smem_bytes(int width, int heads, int head_dim) { return smem_bytes(width, heads, head_dim); }

// slot_attention of float32 (launch_slot_attention) or bfloat16 (launch_slot_attention_bf16) q, caches and out.
int launch_slot_attention(float* out, const float* q, long long q_stride, const float* keys, const float* values,
                          long long row_stride, const float* slot, const float* pads, int rows, int width, int heads,
                          int head_dim, float scale, cudaStream_t stream) {
  return slot_attention(out, q, q_stride, keys, values, row_stride, slot, pads, rows, width, heads, head_dim, scale,
                        stream);
}

int launch_slot_attention_bf16(__nv_bfloat16* out, const __nv_bfloat16* q, long long q_stride,
                               const __nv_bfloat16* keys, const __nv_bfloat16* values, long long row_stride,
                               const float* slot, const float* pads, int rows, int width, int heads, int head_dim,
                               float scale, cudaStream_t stream) {
  return slot_attention(out, q, q_stride, keys, values, row_stride, slot, pads, rows, width, heads, head_dim, scale,
                        stream);
}

}  // extern "C"
