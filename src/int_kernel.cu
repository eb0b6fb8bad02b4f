// int_kernel.cu: the kernels of int64 tensors, and the index ops of int64 and float32 tensors.
//
//   elementwise  map / map_scalar / zip over any layouts with numpy broadcasting (stride 0) of int64
//                operands: int64 results, or float32 1.0/0.0 for the comparisons lt and eq (the
//                storage of minitorch.bool). Arithmetic wraps around on overflow, as PyTorch's does;
//                floordiv rounds toward negative infinity and remainder takes the divisor's sign
//                (Python's // and %); both give 0 for a zero divisor (the CPU backends refuse one).
//   fill, arange of int64 storage.
//   convert      int64 <-> float32 / bfloat16 / float16 (the codes of convert_kernel.cu): to int64 by
//                truncation toward zero (NaN and out-of-range values are undefined, as in PyTorch);
//                from int64 rounded to nearest float32, then to the 16-bit format.
//   reduce       sum, prod, max or min of int64 along one dim: one thread per output.
//   arg_reduce   int64 position of the first max or min along one dim of float32 or int64 values;
//                a NaN is the extreme (the first NaN wins): one thread per output.
//   cumsum       running sums along one dim of float32 (in order) or int64: one thread per row.
//   sort_rows    int64 positions of a stable sort along one dim of float32 or int64 values, NaN as
//                the largest: one block per row, a bitonic sort of (value, position) pairs in shared
//                memory (rows of up to kMaxSortRow elements); equal values keep their order because
//                the position breaks ties.
//   gather_rows  rows of an int64 table [V, C] picked by int64 ids (0 for an id outside [0, V)).
//
// Rows and outputs of the one-dim ops are addressed as in combine.cu's reduce: `outer` maps a row's
// ordinal to the storage offset of its first element, `stride` steps along the dim.
//
// Every extern "C" launcher takes device pointers, layouts/sizes by value and a cudaStream_t, and
// returns an int cudaError_t (0 = success; cudaErrorInvalidValue for bad sizes or codes).
#include <cuda_runtime.h>

#include <type_traits>

#include "includes/cuda_check.cuh"
#include "includes/storage.cuh"
#include "includes/launch_utils.cuh"
#include "includes/layout.cuh"
#include "includes/op_table.cuh"

namespace {

using i64 = long long;
using u64 = unsigned long long;

// ------------------------------------------------------------------------------------------------
// Scalar operations on int64 (wrapping arithmetic through unsigned, which has no overflow UB).
// ------------------------------------------------------------------------------------------------
__device__ __forceinline__ i64 wrap_neg(i64 x) { return static_cast<i64>(0ull - static_cast<u64>(x)); }

struct IntId {
  static constexpr const char* kName = "id";
  __device__ __forceinline__ i64 operator()(i64 x, i64) const { return x; }
};
struct IntNeg {
  static constexpr const char* kName = "neg";
  __device__ __forceinline__ i64 operator()(i64 x, i64) const { return wrap_neg(x); }
};
struct IntAbs {
  static constexpr const char* kName = "abs";
  __device__ __forceinline__ i64 operator()(i64 x, i64) const { return x < 0 ? wrap_neg(x) : x; }
};
struct IntAdd {
  static constexpr const char* kName = "add";
  __device__ __forceinline__ i64 operator()(i64 x, i64 y) const {
    return static_cast<i64>(static_cast<u64>(x) + static_cast<u64>(y));
  }
};
struct IntMul {
  static constexpr const char* kName = "mul";
  __device__ __forceinline__ i64 operator()(i64 x, i64 y) const {
    return static_cast<i64>(static_cast<u64>(x) * static_cast<u64>(y));
  }
};
struct IntMax {
  static constexpr const char* kName = "max";
  __device__ __forceinline__ i64 operator()(i64 x, i64 y) const { return x > y ? x : y; }
};
struct IntMin {
  static constexpr const char* kName = "min";
  __device__ __forceinline__ i64 operator()(i64 x, i64 y) const { return x < y ? x : y; }
};
struct IntFloorDiv {
  static constexpr const char* kName = "floordiv";
  __device__ __forceinline__ i64 operator()(i64 x, i64 y) const {
    if (y == 0) return 0;
    if (y == -1) return wrap_neg(x);  // INT64_MIN / -1 overflows in C++
    const i64 q = x / y;
    return (x % y != 0 && ((x < 0) != (y < 0))) ? q - 1 : q;
  }
};
struct IntRemainder {
  static constexpr const char* kName = "remainder";
  __device__ __forceinline__ i64 operator()(i64 x, i64 y) const {
    if (y == 0 || y == -1) return 0;
    const i64 r = x % y;
    return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
  }
};
struct IntLt {
  static constexpr const char* kName = "lt";
  __device__ __forceinline__ float operator()(i64 x, i64 y) const { return x < y ? 1.f : 0.f; }
};
struct IntEq {
  static constexpr const char* kName = "eq";
  __device__ __forceinline__ float operator()(i64 x, i64 y) const { return x == y ? 1.f : 0.f; }
};

// The opcode tables (an opcode is an operation's position), names checked by the binding.
using IntUnaryOps = mt::OpTable<IntId, IntNeg, IntAbs>;
using IntBinaryOps = mt::OpTable<IntAdd, IntMul, IntMax, IntMin, IntFloorDiv, IntRemainder, IntLt, IntEq>;

// ------------------------------------------------------------------------------------------------
// Elementwise: out[i] = f(a[i], b[i]) over the output's layout; NIN inputs (0: fill, 1: map with a
// scalar b, 2: zip). Out is int64 or float32 (the comparisons), decided by the functor's result.
// ------------------------------------------------------------------------------------------------
template <int NIN, class Out, class F>
__global__ void int_elementwise_kernel(Out* out, const MtLayout out_l, const i64* a, const MtLayout a_l,
                                       const i64* b, const MtLayout b_l, i64 scalar, int n, F f) {
  const long long step = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < n; i += step) {
    int oo = 0, ao = 0, bo = 0;
    mt::layout_offsets<NIN + 1>(out_l, out_l, a_l, b_l, static_cast<int>(i), &oo, &ao, &bo);
    out[oo] = f(NIN > 0 ? a[ao] : scalar, NIN > 1 ? b[bo] : scalar);
  }
}

