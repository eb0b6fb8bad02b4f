// classifier_kernel.cu: the fused classifier behind minitorch.fused_linear_cross_entropy.
//
// Softmax, cross-entropy and the gradient of the logits in one kernel, in the manner of llm.c's
// fused classifier. Shapes: logits [rows, V] (float32 or bf16, rows ld >= V elements apart, a chunk of the
// tokens; float32 math either way), one target id,
// one token weight and one loss per row; weight_sum points at sum(token weights) over ALL tokens
// of the loss (not just this chunk), so that the loss is sum(loss_r * w_r) / sum(w).
// Label smoothing e replaces the one-hot target by q = (1 - e) * onehot + e / V (torch's
// definition): loss_r = logsumexp - (1 - e) * x[target] - e * mean(x), dlogits = softmax - q.
//
// Thread mapping: one block per row. Pass 1: every thread folds its elements of the row (16-byte
// groups, consecutive per lane, kUnroll groups loaded before they are folded, when the rows start
// 16-byte aligned, then a scalar tail for a vocab that is not a whole number of groups; else scalar
// with four loads in flight) into an online (max, sum of exp) pair plus the plain sum of the row (for
// label smoothing); these merge across the warp with shuffles, then across the block through shared
// memory. Thread 0 reads the target's logit before anything is overwritten.
// Pass 2 (when the gradient is wanted): each thread rereads its own elements (mostly from L2) and
// writes dlogits = (softmax - q) * w_r / sum(w) into the gradient rows, which may be the logits
// themselves (the fused linear cross-entropy writes IN PLACE, so nothing of size [rows, V] besides
// the logits buffer is ever allocated) or another buffer (nn.cross_entropy's backward, which must
// leave the logits as they are). Columns V .. ld_grad - 1 of a gradient row get zeros: a weight with
// padding columns that are not classes (llm.c's padded vocabulary) gets no gradient from them.
//
// A row whose scale w_r / sum(w) is 0 (an ignored token, or sum(w) == 0) reads nothing: its loss is
// 0 and its dlogits row is written as zeros. A row with a non-zero weight whose target is not an
// integer in [0, V) gets a NaN loss (the device cannot raise; the CPU backends check on the host).
#include <cmath>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "includes/cuda_check.cuh"
#include "includes/dependent_launch.cuh"
#include "includes/launch_utils.cuh"
#include "includes/ptx.cuh"
#include "includes/reduce.cuh"
#include "includes/vec.cuh"

