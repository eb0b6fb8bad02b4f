// combine.cu: the elementwise and reduction kernels of minitorch's CUDA backend, and the scalar
// operations they apply.
//
//   elementwise   map / map_scalar / zip / fill / copy over any layout with numpy broadcasting, and
//                 arange. Contiguous operands take a grid-stride float4 path (one wave of resident
//                 blocks, four 16-byte loads in flight per thread and operand); any other layout
//                 decomposes the flat output index over the output shape once and applies each
//                 operand's strides (stride 0 = broadcast).
//   reduce        along one dim with a start value (sum, product, max, min; max and min propagate NaN).
//                 "rows":    the reduced dim is contiguous (stride 1): one warp per output, lanes
//                            stride over the row with float4 loads, then a shuffle reduction.
//                 "columns": any other stride: a 32x8 block, x over 32 consecutive outputs (coalesced
//                            when the outputs are adjacent in memory), y over the reduced dim, then a
//                            shared-memory reduction over y.
//                 With few outputs and a long reduced dim both split the reduced dim over more
//                 warps/blocks, write partials to a caller-provided workspace, and a second launch
//                 reduces the partials (deterministic, no atomics).
//
// Every extern "C" launcher takes device pointers, layouts/sizes by value and a cudaStream_t, and
// returns an int cudaError_t (0 = success): cudaErrorInvalidValue for bad sizes, else the status of
// the launch. Opcodes are indices into the lists MT_UNARY_OPS / MT_BINARY_OPS below, exported by
// name so the Python binding can check that both sides agree.
#include <cmath>
#include <cstdint>
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"
#include "includes/device_info.cuh"
#include "includes/launch_utils.cuh"
#include "includes/layout.cuh"
#include "includes/opcodes.cuh"
#include "includes/reduce.cuh"
#include "includes/vec.cuh"

