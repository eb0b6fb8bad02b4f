// Fused attention in bfloat16, forward and backward (FlashAttention-2 style), with a softmax or a
// ReLU activation: the bf16 twin of attention_kernel.cu (same shapes, masks, causal rule, lse and
// edge cases; see the top of that file). q, k, v, out, dout, dq, dk, dv are bf16; lse, D, the mask
// and all arithmetic are float32: products run as mma.sync m16n8k16 bf16 with float32 accumulators,
// P (and dS) are rounded to bf16 only as operands of the next product (in the head-dim bucket of 32,
// dS enters dK = dS^T Q as a hi/lo pair of bf16, add_product's SPLIT); dq is summed with float32
// atomics into a workspace and rounded to bf16 once at the end.
//
// Layouts: q, k, v, out, dout, dq, dk, dv are [B, H, T, D] with any (batch, head, token) strides in
// elements and unit stride along D (Strides, includes/attention_common.cuh; the launchers take them
// as an array, three per operand). A GPT-2 block passes q, k, v as the thirds of its packed [B, T, 3C]
// projection (strides {T * 3C, D, 3C}), out and dout as [B, T, H, D] = [B, T, C] (strides {T * C, D,
// C}) and dq, dk, dv as the thirds of one [B, T, 3C] gradient, so no layout copy runs around the
// kernels. lse and D_i [B, H, Tq] and the float32 dq workspace [B, H, Tq, D] are contiguous. Tiles
// load in 16-byte chunks (cp.async of 8 bf16) when D, every stride and every pointer allow it (rows
// 16-byte aligned), element by element otherwise.
//
// Shared tiles are bf16 [rows][DP + 8] (DP = 32, 64 or 128, columns past head_dim zero): rows are
// 16-byte aligned for cp.async and ldmatrix, and the 8 rows that one ldmatrix matrix reads fall in 8
// distinct 16-byte bank groups. Fragments (PTX ISA, g = lane / 4, t = lane % 4): A a0a1 = A[g][2t..],
// a2a3 = A[g + 8][2t..], a4a5 = A[g][2t + 8..], a6a7 = A[g + 8][2t + 8..]; B b0b1 = B[2t..][g],
// b2b3 = B[2t + 8..][g]; C c0c1 = C[g][2t..], c2c3 = C[g + 8][2t..]. So two C tiles of 8 columns are
// one A fragment of 16 columns in registers (c_pair_to_a), the FlashAttention trick for P V.
// ldmatrix makes every other fragment (load_a: a row-major A; load_b_rows: B = tile^T, i.e. B[k][n] =
// tile[n][k], two n-tiles; load_b_cols: B = tile, .trans, two n-tiles).
//
// Forward, attention_bf16_fw<DP, ACT>: grid (B * H, query blocks of 64, the last one first under
// causal); warp w owns queries 16w .. 16w + 15 (its Q fragments stay in registers) and walks the key
// tiles of 64: S = Q K^T, score_step (includes/attention_common.cuh), O = O * rescale + P V. K of
// tile t + 1 loads (cp.async) during the softmax and P V of tile t, V of tile t + 1 during S of t + 1.
//
// Backward, attention_bf16_bw<DP, ACT>: grid (B * H, key blocks of 64), in groups of heads where
// the operands exceed L2 (tile_grid, launch_bucket); warp w owns keys 16w .. 16w
// + 15 and keeps their dK, dV in C fragments over the query tiles of BM (64; 32 for DP = 128) that
// see them: S^T = K Q^T, dP^T = V dO^T, (P^T, dS^T) elementwise, dV += P^T dO, dK += dS^T Q (P^T and
// dS^T from C to A fragments), dS^T to shared memory, dQ += dS K (dS by ldmatrix.trans) added to the
// float32 workspace with atomics (float4 where the rows allow, float2 otherwise, on sm_90). The Q and
// dO tiles (with their lse and D) are double-buffered: tile qt + 1 loads during all of tile qt's products.
// Around it two memory-bound passes, 8 lanes per query row and 16-byte accesses where the rows allow:
// attention_bf16_bw_prepass zeroes the row's float32 dq workspace and (softmax) forms D_i = dO_i . O_i,
// round_to_bf16 rounds the workspace into dq afterwards.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "includes/attention_common.cuh"
#include "includes/cuda_check.cuh"
#include "includes/launch_utils.cuh"
#include "includes/ptx.cuh"
#include "includes/vec.cuh"
#include "matmul/bf16_mma.cuh"

