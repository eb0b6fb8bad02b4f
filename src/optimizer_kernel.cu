// optimizer_kernel.cu: fused AdamW, updating a parameter and both moments in place in one pass.
//
// The update of torch.optim.AdamW (decoupled weight decay, bias-corrected moments), per element:
//   p <- p * (1 - lr * weight_decay)
//   m <- beta1 * m + (1 - beta1) * g
//   v <- beta2 * v + (1 - beta2) * g^2
//   p <- p - (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// It reads p, g, m, v and writes p, m, v: 28 bytes per parameter, the least any AdamW can move.
//
// Thread mapping: a grid-stride loop over float4 groups with one wave of resident blocks; each
// thread issues its loads for two groups (8 independent 16-byte loads) before the first use. A
// scalar path takes tensors that are not 16-byte aligned, and the last n % 4 elements.
//
// The multi-tensor step updates every parameter of a model in three launches, with nothing read
// back by the host, so a training step can be captured in a CUDA graph:
//   1. grad_sumsq_kernel: the sum of squares of every gradient, one partial per block of
//      kChunk elements of one tensor (a block's tensor is found in a table of block offsets);
//   2. adamw_prepare_kernel (one block): the global norm sqrt(sum of partials, in double, in a
//      fixed order: deterministic), the clip factor min(1, max_norm / norm), and the AdamW
//      coefficients from the learning rate and step count that the host wrote to device memory;
//   3. adamw_multi_kernel: per block, one chunk of one tensor, g scaled by the clip factor.
// Mixed precision: a gradient may be float32 or bfloat16 (grad_format, read as float), and a
// parameter may have a bfloat16 working copy (working, else null) that the model's products read:
// the update writes it from the new float32 master value in the same pass (2 more bytes per element
// instead of a separate cast pass of 6).
// Tensors come in lists of up to kMaxTensors pointers passed by value (an 8.8 KB kernel argument:
// CUDA 12.1+ takes up to 32 KB), so GPT-2 124M's 148 parameters are one launch of each kernel, not
// four, each of which ended with its last wave's blocks on part of the GPU; longer lists take several
// launches of 1 and 3, their partials in consecutive ranges of one buffer.
//
// The gradient pack of data-parallel training uses the same lists: param[t] <- grad[t] * scale, or
// param[t] += grad[t] * scale when accumulating the micro-batches of a step, for every tensor of a
// list in one launch (param[t] is the gradient's slot in a flat bucket that is then reduced over
// the processes; the moments are unused), instead of one copy kernel per parameter.
#include <cmath>
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"
#include "includes/device_info.cuh"
#include "includes/reduce.cuh"
#include "includes/storage.cuh"
#include "includes/vec.cuh"

// Exported in the C ABI, so outside the anonymous namespace (a type with internal linkage would
// give the launchers internal linkage too).
constexpr int kMaxTensors = 160;

// Up to kMaxTensors contiguous tensors by value; block b of a launch works on chunk
// b - block_start[t] of the tensor t with block_start[t] <= b < block_start[t + 1]. param and the
// moments are float32; grad[t] is stored as grad_format[t] says (mt::with_storage codes: 0 float32,
// 1 bfloat16); working[t] is a bfloat16 copy of param[t] written by the update, or null.
struct TensorList {
  float* param[kMaxTensors];
  const void* grad[kMaxTensors];
  float* exp_avg[kMaxTensors];
  float* exp_avg_sq[kMaxTensors];
  __nv_bfloat16* working[kMaxTensors];
  long long numel[kMaxTensors];
  int grad_format[kMaxTensors];
  int block_start[kMaxTensors + 1];
  int count;
};

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 2;

struct AdamWCoefficients {
  float decay;         // 1 - lr * weight_decay
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^step)
  float inv_bc2_sqrt;  // 1 / sqrt(1 - beta2^step)
  float eps;
  float grad_scale;    // the clip factor of the multi-tensor step (1 for the single-tensor one)
  float grad_norm;     // the global gradient norm before clipping (multi-tensor step)
};