namespace {

// ------------------------------------------------------------------------------------------------
// Scalar operations: the same meaning as the functions of minitorch/operators.py.
// ------------------------------------------------------------------------------------------------
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

struct OpId {
  __device__ __forceinline__ float operator()(float x) const { return x; }
};
struct OpNeg {
  __device__ __forceinline__ float operator()(float x) const { return -x; }
};
struct OpSigmoid {
  // Two branches so that exp never overflows.
  __device__ __forceinline__ float operator()(float x) const {
    if (x >= 0.f) return 1.f / (1.f + expf(-x));
    const float e = expf(x);
    return e / (1.f + e);
  }
};
struct OpRelu {
  __device__ __forceinline__ float operator()(float x) const { return x > 0.f ? x : 0.f; }
};
struct OpLog {
  __device__ __forceinline__ float operator()(float x) const { return logf(x); }
};
struct OpExp {
  __device__ __forceinline__ float operator()(float x) const { return expf(x); }
};
struct OpInv {
  __device__ __forceinline__ float operator()(float x) const { return 1.f / x; }
};
struct OpTanh {
  __device__ __forceinline__ float operator()(float x) const { return tanhf(x); }
};
struct OpGelu {
  __device__ __forceinline__ float operator()(float x) const {
    return 0.5f * x * (1.f + tanhf(kGeluC * (x + kGeluA * x * x * x)));
  }
};
struct OpAbs {
  __device__ __forceinline__ float operator()(float x) const { return fabsf(x); }
};
struct OpSqrt {
  __device__ __forceinline__ float operator()(float x) const { return sqrtf(x); }
};
struct OpSin {
  __device__ __forceinline__ float operator()(float x) const { return sinf(x); }
};
struct OpCos {
  __device__ __forceinline__ float operator()(float x) const { return cosf(x); }
};
struct OpFloor {
  __device__ __forceinline__ float operator()(float x) const { return floorf(x); }
};
constexpr float kSqrtHalf = 0.7071067811865476f;   // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1 / sqrt(2 pi)
struct OpGeluErf {
  __device__ __forceinline__ float operator()(float x) const { return 0.5f * x * (1.f + erff(x * kSqrtHalf)); }
};

struct OpAdd {
  __device__ __forceinline__ float operator()(float x, float y) const { return x + y; }
};
struct OpMul {
  __device__ __forceinline__ float operator()(float x, float y) const { return x * y; }
};
struct OpLt {
  __device__ __forceinline__ float operator()(float x, float y) const { return x < y ? 1.f : 0.f; }
};
struct OpEq {
  __device__ __forceinline__ float operator()(float x, float y) const { return x == y ? 1.f : 0.f; }
};
struct OpIsClose {
  __device__ __forceinline__ float operator()(float x, float y) const {
    return fabsf(x - y) < 1e-2f ? 1.f : 0.f;
  }
};
// operators.max / min: NaN when either operand is NaN (as torch.max), unlike fmaxf.
struct OpMax {
  __device__ __forceinline__ float operator()(float x, float y) const { return (x > y || x != x) ? x : y; }
};
struct OpMin {
  __device__ __forceinline__ float operator()(float x, float y) const { return (x < y || x != x) ? x : y; }
};
struct OpDiv {
  __device__ __forceinline__ float operator()(float x, float y) const { return x / y; }
};
struct OpPow {
  // operators.pow: nan for a negative base with a fractional exponent, +inf for 0 ** negative
  // (powf would give -inf for -0 ** odd negative integers).
  __device__ __forceinline__ float operator()(float x, float y) const {
    if (x == 0.f && y < 0.f) return INFINITY;
    return powf(x, y);
  }
};
struct OpReluBack {
  __device__ __forceinline__ float operator()(float x, float d) const { return x > 0.f ? d : 0.f; }
};
struct OpLogBack {
  __device__ __forceinline__ float operator()(float x, float d) const { return d / x; }
};
struct OpInvBack {
  __device__ __forceinline__ float operator()(float x, float d) const { return -d / (x * x); }
};
struct OpSigmoidBack {
  __device__ __forceinline__ float operator()(float y, float d) const { return d * y * (1.f - y); }
};
struct OpTanhBack {
  __device__ __forceinline__ float operator()(float y, float d) const { return d * (1.f - y * y); }
};
struct OpGeluErfBack {
  __device__ __forceinline__ float operator()(float x, float d) const {
    return d * (0.5f * (1.f + erff(x * kSqrtHalf)) + x * expf(-0.5f * x * x) * kInvSqrt2Pi);
  }
};
struct OpGeluBack {
  __device__ __forceinline__ float operator()(float x, float d) const {
    const float t = tanhf(kGeluC * (x + kGeluA * x * x * x));
    const float dinner = kGeluC * (1.f + 3.f * kGeluA * x * x);
    return d * (0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * dinner);
  }
};

// The opcode tables: X(code, name, functor). The names are those of minitorch.operators.
#define MT_UNARY_OPS(X) \
  X(0, id, OpId)        \
  X(1, neg, OpNeg)      \
  X(2, sigmoid, OpSigmoid) \
  X(3, relu, OpRelu)    \
  X(4, log, OpLog)      \
  X(5, exp, OpExp)      \
  X(6, inv, OpInv)      \
  X(7, tanh, OpTanh)    \
  X(8, gelu, OpGelu)    \
  X(9, abs, OpAbs)      \
  X(10, sqrt, OpSqrt)   \
  X(11, sin, OpSin)     \
  X(12, cos, OpCos)     \
  X(13, floor, OpFloor) \
  X(14, gelu_erf, OpGeluErf)

#define MT_BINARY_OPS(X)          \
  X(0, add, OpAdd)                \
  X(1, mul, OpMul)                \
  X(2, lt, OpLt)                  \
  X(3, eq, OpEq)                  \
  X(4, is_close, OpIsClose)       \
  X(5, max, OpMax)                \
  X(6, pow, OpPow)                \
  X(7, relu_back, OpReluBack)     \
  X(8, log_back, OpLogBack)       \
  X(9, inv_back, OpInvBack)       \
  X(10, sigmoid_back, OpSigmoidBack) \
  X(11, tanh_back, OpTanhBack)    \
  X(12, gelu_back, OpGeluBack)    \
  X(13, min, OpMin)               \
  X(14, div, OpDiv)               \
  X(15, gelu_erf_back, OpGeluErfBack)

constexpr int kNumUnaryOps = MT_OPCODE_COUNT(MT_UNARY_OPS);
constexpr int kNumBinaryOps = MT_OPCODE_COUNT(MT_BINARY_OPS);

constexpr int kOpAdd = 0;
constexpr int kOpMul = 1;
constexpr int kOpMax = 5;
constexpr int kOpMin = 13;

MT_DEFINE_OPCODE_DISPATCH(dispatch_unary, MT_UNARY_OPS)
MT_DEFINE_OPCODE_DISPATCH(dispatch_binary, MT_BINARY_OPS)

// Adapters that give every elementwise operation the shape f(x, y) -> float.
template <class Op>
struct UnaryFn {
  Op op;
  __device__ __forceinline__ float operator()(float x, float) const { return op(x); }
};
template <class Op>
struct ScalarFn {
  Op op;
  float s;
  __device__ __forceinline__ float operator()(float x, float) const { return op(x, s); }
};
struct FillFn {
  float value;
  __device__ __forceinline__ float operator()(float, float) const { return value; }
};

// ------------------------------------------------------------------------------------------------
// Elementwise kernels. NIN is the number of tensor inputs (0 for fill, 1 for map, 2 for zip).
// ------------------------------------------------------------------------------------------------
constexpr int kEwUnroll = 4;

template <int NIN, class F>
__global__ void __launch_bounds__(mt::kGridStrideThreads)
elementwise_contiguous_kernel(float* out, const float* a, const float* b, long long n, F f) {
  const long long n4 = n >> 2;
  const long long stride = mt::grid_stride_step();
  const long long first = mt::grid_stride_first();
  const float4* a4 = reinterpret_cast<const float4*>(a);
  const float4* b4 = reinterpret_cast<const float4*>(b);
  float4* out4 = reinterpret_cast<float4*>(out);
  const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);

