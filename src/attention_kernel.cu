// Fused attention, forward and backward (FlashAttention-2 style), fp32 on the CUDA cores (FFMA), with
// a softmax or a ReLU activation. Nothing of size Tq x Tk is ever stored.
//
// Shapes, all contiguous row-major fp32: q, out, dq [B, H, Tq, D]; k, v, dk, dv [B, H, Tk, D];
// lse [B, H, Tq]; mask (optional, additive) [B, Tk]. For query i and key j of one (b, h):
//   x[i, j] = scale * q[i] . k[j] + mask[b, j],
//   key j is kept when j <= i + (Tk - Tq) under causal (every key otherwise);
//   softmax: out[i] = sum_j p[i, j] v[j], p = exp(x - lse[i]) over kept keys,
//            lse[i] = log(sum of exp(x[i, j]) over kept keys) (-inf when no key is kept: that row of
//            out is 0 and its gradients are 0, never NaN);
//   relu:    out[i] = sum_j relu(x[i, j]) v[j] over kept keys (no normalization); lse is written as 0.
// A mask of -inf removes a key under both activations; finite values are plain additions.
// D (any size up to 128) is padded with zeros to a bucket DP of 32, 64 or 128 in shared memory.
//
// Thread mapping: blocks of 4 warps; the 32 lanes of a warp form 4 row groups rg = lane / 8 times
// 8 column groups cg = lane % 8. Micro-tiles are strided so that one float4 shared-memory read
// instruction of a warp touches at most 8 distinct 16-byte words, all in distinct banks (tiles have
// rows of DP + 4 floats, score tiles rows of (keys or queries) + 8 floats).
//
// Forward, attention_fw<DP, ACT>: grid (B * H, query blocks of BM = 64; under causal the last block,
// which sees the most keys, is scheduled first). Warp w owns query rows 16w + rg + 4i (i < 4).
// Per tile of BN keys (64; 32 for DP = 128):
//   S = Q K^T         lane: its 4 rows x keys cg + 8j (j < BN / 8), float4 reads along d;
//   online softmax    running row max, reduced over the row group's 8 lanes by shuffles each tile,
//                     and a running per-lane sum, reduced once at the end; relu: P = relu(S);
//   O += P V          P goes through shared memory (rows of the warp); lane: its 4 rows x output
//                     columns 32g + 4cg + c (g < DP / 32, c < 4), float4 reads of P and V.
// Q stays in shared memory; K and V are single tiles loaded with cp.async: K of tile t + 1 is in
// flight during the softmax and P V of tile t, V of tile t + 1 during S of tile t + 1.
//
// Backward: attention_bw_dot: D_i = sum_d dO[i, d] O[i, d] (softmax only), one warp per row.
// attention_bw<DP, ACT>: grid (B * H, key blocks of BN keys: 4 warps x 4 row groups x TK keys per lane;
// 64, or 32 for DP = 128). The block keeps its K and V tiles in shared memory and dK, dV in registers,
// and walks the query tiles of BM queries (64; 32 for DP = 128) that can see its keys (from the
// diagonal on under causal). Warp w owns keys 4 TK w + rg + 4i (i < TK); per query tile:
//   S^T = K Q^T, dP^T = V dO^T   lane: its keys x queries cg + 8j (j < BM / 8);
//   P^T = exp(x^T - lse), dS^T = P^T (dP^T - D) scale   (relu: P^T = relu(x^T), dS^T = [x^T > 0] dP^T
//                                scale), both to shared memory;
//   dV += P^T dO, dK += dS^T Q   lane: its keys x columns 32g + 4cg + c;
//   dQ += dS K                   lane: queries (4w + rg) BM/16 + r (r < BM / 16) x columns 32g + 4cg + c,
//                                added to dq with float4 atomics on sm_90 (scalar ones before; dq is
//                                zeroed first).
// The next Q and dO tiles load (cp.async) while dQ is computed. The order of the atomic additions
// varies from run to run, so dq may differ in the last bits between runs.
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cmath>

#include "includes/cuda_check.cuh"
#include "includes/ptx.cuh"
#include "includes/vec.cuh"

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kFwRows = kWarps * 16;  // query rows of a forward block
constexpr int kMaxHeadDim = 128;
constexpr int kDotWarps = 8;          // warps (rows) per block of attention_bw_dot
constexpr int kMaxGridY = 65535;

enum Activation { kSoftmax = 0, kRelu = 1 };

