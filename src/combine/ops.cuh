// The scalar operations that combine.cu's kernels apply, with the same meaning as the functions of
// minitorch/operators.py, and their opcode tables: an opcode is an operation's index in UnaryOps or
// BinaryOps, and its kName the name in minitorch.operators (the binding checks both sides agree).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "../includes/op_table.cuh"

namespace {

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

struct OpId {
  static constexpr const char* kName = "id";
  __device__ __forceinline__ float operator()(float x) const { return x; }
};
struct OpNeg {
  static constexpr const char* kName = "neg";
  __device__ __forceinline__ float operator()(float x) const { return -x; }
};
struct OpSigmoid {
  static constexpr const char* kName = "sigmoid";
  // Two branches so that exp never overflows.
  __device__ __forceinline__ float operator()(float x) const {
    if (x >= 0.f) return 1.f / (1.f + expf(-x));
    const float e = expf(x);
    return e / (1.f + e);
  }
};
struct OpRelu {
  static constexpr const char* kName = "relu";
  __device__ __forceinline__ float operator()(float x) const { return x > 0.f ? x : 0.f; }
};
struct OpLog {
  static constexpr const char* kName = "log";
  __device__ __forceinline__ float operator()(float x) const { return logf(x); }
};
struct OpExp {
  static constexpr const char* kName = "exp";
  __device__ __forceinline__ float operator()(float x) const { return expf(x); }
};
struct OpInv {
  static constexpr const char* kName = "inv";
  __device__ __forceinline__ float operator()(float x) const { return 1.f / x; }
};
struct OpTanh {
  static constexpr const char* kName = "tanh";
  __device__ __forceinline__ float operator()(float x) const { return tanhf(x); }
};
struct OpGelu {
  static constexpr const char* kName = "gelu";
  __device__ __forceinline__ float operator()(float x) const {
    return 0.5f * x * (1.f + tanhf(kGeluC * (x + kGeluA * x * x * x)));
  }
};

struct OpAbs {
  static constexpr const char* kName = "abs";
  __device__ __forceinline__ float operator()(float x) const { return fabsf(x); }
};
struct OpSqrt {
  static constexpr const char* kName = "sqrt";
  __device__ __forceinline__ float operator()(float x) const { return sqrtf(x); }
};
struct OpSin {
  static constexpr const char* kName = "sin";
  __device__ __forceinline__ float operator()(float x) const { return sinf(x); }
};
struct OpCos {
  static constexpr const char* kName = "cos";
  __device__ __forceinline__ float operator()(float x) const { return cosf(x); }
};
struct OpFloor {
  static constexpr const char* kName = "floor";
  __device__ __forceinline__ float operator()(float x) const { return floorf(x); }
};
constexpr float kSqrtHalf = 0.7071067811865476f;   // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1 / sqrt(2 pi)
struct OpGeluErf {
  static constexpr const char* kName = "gelu_erf";
  __device__ __forceinline__ float operator()(float x) const { return 0.5f * x * (1.f + erff(x * kSqrtHalf)); }
};

struct OpAdd {
  static constexpr const char* kName = "add";
  __device__ __forceinline__ float operator()(float x, float y) const { return x + y; }
};
struct OpMul {
  static constexpr const char* kName = "mul";
  __device__ __forceinline__ float operator()(float x, float y) const { return x * y; }
};
struct OpLt {
  static constexpr const char* kName = "lt";
  __device__ __forceinline__ float operator()(float x, float y) const { return x < y ? 1.f : 0.f; }
};
struct OpEq {
  static constexpr const char* kName = "eq";
  __device__ __forceinline__ float operator()(float x, float y) const { return x == y ? 1.f : 0.f; }
};
struct OpIsClose {
  static constexpr const char* kName = "is_close";
  __device__ __forceinline__ float operator()(float x, float y) const {
    return fabsf(x - y) < 1e-2f ? 1.f : 0.f;
  }
};
// operators.max / min: NaN when either operand is NaN (as torch.max), unlike fmaxf; also the
// combining operations of reduce's max and min.
struct OpMax {
  static constexpr const char* kName = "max";
  __device__ __forceinline__ float operator()(float x, float y) const { return (x > y || x != x) ? x : y; }
};
struct OpMin {
  static constexpr const char* kName = "min";
  __device__ __forceinline__ float operator()(float x, float y) const { return (x < y || x != x) ? x : y; }
};
struct OpDiv {
  static constexpr const char* kName = "div";
  __device__ __forceinline__ float operator()(float x, float y) const { return x / y; }
};
struct OpPow {
  static constexpr const char* kName = "pow";
  // operators.pow: nan for a negative base with a fractional exponent, +inf for 0 ** negative
  // (powf would give -inf for -0 ** odd negative integers).
  __device__ __forceinline__ float operator()(float x, float y) const {
    if (x == 0.f && y < 0.f) return INFINITY;
    return powf(x, y);
  }
};
struct OpReluBack {
  static constexpr const char* kName = "relu_back";
  __device__ __forceinline__ float operator()(float x, float d) const { return x > 0.f ? d : 0.f; }
};
struct OpLogBack {
  static constexpr const char* kName = "log_back";
  __device__ __forceinline__ float operator()(float x, float d) const { return d / x; }
};
struct OpInvBack {
  static constexpr const char* kName = "inv_back";
  __device__ __forceinline__ float operator()(float x, float d) const { return -d / (x * x); }
};
struct OpSigmoidBack {
  static constexpr const char* kName = "sigmoid_back";
  __device__ __forceinline__ float operator()(float y, float d) const { return d * y * (1.f - y); }
};
struct OpTanhBack {
  static constexpr const char* kName = "tanh_back";
  __device__ __forceinline__ float operator()(float y, float d) const { return d * (1.f - y * y); }
};
struct OpGeluErfBack {
  static constexpr const char* kName = "gelu_erf_back";
  __device__ __forceinline__ float operator()(float x, float d) const {
    return d * (0.5f * (1.f + erff(x * kSqrtHalf)) + x * expf(-0.5f * x * x) * kInvSqrt2Pi);
  }
};
struct OpGeluBack {
  static constexpr const char* kName = "gelu_back";
  __device__ __forceinline__ float operator()(float x, float d) const {
    const float t = tanhf(kGeluC * (x + kGeluA * x * x * x));
    const float dinner = kGeluC * (1.f + 3.f * kGeluA * x * x);
    return d * (0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * dinner);
  }
};

using UnaryOps = mt::OpTable<OpId, OpNeg, OpSigmoid, OpRelu, OpLog, OpExp, OpInv, OpTanh, OpGelu, OpAbs, OpSqrt, OpSin,
                              OpCos, OpFloor, OpGeluErf>;
using BinaryOps = mt::OpTable<OpAdd, OpMul, OpLt, OpEq, OpIsClose, OpMax, OpPow, OpReluBack, OpLogBack, OpInvBack,
                              OpSigmoidBack, OpTanhBack, OpGeluBack, OpMin, OpDiv, OpGeluErfBack>;

}  // namespace