  long long i = first;
  for (; i + (kEwUnroll - 1) * stride < n4; i += kEwUnroll * stride) {
    float4 x[kEwUnroll], y[kEwUnroll];
#pragma unroll
    for (int u = 0; u < kEwUnroll; ++u) {
      x[u] = NIN > 0 ? a4[i + u * stride] : zero4;
      y[u] = NIN > 1 ? b4[i + u * stride] : zero4;
    }
#pragma unroll
    for (int u = 0; u < kEwUnroll; ++u) out4[i + u * stride] = mt::apply4(f, x[u], y[u]);
  }
  for (; i < n4; i += stride) {
    const float4 x = NIN > 0 ? a4[i] : zero4;
    const float4 y = NIN > 1 ? b4[i] : zero4;
    out4[i] = mt::apply4(f, x, y);
  }
  const long long tail = (n4 << 2) + first;  // the last n % 4 elements
  if (tail < n) out[tail] = f(NIN > 0 ? a[tail] : 0.f, NIN > 1 ? b[tail] : 0.f);
}

// Strided operands, VEC elements per item: VEC 1 for any layouts; VEC 4 for operands whose
// innermost dim has unit stride and a multiple of 4 elements, their other strides multiples of 4 and
// their bases 16-byte aligned (a permuted copy of attention heads, a slice of packed q/k/v): one
// index decomposition and one 16-byte access per operand for every 4 elements.
template <int NIN, int VEC, class F>
__global__ void __launch_bounds__(mt::kGridStrideThreads)
elementwise_strided_kernel(float* out, const MtLayout out_l, const float* a, const MtLayout a_l,
                           const float* b, const MtLayout b_l, int items, F f) {
  const long long stride = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < items; i += stride) {
    int oo, ao, bo;
    mt::layout_offsets<NIN + 1>(out_l, out_l, a_l, b_l, static_cast<int>(i) * VEC, &oo, &ao, &bo);
    if constexpr (VEC == 4) {
      const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 x = NIN > 0 ? *reinterpret_cast<const float4*>(a + ao) : zero4;
      const float4 y = NIN > 1 ? *reinterpret_cast<const float4*>(b + bo) : zero4;
      *reinterpret_cast<float4*>(out + oo) = mt::apply4(f, x, y);
    } else {
      out[oo] = f(NIN > 0 ? a[ao] : 0.f, NIN > 1 ? b[bo] : 0.f);
    }
  }
}

