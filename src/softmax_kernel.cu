// Attention softmax, forward and backward (LightSeq2-style fused row kernels).
//
// Forward: out[r, :] = softmax(inp[r, :] + mask[b, :]) over the last dim of scores [B, H, Tq, Tk],
// r = (b * H + h) * Tq + i, with keys j > i + (Tk - Tq) removed when causal. A removed key (causal
// or mask == -inf) contributes exp(-inf) = 0; a row with no key left is all zeros. Finite mask
// values (-1e8) are plain additions, rounded in float32 exactly like torch's x + mask.
// Backward: grad_inp[r, :] = y * (g - sum_j g_j * y_j) with y = the forward output.
// Storage: scores, probabilities and their gradients are T, float or bfloat16; the mask is float32;
// the row max, sum and dot product and all the math are float32.
//
// Kernels (rows = B * H * Tq, k_len = Tk, VEC = 4 when Tk % 4 == 0 and every pointer is aligned to
// 4 elements, else 1):
//   *_rows<VEC, LANES, ITERS>: a team of LANES threads per row (fused_utils.cuh). Lane l keeps
//     vectors l, l + LANES, ... (ITERS of them, VEC floats each) in registers, so the row is read
//     once and written once. LANES <= 32: 128-thread blocks of 128 / LANES rows, reduced with
//     shuffles only; LANES > 32: one row per block, reduced through shared memory.
//     Forward: load (+ mask) -> max -> exp2 and sum -> scale -> store.
//     Backward: load g and y -> sum(g * y) -> store y * (g - sum).
//     Buckets (elements of capacity LANES * ITERS * VEC; a row uses the smallest that holds it):
//       VEC 4: 4..32 (1..8 lanes x 1), 64 (8 x 2), 128 (16 x 2), 256 (32 x 2), 384 (32 x 3),
//              512 (32 x 4), 768 (32 x 6), 1024 (32 x 8), then blocks of 128/256/512/1024
//              threads x 4 vectors for 2048/4096/8192/16384;
//       VEC 1: 1..32 (1..32 lanes x 1), 64..1024 (32 lanes x 2..32), then blocks of
//              256/512/1024/1024 threads x 8/8/8/16 for 2048/4096/8192/16384.
//   *_stream<VEC>: rows longer than 16384, one 512-thread block per row, any length. The forward
//     keeps a running (max, sum of exp) per thread over chunks of the row, merges them across the
//     block, then reads the row again to write it; the backward sums g * y, then reads again.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <type_traits>

#include "includes/cuda_check.cuh"
#include "includes/fused_utils.cuh"
#include "includes/launch_by_length.cuh"
#include "includes/ptx.cuh"
#include "includes/reduce.cuh"
#include "includes/storage.cuh"
#include "includes/vec.cuh"

