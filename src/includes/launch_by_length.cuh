// The launch-by-length walker of the fused row kernels (softmax_kernel.cu, layernorm_kernel.cu).
//
// A row kernel is templated on VEC (floats per vector), LANES (threads of the team that holds a row)
// and ITERS (vectors per thread), see fused_utils.cuh; an instance holds rows of up to its capacity,
// VEC * LANES * ITERS floats, in registers. Each operation lists its buckets, shortest rows first:
//   using Vec4 = fused::Buckets<4, fused::Team<1, 1>, fused::Team<2, 1>, ...>;
// and walk_buckets(n, pick, Vec4{}) calls pick.template bucket<VEC, LANES, ITERS>() for the first
// bucket that holds a row of n floats, or pick.template beyond<VEC>() when none does (a streaming
// kernel's turn). LaunchRows is the pick that launches an operation's kernels.
#pragma once

#include <cuda_runtime.h>

#include "cuda_check.cuh"
#include "dependent_launch.cuh"
#include "fused_utils.cuh"

namespace fused {

// A team of LANES threads per row, each holding ITERS vectors.
template <int LANES, int ITERS>
struct Team {
  static constexpr int kLanes = LANES;
  static constexpr int kIters = ITERS;
};

// The buckets of one vector width, shortest rows first.
template <int VEC, class... Teams>
struct Buckets {};

template <int VEC, class Pick>
auto walk_buckets(int, const Pick& pick, Buckets<VEC>) {
  return pick.template beyond<VEC>();
}

template <int VEC, class Pick, class First, class... Rest>
auto walk_buckets(int n, const Pick& pick, Buckets<VEC, First, Rest...>) {
  if (n <= VEC * First::kLanes * First::kIters) return pick.template bucket<VEC, First::kLanes, First::kIters>();
  return walk_buckets(n, pick, Buckets<VEC, Rest...>{});
}

// Launches one operation's row kernels on `rows` rows of args: Kernels::rows<VEC, LANES, ITERS>()
// (the kernel of a bucket) on teams of LANES threads, kTeamBlockThreads<LANES> to a block, and
// Kernels::stream<VEC>() (rows longer than every bucket) on one block of kStreamThreads per row;
// kDependent: as dependent launches (both kernels keep the contract of dependent_launch.cuh).
template <class Kernels, class Args, bool kDependent = false>
struct LaunchRows {
  const Args& args;
  int rows;
  cudaStream_t stream;

  template <int VEC, int LANES, int ITERS>
  int bucket() const {
    constexpr int kThreads = kTeamBlockThreads<LANES>;
    constexpr int kTeams = kThreads / LANES;
    const unsigned blocks = static_cast<unsigned>((static_cast<long long>(rows) + kTeams - 1) / kTeams);
    const auto kernel = Kernels::template rows<VEC, LANES, ITERS>();
    if constexpr (kDependent) return mt::launch_dependent(kernel, dim3(blocks), dim3(kThreads), 0, stream, args);
    kernel<<<blocks, kThreads, 0, stream>>>(args);
    return mt_launch_status();
  }

  template <int VEC>
  int beyond() const {
    const auto kernel = Kernels::template stream<VEC>();
    if constexpr (kDependent) {
      return mt::launch_dependent(kernel, dim3(static_cast<unsigned>(rows)), dim3(kStreamThreads), 0, stream, args);
    }
    kernel<<<static_cast<unsigned>(rows), kStreamThreads, 0, stream>>>(args);
    return mt_launch_status();
  }
};

}  // namespace fused
