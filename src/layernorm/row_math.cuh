// The row math that layernorm_kernel.cu's forward and backward kernels share: vector loads and
// stores of a row (VEC 8 for the 16-byte vectors of bfloat16 rows), a row's values held as loaded,
// the statistics and their bit-symmetric merge, the backward's per-vector terms and three row sums,
// and the kernels' argument structs. See the top of layernorm_kernel.cu for the algorithm.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "../includes/fused_utils.cuh"
#include "../includes/reduce.cuh"
#include "../includes/storage.cuh"
#include "../includes/vec.cuh"

namespace mt_ln {

// fused::load_vec / store_vec, plus VEC 8 for the 16-byte vectors of bfloat16 rows: the float32
// gamma of 8 columns as two float4, and 8 bfloat16 in one 16-byte store (Held loads them); the
// addresses 16-byte aligned.
template <int VEC, class T>
__device__ __forceinline__ void load_vec(float (&dst)[VEC], const T* src) {
  if constexpr (VEC == 8) {
    static_assert(std::is_same_v<T, float>, "VEC 8 loads of bfloat16 are Held's");
    const float4 lo = mt::load4(src);
    const float4 hi = mt::load4(src + 4);
    dst[0] = lo.x, dst[1] = lo.y, dst[2] = lo.z, dst[3] = lo.w;
    dst[4] = hi.x, dst[5] = hi.y, dst[6] = hi.z, dst[7] = hi.w;
  } else {
    fused::load_vec<VEC>(dst, src);
  }
}

template <int VEC, class T>
__device__ __forceinline__ void store_vec(T* dst, const float (&src)[VEC]) {
  if constexpr (VEC == 8) {
    static_assert(std::is_same_v<T, mt::bf16>, "VEC 8 rows are bfloat16");
    unsigned words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(src[2 * i], src[2 * i + 1]);
      words[i] = *reinterpret_cast<const unsigned*>(&h);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
  } else {
    fused::store_vec<VEC>(dst, src);
  }
}

// A vector of VEC elements of a row as loaded (load_vec's access), widened to float only where it
// is used: bfloat16 stays two elements to a register, which is what lets the backward's 16-byte
// warp buckets hold 24 columns of x and dout a thread.
template <class T, int VEC>
struct Held {
  float v[VEC];

  __device__ __forceinline__ void load(const T* src) { load_vec<VEC>(v, src); }
  __device__ __forceinline__ void unpack(float (&dst)[VEC]) const {
#pragma unroll
    for (int c = 0; c < VEC; ++c) dst[c] = v[c];
  }
};

template <int VEC>
struct Held<mt::bf16, VEC> {
  unsigned w[(VEC + 1) / 2];  // element c in the low (c even) or high half of w[c / 2]

  __device__ __forceinline__ void load(const mt::bf16* src) {
    if constexpr (VEC == 8) {
      const uint4 raw = *reinterpret_cast<const uint4*>(src);
      w[0] = raw.x, w[1] = raw.y, w[2] = raw.z, w[3] = raw.w;
    } else if constexpr (VEC == 4) {
      const uint2 raw = *reinterpret_cast<const uint2*>(src);
      w[0] = raw.x, w[1] = raw.y;
    } else {
      static_assert(VEC == 1, "VEC is 1, 4 or 8");
      w[0] = *reinterpret_cast<const unsigned short*>(src);
    }
  }
  // A bfloat16 is the top half of the float it widens to.
  __device__ __forceinline__ void unpack(float (&dst)[VEC]) const {
#pragma unroll
    for (int c = 0; c < VEC; ++c) dst[c] = __uint_as_float(c % 2 ? w[c / 2] & 0xffff0000u : w[c / 2] << 16);
  }
};

// Count, mean and sum of squared deviations of a set of values. The merge is symmetric bit for bit
// (explicitly rounded products, no contraction across the two sides), so every lane of a butterfly
// ends with the same statistics.
struct Stats {
  float n;
  float mean;
  float m2;
};

struct StatsMerge {
  __device__ __forceinline__ Stats operator()(Stats a, Stats b) const {
    const float n = __fadd_rn(a.n, b.n);
    const float inv_n = n > 0.f ? __fdividef(1.f, n) : 0.f;
    const float mean = __fmul_rn(__fadd_rn(__fmul_rn(a.n, a.mean), __fmul_rn(b.n, b.mean)), inv_n);
    const float d = __fadd_rn(b.mean, -a.mean);
    const float cross = __fmul_rn(__fmul_rn(d, d), __fmul_rn(__fmul_rn(a.n, b.n), inv_n));
    return {n, mean, __fadd_rn(__fadd_rn(a.m2, b.m2), cross)};
  }
};

// Statistics of the `count` live values among v (the others are zero) from one thread's registers:
// a two-pass mean and sum of squares, exact up to rounding.
template <int K, int VEC>
__device__ __forceinline__ Stats local_stats(const float (&v)[K][VEC], const bool (&live)[K]) {
  float count = 0.f;
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (live[k]) count += VEC;
#pragma unroll
    for (int c = 0; c < VEC; ++c) sum += v[k][c];
  }
  const float mean = count > 0.f ? __fdividef(sum, count) : 0.f;
  float m2 = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (live[k]) {
#pragma unroll
      for (int c = 0; c < VEC; ++c) m2 = fmaf(v[k][c] - mean, v[k][c] - mean, m2);
    }
  }
  return {count, mean, m2};
}

