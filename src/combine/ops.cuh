// The scalar operations that combine.cu's kernels apply, with the same meaning as the functions of
// minitorch/operators.py, and their opcode tables: an opcode is an operation's index in UnaryOps or
// BinaryOps, and its kName the name in minitorch.operators (the binding checks both sides agree).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

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
struct OpMax {
  static constexpr const char* kName = "max";
  __device__ __forceinline__ float operator()(float x, float y) const { return x > y ? x : y; }
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
struct OpGeluBack {
  static constexpr const char* kName = "gelu_back";
  __device__ __forceinline__ float operator()(float x, float d) const {
    const float t = tanhf(kGeluC * (x + kGeluA * x * x * x));
    const float dinner = kGeluC * (1.f + 3.f * kGeluA * x * x);
    return d * (0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * dinner);
  }
};

// The operations of one table, in opcode order.
template <class... Ops>
struct OpTable {
  static constexpr int kCount = sizeof...(Ops);

  // launch(Op{}) for the operation Op of opcode op; cudaErrorInvalidValue when there is none.
  template <class Launch>
  static int dispatch(int op, Launch&& launch) {
    int status = static_cast<int>(cudaErrorInvalidValue);
    int code = 0;
    // Walks the operations in order and stops at the one whose position is op.
    (void)((code++ == op ? (status = launch(Ops{}), true) : false) || ...);
    return status;
  }

  // The name of opcode op, nullptr when out of range.
  static const char* name(int op) {
    constexpr const char* kNames[] = {Ops::kName...};
    return op >= 0 && op < kCount ? kNames[op] : nullptr;
  }

  // The opcode of Op.
  template <class Op>
  static constexpr int code() {
    constexpr bool kIs[] = {std::is_same_v<Op, Ops>...};
    for (int i = 0; i < kCount; ++i) {
      if (kIs[i]) return i;
    }
    return -1;
  }
};

using UnaryOps = OpTable<OpId, OpNeg, OpSigmoid, OpRelu, OpLog, OpExp, OpInv, OpTanh, OpGelu>;
using BinaryOps = OpTable<OpAdd, OpMul, OpLt, OpEq, OpIsClose, OpMax, OpPow, OpReluBack, OpLogBack, OpInvBack,
                          OpSigmoidBack, OpTanhBack, OpGeluBack>;

}  // namespace
