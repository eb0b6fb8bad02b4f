// combine.cu: the general-purpose kernels of minitorch's CUDA backend.
//
//   elementwise   map / map_scalar / zip / fill / copy over any layout with numpy broadcasting.
//                 Contiguous operands take a grid-stride float4 path (one wave of resident blocks,
//                 four 16-byte loads in flight per thread and operand); any other layout decomposes
//                 the flat output index over the output shape once and applies each operand's
//                 strides (stride 0 = broadcast).
//   generators    arange and a counter-based uniform RNG (Philox-4x32-10 keyed by the seed and
//                 counted by element group, so values do not depend on the launch configuration).
//   reduce        along one dim with a start value (sum, product, max).
//                 "rows":    the reduced dim is contiguous (stride 1): one warp per output, lanes
//                            stride over the row with float4 loads, then a shuffle reduction.
//                 "columns": any other stride: a 32x8 block, x over 32 consecutive outputs (coalesced
//                            when the outputs are adjacent in memory), y over the reduced dim, then a
//                            shared-memory reduction over y.
//                 With few outputs and a long reduced dim both split the reduced dim over more
//                 warps/blocks, write partials to a caller-provided workspace, and a second launch
//                 reduces the partials (deterministic, no atomics).
//   matmul        C[b] = A[b] @ B[b] with broadcast batch dims and arbitrary strides, fp32 FFMA.
//                 A block computes a BM x BN tile of C (128x128 with 256 threads, or 64x64 with 64
//                 threads when the big tiles would not fill the GPU); each thread holds an 8x8
//                 register tile made of 2x2 sub-tiles of 4x4 spaced BM/2 and BN/2 apart, so its
//                 shared-memory reads are float4 and conflict-free. K advances in steps of BK = 8 with
//                 two shared-memory buffers: the next tile's global loads are issued before the
//                 current tile's FFMAs and stored after them (one barrier per step). Global loads run
//                 along whichever of the tile's dims is contiguous in memory (template flags), as
//                 float4 when the strides and alignment allow it; tiles are zero-padded at the edges
//                 so the inner loop has no bounds checks.
//   embedding     gather out[r, :] = weight[ids[r], :] and the scatter-add backward (atomicAdd).
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
#include "includes/layout.cuh"
#include "includes/reduce.cuh"
#include "includes/vec.cuh"

