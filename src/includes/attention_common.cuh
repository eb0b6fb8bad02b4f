// What the fp32 (attention_kernel.cu) and bf16 (attention_bf16_kernel.cu) fused attention kernels
// share: the parameter blocks (templated on the storage type T of q, k, v, out and their gradients;
// lse, D and the mask stay float32), the strides that address q, k, v, out, dout, dk and dv (any
// (batch, head, token) strides, unit stride along D; the fp32 launchers pass contiguous ones), the
// (batch, head) of a block, the score step of the forward (scale, mask, causal limit, online softmax
// or ReLU on a warp's C fragments) and the size and stride checks.
// Both tensor-core shapes (m16n8k8 TF32, m16n8k16 bf16) have the same C fragment, c0c1 = C[g][2t..],
// c2c3 = C[g + 8][2t..] with g = lane / 4, t = lane % 4, which is what the score step works on.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "ptx.cuh"
#include "reduce.cuh"

namespace mt_attn {

using mt::kLog2e;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kFwRows = kWarps * 16;  // query rows of a forward block
constexpr int kBwKeys = kWarps * 16;  // keys of a backward block
constexpr int kMaxHeadDim = 128;
constexpr int kDotWarps = 8;  // warps (rows) per block of attention_bw_dot
constexpr int kMaxGridY = 65535;
constexpr long long kMaxTokenStride = (INT_MAX - kMaxHeadDim) / 64;  // a tile's row offsets fit int

enum Activation { kSoftmax = 0, kRelu = 1 };

// Where the rows of a [batch, heads, len, head_dim] operand are, in elements: element (b, h, t, d) at
// b * batch + h * head + t * token + d. E.g. q of a packed [B, T, 3C] projection (C = H * D):
// {T * 3C, D, 3C} from the projection's start (k from + C, v from + 2C).
struct Strides {
  long long batch;
  long long head;
  long long token;
};

// The strides of a contiguous [batch, heads, len, head_dim] operand.
inline Strides contiguous_strides(int heads, int len, int head_dim) {
  const long long row = static_cast<long long>(len) * head_dim;
  return {row * heads, row, head_dim};
}

template <class T>
struct FwParams {
  T* out;
  float* lse;
  const T* q;
  const T* k;
  const T* v;
  const float* mask;  // [batch, k_len] or nullptr
  Strides q_strides;
  Strides k_strides;
  Strides v_strides;
  Strides out_strides;
  int heads;
  int q_len;
  int k_len;
  int head_dim;
  int causal;
  float scale;
  int vec;  // every row starts 16-byte aligned (head_dim, pointers, strides): tiles load in 16-byte chunks
};

template <class T>
struct BwParams {
  float* dq;  // float32 (bf16: a workspace accumulated with atomics and cast afterwards)
  T* dk;
  T* dv;
  const T* dout;
  const T* q;
  const T* k;
  const T* v;
  const float* lse;
  const float* di;
  const float* mask;
  Strides dk_strides;
  Strides dv_strides;
  Strides dout_strides;
  Strides q_strides;
  Strides k_strides;
  Strides v_strides;
  int heads;
  int q_len;
  int k_len;
  int head_dim;
  int causal;
  float scale;
  int vec;
  int dq_vec4;  // bf16: float4 atomics into the dq workspace (head_dim % 4 == 0, 16-byte aligned rows)
};

// Heads whose blocks a backward grid starts together when its operands do not fit in L2 (see tile_grid).
constexpr int kHeadGroup = 16;
constexpr int kMaxGridZ = 65535;

// The grid of a forward or backward launch over batch_heads heads of `tiles` tiles each (query tiles
// of the forward, key tiles of the backward): (group, tiles, batch_heads / group). Blocks start in
// the order of their linear index, blockIdx.x fastest, so the GPU walks the heads a group at a time,
// tile by tile over a group's heads before the next group. The group is the largest divisor of
// batch_heads up to `most` (so every block has a head); one group of all heads where the groups
// would overflow z. One group is the plain order (every head's first tile, then every head's second):
// the longest blocks first under causal, so the last wave is short.
inline dim3 tile_grid(int batch_heads, int tiles, int most) {
  int group = most < batch_heads ? most : batch_heads;
  while (batch_heads % group != 0) --group;
  if (batch_heads / group > kMaxGridZ) group = batch_heads;
  return dim3(static_cast<unsigned>(group), static_cast<unsigned>(tiles), static_cast<unsigned>(batch_heads / group));
}

// The (batch * heads + head, tile) of a block of a tile_grid.
struct BlockTile {
  int bh;
  int tile;
};

__device__ __forceinline__ BlockTile block_tile() {
  return {static_cast<int>(blockIdx.z * gridDim.x + blockIdx.x), static_cast<int>(blockIdx.y)};
}

// The (batch, head) of a block, bh = batch * heads + head, and where its rows start (computed where
// used, from bh and the parameters: fewer values held in registers).
struct Head {
  int bh;
  int heads;
  int q_len;
  int offset;  // k_len - q_len: under causal, query i sees the keys j <= i + offset

