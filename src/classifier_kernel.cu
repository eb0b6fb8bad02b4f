// classifier_kernel.cu: the fused classifier behind minitorch.fused_linear_cross_entropy.
//
// Softmax, cross-entropy and the gradient of the logits in one kernel, in the manner of llm.c's
// fused classifier. Shapes: logits [rows, V] (rows ld >= V floats apart, a chunk of the tokens), one target id,
// one token weight and one loss per row; weight_sum points at sum(token weights) over ALL tokens
// of the loss (not just this chunk), so that the loss is sum(loss_r * w_r) / sum(w).
// Label smoothing e replaces the one-hot target by q = (1 - e) * onehot + e / V (torch's
// definition): loss_r = logsumexp - (1 - e) * x[target] - e * mean(x), dlogits = softmax - q.
//
// Thread mapping: one block per row. Pass 1: every thread folds its elements of the row (lanes
// consecutive, float4 when every row is 16-byte aligned, else scalar with four loads in flight) into
// an online (max, sum of exp) pair plus the plain sum of the row (for label smoothing); these merge
// across the warp with shuffles, then across the block through shared memory. Thread 0 reads the target's logit before anything is overwritten.
// Pass 2 (when the gradient is wanted): each thread rereads its own elements (mostly from L2) and
// writes, IN PLACE over the logits, dlogits = (softmax - q) * w_r / sum(w). Nothing of
// size [rows, V] besides the logits buffer itself is ever allocated.
//
// A row whose scale w_r / sum(w) is 0 (an ignored token, or sum(w) == 0) reads nothing: its loss is
// 0 and its dlogits row is written as zeros. A row with a non-zero weight whose target is not an
// integer in [0, V) gets a NaN loss (the device cannot raise; the CPU backends check on the host).
#include <cmath>
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"
#include "includes/launch_utils.cuh"
#include "includes/reduce.cuh"
#include "includes/vec.cuh"