// Whether an operand of layout l at p can be read or written four elements at a time (VEC 4 above).
inline bool vector4_layout(const float* p, const MtLayout& l) {
  if (l.ndim < 1 || !mt::is_aligned16(p)) return false;
  const int last = l.ndim - 1;
  if (l.shape[last] % 4 != 0 || (l.shape[last] > 1 && l.strides[last] != 1)) return false;
  for (int d = 0; d < last; ++d) {
    if (l.strides[d] % 4 != 0) return false;
  }
  return true;
}

// Launches the contiguous path when every operand is one aligned run of elements, the strided path
// four elements at a time when every operand allows it, else the strided path. Inputs that are unused
// (NIN < 2) are passed as the output's layout.
template <int NIN, class F>
int launch_elementwise(float* out, const MtLayout& out_l, const float* a, const MtLayout& a_l,
                       const float* b, const MtLayout& b_l, F f, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!mt::valid_layout(out_l) || !mt::valid_layout(a_l) || !mt::valid_layout(b_l));
  MT_RETURN_IF_INVALID(!mt::same_shape(out_l, a_l) || !mt::same_shape(out_l, b_l));
  const long long n = mt::layout_numel(out_l);
  MT_RETURN_IF_INVALID(n > mt::kMaxInt);
  if (n == 0) return 0;
  const bool contiguous = mt::layout_is_flat_contiguous(out_l) && mt::is_aligned16(out) &&
                          (NIN < 1 || (mt::layout_is_flat_contiguous(a_l) && mt::is_aligned16(a))) &&
                          (NIN < 2 || (mt::layout_is_flat_contiguous(b_l) && mt::is_aligned16(b)));
  if (contiguous) {
    return mt::launch_grid_stride<elementwise_contiguous_kernel<NIN, F>>((n + 3) / 4, stream, out, a, b,
                                                                         n, f);
  }
  if (vector4_layout(out, out_l) && (NIN < 1 || vector4_layout(a, a_l)) && (NIN < 2 || vector4_layout(b, b_l))) {
    return mt::launch_grid_stride<elementwise_strided_kernel<NIN, 4, F>>(n / 4, stream, out, out_l, a, a_l, b, b_l,
                                                                        static_cast<int>(n / 4), f);
  }
  return mt::launch_grid_stride<elementwise_strided_kernel<NIN, 1, F>>(n, stream, out, out_l, a, a_l, b, b_l,
                                                                      static_cast<int>(n), f);
}

__global__ void arange_kernel(float* out, int n) {
  const long long stride = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < n; i += stride) {
    out[i] = static_cast<float>(i);
  }
}

// ------------------------------------------------------------------------------------------------
// Reduce along one dim. `outer` maps an output ordinal to the storage offset of the first element
// reduced into it; `out_l` maps the same ordinal to the output's storage offset.
// ------------------------------------------------------------------------------------------------
constexpr int kReduceThreads = 256;
constexpr int kColsX = 32;
constexpr int kColsY = 8;