namespace {

using bf16 = __nv_bfloat16;
using namespace mt_attn;

template <int DP>
struct Bf16Config {
  static_assert(DP == 32 || DP == 64 || DP == 128, "head-dim buckets are 32, 64 and 128");
  static constexpr int kLd = DP + 8;                   // row pitch of a Q/K/V/dO tile
  static constexpr int kKeys = 64;                     // keys of a forward tile
  static constexpr int kQueries = DP == 128 ? 32 : 64;  // queries of a backward tile
  static constexpr int kFwMinBlocks = DP == 128 ? 2 : 3;
  static constexpr int kFwBytes = (kFwRows + 2 * kKeys) * kLd * 2;
  static constexpr int kLdT = kQueries + 8;  // row pitch of dS^T
  // two stages of the query tile (lse and D, Q and dO) beside K, V and dS^T
  static constexpr int kBwBytes = 4 * kQueries * 4 + ((2 * kBwKeys + 4 * kQueries) * kLd + kBwKeys * kLdT) * 2;
};

// ldmatrix (x4, plain or .trans) and mma.sync m16n8k16 bf16 with float32 accumulators: the matmul
// library's (matmul/bf16_mma.cuh).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) { bf16mm::ldmatrix_x4<false>(r, row); }

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* row) {
  bf16mm::ldmatrix_x4<true>(r, row);
}

using bf16mm::mma_bf16;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ int lane_id() { return threadIdx.x % 32; }

// A fragment of A = tile[row0 .. row0 + 15][col0 .. col0 + 15] (row-major, k along the row).
template <int LD>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int row0, int col0) {
  const int l = lane_id();
  ldmatrix_x4(a, tile + (row0 + l % 16) * LD + col0 + (l / 16) * 8);
}

// A fragment of A = tile^T: A[m][k] = tile[row0 + k][col0 + m] (16 x 16; e.g. dS from dS^T).
template <int LD>
__device__ __forceinline__ void load_a_transposed(uint32_t (&a)[4], const bf16* tile, int row0, int col0) {
  const int l = lane_id();
  ldmatrix_x4_trans(a, tile + (row0 + (l / 16) * 8 + l % 8) * LD + col0 + ((l / 8) % 2) * 8);
}

// B fragments of two 8-column tiles of B = tile^T: B[k][n] = tile[row0 + n][col0 + k], k < 16,
// n < 16; b[0], b[1] for n < 8 and b[2], b[3] for n >= 8 (e.g. K in S = Q K^T).
template <int LD>
__device__ __forceinline__ void load_b_rows(uint32_t (&b)[4], const bf16* tile, int row0, int col0) {
  const int l = lane_id();
  ldmatrix_x4(b, tile + (row0 + (l / 16) * 8 + l % 8) * LD + col0 + ((l / 8) % 2) * 8);
}

// B fragments of two 8-column tiles of B = tile: B[k][n] = tile[row0 + k][col0 + n] (e.g. V in P V).
template <int LD>
__device__ __forceinline__ void load_b_cols(uint32_t (&b)[4], const bf16* tile, int row0, int col0) {
  const int l = lane_id();
  ldmatrix_x4_trans(b, tile + (row0 + ((l / 8) % 2) * 8 + l % 8) * LD + col0 + (l / 16) * 8);
}

// The A fragment (16 rows x 16 columns) of the C fragments c0 (columns 0-7) and c1 (columns 8-15).
__device__ __forceinline__ void c_pair_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// The A fragment of what c_pair_to_a rounds away: c - bf16(c), itself rounded to bf16 (the low half of
// a hi/lo split, so A_hi + A_lo carries c to about 16 bits).
__device__ __forceinline__ void c_pair_residual_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  const auto low = [](float x) { return x - __bfloat162float(__float2bfloat16(x)); };
  a[0] = pack_bf16(low(c0[0]), low(c0[1]));
  a[1] = pack_bf16(low(c0[2]), low(c0[3]));
  a[2] = pack_bf16(low(c1[0]), low(c1[1]));
  a[3] = pack_bf16(low(c1[2]), low(c1[3]));
}

// acc[16 x 8 ND] += A B, A the C fragments a[2 KT] (16 x 16 KT), B = tile[row0 + k][n] (16 KT x 8 ND).
// SPLIT adds the product of A's rounding residual too (twice the mma work), so A enters with ~16 bits
// instead of bf16's 8: the small head dims, whose few products per output leave A's rounding as the
// largest error term, use it for dK = dS^T Q.
template <int KT, int ND, int LD, bool SPLIT = false>
__device__ __forceinline__ void add_product(float (&acc)[ND][4], const float (&a)[2 * KT][4], const bf16* tile) {
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    uint32_t frag[4], low[4];
    c_pair_to_a(frag, a[2 * kk], a[2 * kk + 1]);
    if constexpr (SPLIT) c_pair_residual_to_a(low, a[2 * kk], a[2 * kk + 1]);
#pragma unroll
    for (int nn = 0; nn < ND / 2; ++nn) {
      uint32_t b[4];
      load_b_cols<LD>(b, tile, 16 * kk, 16 * nn);
      mma_bf16(acc[2 * nn], frag, b[0], b[1]);
      mma_bf16(acc[2 * nn + 1], frag, b[2], b[3]);
      if constexpr (SPLIT) {
        mma_bf16(acc[2 * nn], low, b[0], b[1]);
        mma_bf16(acc[2 * nn + 1], low, b[2], b[3]);
      }
    }
  }
}