namespace {

using mt::kLog2e;
using fused::kStreamChunk;
using fused::kStreamThreads;
using fused::Team;

// n / d for n, d < 2^31 by a multiply-high and a shift (Granlund-Montgomery), precomputed on the
// host: the per-row batch and query indices would otherwise cost a ~20-instruction division each.
struct FastDiv {
  unsigned divisor;
  unsigned magic;
  unsigned shift;
};

FastDiv make_fast_div(unsigned d) {
  unsigned shift = 0;
  while (shift < 31 && (1u << shift) < d) ++shift;
  const unsigned long long magic = ((1ull << 32) * ((1ull << shift) - d)) / d + 1;
  return {d, static_cast<unsigned>(magic), shift};
}

__device__ __forceinline__ unsigned fast_div(unsigned n, const FastDiv& d) {
  return (__umulhi(n, d.magic) + n) >> d.shift;
}

// Running softmax statistics: max m and sum of exp(x - m). The merge is written so that
// merge(a, b) == merge(b, a) bit for bit (no fused multiply-add across the two sides), which keeps
// every lane of a butterfly reduction on the same result.
struct MaxSum {
  float m;
  float s;
};

__device__ __forceinline__ float rescaled_sum(MaxSum v, float m) {
  return v.m == -INFINITY ? 0.f : __fmul_rn(v.s, mt::fast_exp2((v.m - m) * kLog2e));
}

struct MaxSumMerge {
  __device__ __forceinline__ MaxSum operator()(MaxSum a, MaxSum b) const {
    const float m = fmaxf(a.m, b.m);
    return {m, __fadd_rn(rescaled_sum(a, m), rescaled_sum(b, m))};
  }
};

// Where a row's inputs live.
template <class T>
struct FwArgs {
  T* out;
  const T* inp;
  const float* mask;       // [batch, k_len] or nullptr
  int rows;                // batch * heads * q_len
  int k_len;
  int q_len;
  int causal;
  FastDiv per_query;       // row / q_len
  FastDiv per_batch;       // row / (heads * q_len): the mask row
};

template <class T>
struct BwArgs {
  T* grad_inp;
  const T* grad_out;
  const T* soft_out;
  int rows;
  int k_len;
};

// Keys [0, limit) of `row` take part: all of them, or with the causal mask those j with
// j <= i + (Tk - Tq) for the row's query i.
template <class T>
__device__ __forceinline__ int live_keys(const FwArgs<T>& a, unsigned row) {
  if (!a.causal) return a.k_len;
  const unsigned query = row - fast_div(row, a.per_query) * a.per_query.divisor;
  const long long limit = static_cast<long long>(query) + a.k_len - a.q_len + 1;
  return limit < 0 ? 0 : (limit > a.k_len ? a.k_len : static_cast<int>(limit));
}

template <class T>
__device__ __forceinline__ const float* mask_row(const FwArgs<T>& a, unsigned row) {
  return a.mask + static_cast<size_t>(fast_div(row, a.per_batch)) * a.k_len;
}

// ---- forward, row in registers ---------------------------------------------------------------
template <class T, int VEC, int LANES, int ITERS>
__global__ void __launch_bounds__(fused::kTeamBlockThreads<LANES>)
    attn_softmax_fw_rows(const FwArgs<T> a) {
  __shared__ float scratch[32];
  const auto [lane, row, active, offset] = fused::team_row<LANES>(a.rows, a.k_len);
  const int limit = active ? live_keys(a, row) : 0;

  float v[ITERS][VEC];
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = (it * LANES + lane) * VEC;
    if (j < limit) {
      fused::load_vec<VEC>(v[it], a.inp + offset + j);
    }
  }
  if (a.mask != nullptr) {
    const float* m = mask_row(a, active ? row : 0);
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int j = (it * LANES + lane) * VEC;
      if (j < limit) {
        float mv[VEC];
        fused::load_vec<VEC>(mv, m + j);
#pragma unroll
        for (int c = 0; c < VEC; ++c) v[it][c] += mv[c];
      }
    }
  }
  float local_max = -INFINITY;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = (it * LANES + lane) * VEC;
    if (j + VEC > limit) {  // the vector is not entirely live (or was not loaded at all)
#pragma unroll
      for (int c = 0; c < VEC; ++c) {
        if (j + c >= limit) v[it][c] = -INFINITY;
      }
    }
#pragma unroll
    for (int c = 0; c < VEC; ++c) local_max = fmaxf(local_max, v[it][c]);
  }
  const float row_max = fused::team_allreduce<LANES>(local_max, mt::MaxOp{}, -INFINITY, scratch);
  // A row with every key removed has max -inf; shifting by 0 keeps exp(-inf - 0) = 0, not nan.
  const float shift = row_max == -INFINITY ? 0.f : row_max;
  float local_sum = 0.f;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
#pragma unroll
    for (int c = 0; c < VEC; ++c) {
      v[it][c] = mt::fast_exp2((v[it][c] - shift) * kLog2e);
      local_sum += v[it][c];
    }
  }
  const float row_sum = fused::team_allreduce<LANES>(local_sum, mt::SumOp{}, 0.f, scratch);
  const float inv = row_sum == 0.f ? 0.f : 1.f / row_sum;
  if (!active) return;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = (it * LANES + lane) * VEC;
    if (j < a.k_len) {
#pragma unroll
      for (int c = 0; c < VEC; ++c) v[it][c] *= inv;
      fused::store_vec<VEC>(a.out + offset + j, v[it]);
    }
  }
}

