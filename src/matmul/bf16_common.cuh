// What both kernels of matmul_bf16_kernel.cu share: the product's parameters, the epilogue that turns
// float32 sums into output elements, the split-K reduction, the grouped tile order and the planner.
//
// out[i] = epilogue(A[i] @ B[i]) for every batch index i, bf16 operands read through any strides,
// float32 sums, the output in float32 or bf16 (rounded to nearest even once, after the epilogue).
// Epilogues as matmul_kernel.cu's: none, + bias[c], gelu(x + bias[c]) (tanh form, as
// minitorch.operators.gelu), relu(x + bias[c]); the pre-activation x + bias can be stored too, and
// out += result instead of out = result. bias and pre_act have the output's dtype. The backward
// epilogues multiply by an activation's derivative at a pre-activation read from pre_act (same layout
// as out): x * gelu'(pre) or x * relu'(pre), the input gradient of a Linear whose input was
// act(pre), so that the gradient through the activation needs no pass of its own.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../includes/cuda_check.cuh"
#include "../includes/launch_utils.cuh"
#include "../includes/layout.cuh"

namespace bf16mm {

using mt::ceil_div;

// kBiasGeluD / kBiasReluD: as kBiasGelu / kBiasRelu, but pre_act receives the activation's derivative
// at the pre-activation (rounded to pre_act's dtype) instead of the pre-activation; kScaleBack reads
// such a derivative from pre_act: out = (A @ B) * pre_act, the backward of the first without its math.
enum Epilogue {
  kNone = 0, kBias = 1, kBiasGelu = 2, kBiasRelu = 3, kGeluBack = 4, kReluBack = 5, kBiasGeluD = 6, kBiasReluD = 7,
  kScaleBack = 8
};
enum OutDtype { kOutF32 = 0, kOutBf16 = 1 };
// Tile rows per group of the grouped tile order (tile_coords). With 16, a wave of 132 tiles of 128 x 256 of a
// 4096^3 product covers 16 x 8.25 tiles (16 MB of A, 16.5 MB of B); with 8 it covered 8 x 16.5, all of B, read
// again from DRAM each wave: under ncu its L2 hit rate went 65% -> 78%, and on an H200 it took 175.3 -> 174.2-
// 174.7 us, the LM head's logits 474 -> 467 (bf16_notes.md, nineteenth session).
constexpr int kTileGroup = 16;
constexpr int kMaxSplits = 16;
constexpr int kMaxGridZ = 65535;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

struct Params {
  const __nv_bfloat16* a;
  const __nv_bfloat16* b;
  void* out;  // float or bf16 (out_bf16), batch matrix i at out + i * M * ldc elements
  const void* bias;
  void* pre_act;  // written by kBiasGelu / kBiasRelu, read by kGeluBack / kReluBack
  const void* addend;  // with accumulate: added to the result, laid out as out (out itself, or e.g. a residual)
  int M, N, K;
  int ldc;  // elements between output rows (>= N)
  int a_row_stride, a_k_stride, b_k_stride, b_col_stride;
  MtLayout a_batch, b_batch;
  int batch;
  int out_bf16, epilogue, accumulate;
  bool vec2, vec4;  // 2 (4) adjacent output elements from a column multiple of 2 (4) go as one access
  // Split-K: the kernels write float32 partial products here (split s, batch matrix i, row r at
  // partials + s * split_stride + (i * M + r) * N) instead of running the epilogue.
  float* partials;
  long long split_stride;
  // The work, set by the launcher: output tiles of one batch matrix, K tiles (of the kernel's depth)
  // in all and per split.
  int tiles_m, tiles_n, k_tiles, splits, k_tiles_per_split;
};

// 0.5 (1 + tanh(u)) of GELU's tanh form, u = sqrt(2 / pi) (x + 0.044715 x^3), as the logistic
// sigmoid of 2u: one ex2.approx and one rcp.approx where tanhf takes a few dozen instructions, which the
// epilogue runs with the tensor cores idle; relative error ~1e-7, also where 1 + tanh(u) cancels (x << 0).
__device__ __forceinline__ float gelu_gate(float x) {
  return __fdividef(1.f, 1.f + __expf(-2.f * kGeluC * (x + kGeluA * x * x * x)));
}

__device__ __forceinline__ float gelu(float x) { return x * gelu_gate(x); }

__device__ __forceinline__ float load_elem(const void* base, long long i, bool bf16) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]) : static_cast<const float*>(base)[i];
}