namespace {

constexpr long long kMaxInt = 2147483647LL;

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
struct OpMax {
  __device__ __forceinline__ float operator()(float x, float y) const { return x > y ? x : y; }
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
  X(8, gelu, OpGelu)

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
  X(12, gelu_back, OpGeluBack)

#define MT_COUNT_OP(code, name, functor) +1
constexpr int kNumUnaryOps = 0 MT_UNARY_OPS(MT_COUNT_OP);
constexpr int kNumBinaryOps = 0 MT_BINARY_OPS(MT_COUNT_OP);
#undef MT_COUNT_OP

constexpr int kOpAdd = 0;
constexpr int kOpMul = 1;
constexpr int kOpMax = 5;

// Calls launch(Functor{}) for the functor of a unary opcode; cudaErrorInvalidValue if unknown.
template <class Launch>
int dispatch_unary(int op, Launch&& launch) {
  switch (op) {
#define MT_CASE(code, name, functor) \
  case code:                         \
    return launch(functor{});
    MT_UNARY_OPS(MT_CASE)
#undef MT_CASE
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

template <class Launch>
int dispatch_binary(int op, Launch&& launch) {
  switch (op) {
#define MT_CASE(code, name, functor) \
  case code:                         \
    return launch(functor{});
    MT_BINARY_OPS(MT_CASE)
#undef MT_CASE
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

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
constexpr int kEwThreads = 256;
constexpr int kEwUnroll = 4;

template <int NIN, class F>
__global__ void __launch_bounds__(kEwThreads)
elementwise_contiguous_kernel(float* out, const float* a, const float* b, long long n, F f) {
  const long long n4 = n >> 2;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
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

template <int NIN, class F>
__global__ void __launch_bounds__(kEwThreads)
elementwise_strided_kernel(float* out, const MtLayout out_l, const float* a, const MtLayout a_l,
                           const float* b, const MtLayout b_l, int n, F f) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    int oo, ao, bo;
    mt::layout_offsets<NIN + 1>(out_l, out_l, a_l, b_l, static_cast<int>(i), &oo, &ao, &bo);
    out[oo] = f(NIN > 0 ? a[ao] : 0.f, NIN > 1 ? b[bo] : 0.f);
  }
}

bool same_shape(const MtLayout& x, const MtLayout& y) {
  if (x.ndim != y.ndim) return false;
  for (int d = 0; d < x.ndim; ++d) {
    if (x.shape[d] != y.shape[d]) return false;
  }
  return true;
}

bool valid_layout(const MtLayout& l) {
  if (l.ndim < 0 || l.ndim > MT_MAX_DIMS) return false;
  for (int d = 0; d < l.ndim; ++d) {
    if (l.shape[d] < 0) return false;
  }
  return true;
}

// Launches the contiguous path when every operand is one aligned run of elements, else the strided
// path. Inputs that are unused (NIN < 2) are passed as the output's layout.
template <int NIN, class F>
int launch_elementwise(float* out, const MtLayout& out_l, const float* a, const MtLayout& a_l,
                       const float* b, const MtLayout& b_l, F f, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!valid_layout(out_l) || !valid_layout(a_l) || !valid_layout(b_l));
  MT_RETURN_IF_INVALID(!same_shape(out_l, a_l) || !same_shape(out_l, b_l));
  const long long n = mt::layout_numel(out_l);
  MT_RETURN_IF_INVALID(n > kMaxInt);
  if (n == 0) return 0;
  const bool contiguous = mt::layout_is_flat_contiguous(out_l) && mt::is_aligned16(out) &&
                          (NIN < 1 || (mt::layout_is_flat_contiguous(a_l) && mt::is_aligned16(a))) &&
                          (NIN < 2 || (mt::layout_is_flat_contiguous(b_l) && mt::is_aligned16(b)));
  int grid = 0;
  if (contiguous) {
    static int resident = 0;
    MT_RETURN_IF_ERROR(mt::grid_stride_blocks(elementwise_contiguous_kernel<NIN, F>, kEwThreads,
                                              (n + 3) / 4, &resident, &grid));
    elementwise_contiguous_kernel<NIN><<<grid, kEwThreads, 0, stream>>>(out, a, b, n, f);
  } else {
    static int resident = 0;
    MT_RETURN_IF_ERROR(mt::grid_stride_blocks(elementwise_strided_kernel<NIN, F>, kEwThreads, n,
                                              &resident, &grid));
    elementwise_strided_kernel<NIN><<<grid, kEwThreads, 0, stream>>>(out, out_l, a, a_l, b, b_l,
                                                                     static_cast<int>(n), f);
  }
  return mt_launch_status();
}

// ------------------------------------------------------------------------------------------------
// Generators.
// ------------------------------------------------------------------------------------------------
__global__ void arange_kernel(float* out, int n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = static_cast<float>(i);
  }
}

// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
__device__ __forceinline__ uint4 philox4x32_10(uint4 counter, uint2 key) {
  constexpr unsigned kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr unsigned kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const unsigned hi0 = __umulhi(kMul0, counter.x), lo0 = kMul0 * counter.x;
    const unsigned hi1 = __umulhi(kMul1, counter.z), lo1 = kMul1 * counter.z;
    counter = make_uint4(hi1 ^ counter.y ^ key.x, lo1, hi0 ^ counter.w ^ key.y, lo0);
    key.x += kWeyl0;
    key.y += kWeyl1;
  }
  return counter;
}

// The top 24 bits of a uniform 32-bit integer as a float in [0, 1).
__device__ __forceinline__ float unit_float(unsigned bits) {
  return static_cast<float>(bits >> 8) * (1.f / 16777216.f);
}

// Element i of the logical (row-major) order gets component i % 4 of Philox(counter = i / 4).
__global__ void uniform_kernel(float* out, const MtLayout out_l, int n, bool flat,
                               unsigned long long seed) {
  const uint2 key = make_uint2(static_cast<unsigned>(seed), static_cast<unsigned>(seed >> 32));
  const long long groups = (static_cast<long long>(n) + 3) / 4;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long g = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += stride) {
    const uint4 bits = philox4x32_10(
        make_uint4(static_cast<unsigned>(g), static_cast<unsigned>(g >> 32), 0u, 0u), key);
    const float v[4] = {unit_float(bits.x), unit_float(bits.y), unit_float(bits.z),
                        unit_float(bits.w)};
    const int base = static_cast<int>(g * 4);
    if (flat && base + 3 < n) {
      mt::store_float4(out + base, make_float4(v[0], v[1], v[2], v[3]));
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (base + j < n) out[flat ? base + j : mt::layout_offset(out_l, base + j)] = v[j];
      }
    }
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

long long ceil_div(long long x, long long y) { return (x + y - 1) / y; }

// Splitting only pays when there are too few outputs to fill the GPU and each part still has
// enough elements to amortize the second pass.
ReducePlan plan_reduce(int n_out, int reduce_len, int reduce_stride, int sms, bool allow_split) {
  ReducePlan plan{reduce_stride == 1 && reduce_len >= 32, 1, reduce_len};
  if (!allow_split) return plan;
  long long splits = 1;
  if (plan.rows) {
    const long long target_warps = static_cast<long long>(sms) * 32;
    if (n_out < target_warps && reduce_len >= 2048) {
      splits = ceil_div(target_warps, n_out);
      if (splits > reduce_len / 1024) splits = reduce_len / 1024;
      if (splits > 1) {
        const long long chunk = ceil_div(ceil_div(reduce_len, splits), 128) * 128;
        plan.chunk = static_cast<int>(chunk);
        splits = ceil_div(reduce_len, chunk);
      }
    }
  } else {
    const long long blocks = ceil_div(n_out, kColsX);
    const long long target_blocks = static_cast<long long>(sms) * 8;
    if (blocks < target_blocks && reduce_len >= 256) {
      splits = ceil_div(target_blocks, blocks);
      if (splits > reduce_len / 64) splits = reduce_len / 64;
      if (splits > 65535) splits = 65535;
      if (splits > 1) {
        const long long chunk = ceil_div(reduce_len, splits);
        plan.chunk = static_cast<int>(chunk);
        splits = ceil_div(reduce_len, chunk);
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
    long long blocks = ceil_div(units, warps_per_block);
    if (blocks > kMaxInt) blocks = kMaxInt;
    reduce_rows_kernel<<<static_cast<int>(blocks), kReduceThreads, 0, stream>>>(
        out, out_l, a, outer, units, plan.splits, plan.chunk, reduce_len, identity, start, partial,
        op);
  } else {
    const dim3 grid(static_cast<unsigned>(ceil_div(n_out, kColsX)), static_cast<unsigned>(plan.splits));
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

// ------------------------------------------------------------------------------------------------
// Matmul.
// ------------------------------------------------------------------------------------------------
struct MatmulParams {
  const float* a;
  const float* b;
  float* c;  // contiguous [batch, M, N]
  int M, N, K;
  int a_row_stride, a_k_stride;  // A[i, p] = a[i * a_row_stride + p * a_k_stride]
  int b_k_stride, b_col_stride;  // B[p, j] = b[p * b_k_stride + j * b_col_stride]
  int batch;
  int tiles_n;
  MtLayout a_batch, b_batch;  // storage offset of batch matrix i: layout_offset(x_batch, i)
};

template <int BM, int BN>
struct MatmulConfig {
  static constexpr int kBK = 8;
  static constexpr int kThreadTile = 8;  // 8x8 outputs per thread
  static constexpr int kThreads = (BM / kThreadTile) * (BN / kThreadTile);
  static constexpr int kMinBlocks = 65536 / (kThreads * 128);  // allows up to 128 registers/thread
  static constexpr int kPad = 4;  // keeps float4 alignment and spreads transposed stores over banks
  static constexpr int kGroupsA = BM * kBK / 4 / kThreads;  // 4-element groups a thread loads
  static constexpr int kGroupsB = BN * kBK / 4 / kThreads;
  static_assert(kGroupsA * 4 * kThreads == BM * kBK, "A tile must split evenly over the threads");
  static_assert(kGroupsB * 4 * kThreads == BN * kBK, "B tile must split evenly over the threads");
};

// Loads this thread's groups of the A tile (rows row0.., k k0..) into registers, zero outside A.
// K_FAST: a group is 4 consecutive k of one row; else 4 consecutive rows at one k.
template <int BM, int BN, bool K_FAST>
__device__ __forceinline__ void load_a_tile(const float* A, const MatmulParams& p, int row0, int k0,
                                            bool vec, float (&stage)[MatmulConfig<BM, BN>::kGroupsA][4]) {
  using Cfg = MatmulConfig<BM, BN>;
#pragma unroll
  for (int g = 0; g < Cfg::kGroupsA; ++g) {
    const int e = threadIdx.x + g * Cfg::kThreads;
    const int r = K_FAST ? e / (Cfg::kBK / 4) : (e % (BM / 4)) * 4;
    const int kq = K_FAST ? (e % (Cfg::kBK / 4)) * 4 : e / (BM / 4);
    const int gr = row0 + r, gk = k0 + kq;
    if (K_FAST) {
      if (vec && gr < p.M && gk + 3 < p.K) {
        const float4 v = mt::load_float4(A + gr * p.a_row_stride + gk);
        stage[g][0] = v.x; stage[g][1] = v.y; stage[g][2] = v.z; stage[g][3] = v.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          stage[g][i] = (gr < p.M && gk + i < p.K) ? A[gr * p.a_row_stride + (gk + i) * p.a_k_stride] : 0.f;
        }
      }
    } else {
      if (vec && gr + 3 < p.M && gk < p.K) {
        const float4 v = mt::load_float4(A + gr + gk * p.a_k_stride);
        stage[g][0] = v.x; stage[g][1] = v.y; stage[g][2] = v.z; stage[g][3] = v.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          stage[g][i] = (gr + i < p.M && gk < p.K) ? A[(gr + i) * p.a_row_stride + gk * p.a_k_stride] : 0.f;
        }
      }
    }
  }
}

// Stores the staged A groups transposed, As[k][row], so the compute loop reads rows as float4.
template <int BM, int BN, bool K_FAST>
__device__ __forceinline__ void store_a_tile(float (*As)[BM + MatmulConfig<BM, BN>::kPad],
                                             const float (&stage)[MatmulConfig<BM, BN>::kGroupsA][4]) {
  using Cfg = MatmulConfig<BM, BN>;
#pragma unroll
  for (int g = 0; g < Cfg::kGroupsA; ++g) {
    const int e = threadIdx.x + g * Cfg::kThreads;
    if (K_FAST) {
      const int r = e / (Cfg::kBK / 4), kq = (e % (Cfg::kBK / 4)) * 4;
#pragma unroll
      for (int i = 0; i < 4; ++i) As[kq + i][r] = stage[g][i];
    } else {
      const int r = (e % (BM / 4)) * 4, kq = e / (BM / 4);
      mt::store_float4(&As[kq][r], make_float4(stage[g][0], stage[g][1], stage[g][2], stage[g][3]));
    }
  }
}

// B tile (k k0.., columns col0..). N_FAST: a group is 4 consecutive columns at one k; else 4
// consecutive k of one column.
template <int BM, int BN, bool N_FAST>
__device__ __forceinline__ void load_b_tile(const float* B, const MatmulParams& p, int col0, int k0,
                                            bool vec, float (&stage)[MatmulConfig<BM, BN>::kGroupsB][4]) {
  using Cfg = MatmulConfig<BM, BN>;
#pragma unroll
  for (int g = 0; g < Cfg::kGroupsB; ++g) {
    const int e = threadIdx.x + g * Cfg::kThreads;
    const int c = N_FAST ? (e % (BN / 4)) * 4 : e / (Cfg::kBK / 4);
    const int kq = N_FAST ? e / (BN / 4) : (e % (Cfg::kBK / 4)) * 4;
    const int gc = col0 + c, gk = k0 + kq;
    if (N_FAST) {
      if (vec && gk < p.K && gc + 3 < p.N) {
        const float4 v = mt::load_float4(B + gk * p.b_k_stride + gc);
        stage[g][0] = v.x; stage[g][1] = v.y; stage[g][2] = v.z; stage[g][3] = v.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          stage[g][i] = (gk < p.K && gc + i < p.N) ? B[gk * p.b_k_stride + (gc + i) * p.b_col_stride] : 0.f;
        }
      }
    } else {
      if (vec && gc < p.N && gk + 3 < p.K) {
        const float4 v = mt::load_float4(B + gc * p.b_col_stride + gk);
        stage[g][0] = v.x; stage[g][1] = v.y; stage[g][2] = v.z; stage[g][3] = v.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          stage[g][i] = (gc < p.N && gk + i < p.K) ? B[(gk + i) * p.b_k_stride + gc * p.b_col_stride] : 0.f;
        }
      }
    }
  }
}

template <int BM, int BN, bool N_FAST>
__device__ __forceinline__ void store_b_tile(float (*Bs)[BN + MatmulConfig<BM, BN>::kPad],
                                             const float (&stage)[MatmulConfig<BM, BN>::kGroupsB][4]) {
  using Cfg = MatmulConfig<BM, BN>;
#pragma unroll
  for (int g = 0; g < Cfg::kGroupsB; ++g) {
    const int e = threadIdx.x + g * Cfg::kThreads;
    if (N_FAST) {
      const int c = (e % (BN / 4)) * 4, kq = e / (BN / 4);
      mt::store_float4(&Bs[kq][c], make_float4(stage[g][0], stage[g][1], stage[g][2], stage[g][3]));
    } else {
      const int c = e / (Cfg::kBK / 4), kq = (e % (Cfg::kBK / 4)) * 4;
#pragma unroll
      for (int i = 0; i < 4; ++i) Bs[kq + i][c] = stage[g][i];
    }
  }
}

template <int BM, int BN, bool A_K_FAST, bool B_N_FAST>
__global__ void __launch_bounds__(MatmulConfig<BM, BN>::kThreads, MatmulConfig<BM, BN>::kMinBlocks)
matmul_kernel(const MatmulParams p) {
  using Cfg = MatmulConfig<BM, BN>;
  constexpr int BK = Cfg::kBK;
  __shared__ __align__(16) float As[2][BK][BM + Cfg::kPad];
  __shared__ __align__(16) float Bs[2][BK][BN + Cfg::kPad];

  const int tile_m = blockIdx.x / p.tiles_n;
  const int tile_n = blockIdx.x - tile_m * p.tiles_n;
  const int row0 = tile_m * BM, col0 = tile_n * BN;
  const int tx = threadIdx.x % (BN / 8), ty = threadIdx.x / (BN / 8);
  const int num_k_tiles = (p.K + BK - 1) / BK;
  const bool a_vec_layout = A_K_FAST ? (p.a_k_stride == 1 && p.a_row_stride % 4 == 0)
                                     : (p.a_row_stride == 1 && p.a_k_stride % 4 == 0);
  const bool b_vec_layout = B_N_FAST ? (p.b_col_stride == 1 && p.b_k_stride % 4 == 0)
                                     : (p.b_k_stride == 1 && p.b_col_stride % 4 == 0);
  const bool c_vec = p.N % 4 == 0 && mt::is_aligned16(p.c);

  for (int bi = blockIdx.y; bi < p.batch; bi += gridDim.y) {
    const float* A = p.a + mt::layout_offset(p.a_batch, bi);
    const float* B = p.b + mt::layout_offset(p.b_batch, bi);
    float* C = p.c + static_cast<long long>(bi) * p.M * p.N;
    const bool a_vec = a_vec_layout && mt::is_aligned16(A);
    const bool b_vec = b_vec_layout && mt::is_aligned16(B);

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
    }
    float a_stage[Cfg::kGroupsA][4];
    float b_stage[Cfg::kGroupsB][4];

    load_a_tile<BM, BN, A_K_FAST>(A, p, row0, 0, a_vec, a_stage);
    load_b_tile<BM, BN, B_N_FAST>(B, p, col0, 0, b_vec, b_stage);
    __syncthreads();  // the previous batch matrix's last reads of buffer 0 are done
    store_a_tile<BM, BN, A_K_FAST>(As[0], a_stage);
    store_b_tile<BM, BN, B_N_FAST>(Bs[0], b_stage);
    __syncthreads();

    for (int t = 0; t < num_k_tiles; ++t) {
      const int cur = t & 1;
      const bool has_next = t + 1 < num_k_tiles;
      if (has_next) {
        load_a_tile<BM, BN, A_K_FAST>(A, p, row0, (t + 1) * BK, a_vec, a_stage);
        load_b_tile<BM, BN, B_N_FAST>(B, p, col0, (t + 1) * BK, b_vec, b_stage);
      }
      // Unrolled by 2, not 8: full unrolling lets the compiler prefetch fragments of every kk and
      // pushes the kernel past 128 registers (2 blocks/SM), spilling the tile loaders' addresses.
#pragma unroll 2
      for (int kk = 0; kk < BK; ++kk) {
        const float4 a0 = mt::load_float4(&As[cur][kk][ty * 4]);
        const float4 a1 = mt::load_float4(&As[cur][kk][BM / 2 + ty * 4]);
        const float4 b0 = mt::load_float4(&Bs[cur][kk][tx * 4]);
        const float4 b1 = mt::load_float4(&Bs[cur][kk][BN / 2 + tx * 4]);
        const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
      }
      if (has_next) {
        store_a_tile<BM, BN, A_K_FAST>(As[cur ^ 1], a_stage);
        store_b_tile<BM, BN, B_N_FAST>(Bs[cur ^ 1], b_stage);
      }
      __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = row0 + (i < 4 ? ty * 4 + i : BM / 2 + ty * 4 + (i - 4));
      if (r < p.M) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = col0 + h * (BN / 2) + tx * 4;
          float* dst = C + static_cast<long long>(r) * p.N + c;
          if (c_vec && c + 3 < p.N) {
            mt::store_float4(dst, make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2],
                                              acc[i][4 * h + 3]));
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if (c + j < p.N) dst[j] = acc[i][4 * h + j];
            }
          }
        }
      }
    }
  }
}

