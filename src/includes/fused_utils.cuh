// Helpers shared by the fused row kernels (softmax_kernel.cu, layernorm_kernel.cu).
//
// Both files process a matrix row by row with a "team" of LANES consecutive threads per row:
//   LANES <= 32 (a power of two): several teams share a warp and reduce with xor shuffles, no
//                                 barrier at all;
//   LANES  > 32 (a multiple of 32): the team is the whole block and reduces through shared memory.
// Thread `lane` of a team holds ITERS vectors of VEC floats of its row, vector `it` being the
// elements [(it * LANES + lane) * VEC, ... + VEC): consecutive lanes touch consecutive 16-byte (or
// 4-byte) words, so each load instruction of a warp is coalesced.
#pragma once

#include <cuda_runtime.h>

#include "reduce.cuh"
#include "storage.cuh"
#include "vec.cuh"

namespace fused {

// Load / store VEC consecutive elements of a float or bfloat16 row as floats (VEC = 4: one 16-byte
// or 8-byte access, the address aligned to it: mt::is_aligned4).
template <int VEC, class T>
__device__ __forceinline__ void load_vec(float (&dst)[VEC], const T* src) {
  static_assert(VEC == 1 || VEC == 4, "VEC is 1 or 4");
  if constexpr (VEC == 4) {
    const float4 t = mt::load4(src);
    dst[0] = t.x;
    dst[1] = t.y;
    dst[2] = t.z;
    dst[3] = t.w;
  } else {
    dst[0] = mt::to_float(*src);
  }
}

template <int VEC, class T>
__device__ __forceinline__ void store_vec(T* dst, const float (&src)[VEC]) {
  static_assert(VEC == 1 || VEC == 4, "VEC is 1 or 4");
  if constexpr (VEC == 4) {
    mt::store4(dst, make_float4(src[0], src[1], src[2], src[3]));
  } else {
    *dst = mt::from_float<T>(src[0]);
  }
}

// Rows too long for a team's registers stream through one block of kStreamThreads per row, each
// thread keeping kStreamChunk vectors in flight per step.
constexpr int kStreamThreads = 512;
constexpr int kStreamChunk = 4;

// Threads of the block that row kernels launch for a team of LANES threads (at least 4 warps so
// that short rows still fill a block with several teams).
template <int LANES>
constexpr int kTeamBlockThreads = LANES > 32 ? LANES : 128;

// The row of this thread's team in a row kernel launched by fused::LaunchRows (kTeamBlockThreads<LANES>
// threads to a block, LANES to a row), for `rows` rows of `row_len` floats. A team past the last row
// is not active: it still takes part in the block's reductions (every thread reaches every barrier)
// but works on row 0 (offset) and writes nothing.
struct TeamRow {
  int lane;       // the thread's place in its team
  unsigned row;
  bool active;    // row < rows
  size_t offset;  // the row's first float, row 0's when not active
};

template <int LANES>
__device__ __forceinline__ TeamRow team_row(int rows, int row_len) {
  constexpr int kTeams = kTeamBlockThreads<LANES> / LANES;
  const unsigned row = blockIdx.x * kTeams + threadIdx.x / LANES;
  const bool active = row < static_cast<unsigned>(rows);
  return {static_cast<int>(threadIdx.x % LANES), row, active, static_cast<size_t>(active ? row : 0) * row_len};
}

// All-reduce of v over the team of LANES threads holding one row; every thread of the team gets
// the same value. All threads of the block must call it (inactive teams too), the same number of
// times. scratch: __shared__ storage of 32 T, used only by block-wide teams.
template <int LANES, class T, class Op>
__device__ __forceinline__ T team_allreduce(T v, Op op, T identity, T* scratch) {
  static_assert((LANES <= 32 && (LANES & (LANES - 1)) == 0) || (LANES % 32 == 0 && LANES <= 1024),
                "a team is a power of two <= 32 lanes or a whole block of whole warps");
  if constexpr (LANES <= 32) {
    return mt::warp_allreduce<LANES>(v, op);
  } else {
    return mt::block_allreduce(v, op, identity, scratch);
  }
}

}  // namespace fused
