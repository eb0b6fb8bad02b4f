// random_kernel.cu: uniform [0, 1) floats from a counter-based generator, Philox-4x32-10 keyed by
// the seed and counted by element group, so values do not depend on the launch configuration.
//
// One thread per group of 4 consecutive elements of the layout's row-major order, grid-stride: the
// group's Philox call gives its 4 values, stored as one float4 when the output is flat and aligned,
// else element by element through the layout.
//
// launch_uniform_from reads its key from device memory, so a captured CUDA graph draws new numbers
// at every replay once the host has written a new seed there; its `sequence` (e.g. the ordinal of
// the call within a training step) selects an independent Philox stream through the counter's high
// 64 bits, which launch_uniform leaves at 0.
//
// Both launchers follow cuda_check.cuh's contract: device pointers, layouts by value and a
// cudaStream_t in, an int cudaError_t out (cudaErrorInvalidValue for bad sizes).
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"
#include "includes/launch_utils.cuh"
#include "includes/layout.cuh"
#include "includes/vec.cuh"

namespace {

// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
__device__ __forceinline__ uint4 philox4x32_10(uint4 counter, uint2 key) {
  constexpr unsigned kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr unsigned kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const unsigned hi0 = __umulhi(kMul0, counter.x), lo0 = kMul0 * counter.x;
    const unsigned hi1 = __umulhi(kMul1, counter.z), lo1 = kMul1 * counter.z;
    counter = make_uint4(hi1 ^ counter.y ^ key.x, lo1, hi0 ^ counter.w ^ key.y, lo0);
    key.x += kWeyl0;
    key.y += kWeyl1;
  }
  return counter;
}

// The top 24 bits of a uniform 32-bit integer as a float in [0, 1).
__device__ __forceinline__ float unit_float(unsigned bits) {
  return static_cast<float>(bits >> 8) * (1.f / 16777216.f);
}

// Element i of the logical (row-major) order gets component i % 4 of Philox(counter = (i / 4,
// sequence)), keyed by *seed_ptr when it is given, else by seed.
__global__ void uniform_kernel(float* out, const MtLayout out_l, int n, bool flat, unsigned long long seed,
                               const unsigned long long* seed_ptr, unsigned long long sequence) {
  if (seed_ptr != nullptr) seed = *seed_ptr;
  const uint2 key = make_uint2(static_cast<unsigned>(seed), static_cast<unsigned>(seed >> 32));
  const unsigned seq_lo = static_cast<unsigned>(sequence), seq_hi = static_cast<unsigned>(sequence >> 32);
  const long long groups = (static_cast<long long>(n) + 3) / 4;
  const long long stride = mt::grid_stride_step();
  for (long long g = mt::grid_stride_first(); g < groups; g += stride) {
    const uint4 bits = philox4x32_10(
        make_uint4(static_cast<unsigned>(g), static_cast<unsigned>(g >> 32), seq_lo, seq_hi), key);
    const float v[4] = {unit_float(bits.x), unit_float(bits.y), unit_float(bits.z),
                        unit_float(bits.w)};
    const int base = static_cast<int>(g * 4);
    if (flat && base + 3 < n) {
      mt::store_float4(out + base, make_float4(v[0], v[1], v[2], v[3]));
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (base + j < n) out[flat ? base + j : mt::layout_offset(out_l, base + j)] = v[j];
      }
    }
  }
}

}  // namespace

extern "C" {

MT_DEFINE_ERROR_STRING()

}  // extern "C"

namespace {

int uniform(float* out, const MtLayout& out_l, unsigned long long seed, const unsigned long long* seed_ptr,
            unsigned long long sequence, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(!mt::valid_layout(out_l));
  const long long n = mt::layout_numel(out_l);
  MT_RETURN_IF_INVALID(n > mt::kMaxInt);
  if (n == 0) return 0;
  const bool flat = mt::layout_is_flat_contiguous(out_l) && mt::is_aligned16(out);
  return mt::launch_grid_stride<uniform_kernel>((n + 3) / 4, stream, out, out_l, static_cast<int>(n), flat, seed,
                                                seed_ptr, sequence);
}

}  // namespace

extern "C" {

// Uniform [0, 1) floats: the element at row-major ordinal i of the layout gets a value that depends
// only on (seed, i).
int launch_uniform(float* out, MtLayout out_l, unsigned long long seed, cudaStream_t stream) {
  return uniform(out, out_l, seed, nullptr, 0, stream);
}

// The same with the seed read from device memory when the kernel runs, and stream `sequence`.
int launch_uniform_from(float* out, MtLayout out_l, const unsigned long long* seed_ptr, unsigned long long sequence,
                        cudaStream_t stream) {
  MT_RETURN_IF_INVALID(seed_ptr == nullptr);
  return uniform(out, out_l, 0, seed_ptr, sequence, stream);
}

}  // extern "C"