template <int BM, int BN>
int launch_matmul_config(MatmulParams p, cudaStream_t stream) {
  using Cfg = MatmulConfig<BM, BN>;
  const long long tiles_m = ceil_div(p.M, BM), tiles_n = ceil_div(p.N, BN);
  MT_RETURN_IF_INVALID(tiles_m * tiles_n > kMaxInt);
  p.tiles_n = static_cast<int>(tiles_n);
  const dim3 grid(static_cast<unsigned>(tiles_m * tiles_n), static_cast<unsigned>(p.batch < 65535 ? p.batch : 65535));
  // A is "k-fast" unless its rows are the contiguous dim (a transposed view); B is "n-fast" unless
  // its k dim is the contiguous one.
  const bool a_k_fast = !(p.a_row_stride == 1 && p.a_k_stride != 1);
  const bool b_n_fast = !(p.b_k_stride == 1 && p.b_col_stride != 1);
  if (a_k_fast && b_n_fast) {
    matmul_kernel<BM, BN, true, true><<<grid, Cfg::kThreads, 0, stream>>>(p);
  } else if (a_k_fast) {
    matmul_kernel<BM, BN, true, false><<<grid, Cfg::kThreads, 0, stream>>>(p);
  } else if (b_n_fast) {
    matmul_kernel<BM, BN, false, true><<<grid, Cfg::kThreads, 0, stream>>>(p);
  } else {
    matmul_kernel<BM, BN, false, false><<<grid, Cfg::kThreads, 0, stream>>>(p);
  }
  return mt_launch_status();
}