namespace {

constexpr int kMaxThreads = 512;  // two rows an SM: kUnroll groups in registers take ~64 of them a thread
constexpr int kElemsPerThread = 8;  // fewer threads than V / 8 only when V is small
constexpr int kUnroll = 4;          // 16-byte groups a thread loads at once

// The state of a set of logits: max = their max, sum_exp = sum(exp(x - max)) (the online softmax)
// and total = sum(x) (for label smoothing). Merging two states rescales both sums of exponentials
// to the larger max; {-inf, 0, 0} is the empty set.
struct RowStats {
  float max, sum_exp, total;
};

struct RowStatsOp {
  __device__ __forceinline__ RowStats operator()(RowStats a, RowStats b) const {
    const float m = fmaxf(a.max, b.max);
    if (m == -INFINITY) return {-INFINITY, 0.f, a.total + b.total};
    return {m, a.sum_exp * expf(a.max - m) + b.sum_exp * expf(b.max - m), a.total + b.total};
  }
};

// Logits are float32 or bf16 (T); all arithmetic is float32. A group is the 16 bytes one vector load
// reads: kGroup<T> elements (4 floats, 8 bf16).
template <class T>
constexpr int kGroup = 16 / static_cast<int>(sizeof(T));

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void store_value(float* x, float v) { *x = v; }
__device__ __forceinline__ void store_value(__nv_bfloat16* x, float v) { *x = __float2bfloat16(v); }

// Elements j .. j + kGroup<T> - 1 of the row (16-byte aligned), plus the bias when HAS_BIAS (16-byte
// aligned too: j is a multiple of 4).
template <class T, bool HAS_BIAS>
__device__ __forceinline__ void load_group(const T* x, const float* bias, int j, float (&v)[kGroup<T>]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(x + j);
  if constexpr (sizeof(T) == 4) {
    const float4 f = make_float4(__uint_as_float(raw.x), __uint_as_float(raw.y), __uint_as_float(raw.z),
                                 __uint_as_float(raw.w));
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
  }
  if (HAS_BIAS) {
#pragma unroll
    for (int i = 0; i < kGroup<T>; i += 4) {
      const float4 b = mt::load_float4(bias + j + i);
      v[i] += b.x, v[i + 1] += b.y, v[i + 2] += b.z, v[i + 3] += b.w;
    }
  }
}

template <class T>
__device__ __forceinline__ void store_group(T* x, int j, const float (&v)[kGroup<T>]) {
  uint4 raw;
  if constexpr (sizeof(T) == 4) {
    raw = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
  } else {
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
      words[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
    raw = make_uint4(words[0], words[1], words[2], words[3]);
  }
  *reinterpret_cast<uint4*>(x + j) = raw;
}

// exp(x) for x <= 0 in the logits' precision: the exact expf for float32 logits; for bf16 ones (whose
// gradient is rounded to 8 bits) the hardware's exp2 approximation, within a few float32 ulps, at a
// quarter of the instructions (the kernel is issue-bound on its two exponentials per element).
template <class T>
__device__ __forceinline__ float row_exp(float x) {
  if constexpr (sizeof(T) == 4) {
    return expf(x);
  } else {
    return __expf(x);
  }
}

template <class T, int N>
__device__ __forceinline__ void fold(RowStats& r, const float* v) {
  float nm = r.max;
#pragma unroll
  for (int i = 0; i < N; ++i) nm = fmaxf(nm, v[i]);
  float sum = 0.f, total = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    sum += row_exp<T>(v[i] - nm);
    total += v[i];
  }
  r.sum_exp = r.sum_exp * row_exp<T>(r.max - nm) + sum;
  r.max = nm;
  r.total += total;
}

// Element j of the row plus its bias.
template <class T, bool HAS_BIAS>
__device__ __forceinline__ float element(const T* x, const float* bias, int j) {
  return HAS_BIAS ? to_float(x[j]) + bias[j] : to_float(x[j]);
}

// The first element of the row's scalar tail: VEC rows are read in whole groups up to there (the
// rest one element per thread); other rows are read one element at a time from the start.
template <class T, bool VEC>
__device__ __forceinline__ int tail_start(int V) {
  return VEC ? V - V % kGroup<T> : 0;
}

// The row's elements a thread owns: VEC: groups q = tid, tid + T, ... (elements G q .. G q + G - 1),
// then the tail; scalar: elements j = tid, tid + T, ... taken four at a time for ILP.
template <class T, bool VEC, bool HAS_BIAS>
__device__ __forceinline__ RowStats row_stats(const T* x, const float* bias, int V) {
  constexpr int G = kGroup<T>;
  const int threads = blockDim.x;
  RowStats r{-INFINITY, 0.f, 0.f};
  int j = tail_start<T, VEC>(V) + threadIdx.x;
  if (VEC) {
    int q = threadIdx.x;
    for (; q + (kUnroll - 1) * threads < V / G; q += kUnroll * threads) {
      float v[kUnroll][G];  // every load of the step in flight before the first fold
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) load_group<T, HAS_BIAS>(x, bias, G * (q + u * threads), v[u]);
      fold<T, kUnroll * G>(r, &v[0][0]);
    }
    for (; q < V / G; q += threads) {
      float v[G];
      load_group<T, HAS_BIAS>(x, bias, G * q, v);
      fold<T, G>(r, v);
    }
  } else {
    for (; j + 3 * threads < V; j += 4 * threads) {
      const float v[4] = {element<T, HAS_BIAS>(x, bias, j), element<T, HAS_BIAS>(x, bias, j + threads),
                          element<T, HAS_BIAS>(x, bias, j + 2 * threads), element<T, HAS_BIAS>(x, bias, j + 3 * threads)};
      fold<T, 4>(r, v);
    }
  }
  for (; j < V; j += threads) {
    const float v[1] = {element<T, HAS_BIAS>(x, bias, j)};
    fold<T, 1>(r, v);
  }
  return r;
}