// acc[j] (16 x 8 each, j < 2 NP) += A tile^T over k < 16 KS, A = a_tile rows a_row0.., B^T = tile rows
// 16 jj.. (e.g. S = Q K^T; S^T = K Q^T). Unrolled over k: with the loop kept rolled, each step's
// fragment loads waited on the previous step's products, and the backward (8 warps an SM) ran 8% slower.
template <int KS, int NP, int LD>
__device__ __forceinline__ void add_product_nt(float (&acc)[2 * NP][4], const bf16* a_tile, int a_row0, const bf16* tile) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t a[4];
    load_a<LD>(a, a_tile, a_row0, 16 * ks);
#pragma unroll
    for (int jj = 0; jj < NP; ++jj) {
      uint32_t b[4];
      load_b_rows<LD>(b, tile, 16 * jj, 16 * ks);
      mma_bf16(acc[2 * jj], a, b[0], b[1]);
      mma_bf16(acc[2 * jj + 1], a, b[2], b[3]);
    }
  }
}

// Starts copying rows [row0, row0 + ROWS) of a bf16 [rows, head_dim] matrix whose row r starts at
// src + r * ld (ld <= kMaxTokenStride: offsets within the tile fit int) into the shared tile
// [ROWS][DP + 8]; rows >= `rows` and columns in [head_dim, DP) are zero-filled. Without `vec` (a
// row not 16-byte aligned) the elements are stored directly; the barrier that follows the caller's
// cp_async_wait publishes both kinds.
template <int ROWS, int DP>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* src, long long ld, int row0, int rows, int head_dim,
                                          bool vec) {
  constexpr int LD = DP + 8;
  const bf16* first = src + row0 * ld;  // the tile's first row
  const int step = static_cast<int>(ld);
  if (vec) {
    constexpr int kPerRow = DP / 8;
    static_assert((ROWS * kPerRow) % kThreads == 0, "16-byte chunks must divide evenly over the block");
#pragma unroll
    for (int it = 0; it < ROWS * kPerRow / kThreads; ++it) {
      const int chunk = it * kThreads + threadIdx.x;
      const int r = chunk / kPerRow;
      const int col = (chunk % kPerRow) * 8;
      const bool ok = row0 + r < rows && col < head_dim;
      const bf16* from = ok ? first + (r * step + col) : src;
      mt::cp_async_16(reinterpret_cast<float*>(tile + r * LD + col), reinterpret_cast<const float*>(from), ok);
    }
  } else {
    static_assert((ROWS * DP) % kThreads == 0, "elements must divide evenly over the block");
#pragma unroll 4
    for (int it = 0; it < ROWS * DP / kThreads; ++it) {
      const int e = it * kThreads + threadIdx.x;
      const int r = e / DP;
      const int col = e % DP;
      const bool ok = row0 + r < rows && col < head_dim;
      tile[r * LD + col] = ok ? first[r * step + col] : __float2bfloat16(0.f);
    }
  }
}

// ---- forward -----------------------------------------------------------------------------------
template <int DP, int ACT>
__global__ void __launch_bounds__(kThreads, Bf16Config<DP>::kFwMinBlocks) attention_bf16_fw(const FwParams<bf16> p) {
  mt::join_prior_grids();
  constexpr int BM = kFwRows;
  constexpr int BN = Bf16Config<DP>::kKeys;
  constexpr int NT = BN / 8;  // 8-key column tiles of S
  constexpr int KS = DP / 16;  // 16-wide k steps over d
  constexpr int KD = DP / 8;   // 8-wide column tiles of O
  constexpr int LD = Bf16Config<DP>::kLd;
  extern __shared__ float4 smem_f4[];
  bf16* qs = reinterpret_cast<bf16*>(smem_f4);
  bf16* ks = qs + BM * LD;
  bf16* vs = ks + BN * LD;

  const BlockTile block = block_tile();
  const int q0 = (p.causal ? static_cast<int>(gridDim.y) - 1 - block.tile : block.tile) * BM;
  const int warp = threadIdx.x / 32;
  const int g = frag_g();
  const int t = frag_t();
  const Head head(p, block.bh);
  const bf16* kg = p.k + head.at(p.k_strides);
  const bf16* vg = p.v + head.at(p.v_strides);
  const float* mask_row = p.mask != nullptr ? p.mask + static_cast<size_t>(head.batch()) * p.k_len : nullptr;

  int limit[2];  // keys [0, limit) are kept for the lane's rows q0 + 16 warp + g (+ 8)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int query = q0 + 16 * warp + g + 8 * h;
    limit[h] = query >= p.q_len ? 0 : (p.causal ? min(p.k_len, query + head.offset + 1) : p.k_len);
  }
  const int key_end = p.causal ? max(0, min(p.k_len, min(q0 + BM, p.q_len) + head.offset)) : p.k_len;
  const int num_tiles = (key_end + BN - 1) / BN;

  float o[KD][4] = {};
  RowState rows;
  uint32_t qf[KS][4];

  if (num_tiles > 0) {
    load_tile<BM, DP>(qs, p.q + head.at(p.q_strides), p.q_strides.token, q0, p.q_len, p.head_dim, p.vec);
    load_tile<BN, DP>(ks, kg, p.k_strides.token, 0, p.k_len, p.head_dim, p.vec);
    mt::cp_async_commit();
    load_tile<BN, DP>(vs, vg, p.v_strides.token, 0, p.k_len, p.head_dim, p.vec);
    mt::cp_async_commit();
  }
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int n0 = tile * BN;
    mt::cp_async_wait<1>();  // Q and this K tile (this V tile may still be in flight)
    __syncthreads();
    if (tile == 0) {
#pragma unroll
      for (int kd = 0; kd < KS; ++kd) load_a<LD>(qf[kd], qs, 16 * warp, 16 * kd);
    }

    float s[NT][4] = {};