template <int NIN, class F>
int launch_int_elementwise(void* out, const MtLayout& out_l, const i64* a, const MtLayout& a_l, const i64* b,
                           const MtLayout& b_l, i64 scalar, F f, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!mt::valid_layout(out_l) || !mt::valid_layout(a_l) || !mt::valid_layout(b_l));
  MT_RETURN_IF_INVALID(!mt::same_shape(out_l, a_l) || !mt::same_shape(out_l, b_l));
  const long long n = mt::layout_numel(out_l);
  MT_RETURN_IF_INVALID(n > mt::kMaxInt);
  if (n == 0) return 0;
  using Out = decltype(f(i64{}, i64{}));
  return mt::launch_grid_stride<int_elementwise_kernel<NIN, Out, F>>(n, stream, static_cast<Out*>(out), out_l, a,
                                                                      a_l, b, b_l, scalar, static_cast<int>(n), f);
}

__global__ void int_arange_kernel(i64* out, int n) {
  const long long step = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < n; i += step) out[i] = i;
}

// ------------------------------------------------------------------------------------------------
// Conversions between int64 and the float formats.
// ------------------------------------------------------------------------------------------------
// One element converted: a float to int64 truncated toward zero, an int64 to the nearest float32
// and then to the float format Dst.
template <class Dst, class Src>
__device__ __forceinline__ Dst convert(Src x) {
  if constexpr (std::is_same_v<Dst, i64>) {
    return __float2ll_rz(mt::to_float(x));
  } else {
    return mt::from_float<Dst>(__ll2float_rn(x));
  }
}

template <class Src, class Dst>
__global__ void int64_convert_kernel(Dst* dst, const MtLayout dst_l, const Src* src, const MtLayout src_l, int n) {
  const long long step = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < n; i += step) {
    int d = 0, s = 0, unused = 0;
    mt::layout_offsets<2>(dst_l, dst_l, src_l, src_l, static_cast<int>(i), &d, &s, &unused);
    dst[d] = convert<Dst>(src[s]);
  }
}

// ------------------------------------------------------------------------------------------------
// One-dim ops: one thread per output (reduce, arg_reduce) or per row (cumsum).
// ------------------------------------------------------------------------------------------------
template <class Op>
__global__ void int_reduce_kernel(i64* out, const MtLayout out_l, const i64* a, const MtLayout outer, int n_out,
                                  int len, int stride, i64 start, Op op) {
  const long long step = mt::grid_stride_step();
  for (long long o = mt::grid_stride_first(); o < n_out; o += step) {
    const i64* p = a + mt::layout_offset(outer, static_cast<int>(o));
    i64 acc = start;
    for (int j = 0; j < len; ++j) acc = op(acc, p[static_cast<long long>(j) * stride]);
    out[mt::layout_offset(out_l, static_cast<int>(o))] = acc;
  }
}