// One warp per (output, split) unit. Elements [split * chunk, min(len, (split + 1) * chunk)) of the
// row; a scalar head up to the first 16-byte boundary, float4 body (4 loads in flight), scalar tail.
template <class Op>
__global__ void __launch_bounds__(kReduceThreads)
reduce_rows_kernel(float* out, const MtLayout out_l, const float* a, const MtLayout outer,
                   long long units, int splits, int chunk, int reduce_len, float identity,
                   float start, float* partial, Op op) {
  const int lane = threadIdx.x & 31;
  const long long warps_per_grid = static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
  for (long long unit = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       unit < units; unit += warps_per_grid) {
    const int o = static_cast<int>(unit / splits);
    const int lo = static_cast<int>(unit - static_cast<long long>(o) * splits) * chunk;
    const int len = min(reduce_len - lo, chunk);
    const float* p = a + mt::layout_offset(outer, o) + lo;
    const int misalign = static_cast<int>((reinterpret_cast<std::uintptr_t>(p) & 15u) >> 2);
    const int head = min(len, (4 - misalign) & 3);
    float acc0 = identity, acc1 = identity, acc2 = identity, acc3 = identity;
    if (lane < head) acc0 = op(acc0, p[lane]);
    const float4* p4 = reinterpret_cast<const float4*>(p + head);
    const int n4 = (len - head) >> 2;
    int j = lane;
    for (; j + 96 < n4; j += 128) {
      const float4 v0 = p4[j], v1 = p4[j + 32], v2 = p4[j + 64], v3 = p4[j + 96];
      acc0 = op(acc0, op(op(v0.x, v0.y), op(v0.z, v0.w)));
      acc1 = op(acc1, op(op(v1.x, v1.y), op(v1.z, v1.w)));
      acc2 = op(acc2, op(op(v2.x, v2.y), op(v2.z, v2.w)));
      acc3 = op(acc3, op(op(v3.x, v3.y), op(v3.z, v3.w)));
    }
    for (; j < n4; j += 32) {
      const float4 v = p4[j];
      acc0 = op(acc0, op(op(v.x, v.y), op(v.z, v.w)));
    }
    const int tail = head + (n4 << 2) + lane;
    if (tail < len) acc1 = op(acc1, p[tail]);
    float acc = op(op(acc0, acc1), op(acc2, acc3));
    acc = mt::warp_allreduce(acc, op);
    if (lane == 0) {
      if (partial != nullptr) {
        partial[unit] = acc;
      } else {
        out[mt::layout_offset(out_l, o)] = op(start, acc);
      }
    }
  }
}

// Block (kColsX, kColsY): x picks one of 32 consecutive outputs, y strides over this block's part
// of the reduced dim (blockIdx.y selects the split); partials of the 8 rows meet in shared memory.
template <class Op>
__global__ void __launch_bounds__(kColsX* kColsY)
reduce_cols_kernel(float* out, const MtLayout out_l, const float* a, const MtLayout outer,
                   int n_out, int reduce_len, int reduce_stride, int chunk, float identity,
                   float start, float* partial, Op op) {
  __shared__ float tile[kColsY][kColsX + 1];
  const int o = blockIdx.x * kColsX + threadIdx.x;
  const int lo = blockIdx.y * chunk;
  const int hi = min(reduce_len, lo + chunk);
  float acc = identity;
  if (o < n_out) {
    const float* p = a + mt::layout_offset(outer, o);
    int r = lo + threadIdx.y;
    float acc1 = identity, acc2 = identity, acc3 = identity;
    for (; r + 3 * kColsY < hi; r += 4 * kColsY) {
      const float v0 = p[r * reduce_stride];
      const float v1 = p[(r + kColsY) * reduce_stride];
      const float v2 = p[(r + 2 * kColsY) * reduce_stride];
      const float v3 = p[(r + 3 * kColsY) * reduce_stride];
      acc = op(acc, v0);
      acc1 = op(acc1, v1);
      acc2 = op(acc2, v2);
      acc3 = op(acc3, v3);
    }
    for (; r < hi; r += kColsY) acc = op(acc, p[r * reduce_stride]);
    acc = op(op(acc, acc1), op(acc2, acc3));
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < n_out) {
    float v = tile[0][threadIdx.x];
#pragma unroll
    for (int y = 1; y < kColsY; ++y) v = op(v, tile[y][threadIdx.x]);
    if (partial != nullptr) {
      partial[static_cast<long long>(blockIdx.y) * n_out + o] = v;
    } else {
      out[mt::layout_offset(out_l, o)] = op(start, v);
    }
  }
}

struct ReducePlan {
  bool rows;   // reduce_rows_kernel (else reduce_cols_kernel)
  int splits;  // parts the reduced dim is cut into (1: no workspace, no second pass)
  int chunk;   // elements of the reduced dim per part
};