#pragma unroll
    for (int kd = 0; kd < KS; ++kd) {
#pragma unroll
      for (int jj = 0; jj < NT / 2; ++jj) {
        uint32_t b[4];
        load_b_rows<LD>(b, ks, 16 * jj, 16 * kd);
        mma_bf16(s[2 * jj], qf[kd], b[0], b[1]);
        mma_bf16(s[2 * jj + 1], qf[kd], b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this K tile
    if (tile + 1 < num_tiles) load_tile<BN, DP>(ks, kg, p.k_strides.token, n0 + BN, p.k_len, p.head_dim, p.vec);
    mt::cp_async_commit();

    float rescale[2];
    score_step<ACT>(s, rows, rescale, p, mask_row, n0, limit);
#pragma unroll
    for (int dt = 0; dt < KD; ++dt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) o[dt][c] *= rescale[c / 2];
    }
    mt::cp_async_wait<1>();  // this V tile (the next K tile may still be in flight)
    __syncthreads();

    add_product<BN / 16, KD, LD>(o, s, vs);  // O += P V
    __syncthreads();  // every warp is done with this V tile
    if (tile + 1 < num_tiles) load_tile<BN, DP>(vs, vg, p.v_strides.token, n0 + BN, p.k_len, p.head_dim, p.vec);
    mt::cp_async_commit();
  }

  store_query_rows<ACT>(o, rows, p, head, q0 + 16 * warp);
}

// ---- backward ------------------------------------------------------------------------------------
// Adds a warp's dQ C fragments acc[n] (rows row0 + g, + 8; columns col0 + 8 n + 2 t, + 1) into the
// float32 workspace with atomics. With p.dq_vec4 (head_dim % 4 == 0, 16-byte aligned rows) lanes t and
// t ^ 1 trade halves first, so that each holds 4 adjacent columns of one row (even t: row g, odd t:
// row g + 8) and one float4 atomic (sm_90) replaces two float2 ones: half the atomic traffic to L2.
template <int TILES>
__device__ __forceinline__ void add_dq_tiles(const float (&acc)[TILES][4], const BwParams<bf16>& p, const Head& head,
                                             int row0, int col0) {
  const int g = frag_g();
  const int t = frag_t();
  if (p.dq_vec4) {
    const bool odd = t & 1;
    const int query = row0 + g + (odd ? 8 : 0);
    float* dq_row = p.dq + (head.row() + query) * p.head_dim;
#pragma unroll
    for (int n = 0; n < TILES; ++n) {
      const float x = __shfl_xor_sync(0xffffffffu, odd ? acc[n][0] : acc[n][2], 1);
      const float y = __shfl_xor_sync(0xffffffffu, odd ? acc[n][1] : acc[n][3], 1);
      const float4 v = odd ? make_float4(x, y, acc[n][2], acc[n][3]) : make_float4(acc[n][0], acc[n][1], x, y);
      const int col = col0 + 8 * n + 2 * (t & ~1);
      if (query < p.q_len && col < p.head_dim) atomic_add_quad(dq_row + col, v);
    }
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int query = row0 + g + 8 * h;
    if (query < p.q_len) {
      float* dq_row = p.dq + (head.row() + query) * p.head_dim;
#pragma unroll
      for (int n = 0; n < TILES; ++n) {
        atomic_add_pair(dq_row, col0 + 8 * n + 2 * t, acc[n][2 * h], acc[n][2 * h + 1], p.head_dim, p.head_dim % 2 == 0);
      }
    }
  }
}

