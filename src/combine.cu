// combine.cu: the elementwise and reduction kernels of minitorch's CUDA backend, and the scalar
// operations they apply, each in a header of src/combine/:
//   ops.cuh          the scalar operations and their opcode tables;
//   elementwise.cuh  map / map_scalar / zip / fill / copy over any layout, and arange;
//   reduction.cuh    reduce along one dim (sum, product, max, min; max and min propagate NaN).
//
// Every extern "C" launcher takes device pointers, layouts/sizes by value and a cudaStream_t, and
// returns an int cudaError_t (0 = success): cudaErrorInvalidValue for bad sizes, else the status of
// the launch. Opcodes are indices into UnaryOps / BinaryOps (combine/ops.cuh), exported by name so the
// Python binding can check that both sides agree. out_format / in_format are storage codes (0 float32,
// 1 bfloat16: mt::with_storage) of the output and of every input; the math is float32 throughout.
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "combine/elementwise.cuh"
#include "combine/ops.cuh"
#include "combine/reduction.cuh"
#include "includes/cuda_check.cuh"
#include "includes/device_info.cuh"
#include "includes/launch_utils.cuh"
#include "includes/layout.cuh"
#include "includes/reduce.cuh"

namespace {

// launch_reduce for one pair of storage types.
template <class TO, class TI>
int reduce_typed(int op, TO* out, const MtLayout& out_l, const TI* a, const MtLayout& outer, int reduce_len,
                 int reduce_stride, float start, float* workspace, long long workspace_len, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!mt::valid_layout(out_l) || !mt::valid_layout(outer) || !mt::same_shape(out_l, outer));
  MT_RETURN_IF_INVALID(reduce_len < 0);
  const long long n_out = mt::layout_numel(out_l);
  MT_RETURN_IF_INVALID(n_out > mt::kMaxInt);
  if (n_out == 0) return 0;
  int sms = 0;
  MT_RETURN_IF_ERROR(mt::sm_count(&sms));
  const int n = static_cast<int>(n_out);
  switch (op) {
    case BinaryOps::code<OpAdd>():
      return reduce_pass(mt::SumOp{}, out, out_l, a, outer, n, reduce_len, reduce_stride, 0.f, start,
                         workspace, workspace_len, true, sms, stream);
    case BinaryOps::code<OpMul>():
      return reduce_pass(mt::ProdOp{}, out, out_l, a, outer, n, reduce_len, reduce_stride, 1.f,
                         start, workspace, workspace_len, true, sms, stream);
    case BinaryOps::code<OpMax>():
      return reduce_pass(OpMax{}, out, out_l, a, outer, n, reduce_len, reduce_stride, -INFINITY,
                         start, workspace, workspace_len, true, sms, stream);
    case BinaryOps::code<OpMin>():
      return reduce_pass(OpMin{}, out, out_l, a, outer, n, reduce_len, reduce_stride, INFINITY,
                         start, workspace, workspace_len, true, sms, stream);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace

// ================================================================================================
// C ABI
// ================================================================================================
extern "C" {

MT_DEFINE_ERROR_STRING()

int minitorch_unary_op_count(void) { return UnaryOps::kCount; }
int minitorch_binary_op_count(void) { return BinaryOps::kCount; }

// Name (as in minitorch.operators) of an opcode; NULL when out of range.
const char* minitorch_unary_op_name(int op) { return UnaryOps::name(op); }
const char* minitorch_binary_op_name(int op) { return BinaryOps::name(op); }

// out = unary_op(a). out_l and a_l have the same shape (a broadcast: stride 0). op 0 (id) is the
// strided copy behind contiguous().
int launch_map(int op, int out_format, int in_format, void* out, MtLayout out_l, const void* a, MtLayout a_l,
               cudaStream_t stream) {
  return UnaryOps::dispatch(op, [&](auto functor) {
    return with_formats(out_format, in_format, [&](auto* o, auto* i) {
      using TI = std::remove_pointer_t<decltype(i)>;
      return launch_elementwise<1>(static_cast<decltype(o)>(out), out_l, static_cast<const TI*>(a), a_l,
                                   static_cast<const TI*>(nullptr), out_l, UnaryFn<decltype(functor)>{functor},
                                   stream);
    });
  });
}

// out = binary_op(a, s) with a scalar s.
int launch_map_scalar(int op, int out_format, int in_format, void* out, MtLayout out_l, const void* a,
                      MtLayout a_l, float s, cudaStream_t stream) {
  return BinaryOps::dispatch(op, [&](auto functor) {
    return with_formats(out_format, in_format, [&](auto* o, auto* i) {
      using TI = std::remove_pointer_t<decltype(i)>;
      return launch_elementwise<1>(static_cast<decltype(o)>(out), out_l, static_cast<const TI*>(a), a_l,
                                   static_cast<const TI*>(nullptr), out_l, ScalarFn<decltype(functor)>{functor, s},
                                   stream);
    });
  });
}

// out = binary_op(a, b); all three layouts have the output's shape (broadcast dims: stride 0).
int launch_zip(int op, int out_format, int in_format, void* out, MtLayout out_l, const void* a, MtLayout a_l,
               const void* b, MtLayout b_l, cudaStream_t stream) {
  return BinaryOps::dispatch(op, [&](auto functor) {
    return with_formats(out_format, in_format, [&](auto* o, auto* i) {
      using TI = std::remove_pointer_t<decltype(i)>;
      return launch_elementwise<2>(static_cast<decltype(o)>(out), out_l, static_cast<const TI*>(a), a_l,
                                   static_cast<const TI*>(b), b_l, functor, stream);
    });
  });
}

// Every element of the layout set to value.
int launch_fill(float* out, MtLayout out_l, float value, cudaStream_t stream) {
  return launch_elementwise<0>(out, out_l, static_cast<const float*>(nullptr), out_l, static_cast<const float*>(nullptr),
                               out_l, FillFn{value}, stream);
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
  // the most that either column kernel's plan needs (which one runs depends on the pointers' alignment too)
  const long long one = workspace_floats(plan_reduce(n_out, reduce_len, reduce_stride, sms, true, 1), n_out);
  const long long four = workspace_floats(plan_reduce(n_out, reduce_len, reduce_stride, sms, true, 4), n_out);
  return one > four ? one : four;
}

// out[o] = fold(op, start, a[outer(o) + r * reduce_stride] for r < reduce_len) for every output
// ordinal o of out_l (outer has the same shape as out_l). op: add, mul, max or min (binary opcodes).
// workspace: device scratch of reduce_workspace_floats(...) floats (may be NULL when that is 0).
int launch_reduce(int op, int out_format, int in_format, void* out, MtLayout out_l, const void* a,
                  MtLayout outer, int reduce_len, int reduce_stride, float start, float* workspace,
                  long long workspace_len, cudaStream_t stream) {
  return with_formats(out_format, in_format, [&](auto* o, auto* i) {
    using TI = std::remove_pointer_t<decltype(i)>;
    return reduce_typed(op, static_cast<decltype(o)>(out), out_l, static_cast<const TI*>(a), outer, reduce_len,
                        reduce_stride, start, workspace, workspace_len, stream);
  });
}

}  // extern "C"
