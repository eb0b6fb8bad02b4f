// OpTable: a table of scalar operations in opcode order, for the elementwise libraries (combine.cu,
// int_kernel.cu). An operation is a functor with `static constexpr const char* kName`, its name in
// minitorch.operators, which the library exports so that the Python binding checks both sides agree.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

namespace mt {

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

}  // namespace mt