// ---- forward, streaming (rows of any length) -------------------------------------------------
// Loads vectors [v0, v0 + kStreamChunk * kStreamThreads) of the row into x, -inf where removed.
template <int VEC, class T>
__device__ __forceinline__ void load_scores_chunk(float (&x)[kStreamChunk][VEC], const FwArgs<T>& a,
                                                  size_t offset, const float* m, long long v0,
                                                  int limit) {
#pragma unroll
  for (int k = 0; k < kStreamChunk; ++k) {
    const long long j = (v0 + k * kStreamThreads + threadIdx.x) * VEC;
    if (j < limit) {
      fused::load_vec<VEC>(x[k], a.inp + offset + j);
      if (m != nullptr) {
        float mv[VEC];
        fused::load_vec<VEC>(mv, m + j);
#pragma unroll
        for (int c = 0; c < VEC; ++c) x[k][c] += mv[c];
      }
    }
#pragma unroll
    for (int c = 0; c < VEC; ++c) {
      if (j + c >= limit) x[k][c] = -INFINITY;
    }
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kStreamThreads) attn_softmax_fw_stream(const FwArgs<T> a) {
  __shared__ MaxSum scratch[32];
  const unsigned row = blockIdx.x;
  const int limit = live_keys(a, row);
  const size_t offset = static_cast<size_t>(row) * a.k_len;
  const float* m = a.mask != nullptr ? mask_row(a, row) : nullptr;
  constexpr long long kStep = static_cast<long long>(kStreamChunk) * kStreamThreads;

  MaxSum run = {-INFINITY, 0.f};
  const long long live_vecs = (static_cast<long long>(limit) + VEC - 1) / VEC;
  for (long long v0 = 0; v0 < live_vecs; v0 += kStep) {
    float x[kStreamChunk][VEC];
    load_scores_chunk<VEC>(x, a, offset, m, v0, limit);
    float chunk_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < kStreamChunk; ++k) {
#pragma unroll
      for (int c = 0; c < VEC; ++c) chunk_max = fmaxf(chunk_max, x[k][c]);
    }
    const float new_max = fmaxf(run.m, chunk_max);
    if (new_max != -INFINITY) {
      float s = rescaled_sum(run, new_max);
#pragma unroll
      for (int k = 0; k < kStreamChunk; ++k) {
#pragma unroll
        for (int c = 0; c < VEC; ++c) s += mt::fast_exp2((x[k][c] - new_max) * kLog2e);
      }
      run = {new_max, s};
    }
  }
  const MaxSum total =
      mt::block_allreduce(run, MaxSumMerge{}, MaxSum{-INFINITY, 0.f}, scratch);
  const float shift = total.m == -INFINITY ? 0.f : total.m;
  const float inv = total.s == 0.f ? 0.f : 1.f / total.s;

  const long long all_vecs = a.k_len / VEC;
  for (long long v0 = 0; v0 < all_vecs; v0 += kStep) {
    float x[kStreamChunk][VEC];
    load_scores_chunk<VEC>(x, a, offset, m, v0, limit);
#pragma unroll
    for (int k = 0; k < kStreamChunk; ++k) {
      const long long j = (v0 + k * kStreamThreads + threadIdx.x) * VEC;
      if (j < a.k_len) {
#pragma unroll
        for (int c = 0; c < VEC; ++c) x[k][c] = mt::fast_exp2((x[k][c] - shift) * kLog2e) * inv;
        fused::store_vec<VEC>(a.out + offset + j, x[k]);
      }
    }
  }
}

// ---- backward, row in registers --------------------------------------------------------------
template <class T, int VEC, int LANES, int ITERS>
__global__ void __launch_bounds__(fused::kTeamBlockThreads<LANES>)
    attn_softmax_bw_rows(const BwArgs<T> a) {
  __shared__ float scratch[32];
  const auto [lane, row, active, offset] = fused::team_row<LANES>(a.rows, a.k_len);
  const int n = active ? a.k_len : 0;

  float g[ITERS][VEC];
  float y[ITERS][VEC];
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = (it * LANES + lane) * VEC;
    if (j < n) {
      fused::load_vec<VEC>(g[it], a.grad_out + offset + j);
      fused::load_vec<VEC>(y[it], a.soft_out + offset + j);
    } else {
#pragma unroll
      for (int c = 0; c < VEC; ++c) g[it][c] = y[it][c] = 0.f;
    }
  }
  float local_dot = 0.f;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