// Coefficients from double-precision hyperparameters (with beta2 = 0.999 rounded to float first,
// 1 - beta2 would be off by 1.3e-5 relative, and so would v).
__host__ __device__ inline AdamWCoefficients adamw_coefficients(double lr, double beta1, double beta2, double eps,
                                                                 double weight_decay, double bc1, double bc2) {
  AdamWCoefficients c;
  c.decay = static_cast<float>(1.0 - lr * weight_decay);
  c.beta1 = static_cast<float>(beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.step_size = static_cast<float>(lr / bc1);
  c.inv_bc2_sqrt = static_cast<float>(1.0 / sqrt(bc2));
  c.eps = static_cast<float>(eps);
  c.grad_scale = 1.f;
  c.grad_norm = 0.f;
  return c;
}

__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v, const AdamWCoefficients& c) {
  g *= c.grad_scale;
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  p = p * c.decay - c.step_size * m / (sqrtf(v) * c.inv_bc2_sqrt + c.eps);
}

__device__ __forceinline__ void adamw_float4(float4& p, const float4& g, float4& m, float4& v,
                                             const AdamWCoefficients& c) {
  adamw_element(p.x, g.x, m.x, v.x, c);
  adamw_element(p.y, g.y, m.y, v.y, c);
  adamw_element(p.z, g.z, m.z, v.z, c);
  adamw_element(p.w, g.w, m.w, v.w, c);
}

// kUnroll float4 steps of the update, at elements i + u * step for u < kUnroll (multiples of 4 from
// 16-byte aligned p, m, v), all their loads issued before the first use; WORKING: also the bfloat16
// working copy w.
template <class TG, bool WORKING>
__device__ __forceinline__ void adamw_unrolled(float* __restrict__ p, const TG* __restrict__ g, float* __restrict__ m,
                                               float* __restrict__ v, __nv_bfloat16* __restrict__ w, long long i,
                                               long long step, const AdamWCoefficients& c) {
  float4 p4[kUnroll], g4[kUnroll], m4[kUnroll], v4[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    p4[u] = *reinterpret_cast<const float4*>(p + i + u * step);
    g4[u] = mt::load4(g + i + u * step);
    m4[u] = *reinterpret_cast<const float4*>(m + i + u * step);
    v4[u] = *reinterpret_cast<const float4*>(v + i + u * step);
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    adamw_float4(p4[u], g4[u], m4[u], v4[u], c);
    *reinterpret_cast<float4*>(p + i + u * step) = p4[u];
    *reinterpret_cast<float4*>(m + i + u * step) = m4[u];
    *reinterpret_cast<float4*>(v + i + u * step) = v4[u];
    if constexpr (WORKING) mt::store4(w + i + u * step, p4[u]);
  }
}

__global__ void __launch_bounds__(kThreads)
adamw_vec_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ exp_avg,
                 float* __restrict__ exp_avg_sq, long long n, const AdamWCoefficients c) {
  float4* p4 = reinterpret_cast<float4*>(param);
  const float4* g4 = reinterpret_cast<const float4*>(grad);
  float4* m4 = reinterpret_cast<float4*>(exp_avg);
  float4* v4 = reinterpret_cast<float4*>(exp_avg_sq);
  const long long n4 = n >> 2;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  long long i = first;
  for (; i + (kUnroll - 1) * stride < n4; i += kUnroll * stride) {
    adamw_unrolled<float, false>(param, grad, exp_avg, exp_avg_sq, nullptr, 4 * i, 4 * stride, c);
  }
  for (; i < n4; i += stride) {
    float4 p = p4[i], m = m4[i], v = v4[i];
    adamw_float4(p, g4[i], m, v, c);
    p4[i] = p;
    m4[i] = m;
    v4[i] = v;
  }
  const long long tail = (n4 << 2) + first;  // the last n % 4 elements
  if (tail < n) adamw_element(param[tail], grad[tail], exp_avg[tail], exp_avg_sq[tail], c);
}

__global__ void __launch_bounds__(kThreads)
adamw_scalar_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ exp_avg,
                    float* __restrict__ exp_avg_sq, long long n, const AdamWCoefficients c) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    adamw_element(param[i], grad[i], exp_avg[i], exp_avg_sq[i], c);
  }
}


// ---- multi-tensor step ---------------------------------------------------------------------------
constexpr long long kChunk = 32768;  // elements per block
constexpr int kPrepareThreads = 1024;