__device__ __forceinline__ bool is_nan(float x) { return x != x; }
__device__ __forceinline__ bool is_nan(i64) { return false; }

template <class T>
__global__ void arg_reduce_kernel(i64* out, const MtLayout out_l, const T* a, const MtLayout outer, int n_out,
                                  int len, int stride, bool largest) {
  const long long step = mt::grid_stride_step();
  for (long long o = mt::grid_stride_first(); o < n_out; o += step) {
    const T* p = a + mt::layout_offset(outer, static_cast<int>(o));
    T best = p[0];
    int at = 0;
    for (int j = 1; j < len && !is_nan(best); ++j) {
      const T v = p[static_cast<long long>(j) * stride];
      if (is_nan(v) || (largest ? v > best : v < best)) {
        best = v;
        at = j;
      }
    }
    out[mt::layout_offset(out_l, static_cast<int>(o))] = at;
  }
}

// The running sum's step: float32 adds in order; int64 wraps around.
__device__ __forceinline__ float accumulate(float acc, float v) { return acc + v; }
__device__ __forceinline__ i64 accumulate(i64 acc, i64 v) { return IntAdd{}(acc, v); }

template <class T>
__global__ void cumsum_kernel(T* out, const MtLayout out_outer, int out_stride, const T* a, const MtLayout outer,
                              int rows, int len, int stride) {
  const long long step = mt::grid_stride_step();
  for (long long r = mt::grid_stride_first(); r < rows; r += step) {
    const T* p = a + mt::layout_offset(outer, static_cast<int>(r));
    T* q = out + mt::layout_offset(out_outer, static_cast<int>(r));
    T acc = p[0];
    q[0] = acc;
    for (int j = 1; j < len; ++j) {
      acc = accumulate(acc, p[static_cast<long long>(j) * stride]);
      q[static_cast<long long>(j) * out_stride] = acc;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// sort_rows: block r sorts row r; shared memory holds the row's values and positions, padded to a
// power of two with positions >= len, which sort last.
// ------------------------------------------------------------------------------------------------
constexpr int kMaxSortRow = 4096;
constexpr int kSortThreads = 512;

// Whether (a, ia) comes before (b, ib): padding last, then NaN as the largest value, then the
// values, then the positions (which makes the order total, so the sort is stable).
template <class T>
__device__ __forceinline__ bool sorts_before(T a, int ia, T b, int ib, int len, bool descending) {
  if (ia >= len || ib >= len) return ib >= len && ia < len;
  const bool an = is_nan(a), bn = is_nan(b);
  if (an || bn) return an && bn ? ia < ib : (descending ? an : bn);
  if (a != b) return descending ? a > b : a < b;
  return ia < ib;
}

template <class T>
__global__ void __launch_bounds__(kSortThreads)
sort_rows_kernel(i64* out, const MtLayout out_outer, int out_stride, const T* a, const MtLayout outer, int len,
                 int stride, int padded, bool descending) {
  extern __shared__ __align__(16) unsigned char sort_shared[];
  T* keys = reinterpret_cast<T*>(sort_shared);
  int* pos = reinterpret_cast<int*>(keys + padded);
  const T* p = a + mt::layout_offset(outer, blockIdx.x);
  for (int i = threadIdx.x; i < padded; i += blockDim.x) {
    keys[i] = i < len ? p[static_cast<long long>(i) * stride] : T{};
    pos[i] = i;
  }
  __syncthreads();
  for (int k = 2; k <= padded; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < padded; i += blockDim.x) {
        const int partner = i ^ j;
        if (partner > i) {
          const bool ascending_pair = (i & k) == 0;
          const bool swap = ascending_pair
                                ? sorts_before(keys[partner], pos[partner], keys[i], pos[i], len, descending)
                                : sorts_before(keys[i], pos[i], keys[partner], pos[partner], len, descending);
          if (swap) {
            const T tk = keys[i];
            keys[i] = keys[partner];
            keys[partner] = tk;
            const int tp = pos[i];
            pos[i] = pos[partner];
            pos[partner] = tp;
          }
        }
      }
      __syncthreads();
    }
  }
  i64* q = out + mt::layout_offset(out_outer, blockIdx.x);
  for (int i = threadIdx.x; i < len; i += blockDim.x) q[static_cast<long long>(i) * out_stride] = pos[i];
}

__global__ void int_gather_rows_kernel(i64* out, const i64* table, const i64* ids, int n, int rows, int cols) {
  const long long step = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < static_cast<long long>(n) * cols; i += step) {
    const i64 id = ids[i / cols];
    out[i] = (id >= 0 && id < rows) ? table[id * cols + i % cols] : 0;
  }
}