  template <class Params>
  __device__ Head(const Params& p, int bh_)
      : bh(bh_), heads(p.heads), q_len(p.q_len), offset(p.k_len - p.q_len) {}

  __device__ __forceinline__ int batch() const { return bh / heads; }
  // Its first row of lse, di and the float32 dq (contiguous [B, H, Tq(, D)]).
  __device__ __forceinline__ size_t row() const { return static_cast<size_t>(bh) * q_len; }
  // Its first element (token 0, d 0) of an operand laid out by s.
  __device__ __forceinline__ long long at(const Strides& s) const {
    const int b = batch();
    return b * s.batch + (bh - b * heads) * s.head;
  }
};

// The first element of row `row` = (b * heads + h) * len + t of an operand laid out by s.
__device__ __forceinline__ long long row_offset(const Strides& s, int row, int heads, int len) {
  const int bh = row / len;
  const int b = bh / heads;
  return b * s.batch + (bh - b * heads) * s.head + (row - bh * len) * s.token;
}

__device__ __forceinline__ int frag_g() { return (threadIdx.x % 32) / 4; }
__device__ __forceinline__ int frag_t() { return threadIdx.x % 4; }

// Softmax works in base 2: x * log2(e) is formed by one FFMA from the raw score and mask value.
template <int ACT>
__device__ __forceinline__ float score_scale(float scale) {
  return ACT == kSoftmax ? scale * kLog2e : scale;
}
template <int ACT>
__device__ __forceinline__ float mask_scale() {
  return ACT == kSoftmax ? kLog2e : 1.f;
}

// The running statistics of the lane's two rows (g and g + 8 of the warp's slab).
struct RowState {
  float run_max[2] = {-INFINITY, -INFINITY};
  float run_sum[2] = {0.f, 0.f};
};

// Turns the raw products s[j] (keys n0 + 8 j + 2 t + c % 2, rows c / 2) of a forward tile into P:
// softmax: exp2(x - running max) with the running max and sum updated and rescale[h] the factor the
// row's output accumulator takes; relu: relu(x), rescale 1. Keys at or past limit[h] get P = 0.
template <int ACT, int NT, class Params>
__device__ __forceinline__ void score_step(float (&s)[NT][4], RowState& rows, float (&rescale)[2], const Params& p,
                                           const float* mask_row, int n0, const int (&limit)[2]) {
  const int t = frag_t();
  const float sc = score_scale<ACT>(p.scale);
  float mask_add[NT][2];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = n0 + 8 * j + 2 * t + e;
      mask_add[j][e] = mask_row != nullptr && key < p.k_len ? __ldg(mask_row + key) * mask_scale<ACT>() : 0.f;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rescale[h] = 1.f;
    if constexpr (ACT == kSoftmax) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = n0 + 8 * j + 2 * t + e;
          float& x = s[j][2 * h + e];
          x = key < limit[h] ? fmaf(x, sc, mask_add[j][e]) : -INFINITY;
          tile_max = fmaxf(tile_max, x);
        }
      }
      const float new_max = fmaxf(rows.run_max[h], mt::warp_allreduce<4>(tile_max, mt::MaxOp{}));
      // With no key kept so far the shift is 0, so exp2(-inf - shift) = 0 and nothing is NaN.
      const float shift = new_max == -INFINITY ? 0.f : new_max;
      const float alpha = mt::fast_exp2(rows.run_max[h] - shift);
      float tile_sum = 0.f;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[j][2 * h + e];
          x = mt::fast_exp2(x - shift);
          tile_sum += x;
        }
      }
      rows.run_sum[h] = fmaf(rows.run_sum[h], alpha, tile_sum);
      rows.run_max[h] = new_max;
      rescale[h] = alpha;
    } else {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = n0 + 8 * j + 2 * t + e;
          float& x = s[j][2 * h + e];
          const float y = fmaf(x, sc, mask_add[j][e]);
          x = key < limit[h] && y > 0.f ? y : 0.f;
        }
      }
    }
  }
}