// dlogits over the same elements row_stats read, into out (x itself, or another row of the same
// alignment): (exp(x - max) / sum - q_j) * scale, where the smoothed target q_j is on_target +
// off_target at the target and off_target elsewhere.
//
// bf16 logits (whose gradient is rounded to 8 bits) take two FMAs and one exp2 an element of a whole
// group: with k = scale / sum, (exp(v - max) / sum - off) * scale = exp2(v log2(e) - max log2(e)) * k -
// off * scale, and on_target * scale comes off the one group that holds the target; float32 logits
// keep the formula as written, with the exact expf.
template <class T, bool VEC, bool HAS_BIAS>
__device__ __forceinline__ void row_dlogits(const T* x, T* out, const float* bias, int V, int target, float max,
                                            float inv_sum, float scale, float on_target, float off_target) {
  constexpr int G = kGroup<T>;
  const auto grad = [&](float v, int j) {
    return (row_exp<T>(v - max) * inv_sum - (j == target ? on_target : 0.f) - off_target) * scale;
  };
  const float max_log2 = max * mt::kLog2e, k = inv_sum * scale, off_scaled = off_target * scale;
  const float on_scaled = on_target * scale;
  const auto group = [&](float (&v)[G], int first) {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < G; ++i) v[i] = grad(v[i], first + i);
    } else {
#pragma unroll
      for (int i = 0; i < G; ++i) v[i] = fmaf(mt::fast_exp2(fmaf(v[i], mt::kLog2e, -max_log2)), k, -off_scaled);
      const unsigned at = static_cast<unsigned>(target - first);
      if (at < static_cast<unsigned>(G)) {
#pragma unroll
        for (int i = 0; i < G; ++i) v[i] -= i == static_cast<int>(at) ? on_scaled : 0.f;
      }
    }
  };
  if (VEC) {
    const int threads = blockDim.x;
    int q = threadIdx.x;
    for (; q + (kUnroll - 1) * threads < V / G; q += kUnroll * threads) {
      float v[kUnroll][G];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) load_group<T, HAS_BIAS>(x, bias, G * (q + u * threads), v[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int first = G * (q + u * threads);
        group(v[u], first);
        store_group(out, first, v[u]);
      }
    }
    for (; q < V / G; q += threads) {
      float v[G];
      load_group<T, HAS_BIAS>(x, bias, G * q, v);
      group(v, G * q);
      store_group(out, G * q, v);
    }
  }
  for (int j = tail_start<T, VEC>(V) + threadIdx.x; j < V; j += blockDim.x) {
    store_value(out + j, grad(element<T, HAS_BIAS>(x, bias, j), j));
  }
}

// Zeros into elements from .. to - 1 of a row.
template <class T>
__device__ __forceinline__ void row_zero(T* x, int from, int to) {
  for (int j = from + threadIdx.x; j < to; j += blockDim.x) store_value(x + j, 0.f);
}

// The launcher's arguments (see launch_fused_classifier), passed to the kernel by value.
template <class T>
struct ClassifierArgs {
  const T* logits;
  T* dlogits;  // the gradient rows (may be logits itself); written only when the gradient is wanted
  float* losses;
  const float* bias;  // NULL: no bias
  const float* targets;
  const float* token_weights;  // NULL: every weight 1
  const float* weight_sum;     // NULL: 1
  int vocab;
  int ld;       // elements between rows of logits
  int ld_grad;  // elements between rows of dlogits
  float label_smoothing;
};

// Grid: one block per row; blockDim.x a multiple of 32, at most kMaxThreads.
template <class T, bool VEC, bool HAS_BIAS, bool WRITE_GRAD>
__global__ void __launch_bounds__(kMaxThreads) fused_classifier_kernel(const ClassifierArgs<T> a) {
  mt::join_prior_grids();
  __shared__ RowStats scratch[32];
  const int row = blockIdx.x;
  const int V = a.vocab;
  const float* bias = a.bias;
  const T* x = a.logits + static_cast<long long>(row) * a.ld;
  T* out = a.dlogits + static_cast<long long>(row) * a.ld_grad;
  const float total = a.weight_sum != nullptr ? *a.weight_sum : 1.f;
  const float weight = a.token_weights != nullptr ? a.token_weights[row] : 1.f;
  const float scale = total != 0.f ? weight / total : 0.f;
  if (scale == 0.f) {  // uniform over the block: no barrier is skipped by only some threads
    if (threadIdx.x == 0) a.losses[row] = 0.f;
    if (WRITE_GRAD) row_zero(out, 0, a.ld_grad);
    return;
  }
  const float t = a.targets[row];
  const int target = (t >= 0.f && t < static_cast<float>(V) && t == floorf(t)) ? static_cast<int>(t) : -1;
  float target_logit = 0.f;
  if (threadIdx.x == 0) {
    // Read before the block reduction's barriers, hence before pass 2 may overwrite the row.
    target_logit = target >= 0 ? element<T, HAS_BIAS>(x, bias, target) : NAN;
  }
  const RowStats st = mt::block_allreduce(row_stats<T, VEC, HAS_BIAS>(x, bias, V), RowStatsOp{},
                                          RowStats{-INFINITY, 0.f, 0.f}, scratch);
  const float eps = a.label_smoothing;
  const float on_target = 1.f - eps;
  const float off_target = eps / static_cast<float>(V);
  if (threadIdx.x == 0) {
    // Without smoothing the row sum stays out of the loss (an overflowing sum must not make it NaN).
    const float smoothed = eps != 0.f ? off_target * st.total : 0.f;
    a.losses[row] = (st.max + logf(st.sum_exp) - on_target * target_logit - smoothed) * scale;
  }
  if (WRITE_GRAD) {
    row_dlogits<T, VEC, HAS_BIAS>(x, out, bias, V, target, st.max, 1.f / st.sum_exp, scale, on_target, off_target);
    row_zero(out, V, a.ld_grad);
  }
}