// Tile sizes per head-dim bucket (see the top of the file). kMinBlocks: blocks per SM that
// __launch_bounds__ asks the register allocation to allow (at most what the shared memory allows;
// lower where more would make the compiler spill).
template <int DP>
struct FwConfig;
template <>
struct FwConfig<32> {
  static constexpr int kKeys = 64, kMinBlocks = 3;
};
template <>
struct FwConfig<64> {
  static constexpr int kKeys = 64, kMinBlocks = 3;
};
template <>
struct FwConfig<128> {
  static constexpr int kKeys = 32, kMinBlocks = 2;
};

template <int DP>
struct BwConfig;
template <>
struct BwConfig<32> {
  static constexpr int kKeysPerLane = 4, kQueries = 64, kMinBlocks = 2;
};
template <>
struct BwConfig<64> {
  static constexpr int kKeysPerLane = 4, kQueries = 64, kMinBlocks = 2;
};
template <>
struct BwConfig<128> {
  static constexpr int kKeysPerLane = 2, kQueries = 32, kMinBlocks = 2;
};

template <int DP>
constexpr int fw_smem_floats() {
  constexpr int BN = FwConfig<DP>::kKeys;
  return (kFwRows + 2 * BN) * (DP + 4) + kFwRows * (BN + 8);
}

template <int DP>
constexpr int bw_smem_floats() {
  constexpr int BN = kWarps * 4 * BwConfig<DP>::kKeysPerLane;
  constexpr int BM = BwConfig<DP>::kQueries;
  return (2 * BN + 2 * BM) * (DP + 4) + 2 * BN * (BM + 8) + 2 * BM;
}

struct FwParams {
  float* out;
  float* lse;
  const float* q;
  const float* k;
  const float* v;
  const float* mask;  // [batch, k_len] or nullptr
  int heads;
  int q_len;
  int k_len;
  int head_dim;
  int causal;
  float scale;
  int vec4;  // head_dim % 4 == 0 and every pointer 16-byte aligned
};

struct BwParams {
  float* dq;
  float* dk;
  float* dv;
  const float* dout;
  const float* q;
  const float* k;
  const float* v;
  const float* lse;
  const float* di;
  const float* mask;
  int heads;
  int q_len;
  int k_len;
  int head_dim;
  int causal;
  float scale;
  int vec4;
};

__device__ __forceinline__ float4 lds4(const float* p) { return *reinterpret_cast<const float4*>(p); }

__device__ __forceinline__ float component(const float4& v, int c) {
  return c == 0 ? v.x : (c == 1 ? v.y : (c == 2 ? v.z : v.w));
}

__device__ __forceinline__ float dot4(const float4& a, const float4& b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// acc[0..3] += s * v
__device__ __forceinline__ void axpy4(float* acc, float s, const float4& v) {
  acc[0] = fmaf(s, v.x, acc[0]);
  acc[1] = fmaf(s, v.y, acc[1]);
  acc[2] = fmaf(s, v.z, acc[2]);
  acc[3] = fmaf(s, v.w, acc[3]);
}

// Max over the 8 lanes of a row group (lanes differing in their low 3 bits).
__device__ __forceinline__ float row_group_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
}

__device__ __forceinline__ float row_group_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v + __shfl_xor_sync(0xffffffffu, v, 4);
}

// Starts copying rows [row0, row0 + ROWS) of a row-major [rows, head_dim] matrix into the shared
// tile [ROWS][DP + 4]; rows >= `rows` and columns in [head_dim, DP) are zero-filled.
template <int ROWS, int DP>
__device__ __forceinline__ void load_tile(float* tile, const float* src, int row0, int rows, int head_dim,
                                          bool vec4) {
  constexpr int LD = DP + 4;
  if (vec4) {
    constexpr int kPerRow = DP / 4;
    static_assert((ROWS * kPerRow) % kThreads == 0, "float4 chunks must divide evenly over the block");
#pragma unroll
    for (int it = 0; it < ROWS * kPerRow / kThreads; ++it) {
      const int chunk = it * kThreads + threadIdx.x;
      const int r = chunk / kPerRow;
      const int col = (chunk % kPerRow) * 4;
      const bool ok = row0 + r < rows && col < head_dim;
      mt::cp_async_16(tile + r * LD + col, ok ? src + static_cast<size_t>(row0 + r) * head_dim + col : src, ok);
    }
  } else {
    static_assert((ROWS * DP) % kThreads == 0, "elements must divide evenly over the block");
#pragma unroll 4
    for (int it = 0; it < ROWS * DP / kThreads; ++it) {
      const int e = it * kThreads + threadIdx.x;
      const int r = e / DP;
      const int col = e % DP;
      const bool ok = row0 + r < rows && col < head_dim;
      mt::cp_async_4(tile + r * LD + col, ok ? src + static_cast<size_t>(row0 + r) * head_dim + col : src, ok);
    }
  }
}