// (1 / row sum, lse) of row h after the last tile: softmax 1 / sum and the base-e log-sum-exp (-inf
// and a factor 0 for a row without keys); relu 1 and 0.
template <int ACT>
__device__ __forceinline__ float2 row_finish(const RowState& rows, int h) {
  if constexpr (ACT == kSoftmax) {
    const float total = mt::warp_allreduce<4>(rows.run_sum[h], mt::SumOp{});
    return total > 0.f ? make_float2(1.f / total, (rows.run_max[h] + log2f(total)) * kLn2) : make_float2(0.f, -INFINITY);
  }
  return make_float2(1.f, 0.f);
}

// Backward, one element of S^T (key, query): (P, dS) from the raw product x_raw = q . k, the product
// dp = dO . v, the query's lse (base e) and D. Removed keys (kept == false) give 0, 0.
template <int ACT>
__device__ __forceinline__ float2 prob_and_dscore(float x_raw, float dp, float mask_add, bool kept, float lse,
                                                  float d, float scale) {
  const float x = fmaf(x_raw, score_scale<ACT>(scale), mask_add);
  if constexpr (ACT == kSoftmax) {
    const float prob = kept && lse != -INFINITY ? mt::fast_exp2(x - lse * kLog2e) : 0.f;
    return make_float2(prob, prob * (dp - d) * scale);
  }
  const bool on = kept && x > 0.f;
  return make_float2(on ? x : 0.f, on ? dp * scale : 0.f);
}

// The mask value (pre-scaled for the base-2 softmax) of `key`, 0 without a mask or past k_len.
template <int ACT, class Params>
__device__ __forceinline__ float key_mask(const Params& p, const Head& head, int key) {
  return p.mask != nullptr && key < p.k_len
             ? __ldg(p.mask + static_cast<size_t>(head.batch()) * p.k_len + key) * mask_scale<ACT>()
             : 0.f;
}

__device__ __forceinline__ void atomic_add_pair(float* row_ptr, int col, float x, float y, int head_dim, bool pairs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (pairs) {
    if (col < head_dim) atomicAdd(reinterpret_cast<float2*>(row_ptr + col), make_float2(x, y));
    return;
  }
#endif
  if (col < head_dim) atomicAdd(row_ptr + col, x);
  if (col + 1 < head_dim) atomicAdd(row_ptr + col + 1, y);
}

// dst[0..3] += v with one 16-byte atomic on sm_90 (dst 16-byte aligned), four float atomics before.
__device__ __forceinline__ void atomic_add_quad(float* dst, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(dst), v);
#else
  atomicAdd(dst, v.x);
  atomicAdd(dst + 1, v.y);
  atomicAdd(dst + 2, v.z);
  atomicAdd(dst + 3, v.w);
#endif
}

// Starts copying `count` floats (count <= kThreads) of src[start, start + count), zero past `limit`.
__device__ __forceinline__ void load_vector(float* dst, const float* src, int start, int count, int limit) {
  if (static_cast<int>(threadIdx.x) < count) {
    const bool ok = start + static_cast<int>(threadIdx.x) < limit;
    mt::cp_async_4(dst + threadIdx.x, ok ? src + start + threadIdx.x : src, ok);
  }
}