namespace {

constexpr int kMaxThreads = 1024;
constexpr int kElemsPerThread = 8;  // fewer threads than V / 8 only when V is small

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

__device__ __forceinline__ void fold4(RowStats& r, float a, float b, float c, float d) {
  const float nm = fmaxf(r.max, fmaxf(fmaxf(a, b), fmaxf(c, d)));
  r.sum_exp = r.sum_exp * expf(r.max - nm) + (expf(a - nm) + expf(b - nm)) + (expf(c - nm) + expf(d - nm));
  r.max = nm;
  r.total += (a + b) + (c + d);
}

__device__ __forceinline__ void fold1(RowStats& r, float a) {
  const float nm = fmaxf(r.max, a);
  r.sum_exp = r.sum_exp * expf(r.max - nm) + expf(a - nm);
  r.max = nm;
  r.total += a;
}

// Elements 4q .. 4q + 3 of the row, plus the bias when HAS_BIAS (both 16-byte aligned).
template <bool HAS_BIAS>
__device__ __forceinline__ float4 load4(const float* x, const float* bias, int q) {
  float4 v = mt::load_float4(x + 4 * q);
  if (HAS_BIAS) {
    const float4 b = mt::load_float4(bias + 4 * q);
    v = make_float4(v.x + b.x, v.y + b.y, v.z + b.z, v.w + b.w);
  }
  return v;
}

// The row's elements a thread owns: VEC: float4 groups q = tid, tid + T, ... (elements 4q..4q+3);
// scalar: elements j = tid, tid + T, ... taken four at a time (j, j+T, j+2T, j+3T) for ILP.
template <bool VEC, bool HAS_BIAS>
__device__ __forceinline__ RowStats row_stats(const float* x, const float* bias, int V) {
  const int T = blockDim.x;
  RowStats r{-INFINITY, 0.f, 0.f};
  if (VEC) {
    const int V4 = V >> 2;
    for (int q = threadIdx.x; q < V4; q += T) {
      const float4 v = load4<HAS_BIAS>(x, bias, q);
      fold4(r, v.x, v.y, v.z, v.w);
    }
  } else {
    int j = threadIdx.x;
    for (; j + 3 * T < V; j += 4 * T) {
      float a = x[j], b = x[j + T], c = x[j + 2 * T], d = x[j + 3 * T];
      if (HAS_BIAS) {
        a += bias[j];
        b += bias[j + T];
        c += bias[j + 2 * T];
        d += bias[j + 3 * T];
      }
      fold4(r, a, b, c, d);
    }
    for (; j < V; j += T) fold1(r, HAS_BIAS ? x[j] + bias[j] : x[j]);
  }
  return r;
}

// dlogits over the same elements row_stats read: (exp(x - max) / sum - q_j) * scale, where the
// smoothed target q_j is on_target + off_target at the target and off_target elsewhere.
template <bool VEC, bool HAS_BIAS>
__device__ __forceinline__ void row_dlogits(float* x, const float* bias, int V, int target, float max,
                                            float inv_sum, float scale, float on_target, float off_target) {
  const int T = blockDim.x;
  if (VEC) {
    const int V4 = V >> 2;
    for (int q = threadIdx.x; q < V4; q += T) {
      const float4 v = load4<HAS_BIAS>(x, bias, q);
      const int j = 4 * q;
      mt::store_float4(
          x + j, make_float4((expf(v.x - max) * inv_sum - (j == target ? on_target : 0.f) - off_target) * scale,
                             (expf(v.y - max) * inv_sum - (j + 1 == target ? on_target : 0.f) - off_target) * scale,
                             (expf(v.z - max) * inv_sum - (j + 2 == target ? on_target : 0.f) - off_target) * scale,
                             (expf(v.w - max) * inv_sum - (j + 3 == target ? on_target : 0.f) - off_target) * scale));
    }
  } else {
    for (int j = threadIdx.x; j < V; j += T) {
      const float v = HAS_BIAS ? x[j] + bias[j] : x[j];
      x[j] = (expf(v - max) * inv_sum - (j == target ? on_target : 0.f) - off_target) * scale;
    }
  }
}

template <bool VEC>
__device__ __forceinline__ void row_zero(float* x, int V) {
  if (VEC) {
    for (int q = threadIdx.x; q < (V >> 2); q += blockDim.x) {
      mt::store_float4(x + 4 * q, make_float4(0.f, 0.f, 0.f, 0.f));
    }
  } else {
    for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = 0.f;
  }
}

// The launcher's arguments (see launch_fused_classifier), passed to the kernel by value.
struct ClassifierArgs {
  float* logits;
  float* losses;
  const float* bias;  // NULL: no bias
  const float* targets;
  const float* token_weights;
  const float* weight_sum;
  int vocab;
  int ld;  // floats between rows of logits
  float label_smoothing;
};

// Grid: one block per row; blockDim.x a multiple of 32, at most kMaxThreads.
template <bool VEC, bool HAS_BIAS, bool WRITE_GRAD>
__global__ void __launch_bounds__(kMaxThreads) fused_classifier_kernel(const ClassifierArgs a) {
  __shared__ RowStats scratch[32];
  const int row = blockIdx.x;
  const int V = a.vocab;
  const float* bias = a.bias;
  float* x = a.logits + static_cast<long long>(row) * a.ld;
  const float total = *a.weight_sum;
  const float scale = total != 0.f ? a.token_weights[row] / total : 0.f;
  if (scale == 0.f) {  // uniform over the block: no barrier is skipped by only some threads
    if (threadIdx.x == 0) a.losses[row] = 0.f;
    if (WRITE_GRAD) row_zero<VEC>(x, V);
    return;
  }
  const float t = a.targets[row];
  const int target = (t >= 0.f && t < static_cast<float>(V) && t == floorf(t)) ? static_cast<int>(t) : -1;
  float target_logit = 0.f;
  if (threadIdx.x == 0) {
    // Read before the block reduction's barriers, hence before pass 2 overwrites the row.
    target_logit = target >= 0 ? x[target] + (HAS_BIAS ? bias[target] : 0.f) : NAN;
  }
  const RowStats st = mt::block_allreduce(row_stats<VEC, HAS_BIAS>(x, bias, V), RowStatsOp{},
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
    row_dlogits<VEC, HAS_BIAS>(x, bias, V, target, st.max, 1.f / st.sum_exp, scale, on_target, off_target);
  }
}

template <bool VEC, bool HAS_BIAS>
void launch_classifier_variant(bool write_grad, int rows, int threads, const ClassifierArgs& args,
                               cudaStream_t stream) {
  if (write_grad) {
    fused_classifier_kernel<VEC, HAS_BIAS, true><<<rows, threads, 0, stream>>>(args);
  } else {
    fused_classifier_kernel<VEC, HAS_BIAS, false><<<rows, threads, 0, stream>>>(args);
  }
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
// and, when write_grad != 0, the row is overwritten with
//   (softmax(row) - q) * token_weights[r] / *weight_sum.
// weight_sum is a device pointer (no host read); a zero sum gives zero losses and gradients.
// targets hold integral floats. All pointers are device pointers to float32, contiguous but the logits.
int launch_fused_classifier(float* logits, int ld, float* losses, const float* bias, const float* targets,
                            const float* token_weights, const float* weight_sum, int rows, int vocab,
                            float label_smoothing, int write_grad, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || vocab <= 0 || ld < vocab || !(label_smoothing >= 0.f && label_smoothing <= 1.f));
  MT_RETURN_IF_INVALID(logits == nullptr || losses == nullptr || targets == nullptr ||
                       token_weights == nullptr || weight_sum == nullptr);
  if (rows == 0) return 0;
  // Enough threads for kElemsPerThread elements each, in whole warps, at most kMaxThreads.
  long long threads = mt::ceil_div(mt::ceil_div(vocab, kElemsPerThread), 32) * 32;
  if (threads > kMaxThreads) threads = kMaxThreads;
  const bool vec = vocab % 4 == 0 && ld % 4 == 0 && mt::is_aligned16(logits) && (bias == nullptr || mt::is_aligned16(bias));
  const bool wg = write_grad != 0;
  const int t = static_cast<int>(threads);
  const ClassifierArgs args{logits, losses, bias, targets, token_weights, weight_sum, vocab, ld, label_smoothing};
  if (vec) {
    if (bias != nullptr) {
      launch_classifier_variant<true, true>(wg, rows, t, args, stream);
    } else {
      launch_classifier_variant<true, false>(wg, rows, t, args, stream);
    }
  } else {
    if (bias != nullptr) {
      launch_classifier_variant<false, true>(wg, rows, t, args, stream);
    } else {
      launch_classifier_variant<false, false>(wg, rows, t, args, stream);
    }
  }
  return mt_launch_status();
}

}  // extern "C"