// f(Tag<T>{}) for the value type of a one-dim op: 0 float32, 3 int64 (convert_kernel.cu's codes).
template <class F>
int with_value_dtype(int code, F f) {
  switch (code) {
    case 0:
      return f(mt::Tag<float>{});
    case 3:
      return f(mt::Tag<i64>{});
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

bool valid_rows(const MtLayout& a, const MtLayout& b) {
  return mt::valid_layout(a) && mt::valid_layout(b) && mt::same_shape(a, b) && mt::layout_numel(a) <= mt::kMaxInt;
}

}  // namespace

// ================================================================================================
// C ABI
// ================================================================================================
extern "C" {

MT_DEFINE_ERROR_STRING()

int minitorch_int_unary_op_count(void) { return IntUnaryOps::kCount; }
int minitorch_int_binary_op_count(void) { return IntBinaryOps::kCount; }
int minitorch_int_max_sort_row(void) { return kMaxSortRow; }

const char* minitorch_int_unary_op_name(int op) { return IntUnaryOps::name(op); }
const char* minitorch_int_binary_op_name(int op) { return IntBinaryOps::name(op); }

// out = unary_op(a); out_l and a_l have the same shape (a broadcast: stride 0).
int launch_int_map(int op, i64* out, MtLayout out_l, const i64* a, MtLayout a_l, cudaStream_t stream) {
  return IntUnaryOps::dispatch(op, [&](auto f) { return launch_int_elementwise<1>(out, out_l, a, a_l, a, a_l, 0, f, stream); });
}

// out = binary_op(a, s) for an int64 scalar s; out is float32 for lt and eq, else int64.
int launch_int_map_scalar(int op, void* out, MtLayout out_l, const i64* a, MtLayout a_l, i64 s, cudaStream_t stream) {
  return IntBinaryOps::dispatch(op, [&](auto f) { return launch_int_elementwise<1>(out, out_l, a, a_l, a, a_l, s, f, stream); });
}

// out = binary_op(a, b); all three layouts have the output's shape (broadcast dims: stride 0).
int launch_int_zip(int op, void* out, MtLayout out_l, const i64* a, MtLayout a_l, const i64* b, MtLayout b_l,
                   cudaStream_t stream) {
  return IntBinaryOps::dispatch(op, [&](auto f) { return launch_int_elementwise<2>(out, out_l, a, a_l, b, b_l, 0, f, stream); });
}

// Every element of the layout set to value.
int launch_int_fill(i64* out, MtLayout out_l, i64 value, cudaStream_t stream) {
  return launch_int_elementwise<0>(out, out_l, nullptr, out_l, nullptr, out_l, value, IntId{}, stream);
}

// out[i] = i for i < n (contiguous).
int launch_int_arange(i64* out, int n, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(n < 0);
  if (n == 0) return 0;
  return mt::launch_grid_stride<int_arange_kernel>(n, stream, out, n);
}

// dst (int64) = src (float dtype code 0/1/2) truncated toward zero, element by element of dst_l.
int launch_to_int64(i64* dst, MtLayout dst_l, const void* src, int src_dtype, MtLayout src_l, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!valid_rows(dst_l, src_l));
  const int n = static_cast<int>(mt::layout_numel(dst_l));
  if (n == 0) return 0;
  return mt::with_float_format(src_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return mt::launch_grid_stride<int64_convert_kernel<T, i64>>(n, stream, dst, dst_l, static_cast<const T*>(src), src_l, n);
  });
}

