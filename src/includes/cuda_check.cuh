// Error handling shared by every minitorch CUDA library.
//
// The contract (DESIGN.md): an extern "C" launcher never exits or prints; it returns an int that is
// a cudaError_t (0 = success), and the Python binding turns a non-zero code into an exception whose
// text comes from minitorch_error_string(code).
#pragma once

#include <cuda_runtime.h>

// Evaluate a CUDA runtime call and return its error code from the enclosing launcher on failure.
#define MT_RETURN_IF_ERROR(expr)                   \
  do {                                             \
    const cudaError_t mt_status_ = (expr);         \
    if (mt_status_ != cudaSuccess) {               \
      return static_cast<int>(mt_status_);         \
    }                                              \
  } while (0)

// Return cudaErrorInvalidValue from the enclosing launcher when a size/argument check fails.
#define MT_RETURN_IF_INVALID(cond)                                \
  do {                                                            \
    if (cond) {                                                   \
      return static_cast<int>(cudaErrorInvalidValue);             \
    }                                                             \
  } while (0)

// The status to return right after a kernel launch: a launch-configuration error, if any.
// (Errors raised while the kernel runs surface at the next synchronizing call, as in PyTorch.)
inline int mt_launch_status() { return static_cast<int>(cudaGetLastError()); }

// Each library defines minitorch_error_string exactly once by writing MT_DEFINE_ERROR_STRING() at
// file scope in its .cu file, so every .so exports the same symbol without a duplicate definition.
#define MT_DEFINE_ERROR_STRING()                                        \
  extern "C" const char* minitorch_error_string(int code) {             \
    return cudaGetErrorString(static_cast<cudaError_t>(code));          \
  }
