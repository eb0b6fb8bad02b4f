// Opcode tables shared by the elementwise libraries (combine.cu, int_kernel.cu).
//
// A table is an X-macro listing X(code, name, functor) for codes 0, 1, 2, ...; the names are those of
// minitorch.operators, exported so that the Python binding checks that both sides agree:
//   #define MY_OPS(X) X(0, add, OpAdd) X(1, mul, OpMul)
//   constexpr int kNumOps = MT_OPCODE_COUNT(MY_OPS);
//   MT_DEFINE_OPCODE_DISPATCH(dispatch, MY_OPS)        // dispatch(op, launch) calls launch(Functor{})
//   extern "C" { MT_DEFINE_OPCODE_NAME(my_op_name, MY_OPS) }  // my_op_name(op): its name or NULL
#pragma once

#include <cuda_runtime.h>

#define MT_OPCODE_COUNT_ONE(code, name, functor) +1
#define MT_OPCODE_COUNT(TABLE) (0 TABLE(MT_OPCODE_COUNT_ONE))

#define MT_OPCODE_DISPATCH_CASE(code, name, functor) \
  case code:                                         \
    return launch(functor{});

// template <class Launch> int fn(int op, Launch&& launch): launch(Functor{}) for the functor of op,
// cudaErrorInvalidValue for an unknown op.
#define MT_DEFINE_OPCODE_DISPATCH(fn, TABLE)              \
  template <class Launch>                                 \
  int fn(int op, Launch&& launch) {                       \
    switch (op) {                                         \
      TABLE(MT_OPCODE_DISPATCH_CASE)                      \
      default:                                            \
        return static_cast<int>(cudaErrorInvalidValue);   \
    }                                                     \
  }

#define MT_OPCODE_NAME_CASE(code, name, functor) \
  case code:                                     \
    return #name;

// const char* fn(int op): the name of op, NULL when out of range.
#define MT_DEFINE_OPCODE_NAME(fn, TABLE) \
  const char* fn(int op) {               \
    switch (op) {                        \
      TABLE(MT_OPCODE_NAME_CASE)         \
      default:                           \
        return nullptr;                  \
    }                                    \
  }
