// Warp- and block-level all-reductions, generic over the combining operation.
//
// Usage (any kernel):
//   float s = mt::warp_allreduce(x, mt::SumOp{});            // every lane gets the warp's sum
//   float m = mt::warp_allreduce<16>(x, mt::MaxOp{});        // independent groups of 16 lanes
//   __shared__ float scratch[32];
//   float t = mt::block_allreduce(x, mt::SumOp{}, 0.f, scratch);  // every thread gets the block's sum
//   float2 p = mt::warp_allreduce(make_float2(a, b), mt::SumOp{}); // two sums in one pass
//
// An Op is a functor with `__device__ T operator()(T, T) const`, associative and commutative.
// SumOp and MaxOp also work on float2 (component-wise), which lets a kernel reduce two quantities
// (e.g. sum and sum of squares) with one chain of shuffles; any struct of floats shuffles too, so an
// Op over such a struct (a merge of statistics) reduces it the same way.
#pragma once

#include <cuda_runtime.h>

#include <cstring>

namespace mt {

constexpr unsigned kFullWarpMask = 0xffffffffu;

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  __device__ __forceinline__ float2 operator()(float2 a, float2 b) const {
    return make_float2(a.x + b.x, a.y + b.y);
  }
};

// Same selection rule as minitorch.operators.max (x if x > y else y).
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a > b ? a : b; }
  __device__ __forceinline__ float2 operator()(float2 a, float2 b) const {
    return make_float2(a.x > b.x ? a.x : b.x, a.y > b.y ? a.y : b.y);
  }
};

struct ProdOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a * b; }
};

__device__ __forceinline__ float shfl_xor(float v, int lane_mask, int width) {
  return __shfl_xor_sync(kFullWarpMask, v, lane_mask, width);
}

// Any other value made of floats (float2, a struct of statistics such as (max, sum of exp)), float by
// float: a reduction over such a struct needs no shuffle of its own.
template <class T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask, int width) {
  constexpr int kWords = sizeof(T) / sizeof(float);
  static_assert(sizeof(T) == kWords * sizeof(float), "a value made of floats");
  float words[kWords];
  memcpy(words, &v, sizeof(T));
#pragma unroll
  for (int i = 0; i < kWords; ++i) words[i] = __shfl_xor_sync(kFullWarpMask, words[i], lane_mask, width);
  memcpy(&v, words, sizeof(T));
  return v;
}

// Butterfly all-reduce inside aligned groups of WIDTH lanes (WIDTH a power of two, at most 32).
// All 32 lanes of the warp must call it (the shuffles use the full mask).
template <int WIDTH = 32, class T, class Op>
__device__ __forceinline__ T warp_allreduce(T v, Op op) {
  static_assert(WIDTH >= 1 && WIDTH <= 32 && (WIDTH & (WIDTH - 1)) == 0,
                "WIDTH must be a power of two no larger than a warp");
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2) {
    v = op(v, shfl_xor(v, offset, WIDTH));
  }
  return v;
}

// All-reduce over a 1-D block whose blockDim.x is a multiple of 32 (at most 1024). `identity` is the
// neutral element of op; `scratch` is caller-provided __shared__ storage of at least 32 T. Every
// thread of the block must call it. It ends with a barrier, so scratch may be reused at once.
template <class T, class Op>
__device__ __forceinline__ T block_allreduce(T v, Op op, T identity, T* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  v = warp_allreduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < num_warps ? scratch[lane] : identity;
  v = warp_allreduce(v, op);
  __syncthreads();
  return v;
}

}  // namespace mt