#pragma unroll
    for (int c = 0; c < VEC; ++c) local_dot = fmaf(g[it][c], y[it][c], local_dot);
  }
  const float dot = fused::team_allreduce<LANES>(local_dot, mt::SumOp{}, 0.f, scratch);
  if (!active) return;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = (it * LANES + lane) * VEC;
    if (j < n) {
#pragma unroll
      for (int c = 0; c < VEC; ++c) g[it][c] = y[it][c] * (g[it][c] - dot);
      fused::store_vec<VEC>(a.grad_inp + offset + j, g[it]);
    }
  }
}

// ---- backward, streaming (rows of any length) ------------------------------------------------
template <int VEC, class T>
__device__ __forceinline__ void load_grad_chunk(float (&g)[kStreamChunk][VEC],
                                                float (&y)[kStreamChunk][VEC], const BwArgs<T>& a,
                                                size_t offset, long long v0) {
#pragma unroll
  for (int k = 0; k < kStreamChunk; ++k) {
    const long long j = (v0 + k * kStreamThreads + threadIdx.x) * VEC;
    if (j < a.k_len) {
      fused::load_vec<VEC>(g[k], a.grad_out + offset + j);
      fused::load_vec<VEC>(y[k], a.soft_out + offset + j);
    } else {
#pragma unroll
      for (int c = 0; c < VEC; ++c) g[k][c] = y[k][c] = 0.f;
    }
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kStreamThreads) attn_softmax_bw_stream(const BwArgs<T> a) {
  __shared__ float scratch[32];
  const size_t offset = static_cast<size_t>(blockIdx.x) * a.k_len;
  constexpr long long kStep = static_cast<long long>(kStreamChunk) * kStreamThreads;
  const long long all_vecs = a.k_len / VEC;

  float local_dot = 0.f;
  for (long long v0 = 0; v0 < all_vecs; v0 += kStep) {
    float g[kStreamChunk][VEC], y[kStreamChunk][VEC];
    load_grad_chunk<VEC>(g, y, a, offset, v0);
#pragma unroll
    for (int k = 0; k < kStreamChunk; ++k) {
#pragma unroll
      for (int c = 0; c < VEC; ++c) local_dot = fmaf(g[k][c], y[k][c], local_dot);
    }
  }
  const float dot = mt::block_allreduce(local_dot, mt::SumOp{}, 0.f, scratch);

  for (long long v0 = 0; v0 < all_vecs; v0 += kStep) {
    float g[kStreamChunk][VEC], y[kStreamChunk][VEC];
    load_grad_chunk<VEC>(g, y, a, offset, v0);
#pragma unroll
    for (int k = 0; k < kStreamChunk; ++k) {
      const long long j = (v0 + k * kStreamThreads + threadIdx.x) * VEC;
      if (j < a.k_len) {
#pragma unroll
        for (int c = 0; c < VEC; ++c) g[k][c] = y[k][c] * (g[k][c] - dot);
        fused::store_vec<VEC>(a.grad_inp + offset + j, g[k]);
      }
    }
  }
}

// ---- launchers -------------------------------------------------------------------------------
// The size buckets (see the top of the file), shared by the forward and the backward.
using Vec4Buckets = fused::Buckets<4, Team<1, 1>, Team<2, 1>, Team<4, 1>, Team<8, 1>, Team<8, 2>, Team<16, 2>,
                                   Team<32, 2>, Team<32, 3>, Team<32, 4>, Team<32, 6>, Team<32, 8>, Team<128, 4>,
                                   Team<256, 4>, Team<512, 4>, Team<1024, 4>>;
using ScalarBuckets = fused::Buckets<1, Team<1, 1>, Team<2, 1>, Team<4, 1>, Team<8, 1>, Team<16, 1>, Team<32, 1>,
                                     Team<32, 2>, Team<32, 4>, Team<32, 8>, Team<32, 12>, Team<32, 16>, Team<32, 24>,
                                     Team<32, 32>, Team<256, 8>, Team<512, 8>, Team<1024, 8>, Team<1024, 16>>;

// The kernels fused::LaunchRows launches, forward and backward.
template <class T>
struct FwKernels {
  template <int VEC, int LANES, int ITERS> static auto rows() { return attn_softmax_fw_rows<T, VEC, LANES, ITERS>; }
  template <int VEC> static auto stream() { return attn_softmax_fw_stream<T, VEC>; }
};

template <class T>
struct BwKernels {
  template <int VEC, int LANES, int ITERS> static auto rows() { return attn_softmax_bw_rows<T, VEC, LANES, ITERS>; }
  template <int VEC> static auto stream() { return attn_softmax_bw_stream<T, VEC>; }
};

// Launches Kernels' instance for rows of k_len elements, 4-element accesses when vec4.
template <class Kernels, class Args>
int launch_rows(const Args& a, bool vec4, cudaStream_t stream) {
  const fused::LaunchRows<Kernels, Args> launch{a, a.rows, stream};
  return vec4 ? fused::walk_buckets(a.k_len, launch, Vec4Buckets{})
              : fused::walk_buckets(a.k_len, launch, ScalarBuckets{});
}

template <class T>
int attn_softmax_fw(T* out, const T* inp, const float* mask, int batch, int heads, int q_len, int k_len, int causal,
                    cudaStream_t stream) {
  const long long rows_per_batch = static_cast<long long>(heads) * q_len;
  const long long rows = rows_per_batch * batch;
  MT_RETURN_IF_INVALID(rows > INT_MAX);
  const FwArgs<T> a = {out,
                       inp,
                       mask,
                       static_cast<int>(rows),
                       k_len,
                       q_len,
                       causal != 0,
                       make_fast_div(static_cast<unsigned>(q_len)),
                       make_fast_div(static_cast<unsigned>(rows_per_batch))};
  const bool vec4 = k_len % 4 == 0 && mt::is_aligned4(out) && mt::is_aligned4(inp) &&
                    (mask == nullptr || mt::is_aligned16(mask));
  return launch_rows<FwKernels<T>>(a, vec4, stream);
}

template <class T>
int attn_softmax_bw(T* grad_inp, const T* grad_out, const T* soft_out, int rows, int k_len, cudaStream_t stream) {
  const BwArgs<T> a = {grad_inp, grad_out, soft_out, rows, k_len};
  const bool vec4 = k_len % 4 == 0 && mt::is_aligned4(grad_inp) && mt::is_aligned4(grad_out) &&
                    mt::is_aligned4(soft_out);
  return launch_rows<BwKernels<T>>(a, vec4, stream);
}

}  // namespace