// ------------------------------------------------------------------------------------------------
// Embedding.
// ------------------------------------------------------------------------------------------------

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
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
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
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const long long r = i / dim;
    const int c = static_cast<int>(i - r * dim);
    const int row = embedding_row(ids[r], num_embeddings);
    if (row >= 0) atomicAdd(grad_weight + static_cast<long long>(row) * dim + c, grad_out[i]);
  }
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
const char* minitorch_unary_op_name(int op) {
  switch (op) {
#define MT_NAME(code, name, functor) \
  case code:                         \
    return #name;
    MT_UNARY_OPS(MT_NAME)
#undef MT_NAME
    default:
      return nullptr;
  }
}

const char* minitorch_binary_op_name(int op) {
  switch (op) {
#define MT_NAME(code, name, functor) \
  case code:                         \
    return #name;
    MT_BINARY_OPS(MT_NAME)
#undef MT_NAME
    default:
      return nullptr;
  }
}

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
  static int resident = 0;
  int grid = 0;
  MT_RETURN_IF_ERROR(mt::grid_stride_blocks(arange_kernel, kEwThreads, n, &resident, &grid));
  arange_kernel<<<grid, kEwThreads, 0, stream>>>(out, n);
  return mt_launch_status();
}

// Uniform [0, 1) floats: the element at row-major ordinal i of the layout gets a value that depends
// only on (seed, i).
int launch_uniform(float* out, MtLayout out_l, unsigned long long seed, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!valid_layout(out_l));
  const long long n = mt::layout_numel(out_l);
  MT_RETURN_IF_INVALID(n > kMaxInt);
  if (n == 0) return 0;
  static int resident = 0;
  int grid = 0;
  MT_RETURN_IF_ERROR(mt::grid_stride_blocks(uniform_kernel, kEwThreads, (n + 3) / 4, &resident, &grid));
  const bool flat = mt::layout_is_flat_contiguous(out_l) && mt::is_aligned16(out);
  uniform_kernel<<<grid, kEwThreads, 0, stream>>>(out, out_l, static_cast<int>(n), flat, seed);
  return mt_launch_status();
}