// Starts copying n = `count` floats (count <= kThreads) of src[start, start + count), zero past `limit`.
__device__ __forceinline__ void load_vector(float* dst, const float* src, int start, int count, int limit) {
  if (static_cast<int>(threadIdx.x) < count) {
    const bool ok = start + static_cast<int>(threadIdx.x) < limit;
    mt::cp_async_4(dst + threadIdx.x, ok ? src + start + threadIdx.x : src, ok);
  }
}

// Writes a lane's 4-column group (columns col .. col + 3) of one output row, as one float4 when the
// head dim allows, else column by column up to head_dim.
__device__ __forceinline__ void store_group(float* row_ptr, int col, const float* vals, int head_dim, bool vec4) {
  if (vec4) {
    if (col < head_dim) mt::store_float4(row_ptr + col, make_float4(vals[0], vals[1], vals[2], vals[3]));
  } else {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (col + c < head_dim) row_ptr[col + c] = vals[c];
    }
  }
}

__device__ __forceinline__ void atomic_add_group(float* row_ptr, int col, const float* vals, int head_dim,
                                                 bool vec4) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (vec4) {
    if (col < head_dim) {
      atomicAdd(reinterpret_cast<float4*>(row_ptr + col), make_float4(vals[0], vals[1], vals[2], vals[3]));
    }
    return;
  }
#endif
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    if (col + c < head_dim) atomicAdd(row_ptr + col + c, vals[c]);
  }
}

// ---- forward -----------------------------------------------------------------------------------
template <int DP, int ACT>
__global__ void __launch_bounds__(kThreads, FwConfig<DP>::kMinBlocks) attention_fw(const FwParams p) {
  constexpr int BM = kFwRows;
  constexpr int BN = FwConfig<DP>::kKeys;
  constexpr int TR = 4;        // query rows per lane
  constexpr int TN = BN / 8;   // keys per lane
  constexpr int TG = DP / 32;  // float4 groups of output columns per lane
  constexpr int LD = DP + 4;
  constexpr int LDP = BN + 8;
  extern __shared__ float4 smem_f4[];
  float* qs = reinterpret_cast<float*>(smem_f4);
  float* ks = qs + BM * LD;
  float* vs = ks + BN * LD;
  float* ps = vs + BN * LD;

  const int bh = blockIdx.x;
  const int q0 = (p.causal ? gridDim.y - 1 - blockIdx.y : blockIdx.y) * BM;
  const int warp = threadIdx.x / 32;
  const int rg = (threadIdx.x % 32) / 8;
  const int cg = threadIdx.x % 8;
  const int offset = p.k_len - p.q_len;
  const size_t q_base = static_cast<size_t>(bh) * p.q_len;
  const size_t k_base = static_cast<size_t>(bh) * p.k_len;
  const float* kg = p.k + k_base * p.head_dim;
  const float* vg = p.v + k_base * p.head_dim;
  const float* mask_row = p.mask != nullptr ? p.mask + static_cast<size_t>(bh / p.heads) * p.k_len : nullptr;

  const int row0 = warp * 16 + rg;  // the lane's rows: row0 + 4i
  int limit[TR];                    // keys [0, limit) are kept for the row
#pragma unroll
  for (int i = 0; i < TR; ++i) {
    const int query = q0 + row0 + 4 * i;
    limit[i] = query >= p.q_len ? 0 : (p.causal ? min(p.k_len, query + offset + 1) : p.k_len);
  }
  const int key_end = p.causal ? max(0, min(p.k_len, min(q0 + BM, p.q_len) + offset)) : p.k_len;
  const int num_tiles = (key_end + BN - 1) / BN;
  // Softmax works in base 2: x * log2(e) is formed by one FFMA from the raw score and mask value.
  const float score_scale = ACT == kSoftmax ? p.scale * kLog2e : p.scale;
  const float mask_scale = ACT == kSoftmax ? kLog2e : 1.f;

  float o[TR][4 * TG];
  float run_max[TR];
  float run_sum[TR];
#pragma unroll
  for (int i = 0; i < TR; ++i) {
    run_max[i] = -INFINITY;
    run_sum[i] = 0.f;
#pragma unroll
    for (int c = 0; c < 4 * TG; ++c) o[i][c] = 0.f;
  }

  if (num_tiles > 0) {
    load_tile<BM, DP>(qs, p.q + q_base * p.head_dim, q0, p.q_len, p.head_dim, p.vec4);
    load_tile<BN, DP>(ks, kg, 0, p.k_len, p.head_dim, p.vec4);
    mt::cp_async_commit();
    load_tile<BN, DP>(vs, vg, 0, p.k_len, p.head_dim, p.vec4);
    mt::cp_async_commit();
  }
  for (int t = 0; t < num_tiles; ++t) {
    const int n0 = t * BN;
    mt::cp_async_wait<1>();  // Q and this K tile (this V tile may still be in flight)
    __syncthreads();

    float s[TR][TN];
#pragma unroll
    for (int i = 0; i < TR; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) s[i][j] = 0.f;
    }
#pragma unroll 4
    for (int d = 0; d < DP; d += 4) {
      float4 qv[TR];
#pragma unroll
      for (int i = 0; i < TR; ++i) qv[i] = lds4(qs + (row0 + 4 * i) * LD + d);
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const float4 kv = lds4(ks + (cg + 8 * j) * LD + d);
#pragma unroll
        for (int i = 0; i < TR; ++i) s[i][j] = dot4(qv[i], kv, s[i][j]);
      }
    }
    __syncthreads();  // every warp is done with this K tile
    if (t + 1 < num_tiles) load_tile<BN, DP>(ks, kg, n0 + BN, p.k_len, p.head_dim, p.vec4);
    mt::cp_async_commit();

    float mask_add[TN];
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int key = n0 + cg + 8 * j;
      mask_add[j] = mask_row != nullptr && key < p.k_len ? __ldg(mask_row + key) * mask_scale : 0.f;
    }