// Writes columns col, col + 1 (col even) of one output row: one 8-byte (float) or 4-byte (bf16)
// store when `vec` (rows 16-byte aligned, so col + 1 < head_dim with col), else element by element.
__device__ __forceinline__ void store_pair(float* row_ptr, int col, float x, float y, int head_dim, bool vec) {
  if (vec) {
    if (col < head_dim) *reinterpret_cast<float2*>(row_ptr + col) = make_float2(x, y);
  } else {
    if (col < head_dim) row_ptr[col] = x;
    if (col + 1 < head_dim) row_ptr[col + 1] = y;
  }
}

__device__ __forceinline__ void store_pair(__nv_bfloat16* row_ptr, int col, float x, float y, int head_dim, bool vec) {
  if (vec) {
    if (col < head_dim) *reinterpret_cast<__nv_bfloat162*>(row_ptr + col) = __floats2bfloat162_rn(x, y);
  } else {
    if (col < head_dim) row_ptr[col] = __float2bfloat16(x);
    if (col + 1 < head_dim) row_ptr[col + 1] = __float2bfloat16(y);
  }
}

// Forward epilogue: the lane's rows row0 + g and row0 + 8 + g of O (C fragments o[KD], unnormalized)
// divided by their sums, and their lse.
template <int ACT, int KD, class Params>
__device__ __forceinline__ void store_query_rows(const float (&o)[KD][4], const RowState& rows, const Params& p,
                                                 const Head& head, int row0) {
  const int g = frag_g();
  const int t = frag_t();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int query = row0 + g + 8 * h;
    const float2 fin = row_finish<ACT>(rows, h);
    if (query < p.q_len) {
      auto* out_row = p.out + head.at(p.out_strides) + query * p.out_strides.token;
#pragma unroll
      for (int dt = 0; dt < KD; ++dt) {
        store_pair(out_row, 8 * dt + 2 * t, o[dt][2 * h] * fin.x, o[dt][2 * h + 1] * fin.x, p.head_dim, p.vec);
      }
      if (t == 0) p.lse[head.row() + query] = fin.y;
    }
  }
}

// Backward: the query tiles [first, end) of BM queries that can see a key of the block at n0 (under
// causal, queries i >= n0 - offset).
template <int BM, class Params>
__device__ __forceinline__ int2 query_tile_range(const Params& p, const Head& head, int n0) {
  const int first_query = p.causal ? max(0, n0 - head.offset) : 0;
  const int end = (p.q_len + BM - 1) / BM;
  return make_int2(first_query >= p.q_len ? end : first_query / BM, end);
}

// Backward: starts loading lse and D of the query tile at m0 (softmax only).
template <int ACT, int BM, class Params>
__device__ __forceinline__ void load_row_stats(float* ls, float* dis, const Params& p, const Head& head, int m0) {
  if constexpr (ACT == kSoftmax) {
    load_vector(ls, p.lse + head.row(), m0, BM, p.q_len);
    load_vector(dis, p.di + head.row(), m0, BM, p.q_len);
  }
}

// Backward: turns the products st (S^T) and dpt (dP^T) of a warp's 16 keys from key0 and the query
// tile at m0 into P^T and dS^T in place. Element c of st[j]: key key0 + g + 8 (c / 2), query m0 + 8 j
// + 2 t + c % 2; ls and dis hold the tile's lse and D.
template <int ACT, int QT, class Params>
__device__ __forceinline__ void probs_and_dscores(float (&st)[QT][4], float (&dpt)[QT][4], const Params& p,
                                                  const Head& head, int key0, int m0, const float (&mask_add)[2],
                                                  const float* ls, const float* dis) {
  const int g = frag_g();
  const int t = frag_t();
#pragma unroll
  for (int j = 0; j < QT; ++j) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int key = key0 + g + 8 * (c / 2);
      const int col = 8 * j + 2 * t + c % 2;
      const int query = m0 + col;
      const bool kept = key < p.k_len && query < p.q_len && (!p.causal || key <= query + head.offset);
      const float l = ACT == kSoftmax ? ls[col] : 0.f;  // base-e lse; -inf for a row with no key
      const float d = ACT == kSoftmax ? dis[col] : 0.f;
      const float2 pd = prob_and_dscore<ACT>(st[j][c], dpt[j][c], mask_add[c / 2], kept, l, d, p.scale);
      st[j][c] = pd.x;
      dpt[j][c] = pd.y;
    }
  }
}