// Floats of scratch that launch_reduce needs for these sizes on the current device (0: none).
long long reduce_workspace_floats(int n_out, int reduce_len, int reduce_stride) {
  int sms = 0;
  if (n_out <= 0 || reduce_len < 0 || mt::sm_count(&sms) != cudaSuccess) return 0;
  return workspace_floats(plan_reduce(n_out, reduce_len, reduce_stride, sms, true), n_out);
}

// out[o] = fold(op, start, a[outer(o) + r * reduce_stride] for r < reduce_len) for every output
// ordinal o of out_l (outer has the same shape as out_l). op: add, mul or max (binary opcodes).
// workspace: device scratch of reduce_workspace_floats(...) floats (may be NULL when that is 0).
int launch_reduce(int op, float* out, MtLayout out_l, const float* a, MtLayout outer, int reduce_len,
                  int reduce_stride, float start, float* workspace, long long workspace_len,
                  cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!valid_layout(out_l) || !valid_layout(outer) || !same_shape(out_l, outer));
  MT_RETURN_IF_INVALID(reduce_len < 0);
  const long long n_out = mt::layout_numel(out_l);
  MT_RETURN_IF_INVALID(n_out > kMaxInt);
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
      return reduce_pass(mt::MaxOp{}, out, out_l, a, outer, n, reduce_len, reduce_stride, -INFINITY,
                         start, workspace, workspace_len, true, sms, stream);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