__device__ __forceinline__ void store_elem(void* base, long long i, float v, bool bf16) {
  if (bf16) {
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(base)[i] = v;
  }
}

// W = 2 or 4 consecutive elements at base + i (aligned to W elements) as one access.
template <int W>
__device__ __forceinline__ void load_vec(const void* base, long long i, bool bf16, float (&x)[W]) {
  if (bf16) {
    const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(static_cast<const __nv_bfloat16*>(base) + i);
    if constexpr (W == 4) {
      const uint2 raw = *reinterpret_cast<const uint2*>(v);
      const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      x[0] = lo.x, x[1] = lo.y, x[2] = hi.x, x[3] = hi.y;
    } else {
      const float2 lo = __bfloat1622float2(*v);
      x[0] = lo.x, x[1] = lo.y;
    }
  } else if constexpr (W == 4) {
    const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
    const float2 v = *reinterpret_cast<const float2*>(static_cast<const float*>(base) + i);
    x[0] = v.x, x[1] = v.y;
  }
}

template <int W>
__device__ __forceinline__ void store_vec(void* base, long long i, const float (&x)[W], bool bf16) {
  if (bf16) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(x[0], x[1]);
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(base) + i;
    if constexpr (W == 4) {
      const __nv_bfloat162 hi = __floats2bfloat162_rn(x[2], x[3]);
      *reinterpret_cast<uint2*>(dst) =
          make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    } else {
      *reinterpret_cast<__nv_bfloat162*>(dst) = lo;
    }
  } else if constexpr (W == 4) {
    *reinterpret_cast<float4*>(static_cast<float*>(base) + i) = make_float4(x[0], x[1], x[2], x[3]);
  } else {
    *reinterpret_cast<float2*>(static_cast<float*>(base) + i) = make_float2(x[0], x[1]);
  }
}

// The derivative of GELU at x from its gate s = gelu_gate(x) (tanh form, as combine's gelu_back: with
// s = 0.5 (1 + tanh(u)), 0.5 (1 - tanh(u)^2) = 2 s (1 - s)).
__device__ __forceinline__ float gelu_derivative(float x, float s) {
  return s + 2.f * x * s * (1.f - s) * (kGeluC * (1.f + 3.f * kGeluA * x * x));
}

__host__ __device__ __forceinline__ bool forward_activation(int epilogue) {
  return epilogue == kBiasGelu || epilogue == kBiasRelu || epilogue == kBiasGeluD || epilogue == kBiasReluD;
}

__device__ __forceinline__ float activate(int epilogue, float x) {
  if (epilogue == kBiasGelu || epilogue == kBiasGeluD) return gelu(x);
  return epilogue == kBiasRelu || epilogue == kBiasReluD ? fmaxf(x, 0.f) : x;
}

// The value pre_act keeps of pre-activation x: x itself, or (kBiasGeluD / kBiasReluD) the activation's
// derivative there.
__device__ __forceinline__ float kept_value(int epilogue, float x) {
  if (epilogue == kBiasGeluD) return gelu_derivative(x, gelu_gate(x));
  if (epilogue == kBiasReluD) return x > 0.f ? 1.f : 0.f;
  return x;
}

__host__ __device__ __forceinline__ bool backward_epilogue(int epilogue) {
  return epilogue == kGeluBack || epilogue == kReluBack || epilogue == kScaleBack;
}

// d times the derivative at pre-activation x of GELU (kGeluBack) or ReLU (kReluBack: d where x > 0,
// else 0, as relu_back); kScaleBack: d times x, the derivative kept by the forward.
__device__ __forceinline__ float activation_grad(int epilogue, float x, float d) {
  if (epilogue == kReluBack) return x > 0.f ? d : 0.f;
  if (epilogue == kScaleBack) return d * x;
  return d * gelu_derivative(x, gelu_gate(x));
}