// dst (float dtype code 0/1/2) = src (int64) rounded, element by element of dst_l.
int launch_from_int64(void* dst, int dst_dtype, MtLayout dst_l, const i64* src, MtLayout src_l, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!valid_rows(dst_l, src_l));
  const int n = static_cast<int>(mt::layout_numel(dst_l));
  if (n == 0) return 0;
  return mt::with_float_format(dst_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return mt::launch_grid_stride<int64_convert_kernel<i64, T>>(n, stream, static_cast<T*>(dst), dst_l, src, src_l, n);
  });
}

// out[o] = fold(op, start, a[outer(o) + j * stride] for j < len); op: add, mul, max or min (binary codes 0-3).
int launch_int_reduce(int op, i64* out, MtLayout out_l, const i64* a, MtLayout outer, int len, int stride, i64 start,
                      cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!valid_rows(out_l, outer) || len < 0);
  const int n_out = static_cast<int>(mt::layout_numel(out_l));
  if (n_out == 0) return 0;
  auto launch = [&](auto f) {
    return mt::launch_grid_stride<int_reduce_kernel<decltype(f)>>(n_out, stream, out, out_l, a, outer, n_out, len,
                                                                  stride, start, f);
  };
  switch (op) {
    case IntBinaryOps::code<IntAdd>():
      return launch(IntAdd{});
    case IntBinaryOps::code<IntMul>():
      return launch(IntMul{});
    case IntBinaryOps::code<IntMax>():
      return launch(IntMax{});
    case IntBinaryOps::code<IntMin>():
      return launch(IntMin{});
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

// out[o] (int64) = position of the first largest (or smallest) a[outer(o) + j * stride], j < len (>= 1);
// a of value dtype 0 (float32) or 3 (int64).
int launch_arg_reduce(i64* out, MtLayout out_l, const void* a, int dtype, MtLayout outer, int len, int stride,
                      int largest, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!valid_rows(out_l, outer) || len < 1);
  const int n_out = static_cast<int>(mt::layout_numel(out_l));
  if (n_out == 0) return 0;
  return with_value_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return mt::launch_grid_stride<arg_reduce_kernel<T>>(n_out, stream, out, out_l, static_cast<const T*>(a), outer,
                                                        n_out, len, stride, largest != 0);
  });
}

// Running sums along a dim: row r of a at outer(r) + j * stride, of out at out_outer(r) + j * out_stride.
int launch_cumsum(void* out, MtLayout out_outer, int out_stride, const void* a, int dtype, MtLayout outer, int len,
                  int stride, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!valid_rows(out_outer, outer) || len < 0);
  const int rows = static_cast<int>(mt::layout_numel(outer));
  if (rows == 0 || len == 0) return 0;
  return with_value_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return mt::launch_grid_stride<cumsum_kernel<T>>(rows, stream, static_cast<T*>(out), out_outer, out_stride,
                                                    static_cast<const T*>(a), outer, rows, len, stride);
  });
}

// out (int64) row r, at out_outer(r) + j * out_stride: the positions of a stable sort of row r of a
// (outer(r) + j * stride, j < len <= kMaxSortRow), ascending or descending, NaN the largest.
int launch_sort_rows(i64* out, MtLayout out_outer, int out_stride, const void* a, int dtype, MtLayout outer, int len,
                     int stride, int descending, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!valid_rows(out_outer, outer) || len < 0 || len > kMaxSortRow);
  const long long rows = mt::layout_numel(outer);
  if (rows == 0 || len == 0) return 0;
  int padded = 1;
  while (padded < len) padded <<= 1;
  return with_value_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const size_t shared = static_cast<size_t>(padded) * (sizeof(T) + sizeof(int));
    sort_rows_kernel<T><<<static_cast<unsigned>(rows), kSortThreads, shared, stream>>>(
        out, out_outer, out_stride, static_cast<const T*>(a), outer, len, stride, padded, descending != 0);
    return mt_launch_status();
  });
}

// out [n, cols] = rows of table [rows, cols] (contiguous, int64) at ids [n] (int64); 0 outside [0, rows).
int launch_int_gather_rows(i64* out, const i64* table, const i64* ids, int n, int rows, int cols,
                           cudaStream_t stream) {
  MT_RETURN_IF_INVALID(n < 0 || rows < 0 || cols < 0 || static_cast<long long>(n) * cols > mt::kMaxInt);
  if (static_cast<long long>(n) * cols == 0) return 0;
  return mt::launch_grid_stride<int_gather_rows_kernel>(static_cast<long long>(n) * cols, stream, out, table, ids, n,
                                                        rows, cols);
}

}  // extern "C"