// Backward epilogue: the lane's keys key0 + g and key0 + 8 + g of dK and dV (C fragments).
template <int KD, class Params>
__device__ __forceinline__ void store_key_rows(const float (&dk)[KD][4], const float (&dv)[KD][4], const Params& p,
                                               const Head& head, int key0) {
  const int g = frag_g();
  const int t = frag_t();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key0 + g + 8 * h;
    if (key < p.k_len) {
      auto* dk_row = p.dk + head.at(p.dk_strides) + key * p.dk_strides.token;
      auto* dv_row = p.dv + head.at(p.dv_strides) + key * p.dv_strides.token;
#pragma unroll
      for (int dt = 0; dt < KD; ++dt) {
        store_pair(dk_row, 8 * dt + 2 * t, dk[dt][2 * h], dk[dt][2 * h + 1], p.head_dim, p.vec);
        store_pair(dv_row, 8 * dt + 2 * t, dv[dt][2 * h], dv[dt][2 * h + 1], p.head_dim, p.vec);
      }
    }
  }
}

// di[r] = sum_d dout[r, d] * out[r, d] in float32 for the rows r = (b * heads + h) * q_len + i, one
// warp per row.
template <class T>
__global__ void __launch_bounds__(kDotWarps * 32)
    attention_bw_dot(float* di, const T* dout, Strides dout_strides, const T* out, Strides out_strides, int heads,
                     int q_len, int rows, int head_dim) {
  const int row = blockIdx.x * kDotWarps + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % 32;
  const T* dout_row = dout + row_offset(dout_strides, row, heads, q_len);
  const T* out_row = out + row_offset(out_strides, row, heads, q_len);
  float acc = 0.f;
  for (int d = lane; d < head_dim; d += 32) acc = fmaf(static_cast<float>(dout_row[d]), static_cast<float>(out_row[d]), acc);
  acc = mt::warp_allreduce(acc, mt::SumOp{});
  if (lane == 0) di[row] = acc;
}

// Sizes every launcher accepts: positive, D <= 128, B * H * T * D within 32-bit element counts
// per operand and the grid's y limit for the query / key blocks.
inline bool sizes_ok(int batch, int heads, int q_len, int k_len, int head_dim, int activation) {
  if (batch <= 0 || heads <= 0 || q_len <= 0 || k_len <= 0 || head_dim <= 0 || head_dim > kMaxHeadDim) return false;
  if (activation != kSoftmax && activation != kRelu) return false;
  const long long bh = static_cast<long long>(batch) * heads;
  if (bh * q_len * head_dim > INT_MAX || bh * k_len * head_dim > INT_MAX) return false;
  return (q_len + kFwRows - 1) / kFwRows <= kMaxGridY && (k_len + kBwKeys - 1) / kBwKeys <= kMaxGridY;
}

// Strides every launcher accepts for a [batch, heads, len, head_dim] operand (sizes_ok already
// holding): none negative, the token stride at most kMaxTokenStride and every offset within long
// long; for an operand a kernel writes (`written`), also rows that never overlap: ordered by stride,
// each dim longer than 1 steps at least over the extent of the smaller ones.
inline bool strides_ok(const Strides& s, int batch, int heads, int len, int head_dim, bool written) {
  if (s.token > kMaxTokenStride) return false;
  struct Dim {
    long long stride, size;
  };
  Dim dims[3] = {{s.token, len}, {s.head, heads}, {s.batch, batch}};
  std::sort(dims, dims + 3, [](const Dim& x, const Dim& y) { return x.stride < y.stride; });
  long long extent = head_dim;
  for (const Dim& d : dims) {
    if (d.stride < 0) return false;
    if (d.size == 1) continue;
    if ((written && d.stride < extent) || d.stride > (LLONG_MAX - extent) / (d.size - 1)) return false;
    extent += (d.size - 1) * d.stride;
  }
  return true;
}

}  // namespace mt_attn