#pragma unroll
    for (int i = 0; i < TR; ++i) {
      if constexpr (ACT == kSoftmax) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          const float x = n0 + cg + 8 * j < limit[i] ? fmaf(s[i][j], score_scale, mask_add[j]) : -INFINITY;
          s[i][j] = x;
          tile_max = fmaxf(tile_max, x);
        }
        const float new_max = fmaxf(run_max[i], row_group_max(tile_max));
        // With no key kept so far the shift is 0, so exp2(-inf - shift) = 0 and nothing is NaN.
        const float shift = new_max == -INFINITY ? 0.f : new_max;
        const float alpha = mt::fast_exp2(run_max[i] - shift);
        float tile_sum = 0.f;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          s[i][j] = mt::fast_exp2(s[i][j] - shift);
          tile_sum += s[i][j];
        }
        run_sum[i] = fmaf(run_sum[i], alpha, tile_sum);
        run_max[i] = new_max;
#pragma unroll
        for (int c = 0; c < 4 * TG; ++c) o[i][c] *= alpha;
      } else {
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          const float x = fmaf(s[i][j], score_scale, mask_add[j]);
          s[i][j] = n0 + cg + 8 * j < limit[i] && x > 0.f ? x : 0.f;
        }
      }
#pragma unroll
      for (int j = 0; j < TN; ++j) ps[(row0 + 4 * i) * LDP + cg + 8 * j] = s[i][j];
    }
    mt::cp_async_wait<1>();  // this V tile (the next K tile may still be in flight)
    __syncthreads();         // ... visible to all, and P visible to its warp

#pragma unroll 4
    for (int n = 0; n < BN; n += 4) {
      float4 pv[TR];
#pragma unroll
      for (int i = 0; i < TR; ++i) pv[i] = lds4(ps + (row0 + 4 * i) * LDP + n);
#pragma unroll
      for (int nn = 0; nn < 4; ++nn) {
#pragma unroll
        for (int g = 0; g < TG; ++g) {
          const float4 vv = lds4(vs + (n + nn) * LD + 32 * g + 4 * cg);
#pragma unroll
          for (int i = 0; i < TR; ++i) axpy4(&o[i][4 * g], component(pv[i], nn), vv);
        }
      }
    }
    __syncthreads();  // every warp is done with this V tile and its P rows
    if (t + 1 < num_tiles) load_tile<BN, DP>(vs, vg, n0 + BN, p.k_len, p.head_dim, p.vec4);
    mt::cp_async_commit();
  }

#pragma unroll
  for (int i = 0; i < TR; ++i) {
    const int query = q0 + row0 + 4 * i;
    float inv = 1.f;
    float lse = 0.f;
    if constexpr (ACT == kSoftmax) {
      const float total = row_group_sum(run_sum[i]);
      inv = total > 0.f ? 1.f / total : 0.f;
      lse = total > 0.f ? (run_max[i] + log2f(total)) * kLn2 : -INFINITY;
    }
    if (query < p.q_len) {
      float* out_row = p.out + (q_base + query) * p.head_dim;
#pragma unroll
      for (int g = 0; g < TG; ++g) {
        float vals[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) vals[c] = o[i][4 * g + c] * inv;
        store_group(out_row, 32 * g + 4 * cg, vals, p.head_dim, p.vec4);
      }
      if (cg == 0) p.lse[q_base + query] = lse;
    }
  }
}