template <int DP, int ACT>
__global__ void __launch_bounds__(kThreads, 2) attention_bf16_bw(const BwParams<bf16> p) {
  mt::join_prior_grids();
  constexpr int BN = kBwKeys;
  constexpr int BM = Bf16Config<DP>::kQueries;
  constexpr int QT = BM / 8;  // 8-query column tiles of S^T
  constexpr int KS = DP / 16;
  constexpr int KD = DP / 8;                   // 8-wide column tiles of dK, dV, dQ
  constexpr int MT = BM / 16;                  // 16-query row slabs of dQ
  constexpr int DQ_TILES = KD * MT / kWarps;  // dQ column tiles per warp
  constexpr int LD = Bf16Config<DP>::kLd;
  constexpr int LDT = Bf16Config<DP>::kLdT;
  static_assert(DQ_TILES * kWarps == KD * MT && DQ_TILES % 2 == 0, "dQ tile pairs must divide evenly over the warps");
  extern __shared__ float4 smem_f4[];
  float* stats = reinterpret_cast<float*>(smem_f4);  // per stage: lse, then D, of the query tile
  bf16* ks = reinterpret_cast<bf16*>(stats + 4 * BM);
  bf16* vs = ks + BN * LD;
  bf16* dst = vs + BN * LD;    // dS^T [BN][LDT]
  bf16* qdo = dst + BN * LDT;  // per stage: the Q tile, then the dO tile, [BM][LD] each

  const BlockTile block = block_tile();
  const int n0 = block.tile * BN;
  const int warp = threadIdx.x / 32;
  const int g = frag_g();
  const int t = frag_t();
  const Head head(p, block.bh);
  const bf16* qg = p.q + head.at(p.q_strides);
  const bf16* dog = p.dout + head.at(p.dout_strides);
  // Starts loading the query tile at m0 (Q, dO and their row statistics) into stage s.
  const auto load_query_tile = [&](int s, int m0) {
    load_tile<BM, DP>(qdo + 2 * s * BM * LD, qg, p.q_strides.token, m0, p.q_len, p.head_dim, p.vec);
    load_tile<BM, DP>(qdo + (2 * s + 1) * BM * LD, dog, p.dout_strides.token, m0, p.q_len, p.head_dim, p.vec);
    load_row_stats<ACT, BM>(stats + 2 * s * BM, stats + (2 * s + 1) * BM, p, head, m0);
  };

  float mask_add[2];  // of the lane's keys n0 + 16 warp + g (C elements 0, 1) and + 8 (2, 3)
#pragma unroll
  for (int h = 0; h < 2; ++h) mask_add[h] = key_mask<ACT>(p, head, n0 + 16 * warp + g + 8 * h);
  const int2 qt_range = query_tile_range<BM>(p, head, n0);
  const int qt_begin = qt_range.x, qt_end = qt_range.y;
  const int dq_slab = warp % MT;
  const int dq_col0 = (warp / MT) * DQ_TILES;

  float dk[KD][4] = {};
  float dv[KD][4] = {};

  if (qt_begin < qt_end) {
    load_tile<BN, DP>(ks, p.k + head.at(p.k_strides), p.k_strides.token, n0, p.k_len, p.head_dim, p.vec);
    load_tile<BN, DP>(vs, p.v + head.at(p.v_strides), p.v_strides.token, n0, p.k_len, p.head_dim, p.vec);
    load_query_tile(0, qt_begin * BM);
    mt::cp_async_commit();
  }
  for (int qt = qt_begin; qt < qt_end; ++qt) {
    const int m0 = qt * BM;
    const int s = (qt - qt_begin) & 1;
    mt::cp_async_wait<0>();
    __syncthreads();  // stage s holds this tile; every warp is done with the previous one (stage s ^ 1)
    if (qt + 1 < qt_end) load_query_tile(s ^ 1, m0 + BM);  // lands during this whole tile's products
    mt::cp_async_commit();
    const bf16* qs = qdo + 2 * s * BM * LD;
    const bf16* dos = qs + BM * LD;

    float st[QT][4] = {};
    float dpt[QT][4] = {};
    add_product_nt<KS, QT / 2, LD>(st, ks, 16 * warp, qs);    // S^T = K Q^T
    add_product_nt<KS, QT / 2, LD>(dpt, vs, 16 * warp, dos);  // dP^T = V dO^T

    probs_and_dscores<ACT>(st, dpt, p, head, n0 + 16 * warp, m0, mask_add, stats + 2 * s * BM,
                           stats + (2 * s + 1) * BM);
#pragma unroll
    for (int j = 0; j < QT; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<__nv_bfloat162*>(dst + (16 * warp + g + 8 * h) * LDT + 8 * j + 2 * t) =
            __floats2bfloat162_rn(dpt[j][2 * h], dpt[j][2 * h + 1]);
      }
    }

    add_product<BM / 16, KD, LD>(dv, st, dos);  // dV += P^T dO
    add_product<BM / 16, KD, LD, DP == 32>(dk, dpt, qs);  // dK += dS^T Q
    __syncthreads();  // dS^T complete

    // dQ[16 dq_slab + r][8 (dq_col0 + n) + c] of this tile: A = dS = dst^T, B = K.
    float acc[DQ_TILES][4] = {};
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      load_a_transposed<LDT>(a, dst, 16 * kk, 16 * dq_slab);
#pragma unroll
      for (int nn = 0; nn < DQ_TILES / 2; ++nn) {
        uint32_t b[4];
        load_b_cols<LD>(b, ks, 16 * kk, 8 * dq_col0 + 16 * nn);
        mma_bf16(acc[2 * nn], a, b[0], b[1]);
        mma_bf16(acc[2 * nn + 1], a, b[2], b[3]);
      }
    }
    add_dq_tiles<DQ_TILES>(acc, p, head, m0 + 16 * dq_slab, 8 * dq_col0);
  }

  store_key_rows(dk, dv, p, head, n0 + 16 * warp);
}