template <class T, bool VEC, bool HAS_BIAS>
int launch_classifier_variant(bool write_grad, int rows, int threads, const ClassifierArgs<T>& args,
                              cudaStream_t stream) {
  const auto kernel = write_grad ? fused_classifier_kernel<T, VEC, HAS_BIAS, true>
                                 : fused_classifier_kernel<T, VEC, HAS_BIAS, false>;
  return mt::launch_dependent(kernel, dim3(rows), dim3(threads), 0, stream, args);
}

template <class T>
int launch_classifier(const T* logits, int ld, T* dlogits, int ld_grad, float* losses, const float* bias, const float* targets,
                      const float* token_weights, const float* weight_sum, int rows, int vocab, float label_smoothing,
                      int write_grad, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || vocab <= 0 || ld < vocab || !(label_smoothing >= 0.f && label_smoothing <= 1.f));
  MT_RETURN_IF_INVALID(logits == nullptr || losses == nullptr || targets == nullptr);
  MT_RETURN_IF_INVALID(write_grad != 0 && (dlogits == nullptr || ld_grad < vocab));
  if (rows == 0) return 0;
  // Enough threads for kElemsPerThread elements each, in whole warps, at most kMaxThreads.
  long long threads = mt::ceil_div(mt::ceil_div(vocab, kElemsPerThread), 32) * 32;
  if (threads > kMaxThreads) threads = kMaxThreads;
  // Whole groups from 16-byte aligned row starts (any vocab: the rest of a row is a scalar tail).
  const bool wg = write_grad != 0;
  const bool vec = ld % kGroup<T> == 0 && mt::is_aligned16(logits) && (bias == nullptr || mt::is_aligned16(bias)) &&
                   (!wg || (ld_grad % kGroup<T> == 0 && mt::is_aligned16(dlogits)));
  const int t = static_cast<int>(threads);
  const ClassifierArgs<T> args{logits, dlogits, losses, bias, targets, token_weights, weight_sum,
                               vocab,  ld,      ld_grad, label_smoothing};
  if (vec) {
    return bias != nullptr ? launch_classifier_variant<T, true, true>(wg, rows, t, args, stream)
                           : launch_classifier_variant<T, true, false>(wg, rows, t, args, stream);
  }
  return bias != nullptr ? launch_classifier_variant<T, false, true>(wg, rows, t, args, stream)
                         : launch_classifier_variant<T, false, false>(wg, rows, t, args, stream);
}

}  // namespace

// ================================================================================================
// C ABI
// ================================================================================================
extern "C" {

MT_DEFINE_ERROR_STRING()

// For each row r < rows of logits [rows, vocab] (row r at logits + r * ld, ld >= vocab; + bias [vocab]
// when bias is not NULL), with
// e = label_smoothing in [0, 1] and q = (1 - e) * onehot(targets[r]) + e / vocab:
//   losses[r] = (logsumexp(row) - sum_j q_j row_j) * token_weights[r] / *weight_sum
// and, when write_grad != 0, row r of dlogits [rows, vocab] (row r at dlogits + r * ld_grad; dlogits may
// be logits itself, with ld_grad == ld, to write in place) gets
//   (softmax(row) - q) * token_weights[r] / *weight_sum,
// and its columns vocab .. ld_grad - 1 zeros (the gradient of padding columns that are not classes,
// such as llm.c's padded vocabulary: a product over all ld_grad columns then gives them none).
// weight_sum is a device pointer (no host read); a zero sum gives zero losses and gradients. A NULL
// token_weights stands for weights of 1, a NULL weight_sum for a sum of 1 (the unscaled losses).
// targets hold integral floats. All pointers are device pointers to float32, contiguous but the
// logits and dlogits (NULL when write_grad == 0).
int launch_fused_classifier(const float* logits, int ld, float* dlogits, int ld_grad, float* losses, const float* bias,
                            const float* targets, const float* token_weights, const float* weight_sum, int rows,
                            int vocab, float label_smoothing, int write_grad, cudaStream_t stream) {
  return launch_classifier(logits, ld, dlogits, ld_grad, losses, bias, targets, token_weights, weight_sum, rows, vocab,
                           label_smoothing, write_grad, stream);
}

// The same over bf16 logits (float32 math; the gradient rounded to bf16); the bias, losses, targets
// and weights stay float32.
int launch_fused_classifier_bf16(const __nv_bfloat16* logits, int ld, __nv_bfloat16* dlogits, int ld_grad,
                                 float* losses, const float* bias, const float* targets, const float* token_weights,
                                 const float* weight_sum, int rows, int vocab, float label_smoothing, int write_grad,
                                 cudaStream_t stream) {
  return launch_classifier(logits, ld, dlogits, ld_grad, losses, bias, targets, token_weights, weight_sum, rows, vocab,
                           label_smoothing, write_grad, stream);
}

}  // extern "C"