// ---- backward ------------------------------------------------------------------------------------
// di[r] = sum_d dout[r, d] * out[r, d], one warp per row.
__global__ void __launch_bounds__(kDotWarps * 32)
    attention_bw_dot(float* di, const float* dout, const float* out, int rows, int head_dim) {
  const int row = blockIdx.x * kDotWarps + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % 32;
  const size_t base = static_cast<size_t>(row) * head_dim;
  float acc = 0.f;
  for (int d = lane; d < head_dim; d += 32) acc = fmaf(dout[base + d], out[base + d], acc);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (lane == 0) di[row] = acc;
}

template <int DP, int ACT>
__global__ void __launch_bounds__(kThreads, BwConfig<DP>::kMinBlocks) attention_bw(const BwParams p) {
  constexpr int TK = BwConfig<DP>::kKeysPerLane;
  constexpr int BN = kWarps * 4 * TK;  // keys of the block
  constexpr int BM = BwConfig<DP>::kQueries;
  constexpr int TQ = BM / 8;   // query columns per lane in S^T
  constexpr int QR = BM / 16;  // dQ rows per lane
  constexpr int TG = DP / 32;
  constexpr int LD = DP + 4;
  constexpr int LDT = BM + 8;
  static_assert(QR == 2 || QR == 4, "dS^T is read as float2 or float4 along the queries");
  extern __shared__ float4 smem_f4[];
  float* ks = reinterpret_cast<float*>(smem_f4);
  float* vs = ks + BN * LD;
  float* qs = vs + BN * LD;
  float* dos = qs + BM * LD;
  float* pt = dos + BM * LD;   // P^T [BN][LDT]
  float* dst = pt + BN * LDT;  // dS^T [BN][LDT]
  float* ls = dst + BN * LDT;  // lse of the query tile
  float* dis = ls + BM;        // D of the query tile

  const int bh = blockIdx.x;
  const int n0 = blockIdx.y * BN;
  const int warp = threadIdx.x / 32;
  const int rg = (threadIdx.x % 32) / 8;
  const int cg = threadIdx.x % 8;
  const int offset = p.k_len - p.q_len;
  const size_t q_base = static_cast<size_t>(bh) * p.q_len;
  const size_t k_base = static_cast<size_t>(bh) * p.k_len;
  const float* qg = p.q + q_base * p.head_dim;
  const float* dog = p.dout + q_base * p.head_dim;
  const float score_scale = ACT == kSoftmax ? p.scale * kLog2e : p.scale;
  const float mask_scale = ACT == kSoftmax ? kLog2e : 1.f;

  const int key0 = warp * 4 * TK + rg;  // the lane's keys: key0 + 4i (in the block)
  float mask_add[TK];
#pragma unroll
  for (int i = 0; i < TK; ++i) {
    const int key = n0 + key0 + 4 * i;
    mask_add[i] = p.mask != nullptr && key < p.k_len
                      ? __ldg(p.mask + static_cast<size_t>(bh / p.heads) * p.k_len + key) * mask_scale
                      : 0.f;
  }
  // Query tiles that can see a key of this block: under causal, queries i >= n0 - offset.
  const int first_query = p.causal ? max(0, n0 - offset) : 0;
  const int qt_end = (p.q_len + BM - 1) / BM;
  const int qt_begin = first_query >= p.q_len ? qt_end : first_query / BM;

  float dk[TK][4 * TG];
  float dv[TK][4 * TG];
#pragma unroll
  for (int i = 0; i < TK; ++i) {
#pragma unroll
    for (int c = 0; c < 4 * TG; ++c) dk[i][c] = dv[i][c] = 0.f;
  }

  if (qt_begin < qt_end) {
    load_tile<BN, DP>(ks, p.k + k_base * p.head_dim, n0, p.k_len, p.head_dim, p.vec4);
    load_tile<BN, DP>(vs, p.v + k_base * p.head_dim, n0, p.k_len, p.head_dim, p.vec4);
    load_tile<BM, DP>(qs, qg, qt_begin * BM, p.q_len, p.head_dim, p.vec4);
    load_tile<BM, DP>(dos, dog, qt_begin * BM, p.q_len, p.head_dim, p.vec4);
    if constexpr (ACT == kSoftmax) {
      load_vector(ls, p.lse + q_base, qt_begin * BM, BM, p.q_len);
      load_vector(dis, p.di + q_base, qt_begin * BM, BM, p.q_len);
    }
    mt::cp_async_commit();
  }
  for (int qt = qt_begin; qt < qt_end; ++qt) {
    const int m0 = qt * BM;
    mt::cp_async_wait<0>();
    __syncthreads();

    float st[TK][TQ];
    float dpt[TK][TQ];
#pragma unroll
    for (int i = 0; i < TK; ++i) {
#pragma unroll
      for (int j = 0; j < TQ; ++j) st[i][j] = dpt[i][j] = 0.f;
    }
#pragma unroll 2
    for (int d = 0; d < DP; d += 4) {
      float4 kv[TK];
      float4 vv[TK];
#pragma unroll
      for (int i = 0; i < TK; ++i) {
        kv[i] = lds4(ks + (key0 + 4 * i) * LD + d);
        vv[i] = lds4(vs + (key0 + 4 * i) * LD + d);
      }
#pragma unroll
      for (int j = 0; j < TQ; ++j) {
        const float4 qv = lds4(qs + (cg + 8 * j) * LD + d);
        const float4 gv = lds4(dos + (cg + 8 * j) * LD + d);
#pragma unroll
        for (int i = 0; i < TK; ++i) {
          st[i][j] = dot4(kv[i], qv, st[i][j]);
          dpt[i][j] = dot4(vv[i], gv, dpt[i][j]);
        }
      }
    }

    float row_lse[TQ];  // base-2 lse of the query; +inf for a row with no key (so P = 0)
    float row_d[TQ];
    if constexpr (ACT == kSoftmax) {
#pragma unroll
      for (int j = 0; j < TQ; ++j) {
        const float l = ls[cg + 8 * j];
        row_lse[j] = l == -INFINITY ? INFINITY : l * kLog2e;
        row_d[j] = dis[cg + 8 * j];
      }
    }
#pragma unroll
    for (int i = 0; i < TK; ++i) {
      const int key = n0 + key0 + 4 * i;
#pragma unroll
      for (int j = 0; j < TQ; ++j) {
        const int query = m0 + cg + 8 * j;
        const bool kept = key < p.k_len && query < p.q_len && (!p.causal || key <= query + offset);
        const float x = fmaf(st[i][j], score_scale, mask_add[i]);
        float prob;
        float dscore;
        if constexpr (ACT == kSoftmax) {
          prob = kept ? mt::fast_exp2(x - row_lse[j]) : 0.f;
          dscore = prob * (dpt[i][j] - row_d[j]) * p.scale;
        } else {
          const bool on = kept && x > 0.f;
          prob = on ? x : 0.f;
          dscore = on ? dpt[i][j] * p.scale : 0.f;
        }
        pt[(key0 + 4 * i) * LDT + cg + 8 * j] = prob;
        dst[(key0 + 4 * i) * LDT + cg + 8 * j] = dscore;
      }
    }
    __syncthreads();  // P^T and dS^T complete (dQ reads every warp's rows of dS^T)

#pragma unroll 2
    for (int m = 0; m < BM; m += 4) {
      float4 pv[TK];
      float4 sv[TK];
#pragma unroll
      for (int i = 0; i < TK; ++i) {
        pv[i] = lds4(pt + (key0 + 4 * i) * LDT + m);
        sv[i] = lds4(dst + (key0 + 4 * i) * LDT + m);
      }
#pragma unroll
      for (int mm = 0; mm < 4; ++mm) {
#pragma unroll
        for (int g = 0; g < TG; ++g) {
          const float4 gv = lds4(dos + (m + mm) * LD + 32 * g + 4 * cg);
          const float4 qv = lds4(qs + (m + mm) * LD + 32 * g + 4 * cg);
#pragma unroll
          for (int i = 0; i < TK; ++i) {
            axpy4(&dv[i][4 * g], component(pv[i], mm), gv);
            axpy4(&dk[i][4 * g], component(sv[i], mm), qv);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this Q and dO tile
    if (qt + 1 < qt_end) {
      load_tile<BM, DP>(qs, qg, m0 + BM, p.q_len, p.head_dim, p.vec4);
      load_tile<BM, DP>(dos, dog, m0 + BM, p.q_len, p.head_dim, p.vec4);
      if constexpr (ACT == kSoftmax) {
        load_vector(ls, p.lse + q_base, m0 + BM, BM, p.q_len);
        load_vector(dis, p.di + q_base, m0 + BM, BM, p.q_len);
      }
    }
    mt::cp_async_commit();

    const int dq_row0 = (warp * 4 + rg) * QR;  // the lane's dQ rows: dq_row0 + r
    float acc[QR][4 * TG];
#pragma unroll
    for (int r = 0; r < QR; ++r) {
#pragma unroll
      for (int c = 0; c < 4 * TG; ++c) acc[r][c] = 0.f;
    }
#pragma unroll 8
    for (int n = 0; n < BN; ++n) {
      float sv[QR];
      if constexpr (QR == 4) {
        const float4 t4 = lds4(dst + n * LDT + dq_row0);
        sv[0] = t4.x;
        sv[1] = t4.y;
        sv[2] = t4.z;
        sv[3] = t4.w;
      } else {
        const float2 t2 = *reinterpret_cast<const float2*>(dst + n * LDT + dq_row0);
        sv[0] = t2.x;
        sv[1] = t2.y;
      }
#pragma unroll
      for (int g = 0; g < TG; ++g) {
        const float4 kv = lds4(ks + n * LD + 32 * g + 4 * cg);
#pragma unroll
        for (int r = 0; r < QR; ++r) axpy4(&acc[r][4 * g], sv[r], kv);
      }
    }
#pragma unroll
    for (int r = 0; r < QR; ++r) {
      const int query = m0 + dq_row0 + r;
      if (query < p.q_len) {
        float* dq_row = p.dq + (q_base + query) * p.head_dim;
#pragma unroll
        for (int g = 0; g < TG; ++g) atomic_add_group(dq_row, 32 * g + 4 * cg, &acc[r][4 * g], p.head_dim, p.vec4);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < TK; ++i) {
    const int key = n0 + key0 + 4 * i;
    if (key < p.k_len) {
      float* dk_row = p.dk + (k_base + key) * p.head_dim;
      float* dv_row = p.dv + (k_base + key) * p.head_dim;
#pragma unroll
      for (int g = 0; g < TG; ++g) {
        store_group(dk_row, 32 * g + 4 * cg, &dk[i][4 * g], p.head_dim, p.vec4);
        store_group(dv_row, 32 * g + 4 * cg, &dv[i][4 * g], p.head_dim, p.vec4);
      }
    }
  }
}

// ---- launchers ---------------------------------------------------------------------------------
// Raises a kernel's dynamic shared-memory limit (needed above 48 KB) once per device.
template <class Kernel>
cudaError_t allow_shared_memory(Kernel kernel, int bytes, std::atomic<unsigned long long>* done_devices) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const unsigned long long bit = device < 64 ? 1ull << device : 0ull;
  if (bit != 0 && (done_devices->load() & bit) != 0) return cudaSuccess;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status == cudaSuccess) done_devices->fetch_or(bit);
  return status;
}

template <int DP, int ACT>
int launch_fw_bucket(const FwParams& p, int batch_heads, cudaStream_t stream) {
  static std::atomic<unsigned long long> configured{0};
  constexpr int bytes = fw_smem_floats<DP>() * static_cast<int>(sizeof(float));
  MT_RETURN_IF_ERROR(allow_shared_memory(attention_fw<DP, ACT>, bytes, &configured));
  const dim3 grid(static_cast<unsigned>(batch_heads), static_cast<unsigned>((p.q_len + kFwRows - 1) / kFwRows));
  attention_fw<DP, ACT><<<grid, kThreads, bytes, stream>>>(p);
  return mt_launch_status();
}

template <int DP, int ACT>
int launch_bw_bucket(const BwParams& p, int batch_heads, cudaStream_t stream) {
  static std::atomic<unsigned long long> configured{0};
  constexpr int BN = kWarps * 4 * BwConfig<DP>::kKeysPerLane;
  constexpr int bytes = bw_smem_floats<DP>() * static_cast<int>(sizeof(float));
  MT_RETURN_IF_ERROR(allow_shared_memory(attention_bw<DP, ACT>, bytes, &configured));
  const dim3 grid(static_cast<unsigned>(batch_heads), static_cast<unsigned>((p.k_len + BN - 1) / BN));
  attention_bw<DP, ACT><<<grid, kThreads, bytes, stream>>>(p);
  return mt_launch_status();
}

template <int ACT>
int launch_fw_activation(const FwParams& p, int batch_heads, cudaStream_t stream) {
  if (p.head_dim <= 32) return launch_fw_bucket<32, ACT>(p, batch_heads, stream);
  if (p.head_dim <= 64) return launch_fw_bucket<64, ACT>(p, batch_heads, stream);
  return launch_fw_bucket<128, ACT>(p, batch_heads, stream);
}

template <int ACT>
int launch_bw_activation(const BwParams& p, int batch_heads, cudaStream_t stream) {
  if (p.head_dim <= 32) return launch_bw_bucket<32, ACT>(p, batch_heads, stream);
  if (p.head_dim <= 64) return launch_bw_bucket<64, ACT>(p, batch_heads, stream);
  return launch_bw_bucket<128, ACT>(p, batch_heads, stream);
}

// Sizes every launcher accepts: positive, D <= 128, B * H * T * D within 32-bit element counts
// per operand and the grid's y limit for the query / key blocks.
bool sizes_ok(int batch, int heads, int q_len, int k_len, int head_dim, int activation) {
  if (batch <= 0 || heads <= 0 || q_len <= 0 || k_len <= 0 || head_dim <= 0 || head_dim > kMaxHeadDim) return false;
  if (activation != kSoftmax && activation != kRelu) return false;
  const long long bh = static_cast<long long>(batch) * heads;
  if (bh * q_len * head_dim > INT_MAX || bh * k_len * head_dim > INT_MAX) return false;
  return (q_len + kFwRows - 1) / kFwRows <= kMaxGridY && (k_len + 31) / 32 <= kMaxGridY;
}

}  // namespace

MT_DEFINE_ERROR_STRING()

extern "C" int launch_attention_fw(float* out, float* lse, const float* q, const float* k, const float* v,
                                   const float* mask, int batch, int heads, int q_len, int k_len, int head_dim,
                                   int causal, int activation, float scale, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(out == nullptr || lse == nullptr || q == nullptr || k == nullptr || v == nullptr);
  MT_RETURN_IF_INVALID(!sizes_ok(batch, heads, q_len, k_len, head_dim, activation));
  const bool vec4 = head_dim % 4 == 0 && mt::is_aligned16(out) && mt::is_aligned16(q) && mt::is_aligned16(k) &&
                    mt::is_aligned16(v);
  const FwParams p = {out, lse, q, k, v, mask, heads, q_len, k_len, head_dim, causal != 0, scale, vec4};
  const int batch_heads = batch * heads;
  return activation == kSoftmax ? launch_fw_activation<kSoftmax>(p, batch_heads, stream)
                                : launch_fw_activation<kRelu>(p, batch_heads, stream);
}

// Floats of scratch that launch_attention_bw needs: D_i for every query row.
extern "C" long long attention_bw_workspace_floats(int batch, int heads, int q_len) {
  return static_cast<long long>(batch) * heads * q_len;
}

// out and lse are read only for the softmax (nullable for relu); workspace holds
// attention_bw_workspace_floats(batch, heads, q_len) floats.
extern "C" int launch_attention_bw(float* dq, float* dk, float* dv, const float* grad_out, const float* q,
                                   const float* k, const float* v, const float* out, const float* lse,
                                   const float* mask, float* workspace, int batch, int heads, int q_len,
                                   int k_len, int head_dim, int causal, int activation, float scale,
                                   cudaStream_t stream) {
  MT_RETURN_IF_INVALID(dq == nullptr || dk == nullptr || dv == nullptr || grad_out == nullptr || q == nullptr ||
                       k == nullptr || v == nullptr);
  MT_RETURN_IF_INVALID(!sizes_ok(batch, heads, q_len, k_len, head_dim, activation));
  MT_RETURN_IF_INVALID(activation == kSoftmax && (out == nullptr || lse == nullptr || workspace == nullptr));
  const bool vec4 = head_dim % 4 == 0 && mt::is_aligned16(dq) && mt::is_aligned16(dk) && mt::is_aligned16(dv) &&
                    mt::is_aligned16(grad_out) && mt::is_aligned16(q) && mt::is_aligned16(k) && mt::is_aligned16(v);
  const int batch_heads = batch * heads;
  const int rows = batch_heads * q_len;
  MT_RETURN_IF_ERROR(cudaMemsetAsync(dq, 0, static_cast<size_t>(rows) * head_dim * sizeof(float), stream));
  if (activation == kSoftmax) {
    attention_bw_dot<<<(rows + kDotWarps - 1) / kDotWarps, kDotWarps * 32, 0, stream>>>(workspace, grad_out, out,
                                                                                        rows, head_dim);
    MT_RETURN_IF_ERROR(cudaGetLastError());
  }
  const BwParams p = {dq,   dk,      dv,     grad_out, q,        k,      v,     lse, workspace,
                      mask, heads, q_len, k_len,    head_dim, causal != 0, scale, vec4};
  return activation == kSoftmax ? launch_bw_activation<kSoftmax>(p, batch_heads, stream)
                                : launch_bw_activation<kRelu>(p, batch_heads, stream);
}