// ---- passes around the backward kernel -----------------------------------------------------------
// Row r = (b * heads + h) * q_len + i (of D_i, of the float32 dq workspace, contiguous [B, H, Tq, D],
// and of dO, O, dq where their strides put it) gets a group of kRowLanes lanes: at D = 64 one 16-byte
// chunk of 8 bf16 per lane is the row, so each access of a warp moves 4 rows instead of a warp per row
// in 2-byte pieces, which left these passes far from the memory bandwidth.
constexpr int kRowLanes = 8;
constexpr int kPassThreads = 256;
constexpr int kPassRows = kPassThreads / kRowLanes;  // rows of a block

// The float32 values of the two bf16 packed in w (bf16 -> float32 is exact: the bits move up 16).
__device__ __forceinline__ float2 unpack_bf16(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// acc + the float32 products of the 8 bf16 pairs of a and b (16 bytes each).
__device__ __forceinline__ float dot8(uint4 a, uint4 b, float acc) {
  const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = unpack_bf16(wa[i]), y = unpack_bf16(wb[i]);
    acc = fmaf(x.y, y.y, fmaf(x.x, y.x, acc));
  }
  return acc;
}

// Before the backward kernel: zeroes row r of the float32 dq workspace `acc` (it takes atomics) and,
// for the softmax (DOT), writes di[r] = sum_d dout[r, d] out[r, d] in float32. VEC: head_dim % 8 == 0
// and 16-byte aligned rows of acc and (DOT) of dout and out, so float4 stores and 16-byte loads of 8
// bf16; else element by element.
template <bool DOT, bool VEC>
__global__ void __launch_bounds__(kPassThreads)
    attention_bf16_bw_prepass(float* acc, float* di, const bf16* dout, Strides dout_strides, const bf16* out,
                              Strides out_strides, int heads, int q_len, int rows, int head_dim) {
  mt::join_prior_grids();
  const int row = blockIdx.x * kPassRows + threadIdx.x / kRowLanes;
  const int lane = threadIdx.x % kRowLanes;
  // A row past the end stays for the shuffles (full mask) and only skips its memory accesses.
  const bool live = row < rows;
  float sum = 0.f;
  if (live) {
    float* acc_row = acc + static_cast<size_t>(row) * head_dim;
    if constexpr (VEC) {
      // Lane by lane over the row's float4s: each store of the group covers 128 contiguous bytes.
#pragma unroll
      for (int i = 0; i < kMaxHeadDim / (4 * kRowLanes); ++i) {
        const int c = 4 * (lane + i * kRowLanes);
        if (c < head_dim) mt::store_float4(acc_row + c, make_float4(0.f, 0.f, 0.f, 0.f));
      }
    } else {
      for (int d = lane; d < head_dim; d += kRowLanes) acc_row[d] = 0.f;
    }
    if constexpr (DOT) {
      const bf16* dout_row = dout + row_offset(dout_strides, row, heads, q_len);
      const bf16* out_row = out + row_offset(out_strides, row, heads, q_len);
      if constexpr (VEC) {
        // All loads issue before the first product (D = 128: two chunks a lane).
        constexpr int kChunks = kMaxHeadDim / (8 * kRowLanes);
        uint4 g[kChunks], o[kChunks];
#pragma unroll
        for (int i = 0; i < kChunks; ++i) {
          const int c = 8 * (lane + i * kRowLanes);
          if (c < head_dim) {
            g[i] = __ldg(reinterpret_cast<const uint4*>(dout_row + c));
            o[i] = __ldg(reinterpret_cast<const uint4*>(out_row + c));
          }
        }
#pragma unroll
        for (int i = 0; i < kChunks; ++i) {
          if (8 * (lane + i * kRowLanes) < head_dim) sum = dot8(g[i], o[i], sum);
        }
      } else {
        for (int d = lane; d < head_dim; d += kRowLanes) {
          sum = fmaf(__bfloat162float(dout_row[d]), __bfloat162float(out_row[d]), sum);
        }
      }
    }
  }
  if constexpr (DOT) {
    sum = mt::warp_allreduce<kRowLanes>(sum, mt::SumOp{});
    if (live && lane == 0) di[row] = sum;
  }
}

// After the backward kernel: dq[r] = bf16(acc[r]), written where dq_strides put row r. VEC: head_dim
// % 8 == 0 and 16-byte aligned rows of acc and dq, so two float4 loads and one 16-byte store per 8
// elements; else element by element.
template <bool VEC>
__global__ void __launch_bounds__(kPassThreads)
    round_to_bf16(bf16* dq, Strides dq_strides, const float* acc, int heads, int q_len, int rows, int head_dim) {
  mt::join_prior_grids();
  const int row = blockIdx.x * kPassRows + threadIdx.x / kRowLanes;
  if (row >= rows) return;
  const int lane = threadIdx.x % kRowLanes;
  bf16* dst = dq + row_offset(dq_strides, row, heads, q_len);
  const float* src = acc + static_cast<size_t>(row) * head_dim;
  if constexpr (VEC) {
    // All loads issue before the first store (D = 128: two chunks a lane).
    constexpr int kChunks = kMaxHeadDim / (8 * kRowLanes);
    float4 lo[kChunks], hi[kChunks];
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = 8 * (lane + i * kRowLanes);
      if (c < head_dim) {
        lo[i] = mt::load_float4(src + c);
        hi[i] = mt::load_float4(src + c + 4);
      }
    }
    // __stcg (st.global.cg, kept in L2 for dq's reader): nvcc 13 splits the plain 16-byte store of the
    // unrolled first chunk into four 4-byte stores.
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = 8 * (lane + i * kRowLanes);
      if (c < head_dim) {
        __stcg(reinterpret_cast<uint4*>(dst + c), make_uint4(pack_bf16(lo[i].x, lo[i].y), pack_bf16(lo[i].z, lo[i].w),
                                                            pack_bf16(hi[i].x, hi[i].y), pack_bf16(hi[i].z, hi[i].w)));
      }
    }
  } else {
    for (int d = lane; d < head_dim; d += kRowLanes) dst[d] = __float2bfloat16(src[d]);
  }
}