// The backward's terms of one vector of a row, from dout, x and gamma as loaded: dy = dout,
// z = x - mean and g = dy * gamma, all zero where the vector is dead (past the row's end).
template <int VEC>
__device__ __forceinline__ void bw_terms(float (&dy)[VEC], float (&z)[VEC], float (&g)[VEC], bool live, float mu) {
#pragma unroll
  for (int c = 0; c < VEC; ++c) {
    dy[c] = live ? dy[c] : 0.f;
    z[c] = live ? z[c] - mu : 0.f;
    g[c] = live ? dy[c] * g[c] : 0.f;
  }
}

// The three row sums of the backward: z = x - mean, g = dout * gamma, g * z.
struct Sum3 {
  float z;
  float g;
  float gz;

  template <int VEC>
  __device__ __forceinline__ void add(const float (&zv)[VEC], const float (&gv)[VEC]) {
#pragma unroll
    for (int c = 0; c < VEC; ++c) {
      z += zv[c];
      g += gv[c];
      gz = fmaf(gv[c], zv[c], gz);
    }
  }
};

struct Sum3Op {
  __device__ __forceinline__ Sum3 operator()(Sum3 a, Sum3 b) const {
    return {a.z + b.z, a.g + b.g, a.gz + b.gz};
  }
};

// A row's backward from its reduced sums: d = mean(z), the residual of the float32 mean (see the top
// of the file), mean(g) and mean(g * xhat); then per element xhat = (z - d) * rstd and dinp.
struct BwRow {
  float rs;
  float d;
  float mean_g;
  float mean_gxhat;

  __device__ __forceinline__ BwRow(Sum3 s, float rstd, float inv_hidden)
      : rs(rstd), d(s.z * inv_hidden), mean_g(s.g * inv_hidden), mean_gxhat(rstd * fmaf(-d, s.g, s.gz) * inv_hidden) {}
  __device__ __forceinline__ float xhat(float z) const { return (z - d) * rs; }
  __device__ __forceinline__ float dinp(float xhat, float g) const { return rs * fmaf(-xhat, mean_gxhat, g - mean_g); }
};

template <class T>
struct FwArgs {
  T* out;
  float* mean;
  float* rstd;
  const T* inp;
  const float* gamma;
  const float* beta;
  int rows;
  int hidden;
  float inv_hidden;
  float eps;
};

template <class T>
struct BwArgs {
  T* dinp;
  float* partial;  // workspace [parts][2 * hidden]
  float* resid;    // workspace [rows] (streaming path only)
  const T* dout;
  const T* inp;
  const float* gamma;
  const float* mean;
  const float* rstd;
  int rows;
  int hidden;
  float inv_hidden;
  const T* addend;  // added to dinp where not null: inp's gradient gathered so far (the residual stream's)
};

}  // namespace mt_ln