// Output elements (r, c .. c + n - 1) of batch matrix bi (n <= W; c a multiple of W) from their float32
// sums x: bias, pre-activation, activation (or an activation's derivative), accumulation, in the
// output's dtype, as one W-wide access
// each where all W are inside and the layout allows (Params::vec2 / vec4); a split-K product writes its
// partial sums of split `split` instead. BACK: p's epilogue is a backward one (a template argument, so
// that the other epilogues keep the code they had without the backward ones: with the branch inside,
// the generic kernel and split_k_reduce ran 12-20% slower in the translation program's profile).
template <int W, bool BACK>
__device__ __forceinline__ void store_run_as(const Params& p, int split, int bi, int r, int c, float (&x)[W], int n) {
  if (p.partials != nullptr) {
    float* dst = p.partials + split * p.split_stride + (static_cast<long long>(bi) * p.M + r) * p.N + c;
    if (n == W && p.N % W == 0) {
      store_vec<W>(dst, 0, x, false);
      return;
    }
#pragma unroll
    for (int j = 0; j < W; ++j) {
      if (j < n) dst[j] = x[j];
    }
    return;
  }
  const bool bf16 = p.out_bf16 != 0;
  const long long idx = (static_cast<long long>(bi) * p.M + r) * p.ldc + c;
  const bool act = forward_activation(p.epilogue);
  const bool bias = !BACK && p.epilogue != kNone && p.bias != nullptr;
  if (n == W && (W == 4 ? p.vec4 : p.vec2)) {
    float y[W];
    if constexpr (BACK) {
      load_vec<W>(p.pre_act, idx, bf16, y);
#pragma unroll
      for (int j = 0; j < W; ++j) x[j] = activation_grad(p.epilogue, y[j], x[j]);
    }
    if (bias) {
      load_vec<W>(p.bias, c, bf16, y);
#pragma unroll
      for (int j = 0; j < W; ++j) x[j] += y[j];
    }
    if (act && p.pre_act != nullptr) {
#pragma unroll
      for (int j = 0; j < W; ++j) y[j] = kept_value(p.epilogue, x[j]);
      store_vec<W>(p.pre_act, idx, y, bf16);
    }
#pragma unroll
    for (int j = 0; j < W; ++j) x[j] = activate(p.epilogue, x[j]);
    if (p.accumulate) {
      load_vec<W>(p.addend, idx, bf16, y);
#pragma unroll
      for (int j = 0; j < W; ++j) x[j] += y[j];
    }
    store_vec<W>(p.out, idx, x, bf16);
    return;
  }
#pragma unroll
  for (int j = 0; j < W; ++j) {
    if (j >= n) break;
    float v = x[j];
    if constexpr (BACK) v = activation_grad(p.epilogue, load_elem(p.pre_act, idx + j, bf16), v);
    if (bias) v += load_elem(p.bias, c + j, bf16);
    if (act && p.pre_act != nullptr) store_elem(p.pre_act, idx + j, kept_value(p.epilogue, v), bf16);
    v = activate(p.epilogue, v);
    if (p.accumulate) v += load_elem(p.addend, idx + j, bf16);
    store_elem(p.out, idx + j, v, bf16);
  }
}

template <int W>
__device__ __forceinline__ void store_run(const Params& p, int split, int bi, int r, int c, float (&x)[W], int n) {
  if (backward_epilogue(p.epilogue)) {
    store_run_as<W, true>(p, split, bi, r, c, x, n);
  } else {
    store_run_as<W, false>(p, split, bi, r, c, x, n);
  }
}

// out = epilogue(sum over s < splits of the partial products, in order s = 0, 1, ...): deterministic.
// p.partials is null here (the epilogue runs); `partials` holds the sums. One thread per run of W (4
// where N is a multiple of 4, else 2) columns, grid-stride; the split loop is unrolled by 4 so that a
// thread's loads of 4 splits are in flight together (one after another, the 768 x 768 attention
// projection's weight gradient, 3 splits, took 8.8 us in this pass under ncu).
template <int W>
__global__ void split_k_reduce(const Params p, const float* partials, int splits) {
  mt::join_prior_grids();
  const int runs = (p.N + W - 1) / W;
  const long long total = static_cast<long long>(p.batch) * p.M * runs;
  for (long long i = mt::grid_stride_first(); i < total; i += mt::grid_stride_step()) {
    const long long row = i / runs;  // batch matrix * M + r
    const int c = static_cast<int>(i - row * runs) * W;
    const int n = min(W, p.N - c);
    const float* src = partials + row * p.N + c;
    float x[W] = {};
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {
      float v[W];
      if (n == W && p.N % W == 0) {
        load_vec<W>(src + s * p.split_stride, 0, false, v);
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) v[j] = j < n ? src[s * p.split_stride + j] : 0.f;
      }
#pragma unroll
      for (int j = 0; j < W; ++j) x[j] += v[j];
    }
    store_run<W>(p, 0, static_cast<int>(row / p.M), static_cast<int>(row % p.M), c, x, n);
  }
}