// out[b] = A[b] @ B[b] for every batch index b of the (equal) shapes of a_batch and b_batch; out is
// contiguous [batch..., M, N]; A[b][i, p] = a[layout_offset(a_batch, b) + i * a_row_stride +
// p * a_k_stride], B[b][p, j] = b[layout_offset(b_batch, b) + p * b_k_stride + j * b_col_stride].
int launch_matmul(float* out, const float* a, const float* b, int M, int N, int K, int a_row_stride,
                  int a_k_stride, int b_k_stride, int b_col_stride, MtLayout a_batch,
                  MtLayout b_batch, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(M < 0 || N < 0 || K < 0);
  MT_RETURN_IF_INVALID(!valid_layout(a_batch) || !valid_layout(b_batch) || !same_shape(a_batch, b_batch));
  const long long batch = mt::layout_numel(a_batch);
  MT_RETURN_IF_INVALID(batch > kMaxInt || batch * M * N > kMaxInt);
  if (batch == 0 || M == 0 || N == 0) return 0;
  int sms = 0;
  MT_RETURN_IF_ERROR(mt::sm_count(&sms));
  MatmulParams p{a, b, out, M, N, K, a_row_stride, a_k_stride, b_k_stride, b_col_stride,
                 static_cast<int>(batch), 0, a_batch, b_batch};
  // Big tiles do twice the work per shared-memory byte; small ones keep the SMs busy when the
  // problem has too few big tiles.
  const long long big_tiles = ceil_div(M, 128) * ceil_div(N, 128) * batch;
  if (big_tiles >= sms) return launch_matmul_config<128, 128>(p, stream);
  return launch_matmul_config<64, 64>(p, stream);
}