// Splitting only pays when there are too few outputs to fill the GPU and each part still has
// enough elements to amortize the second pass.
ReducePlan plan_reduce(int n_out, int reduce_len, int reduce_stride, int sms, bool allow_split) {
  ReducePlan plan{reduce_stride == 1 && reduce_len >= 32, 1, reduce_len};
  if (!allow_split) return plan;
  long long splits = 1;
  if (plan.rows) {
    const long long target_warps = static_cast<long long>(sms) * 32;
    if (n_out < target_warps && reduce_len >= 2048) {
      splits = mt::ceil_div(target_warps, n_out);
      if (splits > reduce_len / 1024) splits = reduce_len / 1024;
      if (splits > 1) {
        const long long chunk = mt::ceil_div(mt::ceil_div(reduce_len, splits), 128) * 128;
        plan.chunk = static_cast<int>(chunk);
        splits = mt::ceil_div(reduce_len, chunk);
      }
    }
  } else {
    const long long blocks = mt::ceil_div(n_out, kColsX);
    const long long target_blocks = static_cast<long long>(sms) * 8;
    if (blocks < target_blocks && reduce_len >= 256) {
      splits = mt::ceil_div(target_blocks, blocks);
      if (splits > reduce_len / 64) splits = reduce_len / 64;
      if (splits > 65535) splits = 65535;
      if (splits > 1) {
        const long long chunk = mt::ceil_div(reduce_len, splits);
        plan.chunk = static_cast<int>(chunk);
        splits = mt::ceil_div(reduce_len, chunk);
      }
    }
  }
  plan.splits = static_cast<int>(splits);
  if (plan.splits == 1) plan.chunk = reduce_len;
  return plan;
}

long long workspace_floats(const ReducePlan& plan, int n_out) {
  return plan.splits > 1 ? static_cast<long long>(plan.splits) * n_out : 0;
}

template <class Op>
int reduce_pass(Op op, float* out, const MtLayout& out_l, const float* a, const MtLayout& outer,
                int n_out, int reduce_len, int reduce_stride, float identity, float start,
                float* workspace, long long workspace_len, bool allow_split, int sms,
                cudaStream_t stream) {
  const ReducePlan plan = plan_reduce(n_out, reduce_len, reduce_stride, sms, allow_split);
  const long long need = workspace_floats(plan, n_out);
  MT_RETURN_IF_INVALID(need > 0 && (workspace == nullptr || workspace_len < need));
  float* partial = need > 0 ? workspace : nullptr;
  if (plan.rows) {
    const long long units = static_cast<long long>(n_out) * plan.splits;
    const int warps_per_block = kReduceThreads / 32;
    long long blocks = mt::ceil_div(units, warps_per_block);
    if (blocks > mt::kMaxInt) blocks = mt::kMaxInt;
    reduce_rows_kernel<<<static_cast<int>(blocks), kReduceThreads, 0, stream>>>(
        out, out_l, a, outer, units, plan.splits, plan.chunk, reduce_len, identity, start, partial,
        op);
  } else {
    const dim3 grid(static_cast<unsigned>(mt::ceil_div(n_out, kColsX)), static_cast<unsigned>(plan.splits));
    reduce_cols_kernel<<<grid, dim3(kColsX, kColsY), 0, stream>>>(
        out, out_l, a, outer, n_out, reduce_len, reduce_stride, plan.chunk, identity, start,
        partial, op);
  }
  MT_RETURN_IF_ERROR(cudaGetLastError());
  if (partial == nullptr) return 0;
  // Second pass over the partials: [n_out, splits] after the row kernel, [splits, n_out] after the
  // column kernel (both keep their writes coalesced).
  MtLayout partial_outer{};
  partial_outer.ndim = 1;
  partial_outer.shape[0] = n_out;
  partial_outer.strides[0] = plan.rows ? plan.splits : 1;
  const int partial_stride = plan.rows ? 1 : n_out;
  return reduce_pass(op, out, out_l, partial, partial_outer, n_out, plan.splits, partial_stride,
                     identity, start, nullptr, 0, false, sms, stream);
}

}  // namespace

