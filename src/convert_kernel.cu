// convert_kernel.cu: dtype conversions between float32, bfloat16 and float16, and copies of one
// dtype, over any layouts: the kernels behind minitorch's casts (Tensor.to(dtype)) and behind the
// copies of 16-bit tensors (contiguous(), copy_, cat, indexed writes).
//
// Dtype codes (exported by name, checked by minitorch/cuda/convert.py when it loads):
//   0 float32, 1 bfloat16, 2 float16.
// A conversion to a 16-bit float rounds to nearest, ties to even (__float2bfloat16_rn /
// __float2half_rn: NaN stays NaN, infinities stay infinite, finite values beyond the range become
// infinities); a widening conversion is exact; a copy of one dtype moves the bits unchanged.
//
// Thread mapping, grid-stride over one wave of resident blocks (launch_utils.cuh):
//   flat     both operands one contiguous run of the same length (the Python side merges dims),
//            16-byte aligned: each step of a thread converts a pack of 8 consecutive elements (two
//            float4 or one 16-byte word of 8 halves on each side), the last n % 8 one by one.
//   strided  any other layout (the source may broadcast: stride 0): one element per step, the flat
//            output index decomposed once over the shape and applied to both operands' strides.
//
// launch_convert follows cuda_check.cuh's contract: device pointers, layouts by value and a
// cudaStream_t in, an int cudaError_t out (cudaErrorInvalidValue for bad codes or layouts).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "includes/cuda_check.cuh"
#include "includes/launch_utils.cuh"
#include "includes/layout.cuh"
#include "includes/storage.cuh"
#include "includes/vec.cuh"

namespace {

constexpr int kPack = 8;
constexpr int kNumDtypes = 3;

template <class T>
struct alignas(16) Pack {
  T v[kPack];
};

using mt::from_float;
using mt::to_float;

// Through float32, which holds every value of the three formats exactly.
template <class Src, class Dst>
__device__ __forceinline__ Dst convert(Src x) {
  if constexpr (std::is_same_v<Src, Dst>) {
    return x;
  } else {
    return from_float<Dst>(to_float(x));
  }
}

template <class Src, class Dst>
__global__ void convert_flat_kernel(const Src* __restrict__ src, Dst* __restrict__ dst, long long n) {
  const long long packs = n / kPack;
  const long long first = mt::grid_stride_first(), step = mt::grid_stride_step();
  const Pack<Src>* in = reinterpret_cast<const Pack<Src>*>(src);
  Pack<Dst>* out = reinterpret_cast<Pack<Dst>*>(dst);
  for (long long p = first; p < packs; p += step) {
    const Pack<Src> a = in[p];
    Pack<Dst> b;
#pragma unroll
    for (int i = 0; i < kPack; ++i) b.v[i] = convert<Src, Dst>(a.v[i]);
    out[p] = b;
  }
  for (long long i = packs * kPack + first; i < n; i += step) dst[i] = convert<Src, Dst>(src[i]);
}

template <class Src, class Dst>
__global__ void convert_strided_kernel(const Src* __restrict__ src, const MtLayout src_l, Dst* __restrict__ dst,
                                       const MtLayout dst_l, int n) {
  const long long step = mt::grid_stride_step();
  for (long long i = mt::grid_stride_first(); i < n; i += step) {
    int d = 0, s = 0, unused = 0;
    mt::layout_offsets<2>(dst_l, dst_l, src_l, src_l, static_cast<int>(i), &d, &s, &unused);
    dst[d] = convert<Src, Dst>(src[s]);
  }
}

template <class Src, class Dst>
int launch_typed(const void* src, const MtLayout& src_l, void* dst, const MtLayout& dst_l, int n,
                 cudaStream_t stream) {
  const Src* s = static_cast<const Src*>(src);
  Dst* d = static_cast<Dst*>(dst);
  if (mt::layout_is_flat_contiguous(src_l) && mt::layout_is_flat_contiguous(dst_l) && mt::is_aligned16(src) &&
      mt::is_aligned16(dst)) {
    const long long work = (n + kPack - 1) / kPack;
    return mt::launch_grid_stride<convert_flat_kernel<Src, Dst>>(work, stream, s, d, static_cast<long long>(n));
  }
  return mt::launch_grid_stride<convert_strided_kernel<Src, Dst>>(n, stream, s, src_l, d, dst_l, n);
}

}  // namespace

extern "C" {

MT_DEFINE_ERROR_STRING()

int minitorch_convert_dtype_count(void) { return kNumDtypes; }

// Name (as minitorch's dtypes) of a dtype code; NULL when out of range.
const char* minitorch_convert_dtype_name(int code) {
  switch (code) {
    case 0:
      return "float32";
    case 1:
      return "bfloat16";
    case 2:
      return "float16";
    default:
      return nullptr;
  }
}

// dst = src converted from src_dtype to dst_dtype, element by element of dst_l; src_l has dst_l's
// shape (a broadcast source: stride 0). dst must not overlap src unless both are the same elements.
int launch_convert(const void* src, int src_dtype, MtLayout src_l, void* dst, int dst_dtype, MtLayout dst_l,
                   cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!mt::valid_layout(src_l) || !mt::valid_layout(dst_l) || !mt::same_shape(src_l, dst_l));
  const long long n = mt::layout_numel(dst_l);
  MT_RETURN_IF_INVALID(n > mt::kMaxInt);
  if (n == 0) return 0;
  return mt::with_float_format(src_dtype, [&](auto src_tag) {
    return mt::with_float_format(dst_dtype, [&](auto dst_tag) {
      using Src = typename decltype(src_tag)::type;
      using Dst = typename decltype(dst_tag)::type;
      return launch_typed<Src, Dst>(src, src_l, dst, dst_l, static_cast<int>(n), stream);
    });
  });
}

}  // extern "C"