// Tile t of one batch matrix's tiles_m x tiles_n, in groups of kTileGroup tile rows walked column by
// column, so that the blocks running at one time share A rows and B columns in L2.
__device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, int* tm, int* tn) {
  const int group = t / (kTileGroup * tiles_n);
  const int first_m = group * kTileGroup;
  const int size = min(tiles_m - first_m, kTileGroup);
  const int in_group = t - group * kTileGroup * tiles_n;
  *tm = first_m + in_group % size;
  *tn = in_group / size;
}

// ------------------------------------------------------------------------------------------------
// Planning (host)
// ------------------------------------------------------------------------------------------------

// A kernel configuration as the planner sees it: tile, K depth, blocks per SM and the SM's rate
// (flop/s) when it runs them; k_major_b: it reads a K-major B only.
struct TileShape {
  int bm, bn, bk, per_sm;
  double sm_rate;
  bool k_major_b = false;
};

struct Plan {
  int shape;  // index into the candidates
  int splits, k_tiles, k_tiles_per_split;
  double cost;  // the estimated time (s)
};

// The shape and K split count with the least estimated time: waves of blocks times a block's time,
// plus a fixed cost per wave (pipeline fill and epilogue, ~1.5 us) and, for a split product, the
// partial sums written and read once (~2.5 TB/s) and the reduction's launch (~3 us). A plan must win
// by 3% to replace a simpler one (fewer splits, or an earlier candidate). Shapes that read a K-major B
// only are skipped where B is MN-major (b_kmajor false). The plan depends only on the sizes, the layout
// and the GPU, so the workspace query and the launch agree on it.
inline Plan plan_product(const TileShape* shapes, int n_shapes, int M, int N, int K, long long batch, int sms,
                         int max_splits, bool b_kmajor = true) {
  Plan best{0, 1, 0, 0, 0.0};
  double best_cost = 1e300;
  for (int i = 0; i < n_shapes; ++i) {
    const TileShape& sh = shapes[i];
    if (sh.k_major_b && !b_kmajor) continue;
    const long long k_tiles = ceil_div(K, sh.bk);
    const long long tiles = ceil_div(M, sh.bm) * ceil_div(N, sh.bn) * batch;
    const double k_tile_time = 2.0 * sh.bm * sh.bn * sh.bk * sh.per_sm / sh.sm_rate;
    for (int s = 1; s <= max_splits; ++s) {
      const long long per_split = ceil_div(k_tiles, s);
      if (s > 1 && (per_split < 2 || ceil_div(k_tiles, per_split) < s)) break;
      if (s > 1 && tiles * s > mt::kMaxInt) break;
      const long long waves = ceil_div(tiles * s, static_cast<long long>(sms) * sh.per_sm);
      double cost = waves * (per_split * k_tile_time + 1.5e-6);
      if (s > 1) cost += 8.0 * s * batch * M * N / 2.5e12 + 3e-6;
      if (cost < best_cost * 0.97) {
        best_cost = cost;
        best = Plan{i, s, static_cast<int>(k_tiles), static_cast<int>(per_split), cost};
      }
    }
  }
  return best;
}

// Bytes of float32 partial products a plan writes (0 without K splits).
inline long long partial_bytes(const Plan& plan, int M, int N, long long batch) {
  return plan.splits > 1 ? 4LL * plan.splits * batch * M * N : 0;
}

// p writing split-K partial products to `workspace` (no epilogue there).
inline Params partial_params(Params p, void* workspace) {
  p.partials = static_cast<float*>(workspace);
  p.split_stride = static_cast<long long>(p.batch) * p.M * p.N;
  return p;
}

// The epilogue over the plan's partial products in `workspace` into p's output.
inline int reduce_splits(const Params& p, const void* workspace, int splits, cudaStream_t stream) {
  Params q = p;
  q.partials = nullptr;
  q.split_stride = static_cast<long long>(p.batch) * p.M * p.N;
  const float* partials = static_cast<const float*>(workspace);
  if (p.N % 4 == 0) {
    const long long runs = static_cast<long long>(p.batch) * p.M * (p.N / 4);
    return mt::launch_grid_stride<split_k_reduce<4>, true>(runs, stream, q, partials, splits);
  }
  const long long pairs = static_cast<long long>(p.batch) * p.M * ((p.N + 1) / 2);
  return mt::launch_grid_stride<split_k_reduce<2>, true>(pairs, stream, q, partials, splits);
}

}  // namespace bf16mm