// The tensor t with block_start[t] <= block < block_start[t + 1] (a binary search: lists are long).
__device__ __forceinline__ int tensor_of_block(const TensorList& l, int block) {
  int lo = 0, hi = l.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (l.block_start[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Four elements a load where the tensor allows it (chunks start at multiples of kChunk), four loads
// in flight a thread and four partial sums; then the last end - begin mod 4 elements one at a time.
template <class TG>
__device__ __forceinline__ float chunk_sumsq(const TG* g, long long begin, long long end) {
  float s[4] = {0.f, 0.f, 0.f, 0.f};
  long long rest = begin;
  if (mt::is_aligned4(g)) {
    rest = begin + ((end - begin) & ~3LL);
#pragma unroll 4
    for (long long i = begin + 4 * threadIdx.x; i < rest; i += 4 * blockDim.x) {
      const float4 x = mt::load4(g + i);
      s[0] = fmaf(x.x, x.x, s[0]);
      s[1] = fmaf(x.y, x.y, s[1]);
      s[2] = fmaf(x.z, x.z, s[2]);
      s[3] = fmaf(x.w, x.w, s[3]);
    }
  }
  for (long long i = rest + threadIdx.x; i < end; i += blockDim.x) {
    const float x = mt::to_float(g[i]);
    s[0] = fmaf(x, x, s[0]);
  }
  return (s[0] + s[1]) + (s[2] + s[3]);
}

__global__ void __launch_bounds__(kThreads) grad_sumsq_kernel(const TensorList l, float* __restrict__ partials) {
  __shared__ float scratch[32];
  const int t = tensor_of_block(l, blockIdx.x);
  const long long begin = (blockIdx.x - l.block_start[t]) * kChunk;
  const long long end = min(begin + kChunk, l.numel[t]);
  float s = l.grad_format[t] == 0 ? chunk_sumsq(static_cast<const float*>(l.grad[t]), begin, end)
                                  : chunk_sumsq(static_cast<const __nv_bfloat16*>(l.grad[t]), begin, end);
  s = mt::block_allreduce(s, mt::SumOp(), 0.f, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// hyper: [lr, step] written by the host; max_norm <= 0 turns clipping off (the norm is still made).
__global__ void __launch_bounds__(kPrepareThreads)
adamw_prepare_kernel(const float* __restrict__ partials, int n_partials, const double* __restrict__ hyper,
                     double max_norm, double beta1, double beta2, double eps, double weight_decay,
                     AdamWCoefficients* __restrict__ out) {
  __shared__ double sums[kPrepareThreads];
  double s = 0.0;
  for (int i = threadIdx.x; i < n_partials; i += blockDim.x) s += partials[i];
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int width = blockDim.x / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) sums[threadIdx.x] += sums[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  const double lr = hyper[0];
  const double step = hyper[1];
  const double norm = sqrt(sums[0]);
  AdamWCoefficients c = adamw_coefficients(lr, beta1, beta2, eps, weight_decay, 1.0 - pow(beta1, step),
                                           1.0 - pow(beta2, step));
  c.grad_scale = max_norm > 0.0 && norm > max_norm ? static_cast<float>(max_norm / norm) : 1.f;
  c.grad_norm = static_cast<float>(norm);
  *out = c;
}

// Elements [begin, end) of one tensor of the multi-tensor step: gradient type TG; WORKING: also
// write the bfloat16 working copy.
template <class TG, bool WORKING>
__device__ __forceinline__ void adamw_chunk(float* __restrict__ p, const TG* __restrict__ g, float* __restrict__ m,
                                            float* __restrict__ v, __nv_bfloat16* __restrict__ w, long long begin,
                                            long long end, const AdamWCoefficients& c) {
  const bool vec = mt::is_aligned16(p) && mt::is_aligned4(g) && mt::is_aligned16(m) && mt::is_aligned16(v) &&
                   (!WORKING || mt::is_aligned4(w));
  if (!vec) {
    for (long long j = begin + threadIdx.x; j < end; j += blockDim.x) {
      adamw_element(p[j], mt::to_float(g[j]), m[j], v[j], c);
      if constexpr (WORKING) w[j] = mt::from_float<__nv_bfloat16>(p[j]);
    }
    return;
  }
  const long long step = 4 * blockDim.x;
  long long i = begin + 4 * threadIdx.x;
  for (; i + (kUnroll - 1) * step + 3 < end; i += kUnroll * step) adamw_unrolled<TG, WORKING>(p, g, m, v, w, i, step, c);
  for (; i + 3 < end; i += step) {
    float4 p4 = *reinterpret_cast<float4*>(p + i), m4 = *reinterpret_cast<float4*>(m + i);
    float4 v4 = *reinterpret_cast<float4*>(v + i);
    adamw_float4(p4, mt::load4(g + i), m4, v4, c);
    *reinterpret_cast<float4*>(p + i) = p4;
    *reinterpret_cast<float4*>(m + i) = m4;
    *reinterpret_cast<float4*>(v + i) = v4;
    if constexpr (WORKING) mt::store4(w + i, p4);
  }
  for (long long j = i; j < min(i + 4, end); ++j) {
    adamw_element(p[j], mt::to_float(g[j]), m[j], v[j], c);
    if constexpr (WORKING) w[j] = mt::from_float<__nv_bfloat16>(p[j]);
  }
}

__global__ void __launch_bounds__(kThreads)
adamw_multi_kernel(const TensorList l, const AdamWCoefficients* __restrict__ coefficients) {
  const AdamWCoefficients c = *coefficients;
  // The chunks in the opposite order to grad_sumsq_kernel's: the gradients it read last are still in L2.
  const int block = gridDim.x - 1 - blockIdx.x;
  const int t = tensor_of_block(l, block);
  const long long begin = (block - l.block_start[t]) * kChunk;
  const long long end = min(begin + kChunk, l.numel[t]);
  float* p = l.param[t];
  float* m = l.exp_avg[t];
  float* v = l.exp_avg_sq[t];
  __nv_bfloat16* w = l.working[t];
  if (l.grad_format[t] == 0) {
    const float* g = static_cast<const float*>(l.grad[t]);
    if (w != nullptr) {
      adamw_chunk<float, true>(p, g, m, v, w, begin, end, c);
    } else {
      adamw_chunk<float, false>(p, g, m, v, w, begin, end, c);
    }
  } else {
    const __nv_bfloat16* g = static_cast<const __nv_bfloat16*>(l.grad[t]);
    if (w != nullptr) {
      adamw_chunk<__nv_bfloat16, true>(p, g, m, v, w, begin, end, c);
    } else {
      adamw_chunk<__nv_bfloat16, false>(p, g, m, v, w, begin, end, c);
    }
  }
}

template <bool kAccumulate>
__global__ void __launch_bounds__(kThreads) gradient_pack_kernel(const TensorList l, float scale) {
  const int t = tensor_of_block(l, blockIdx.x);
  const long long begin = (blockIdx.x - l.block_start[t]) * kChunk;
  const long long end = min(begin + kChunk, l.numel[t]);
  float* out = l.param[t];
  const float* g = static_cast<const float*>(l.grad[t]);
  if (mt::is_aligned16(out) && mt::is_aligned16(g)) {
    long long i = begin + 4 * threadIdx.x;
    for (; i + 3 < end; i += 4 * blockDim.x) {
      const float4 v = *reinterpret_cast<const float4*>(g + i);
      float4 o = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
      if (kAccumulate) {
        const float4 before = *reinterpret_cast<const float4*>(out + i);
        o = make_float4(before.x + o.x, before.y + o.y, before.z + o.z, before.w + o.w);
      }
      *reinterpret_cast<float4*>(out + i) = o;
    }
    for (long long j = i; j < min(i + 4, end); ++j) out[j] = (kAccumulate ? out[j] : 0.f) + g[j] * scale;
  } else {
    for (long long j = begin + threadIdx.x; j < end; j += blockDim.x) {
      out[j] = (kAccumulate ? out[j] : 0.f) + g[j] * scale;
    }
  }
}

bool valid_list(const TensorList& l) {
  if (l.count < 1 || l.count > kMaxTensors || l.block_start[0] != 0) return false;
  for (int t = 0; t < l.count; ++t) {
    if (l.numel[t] < 1 || l.grad[t] == nullptr || l.grad_format[t] < 0 || l.grad_format[t] > 1) return false;
    if (l.block_start[t + 1] - l.block_start[t] != (l.numel[t] + kChunk - 1) / kChunk) return false;
  }
  return true;
}

}  // namespace

// ================================================================================================
// C ABI
// ================================================================================================
extern "C" {

MT_DEFINE_ERROR_STRING()

// One AdamW step (step = 1, 2, ... counts the updates so far, this one included) over n contiguous
// float32 elements: param, exp_avg and exp_avg_sq are updated in place, grad is read. The bias
// corrections are computed here in double precision from double hyperparameters.
int launch_adamw(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, long long n, double lr,
                 double beta1, double beta2, double eps, double weight_decay, int step, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(n < 0 || step < 1);
  if (n == 0) return 0;
  MT_RETURN_IF_INVALID(param == nullptr || grad == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr);
  const double bc1 = 1.0 - std::pow(beta1, step);
  const double bc2 = 1.0 - std::pow(beta2, step);
  MT_RETURN_IF_INVALID(!(bc1 > 0.0) || !(bc2 > 0.0));  // beta == 1 would divide by zero
  const AdamWCoefficients c = adamw_coefficients(lr, beta1, beta2, eps, weight_decay, bc1, bc2);
  const bool vec = mt::is_aligned16(param) && mt::is_aligned16(grad) && mt::is_aligned16(exp_avg) &&
                   mt::is_aligned16(exp_avg_sq);
  int grid = 0;
  if (vec) {
    static int resident = 0;
    MT_RETURN_IF_ERROR(mt::grid_stride_blocks(adamw_vec_kernel, kThreads, (n + 3) / 4, &resident, &grid));
    adamw_vec_kernel<<<grid, kThreads, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, n, c);
  } else {
    static int resident = 0;
    MT_RETURN_IF_ERROR(mt::grid_stride_blocks(adamw_scalar_kernel, kThreads, n, &resident, &grid));
    adamw_scalar_kernel<<<grid, kThreads, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, n, c);
  }
  return mt_launch_status();
}

// Multi-tensor step, see the header. Launch 1 over each list of the model's gradients, writing
// its block_start[count] partials at partials + partial_offset.
int launch_grad_sumsq(TensorList list, float* partials, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!valid_list(list) || partials == nullptr);
  grad_sumsq_kernel<<<list.block_start[list.count], kThreads, 0, stream>>>(list, partials);
  return mt_launch_status();
}

// Launch 2: the norm over n_partials partials and the coefficients for this step into *out.
int launch_adamw_prepare(const float* partials, int n_partials, const double* hyper, double max_norm, double beta1,
                         double beta2, double eps, double weight_decay, void* out, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(n_partials < 1 || partials == nullptr || hyper == nullptr || out == nullptr);
  // The bounds of minitorch.optim.AdamW, which drives this launch.
  MT_RETURN_IF_INVALID(!(beta1 >= 0.0 && beta1 < 1.0) || !(beta2 >= 0.0 && beta2 < 1.0));
  MT_RETURN_IF_INVALID(eps < 0.0 || weight_decay < 0.0);
  adamw_prepare_kernel<<<1, kPrepareThreads, 0, stream>>>(partials, n_partials, hyper, max_norm, beta1, beta2, eps,
                                                          weight_decay, static_cast<AdamWCoefficients*>(out));
  return mt_launch_status();
}

// Launch 3 over each list: the update with the coefficients launch 2 wrote.
int launch_adamw_multi(TensorList list, const void* coefficients, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!valid_list(list) || coefficients == nullptr);
  for (int t = 0; t < list.count; ++t) {
    MT_RETURN_IF_INVALID(list.param[t] == nullptr || list.exp_avg[t] == nullptr || list.exp_avg_sq[t] == nullptr);
  }
  adamw_multi_kernel<<<list.block_start[list.count], kThreads, 0, stream>>>(
      list, static_cast<const AdamWCoefficients*>(coefficients));
  return mt_launch_status();
}

// The gradient pack: list.param[t] <- list.grad[t] * scale for every tensor of the list (float32
// gradients), or list.param[t] += list.grad[t] * scale when accumulate is non-zero.
int launch_gradient_pack(TensorList list, float scale, int accumulate, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!valid_list(list));
  for (int t = 0; t < list.count; ++t) MT_RETURN_IF_INVALID(list.param[t] == nullptr || list.grad_format[t] != 0);
  if (accumulate) {
    gradient_pack_kernel<true><<<list.block_start[list.count], kThreads, 0, stream>>>(list, scale);
  } else {
    gradient_pack_kernel<false><<<list.block_start[list.count], kThreads, 0, stream>>>(list, scale);
  }
  return mt_launch_status();
}

// Sizes the Python binding mirrors (checked when the library loads).
int adamw_max_tensors(void) { return kMaxTensors; }
long long adamw_chunk(void) { return kChunk; }
int adamw_coefficient_floats(void) { return static_cast<int>(sizeof(AdamWCoefficients) / sizeof(float)); }

}  // extern "C"