// out[r, :] = weight[ids[r], :] for r < rows; weight [num_embeddings, dim] and out contiguous.
// ids hold integral floats; a row whose id is not an integer in [0, num_embeddings) is written as
// zeros (the device cannot raise, and checking on the host would need a copy).
int launch_embedding_fw(float* out, const float* weight, const float* ids, int rows,
                        int num_embeddings, int dim, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || num_embeddings < 0 || dim < 0);
  const long long total = static_cast<long long>(rows) * dim;
  if (total == 0) return 0;
  const bool vec = dim % 4 == 0 && mt::is_aligned16(out) && mt::is_aligned16(weight);
  static int resident = 0;
  int grid = 0;
  MT_RETURN_IF_ERROR(mt::grid_stride_blocks(embedding_fw_kernel, kEwThreads, vec ? total / 4 : total,
                                            &resident, &grid));
  embedding_fw_kernel<<<grid, kEwThreads, 0, stream>>>(out, weight, ids, rows, num_embeddings, dim, vec);
  return mt_launch_status();
}

// grad_weight[ids[r], :] += grad_out[r, :] (atomicAdd; the caller zero-fills grad_weight). Rows with
// an invalid id (see launch_embedding_fw) are skipped.
int launch_embedding_bw(float* grad_weight, const float* grad_out, const float* ids, int rows,
                        int num_embeddings, int dim, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(rows < 0 || num_embeddings < 0 || dim < 0);
  const long long total = static_cast<long long>(rows) * dim;
  if (total == 0) return 0;
  static int resident = 0;
  int grid = 0;
  MT_RETURN_IF_ERROR(mt::grid_stride_blocks(embedding_bw_kernel, kEwThreads, total, &resident, &grid));
  embedding_bw_kernel<<<grid, kEwThreads, 0, stream>>>(grad_weight, grad_out, ids, rows,
                                                       num_embeddings, dim);
  return mt_launch_status();
}

}  // extern "C"
