// float32 matrix products on the tensor cores (sm_80+) at float32 accuracy, the "3xTF32" scheme:
// each operand x is split into hi = x rounded to TF32 (10 mantissa bits) and lo = x - hi, and
//   a b ~= a_hi b_hi + a_hi b_lo + a_lo b_hi
// three mma.sync.m16n8k8 TF32 products with float32 accumulation. The dropped a_lo b_lo stays below
// 2^-22 of |a b| and the tensor core's truncation of each lo to TF32 below 2^-21. The split is three
// instructions (an add, a mask and a subtraction), which matters: kernels split every fragment they load.
// (matmul/tma_kernel.cuh's B operand takes the truncated split instead, hi = the top 19 bits, |lo| <= 2^-10 |b|:
// its bounds are twice these.)
//
// Fragments of mma.m16n8k8 (PTX ISA), with g = lane / 4 and t = lane % 4:
//   A (16 x 8, row-major):  a0 = A[g][t], a1 = A[g + 8][t], a2 = A[g][t + 4], a3 = A[g + 8][t + 4];
//   B (8 x 8, k x n):       b0 = B[t][g], b1 = B[t + 4][g];
//   C (16 x 8):             c0 = C[g][2t], c1 = C[g][2t + 1], c2 = C[g + 8][2t], c3 = C[g + 8][2t + 1].
// The k index of A and B may be permuted as long as both use the same permutation. Mapping k = t to
// column 2t and k = t + 4 to column 2t + 1 turns a C fragment into an A fragment in registers:
// (a0, a1, a2, a3) = (c0, c2, c1, c3). Kernels use that to multiply a product they just computed.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace mt {

struct Tf32Pair {
  uint32_t hi;
  uint32_t lo;
};

__device__ __forceinline__ Tf32Pair split_tf32(float x) {
  // hi is x rounded to the nearest TF32 (sign, exponent, 10 mantissa bits), so |lo| <= 2^-11 |x|
  // (truncation would leave 2^-10, doubling the dropped lo*lo term and lo's own truncation in the
  // tensor core); x - hi is exact. Only the largest finite floats (above 2^128 (1 - 2^-12)) round
  // to infinity.
  const uint32_t hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  return {hi, __float_as_uint(x - __uint_as_float(hi))};
}

// An A fragment (4 registers) or a B fragment (2 registers), split.
template <int N>
struct Tf32Frag {
  uint32_t hi[N];
  uint32_t lo[N];

  __device__ __forceinline__ void set(int i, float x) {
    const Tf32Pair s = split_tf32(x);
    hi[i] = s.hi;
    lo[i] = s.lo;
  }
};

__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// c += a b at float32 accuracy (small terms first).
__device__ __forceinline__ void mma_3xtf32(float (&c)[4], const Tf32Frag<4>& a, const Tf32Frag<2>& b) {
  mma_tf32(c, a.lo, b.hi);
  mma_tf32(c, a.hi, b.lo);
  mma_tf32(c, a.hi, b.hi);
}

// The float32 matmul precisions (minitorch.set_float32_matmul_precision): "highest" is the 3xTF32
// scheme above, "high" one TF32 product of the operands rounded to nearest (as cuBLAS's TF32).
enum Precision { kHighest = 0, kHigh = 1 };

// Word of a TF32 operand rounded to nearest (ties away from zero): the tensor core reads only the top
// 19 bits, so adding half of the dropped part's range rounds instead of truncating.
__device__ __forceinline__ uint32_t round_tf32(float x) { return __float_as_uint(x) + 0x1000u; }

// Operand word i of a fragment: hi and lo ("highest"), or the rounded word in hi ("high").
template <int PREC, int N>
__device__ __forceinline__ void set_operand(Tf32Frag<N>& f, int i, float x) {
  if constexpr (PREC == kHighest) {
    f.set(i, x);
  } else {
    f.hi[i] = round_tf32(x);
  }
}

// c += a b at precision PREC, from fragments made by set_operand<PREC>.
template <int PREC>
__device__ __forceinline__ void mma_prec(float (&c)[4], const Tf32Frag<4>& a, const Tf32Frag<2>& b) {
  if constexpr (PREC == kHighest) {
    mma_3xtf32(c, a, b);
  } else {
    mma_tf32(c, a.hi, b.hi);
  }
}

}  // namespace mt
