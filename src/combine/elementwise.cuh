// Elementwise kernels of combine.cu: map / map_scalar / zip / fill / copy over any layout with numpy
// broadcasting, and arange. Contiguous operands take a grid-stride path of four elements per access
// (one wave of resident blocks, four vector loads in flight per thread and operand); any other layout
// decomposes the flat output index over the output shape once and applies each operand's strides
// (stride 0 = broadcast). The output's storage type TO and the inputs' TI are float or bfloat16
// (mt::with_storage codes); the operation always computes in float.
#pragma once

#include <cuda_runtime.h>

#include "../includes/cuda_check.cuh"
#include "../includes/launch_utils.cuh"
#include "../includes/layout.cuh"
#include "../includes/storage.cuh"
#include "../includes/vec.cuh"

namespace {

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

// Elementwise kernels. NIN is the number of tensor inputs (0 for fill, 1 for map, 2 for zip).
// ------------------------------------------------------------------------------------------------
constexpr int kEwUnroll = 4;

template <int NIN, class TO, class TI, class F>
__global__ void __launch_bounds__(mt::kGridStrideThreads)
elementwise_contiguous_kernel(TO* out, const TI* a, const TI* b, long long n, F f) {
  const long long n4 = n >> 2;
  const long long stride = mt::grid_stride_step();
  const long long first = mt::grid_stride_first();
  const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);

  long long i = first;
  for (; i + (kEwUnroll - 1) * stride < n4; i += kEwUnroll * stride) {
    float4 x[kEwUnroll], y[kEwUnroll];
#pragma unroll
    for (int u = 0; u < kEwUnroll; ++u) {
      x[u] = NIN > 0 ? mt::load4(a + 4 * (i + u * stride)) : zero4;
      y[u] = NIN > 1 ? mt::load4(b + 4 * (i + u * stride)) : zero4;
    }
#pragma unroll
    for (int u = 0; u < kEwUnroll; ++u) mt::store4(out + 4 * (i + u * stride), mt::apply4(f, x[u], y[u]));
  }
  for (; i < n4; i += stride) {
    const float4 x = NIN > 0 ? mt::load4(a + 4 * i) : zero4;
    const float4 y = NIN > 1 ? mt::load4(b + 4 * i) : zero4;
    mt::store4(out + 4 * i, mt::apply4(f, x, y));
  }
  const long long tail = (n4 << 2) + first;  // the last n % 4 elements
  if (tail < n) {
    out[tail] = mt::from_float<TO>(f(NIN > 0 ? mt::to_float(a[tail]) : 0.f, NIN > 1 ? mt::to_float(b[tail]) : 0.f));
  }
}

// Strided operands, VEC elements per item: VEC 1 for any layouts; VEC 4 for operands whose
// innermost dim has unit stride and a multiple of 4 elements, their other strides multiples of 4 and
// their bases 16-byte aligned (a permuted copy of attention heads, a slice of packed q/k/v): one
// index decomposition and one 16-byte access per operand for every 4 elements.
template <int NIN, int VEC, class TO, class TI, class F>
__global__ void __launch_bounds__(mt::kGridStrideThreads)
elementwise_strided_kernel(TO* out, const MtLayout out_l, const TI* a, const MtLayout a_l,
                           const TI* b, const MtLayout b_l, int items, F f) {
  const long long stride = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < items; i += stride) {
    int oo, ao, bo;
    mt::layout_offsets<NIN + 1>(out_l, out_l, a_l, b_l, static_cast<int>(i) * VEC, &oo, &ao, &bo);
    if constexpr (VEC == 4) {
      const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 x = NIN > 0 ? mt::load4(a + ao) : zero4;
      const float4 y = NIN > 1 ? mt::load4(b + bo) : zero4;
      mt::store4(out + oo, mt::apply4(f, x, y));
    } else {
      out[oo] = mt::from_float<TO>(f(NIN > 0 ? mt::to_float(a[ao]) : 0.f, NIN > 1 ? mt::to_float(b[bo]) : 0.f));
    }
  }
}

// Whether an operand of layout l at p can be read or written four elements at a time (VEC 4 above).
template <class T>
bool vector4_layout(const T* p, const MtLayout& l) {
  if (l.ndim < 1 || !mt::is_aligned4(p)) return false;
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
template <int NIN, class TO, class TI, class F>
int launch_elementwise(TO* out, const MtLayout& out_l, const TI* a, const MtLayout& a_l,
                       const TI* b, const MtLayout& b_l, F f, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!mt::valid_layout(out_l) || !mt::valid_layout(a_l) || !mt::valid_layout(b_l));
  MT_RETURN_IF_INVALID(!mt::same_shape(out_l, a_l) || !mt::same_shape(out_l, b_l));
  const long long n = mt::layout_numel(out_l);
  MT_RETURN_IF_INVALID(n > mt::kMaxInt);
  if (n == 0) return 0;
  const bool contiguous = mt::layout_is_flat_contiguous(out_l) && mt::is_aligned4(out) &&
                          (NIN < 1 || (mt::layout_is_flat_contiguous(a_l) && mt::is_aligned4(a))) &&
                          (NIN < 2 || (mt::layout_is_flat_contiguous(b_l) && mt::is_aligned4(b)));
  if (contiguous) {
    return mt::launch_grid_stride<elementwise_contiguous_kernel<NIN, TO, TI, F>>((n + 3) / 4, stream, out, a, b,
                                                                                 n, f);
  }
  if (vector4_layout(out, out_l) && (NIN < 1 || vector4_layout(a, a_l)) && (NIN < 2 || vector4_layout(b, b_l))) {
    return mt::launch_grid_stride<elementwise_strided_kernel<NIN, 4, TO, TI, F>>(
        n / 4, stream, out, out_l, a, a_l, b, b_l, static_cast<int>(n / 4), f);
  }
  return mt::launch_grid_stride<elementwise_strided_kernel<NIN, 1, TO, TI, F>>(
      n, stream, out, out_l, a, a_l, b, b_l, static_cast<int>(n), f);
}

// f(TO*, TI*) -- null pointers of the two element types -- for the storage codes of an output and
// its inputs (mt::with_storage).
template <class F>
int with_formats(int out_format, int in_format, F f) {
  return mt::with_storage(out_format, [&](auto o) { return mt::with_storage(in_format, [&](auto i) { return f(o, i); }); });
}

__global__ void arange_kernel(float* out, int n) {
  const long long stride = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < n; i += stride) {
    out[i] = static_cast<float>(i);
  }
}

}  // namespace