// ---- launchers ---------------------------------------------------------------------------------
template <int DP, int ACT>
int launch_bucket(const FwParams<bf16>& p, int batch_heads, cudaStream_t stream) {
  const dim3 grid = tile_grid(batch_heads, (p.q_len + kFwRows - 1) / kFwRows, batch_heads);
  return mt::launch_with_shared_memory<attention_bf16_fw<DP, ACT>, true>(grid, kThreads, Bf16Config<DP>::kFwBytes,
                                                                          stream, p);
}

// The backward's heads a group at a time (tile_grid) when the L2 cannot hold every head's Q, K, V, dO
// and float32 dq: GPT-2's at B 16 x 12 heads (~150 MB) took 560 us a layer in the plain order, 420 in
// groups of 16 heads. Where they fit (B 4, ~38 MB), groups only delay the long blocks of later groups
// to the last wave (111 -> 125 us), so the grid keeps the plain order.
template <int DP, int ACT>
int launch_bucket(const BwParams<bf16>& p, int batch_heads, cudaStream_t stream) {
  int l2_bytes = 0;
  MT_RETURN_IF_ERROR(mt::l2_cache_bytes(&l2_bytes));
  const long long head_bytes = (2LL * p.q_len + 2LL * p.k_len) * p.head_dim * 2 + 4LL * p.q_len * p.head_dim;
  const int group = batch_heads * head_bytes <= l2_bytes ? batch_heads : kHeadGroup;
  const dim3 grid = tile_grid(batch_heads, (p.k_len + kBwKeys - 1) / kBwKeys, group);
  return mt::launch_with_shared_memory<attention_bf16_bw<DP, ACT>, true>(grid, kThreads, Bf16Config<DP>::kBwBytes,
                                                                          stream, p);
}

template <int ACT, class Params>
int launch_head_dim(const Params& p, int batch_heads, cudaStream_t stream) {
  if (p.head_dim <= 32) return launch_bucket<32, ACT>(p, batch_heads, stream);
  if (p.head_dim <= 64) return launch_bucket<64, ACT>(p, batch_heads, stream);
  return launch_bucket<128, ACT>(p, batch_heads, stream);
}

template <class Params>
int launch_variant(const Params& p, int activation, int batch_heads, cudaStream_t stream) {
  return activation == kSoftmax ? launch_head_dim<kSoftmax>(p, batch_heads, stream)
                                : launch_head_dim<kRelu>(p, batch_heads, stream);
}

// Rows of head_dim bf16 elements starting 16-byte aligned at every pointer and every stride.
bool rows_aligned(int head_dim, std::initializer_list<const void*> ptrs, std::initializer_list<Strides> strides) {
  if (head_dim % 8 != 0) return false;
  for (const void* q : ptrs) {
    if (!mt::is_aligned16(q)) return false;
  }
  for (const Strides& s : strides) {
    if (s.batch % 8 != 0 || s.head % 8 != 0 || s.token % 8 != 0) return false;
  }
  return true;
}

// The strides of operand i of a launcher's strides array (three per operand: batch, head, token).
Strides strides_of(const long long* strides, int i) { return {strides[3 * i], strides[3 * i + 1], strides[3 * i + 2]}; }

}  // namespace

MT_DEFINE_ERROR_STRING()

// strides: 12 values, the (batch, head, token) strides in elements of q, k, v and out (see Strides).
extern "C" int launch_attention_bf16_fw(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                        const float* mask, const long long* strides, int batch, int heads, int q_len,
                                        int k_len, int head_dim, int causal, int activation, float scale,
                                        cudaStream_t stream) {
  MT_RETURN_IF_INVALID(out == nullptr || lse == nullptr || q == nullptr || k == nullptr || v == nullptr ||
                       strides == nullptr);
  MT_RETURN_IF_INVALID(!sizes_ok(batch, heads, q_len, k_len, head_dim, activation));
  const Strides qs = strides_of(strides, 0), ks = strides_of(strides, 1), vs = strides_of(strides, 2);
  const Strides os = strides_of(strides, 3);
  MT_RETURN_IF_INVALID(!strides_ok(qs, batch, heads, q_len, head_dim, false) ||
                       !strides_ok(ks, batch, heads, k_len, head_dim, false) ||
                       !strides_ok(vs, batch, heads, k_len, head_dim, false) ||
                       !strides_ok(os, batch, heads, q_len, head_dim, true));
  const bool vec = rows_aligned(head_dim, {out, q, k, v}, {qs, ks, vs, os});
  const FwParams<bf16> p = {out,   lse,   q,     k,     v,        mask,        qs,    ks,  vs,
                            os,    heads, q_len, k_len, head_dim, causal != 0, scale, vec};
  return launch_variant(p, activation, batch * heads, stream);
}