// ================================================================================================
// C ABI
// ================================================================================================
extern "C" {

MT_DEFINE_ERROR_STRING()

int minitorch_unary_op_count(void) { return kNumUnaryOps; }
int minitorch_binary_op_count(void) { return kNumBinaryOps; }

// Name (as in minitorch.operators) of an opcode; NULL when out of range.
MT_DEFINE_OPCODE_NAME(minitorch_unary_op_name, MT_UNARY_OPS)
MT_DEFINE_OPCODE_NAME(minitorch_binary_op_name, MT_BINARY_OPS)

// out = unary_op(a). out_l and a_l have the same shape (a broadcast: stride 0). op 0 (id) is the
// strided copy behind contiguous().
int launch_map(int op, float* out, MtLayout out_l, const float* a, MtLayout a_l, cudaStream_t stream) {
  return dispatch_unary(op, [&](auto functor) {
    return launch_elementwise<1>(out, out_l, a, a_l, nullptr, out_l, UnaryFn<decltype(functor)>{functor},
                                 stream);
  });
}

// out = binary_op(a, s) with a scalar s.
int launch_map_scalar(int op, float* out, MtLayout out_l, const float* a, MtLayout a_l, float s,
                      cudaStream_t stream) {
  return dispatch_binary(op, [&](auto functor) {
    return launch_elementwise<1>(out, out_l, a, a_l, nullptr, out_l,
                                 ScalarFn<decltype(functor)>{functor, s}, stream);
  });
}

// out = binary_op(a, b); all three layouts have the output's shape (broadcast dims: stride 0).
int launch_zip(int op, float* out, MtLayout out_l, const float* a, MtLayout a_l, const float* b,
               MtLayout b_l, cudaStream_t stream) {
  return dispatch_binary(op, [&](auto functor) {
    return launch_elementwise<2>(out, out_l, a, a_l, b, b_l, functor, stream);
  });
}

// Every element of the layout set to value.
int launch_fill(float* out, MtLayout out_l, float value, cudaStream_t stream) {
  return launch_elementwise<0>(out, out_l, nullptr, out_l, nullptr, out_l, FillFn{value}, stream);
}

// out[i] = i for i < n (contiguous).
int launch_arange(float* out, int n, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(n < 0);
  if (n == 0) return 0;
  return mt::launch_grid_stride<arange_kernel>(n, stream, out, n);
}

// Floats of scratch that launch_reduce needs for these sizes on the current device (0: none).
long long reduce_workspace_floats(int n_out, int reduce_len, int reduce_stride) {
  int sms = 0;
  if (n_out <= 0 || reduce_len < 0 || mt::sm_count(&sms) != cudaSuccess) return 0;
  return workspace_floats(plan_reduce(n_out, reduce_len, reduce_stride, sms, true), n_out);
}

// out[o] = fold(op, start, a[outer(o) + r * reduce_stride] for r < reduce_len) for every output
// ordinal o of out_l (outer has the same shape as out_l). op: add, mul, max or min (binary opcodes).
// workspace: device scratch of reduce_workspace_floats(...) floats (may be NULL when that is 0).
int launch_reduce(int op, float* out, MtLayout out_l, const float* a, MtLayout outer, int reduce_len,
                  int reduce_stride, float start, float* workspace, long long workspace_len,
                  cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!mt::valid_layout(out_l) || !mt::valid_layout(outer) || !mt::same_shape(out_l, outer));
  MT_RETURN_IF_INVALID(reduce_len < 0);
  const long long n_out = mt::layout_numel(out_l);
  MT_RETURN_IF_INVALID(n_out > mt::kMaxInt);
  if (n_out == 0) return 0;
  int sms = 0;
  MT_RETURN_IF_ERROR(mt::sm_count(&sms));
  const int n = static_cast<int>(n_out);
  switch (op) {
    case kOpAdd:
      return reduce_pass(mt::SumOp{}, out, out_l, a, outer, n, reduce_len, reduce_stride, 0.f, start,
                         workspace, workspace_len, true, sms, stream);
    case kOpMul:
      return reduce_pass(mt::ProdOp{}, out, out_l, a, outer, n, reduce_len, reduce_stride, 1.f,
                         start, workspace, workspace_len, true, sms, stream);
    case kOpMax:
      return reduce_pass(OpMax{}, out, out_l, a, outer, n, reduce_len, reduce_stride, -INFINITY,
                         start, workspace, workspace_len, true, sms, stream);
    case kOpMin:
      return reduce_pass(OpMin{}, out, out_l, a, outer, n, reduce_len, reduce_stride, INFINITY,
                         start, workspace, workspace_len, true, sms, stream);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // extern "C"