MT_DEFINE_ERROR_STRING()

// format: the storage code (mt::with_storage: 0 float32, 1 bfloat16) of out and inp; mask is float32.
extern "C" int launch_attn_softmax(int format, void* out, const void* inp, const float* mask, int batch, int heads,
                                   int q_len, int k_len, int causal, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(out == nullptr || inp == nullptr);
  MT_RETURN_IF_INVALID(batch <= 0 || heads <= 0 || q_len <= 0 || k_len <= 0);
  return mt::with_storage(format, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return attn_softmax_fw(static_cast<T*>(out), static_cast<const T*>(inp), mask, batch, heads, q_len, k_len, causal,
                           stream);
  });
}

// format: the storage code of grad_inp, grad_out and soft_out.
extern "C" int launch_attn_softmax_bw(int format, void* grad_inp, const void* grad_out, const void* soft_out, int rows,
                                      int k_len, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(grad_inp == nullptr || grad_out == nullptr || soft_out == nullptr);
  MT_RETURN_IF_INVALID(rows <= 0 || k_len <= 0);
  return mt::with_storage(format, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    return attn_softmax_bw(static_cast<T*>(grad_inp), static_cast<const T*>(grad_out), static_cast<const T*>(soft_out),
                           rows, k_len, stream);
  });
}