// Floats of scratch that launch_attention_bf16_bw needs: the float32 dq and D_i of every query row.
extern "C" long long attention_bf16_bw_workspace_floats(int batch, int heads, int q_len, int head_dim) {
  return static_cast<long long>(batch) * heads * q_len * (head_dim + 1);
}

// strides: 24 values, the (batch, head, token) strides in elements of dq, dk, dv, grad_out, q, k, v
// and out (see Strides). out, its strides and lse are read only for the softmax (nullable for relu).
// workspace: attention_bf16_bw_workspace_floats floats, 8-byte aligned (16 for the passes' vector path).
extern "C" int launch_attention_bf16_bw(bf16* dq, bf16* dk, bf16* dv, const bf16* grad_out, const bf16* q,
                                        const bf16* k, const bf16* v, const bf16* out, const float* lse,
                                        const float* mask, float* workspace, const long long* strides, int batch,
                                        int heads, int q_len, int k_len, int head_dim, int causal, int activation,
                                        float scale, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(dq == nullptr || dk == nullptr || dv == nullptr || grad_out == nullptr || q == nullptr ||
                       k == nullptr || v == nullptr || workspace == nullptr || strides == nullptr);
  MT_RETURN_IF_INVALID(!sizes_ok(batch, heads, q_len, k_len, head_dim, activation));
  MT_RETURN_IF_INVALID(activation == kSoftmax && (out == nullptr || lse == nullptr));
  MT_RETURN_IF_INVALID(reinterpret_cast<uintptr_t>(workspace) % 8 != 0);  // dq's float2 atomics
  const Strides dqs = strides_of(strides, 0), dks = strides_of(strides, 1), dvs = strides_of(strides, 2);
  const Strides dos = strides_of(strides, 3), qs = strides_of(strides, 4), ks = strides_of(strides, 5);
  const Strides vs = strides_of(strides, 6), os = strides_of(strides, 7);
  MT_RETURN_IF_INVALID(!strides_ok(dqs, batch, heads, q_len, head_dim, true) ||
                       !strides_ok(dks, batch, heads, k_len, head_dim, true) ||
                       !strides_ok(dvs, batch, heads, k_len, head_dim, true) ||
                       !strides_ok(dos, batch, heads, q_len, head_dim, false) ||
                       !strides_ok(qs, batch, heads, q_len, head_dim, false) ||
                       !strides_ok(ks, batch, heads, k_len, head_dim, false) ||
                       !strides_ok(vs, batch, heads, k_len, head_dim, false) ||
                       (activation == kSoftmax && !strides_ok(os, batch, heads, q_len, head_dim, false)));
  const bool vec = rows_aligned(head_dim, {dk, dv, grad_out, q, k, v}, {dks, dvs, dos, qs, ks, vs});
  const int batch_heads = batch * heads;
  const int rows = batch_heads * q_len;
  const int pass_blocks = (rows + kPassRows - 1) / kPassRows;
  float* dq_acc = workspace;
  float* di = workspace + static_cast<long long>(rows) * head_dim;
  // The passes take 16-byte steps where every row they touch allows: the float32 workspace rows (with
  // head_dim % 8 == 0, multiples of 32 bytes), dout and out (softmax), dq.
  const bool acc_vec = rows_aligned(head_dim, {workspace}, {});
  const bool dot = activation == kSoftmax;
  const bool pre_vec = acc_vec && (!dot || rows_aligned(head_dim, {grad_out, out}, {dos, os}));
  const auto prepass = dot ? (pre_vec ? attention_bf16_bw_prepass<true, true> : attention_bf16_bw_prepass<true, false>)
                       : pre_vec ? attention_bf16_bw_prepass<false, true>
                                 : attention_bf16_bw_prepass<false, false>;
  const int pre = mt::launch_dependent(prepass, dim3(pass_blocks), dim3(kPassThreads), 0, stream, dq_acc, di, grad_out,
                                       dos, out, os, heads, q_len, rows, head_dim);
  if (pre != 0) return pre;
  const BwParams<bf16> p = {dq_acc, dk,    dv,    grad_out, q,     k,     v,        lse,         di,
                            mask,   dks,   dvs,   dos,      qs,    ks,    vs,       heads,       q_len,
                            k_len,  head_dim, causal != 0, scale, vec,   acc_vec};
  const int code = launch_variant(p, activation, batch_heads, stream);
  if (code != 0) return code;
  const auto finish = acc_vec && rows_aligned(head_dim, {dq}, {dqs}) ? round_to_bf16<true> : round_to_bf16<false>;
  return mt::launch_dependent(finish, dim3(pass_blocks), dim3(kPassThreads), 0, stream, dq, dqs, dq_acc, heads, q_len,
                              rows, head_dim);
}
