// A tensor layout passed to kernels by value: shape and strides (in elements) of up to 8 dims,
// outermost dim first, the same convention as minitorch.tensor_data (no storage offset).
//
// Elementwise kernels give every operand a layout with the *output's* shape; an input that is
// broadcast along a dim has stride 0 there. The Python side merges dims that are contiguous in all
// operands and drops size-1 dims first, so most layouts reaching a kernel have 1-3 dims.
#pragma once

#include <cuda_runtime.h>

#define MT_MAX_DIMS 8

extern "C" {
typedef struct {
  int ndim;
  int shape[MT_MAX_DIMS];
  int strides[MT_MAX_DIMS];
} MtLayout;
}

namespace mt {

// Storage offset of the `flat`-th element (row-major order over layout.shape). The loop is unrolled
// over the maximum rank so the shape/stride arrays are indexed with constants and stay in the kernel
// parameter bank instead of being copied to local memory.
__device__ __forceinline__ int layout_offset(const MtLayout& layout, int flat) {
  int offset = 0;
#pragma unroll
  for (int d = MT_MAX_DIMS - 1; d >= 0; --d) {
    if (d < layout.ndim) {
      const int size = layout.shape[d];
      const int q = flat / size;
      offset += (flat - q * size) * layout.strides[d];
      flat = q;
    }
  }
  return offset;
}

// Offsets of the `flat`-th element of `shape_layout.shape` in up to three operands that share that
// shape (their own strides), with one index decomposition.
template <int NUM_OPERANDS>
__device__ __forceinline__ void layout_offsets(const MtLayout& shape_layout, const MtLayout& l0,
                                               const MtLayout& l1, const MtLayout& l2, int flat,
                                               int* o0, int* o1, int* o2) {
  int a = 0, b = 0, c = 0;
#pragma unroll
  for (int d = MT_MAX_DIMS - 1; d >= 0; --d) {
    if (d < shape_layout.ndim) {
      const int size = shape_layout.shape[d];
      const int q = flat / size;
      const int idx = flat - q * size;
      a += idx * l0.strides[d];
      if (NUM_OPERANDS > 1) b += idx * l1.strides[d];
      if (NUM_OPERANDS > 2) c += idx * l2.strides[d];
      flat = q;
    }
  }
  *o0 = a;
  *o1 = b;
  *o2 = c;
}

__host__ __device__ inline long long layout_numel(const MtLayout& layout) {
  long long n = 1;
  for (int d = 0; d < layout.ndim; ++d) n *= layout.shape[d];
  return n;
}

// Whether at most one dim of the layout has a size other than 1 (a batch the TMA paths can address);
// *dim is that dim, or -1 when there is none.
__host__ __device__ inline bool at_most_one_dim(const MtLayout& layout, int* dim) {
  *dim = -1;
  for (int d = 0; d < layout.ndim; ++d) {
    if (layout.shape[d] == 1) continue;
    if (*dim >= 0) return false;
    *dim = d;
  }
  return true;
}

// True when the layout is a single run of consecutive elements (what the Python side produces for
// a contiguous tensor after merging dims).
__host__ __device__ inline bool layout_is_flat_contiguous(const MtLayout& layout) {
  return layout.ndim == 1 && layout.strides[0] == 1;
}

}  // namespace mt
