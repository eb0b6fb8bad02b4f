// Fused attention, forward and backward (FlashAttention-2 style), fp32 with a softmax or a ReLU
// activation. Nothing of size Tq x Tk is ever stored. Every matrix product runs on the tensor cores:
// under the float32 matmul precision "highest" (the default) as three TF32 mma.sync products per
// tile (3xTF32, includes/mma_tf32.cuh), under "high" as one product of operands rounded to TF32 (the
// PREC template argument, as in the matmul library). The tensor core's adder truncates, so sums that
// run over the whole sequence (O, dK, dV) collect each tile's products in fresh accumulators and add
// them in float32: at [8, 12, 1024, 64] the errors against float64 are ~4e-6 of the largest value
// under "highest" (torch's float32 SDPA: ~2e-6; summing in the tensor core throughout: ~2e-5).
// Only the loops whose fragments index register arrays are unrolled in full: the rest stay rolled so
// that the code fits the instruction cache.
// What this kernel shares with its bf16 twin (attention_bf16_kernel.cu): includes/attention_common.cuh.
//
// Shapes, all contiguous row-major fp32: q, out, dq [B, H, Tq, D]; k, v, dk, dv [B, H, Tk, D];
// lse [B, H, Tq]; mask (optional, additive) [B, Tk] (the kernels address q, k, v, out, dout, dk and
// dv through the strides of includes/attention_common.cuh, which the launchers set to these
// contiguous ones). For query i and key j of one (b, h):
//   x[i, j] = scale * q[i] . k[j] + mask[b, j],
//   key j is kept when j <= i + (Tk - Tq) under causal (every key otherwise);
//   softmax: out[i] = sum_j p[i, j] v[j], p = exp(x - lse[i]) over kept keys,
//            lse[i] = log(sum of exp(x[i, j]) over kept keys) (-inf when no key is kept: that row of
//            out is 0 and its gradients are 0, never NaN);
//   relu:    out[i] = sum_j relu(x[i, j]) v[j] over kept keys (no normalization); lse is written as 0.
// A mask of -inf removes a key under both activations; finite values are plain additions.
// D (any size up to 128) is padded with zeros to a bucket DP of 32, 64 or 128 in shared memory.
//
// Blocks of 4 warps; a warp works on 16-row slabs with the m16n8k8 fragments of mma_tf32.cuh (g =
// lane / 4, t = lane % 4). Shared tiles have rows of DP + 4 floats, so the fragment reads
// tile[row g][col t] and tile[row 2t][col g] of a warp hit 32 distinct banks.
//
// Forward, attention_fw<DP, ACT, PREC>: grid (B * H, query blocks of 64; under causal the last block, which
// sees the most keys, is scheduled first). Warp w owns queries 16w .. 16w + 15. Per tile of BN keys
// (64; 32 for DP = 128):
//   S = Q K^T       [16 x BN] per warp in C fragments, Q as A (from shared memory), K as B;
//   online softmax  running row max and sum over the 4 lanes that share a row (shuffles), P = exp;
//                   relu: P = relu(S);
//   O += P V        P goes from C to A fragments in registers (key permutation), V as B.
// K and V are single tiles loaded with cp.async: K of tile t + 1 is in flight during the softmax and
// P V of tile t, V of tile t + 1 during S of tile t + 1.
//
// Backward: attention_bw_dot: D_i = sum_d dO[i, d] O[i, d] (softmax only), one warp per row.
// attention_bw<DP, ACT, PREC>: grid (B * H, key blocks of 64). Warp w owns keys 16w .. 16w + 15 of the block,
// keeps dK and dV of them in C fragments, and walks the query tiles of BM queries (64; 32 for DP = 128)
// that can see its keys (from the diagonal on under causal). Per query tile:
//   S^T = K Q^T, dP^T = V dO^T   [16 x BM] per warp, K and V as A, Q and dO as B;
//   P^T = exp(x^T - lse), dS^T = P^T (dP^T - D) scale   (relu: P^T = relu(x^T), dS^T = [x^T > 0] dP^T
//                                scale); dS^T also to shared memory;
//   dV += P^T dO, dK += dS^T Q   P^T and dS^T from C to A fragments in registers, dO and Q as B;
//   dQ += dS K                   warp w: 16 queries x DP / (64 / BM) columns, dS (shared) as A, K as B;
//                                added to dq with float2 atomics on sm_90 (scalar ones before; dq is
//                                zeroed first).
// The next Q and dO tiles load (cp.async) while dQ is computed. The order of the atomic additions
// varies from run to run, so dq may differ in the last bits between runs.
#include <cuda_runtime.h>

#include "includes/attention_common.cuh"
#include "includes/cuda_check.cuh"
#include "includes/launch_utils.cuh"
#include "includes/mma_tf32.cuh"
#include "includes/ptx.cuh"
#include "includes/vec.cuh"

namespace {

using mt::Tf32Frag;

using namespace mt_attn;

// Tile sizes per head-dim bucket (see the top of the file): keys of a forward tile, queries of a
// backward one. kMinBlocks: blocks per SM that __launch_bounds__ asks the register allocation to allow
// (at most what the shared memory allows).
template <int DP>
struct FwConfig {
  static_assert(DP == 32 || DP == 64 || DP == 128, "head-dim buckets are 32, 64 and 128");
  static constexpr int kKeys = DP == 128 ? 32 : 64, kMinBlocks = DP == 128 ? 2 : 3;
};

template <int DP>
struct BwConfig {
  static_assert(DP == 32 || DP == 64 || DP == 128, "head-dim buckets are 32, 64 and 128");
  static constexpr int kQueries = DP == 128 ? 32 : 64, kMinBlocks = 2;
};

template <int DP>
constexpr int fw_smem_floats() {
  return (kFwRows + 2 * FwConfig<DP>::kKeys) * (DP + 4);
}

template <int DP>
constexpr int bw_smem_floats() {
  constexpr int BM = BwConfig<DP>::kQueries;
  return (2 * kBwKeys + 2 * BM) * (DP + 4) + kBwKeys * (BM + 4) + 2 * BM;
}

// The fragment (4 words: A, 2 words: B) of the shared-memory values p[at[0]], p[at[1]], ...
template <int PREC, int N>
__device__ __forceinline__ Tf32Frag<N> fragment(const float* p, const int (&at)[N]) {
  Tf32Frag<N> f;
#pragma unroll
  for (int i = 0; i < N; ++i) mt::set_operand<PREC>(f, i, p[at[i]]);
  return f;
}

// A fragment of the 16 x 8 block at tile[row0 .. row0 + 15][col0 .. col0 + 7] of a shared tile with
// row stride LD.
template <int PREC, int LD>
__device__ __forceinline__ Tf32Frag<4> load_a(const float* tile, int row0, int col0) {
  return fragment<PREC>(tile + (row0 + frag_g()) * LD + col0 + frag_t(), {0, 8 * LD, 4, 8 * LD + 4});
}

// B fragment of B = tile^T: B[k][n] = tile[row0 + n][col0 + k] (a row-major tile whose rows are the
// n index, e.g. K in S = Q K^T).
template <int PREC, int LD>
__device__ __forceinline__ Tf32Frag<2> load_b_transposed(const float* tile, int row0, int col0) {
  return fragment<PREC>(tile + (row0 + frag_g()) * LD + col0 + frag_t(), {0, 4});
}

// B fragment of B = tile with the permuted k order of mma_tf32.cuh: B[t][n] = tile[row0 + 2t][col0 + n],
// B[t + 4][n] = tile[row0 + 2t + 1][col0 + n] (e.g. V in O = P V with P from a C fragment).
template <int PREC, int LD>
__device__ __forceinline__ Tf32Frag<2> load_b_permuted(const float* tile, int row0, int col0) {
  return fragment<PREC>(tile + (row0 + 2 * frag_t()) * LD + col0 + frag_g(), {0, LD});
}

// The A fragment of a C fragment's 16 x 8 values under the permuted k order.
template <int PREC>
__device__ __forceinline__ Tf32Frag<4> c_to_a(const float (&c)[4]) {
  Tf32Frag<4> a;
  mt::set_operand<PREC>(a, 0, c[0]);
  mt::set_operand<PREC>(a, 1, c[2]);
  mt::set_operand<PREC>(a, 2, c[1]);
  mt::set_operand<PREC>(a, 3, c[3]);
  return a;
}

// Starts copying rows [row0, row0 + ROWS) of a [rows, head_dim] matrix whose row r starts at src + r * ld
// (ld <= kMaxTokenStride: offsets within the tile fit int) into the shared tile [ROWS][DP + 4]; rows >=
// `rows` and columns in [head_dim, DP) are zero-filled.
template <int ROWS, int DP>
__device__ __forceinline__ void load_tile(float* tile, const float* src, long long ld, int row0, int rows,
                                          int head_dim, bool vec4) {
  constexpr int LD = DP + 4;
  const float* first = src + row0 * ld;  // the tile's first row
  const int step = static_cast<int>(ld);
  if (vec4) {
    constexpr int kPerRow = DP / 4;
    static_assert((ROWS * kPerRow) % kThreads == 0, "float4 chunks must divide evenly over the block");
#pragma unroll
    for (int it = 0; it < ROWS * kPerRow / kThreads; ++it) {
      const int chunk = it * kThreads + threadIdx.x;
      const int r = chunk / kPerRow;
      const int col = (chunk % kPerRow) * 4;
      const bool ok = row0 + r < rows && col < head_dim;
      mt::cp_async_16(tile + r * LD + col, ok ? first + (r * step + col) : src, ok);
    }
  } else {
    static_assert((ROWS * DP) % kThreads == 0, "elements must divide evenly over the block");
#pragma unroll 4
    for (int it = 0; it < ROWS * DP / kThreads; ++it) {
      const int e = it * kThreads + threadIdx.x;
      const int r = e / DP;
      const int col = e % DP;
      const bool ok = row0 + r < rows && col < head_dim;
      mt::cp_async_4(tile + r * LD + col, ok ? first + (r * step + col) : src, ok);
    }
  }
}

// ---- forward -----------------------------------------------------------------------------------
// acc[16 x 8 KD] = acc * row_scale + A B for A [16 x 8 NT] in C fragments `a` (rows g and g + 8 of
// the lane scaled by row_scale[0] and [1]) and B = tile[8 NT][8 KD] (shared, permuted k order). The
// products are summed in fresh accumulators and added in float32: the tensor core's adder truncates,
// so it never sums more than one tile's products.
template <int PREC, int NT, int KD, int LD>
__device__ __forceinline__ void add_tile_product(float (&acc)[KD][4], const float (&a)[NT][4], const float* tile,
                                                 const float (&row_scale)[2]) {
  float part[KD][4] = {};
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const Tf32Frag<4> frag = c_to_a<PREC>(a[j]);
#pragma unroll
    for (int dt = 0; dt < KD; ++dt) mt::mma_prec<PREC>(part[dt], frag, load_b_permuted<PREC, LD>(tile, 8 * j, 8 * dt));
  }
#pragma unroll
  for (int dt = 0; dt < KD; ++dt) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[dt][c] = fmaf(acc[dt][c], row_scale[c / 2], part[dt][c]);
  }
}

template <int DP, int ACT, int PREC>
__global__ void __launch_bounds__(kThreads, FwConfig<DP>::kMinBlocks) attention_fw(const FwParams<float> p) {
  constexpr int BM = kFwRows;
  constexpr int BN = FwConfig<DP>::kKeys;
  constexpr int NT = BN / 8;  // 8-key column tiles of S
  constexpr int KD = DP / 8;  // 8-wide steps over d (and 8-wide column tiles of O)
  constexpr int LD = DP + 4;
  extern __shared__ float4 smem_f4[];
  float* qs = reinterpret_cast<float*>(smem_f4);
  float* ks = qs + BM * LD;
  float* vs = ks + BN * LD;

  const BlockTile block = block_tile();
  const int q0 = (p.causal ? static_cast<int>(gridDim.y) - 1 - block.tile : block.tile) * BM;
  const int warp = threadIdx.x / 32;
  const int g = frag_g();
  const int t = frag_t();
  const Head head(p, block.bh);
  const float* kg = p.k + head.at(p.k_strides);
  const float* vg = p.v + head.at(p.v_strides);
  const float* mask_row = p.mask != nullptr ? p.mask + static_cast<size_t>(head.batch()) * p.k_len : nullptr;

  // The lane's rows: query q0 + 16 warp + g (C elements 0, 1) and + 8 (elements 2, 3).
  int limit[2];  // keys [0, limit) are kept for the row
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int query = q0 + 16 * warp + g + 8 * h;
    limit[h] = query >= p.q_len ? 0 : (p.causal ? min(p.k_len, query + head.offset + 1) : p.k_len);
  }
  const int key_end = p.causal ? max(0, min(p.k_len, min(q0 + BM, p.q_len) + head.offset)) : p.k_len;
  const int num_tiles = (key_end + BN - 1) / BN;
  float o[KD][4] = {};
  RowState rows;

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

    float s[NT][4] = {};
#pragma unroll 1
    for (int kd = 0; kd < KD; ++kd) {
      const Tf32Frag<4> a = load_a<PREC, LD>(qs, 16 * warp, 8 * kd);
#pragma unroll
      for (int j = 0; j < NT; ++j) mt::mma_prec<PREC>(s[j], a, load_b_transposed<PREC, LD>(ks, 8 * j, 8 * kd));
    }
    __syncthreads();  // every warp is done with this K tile
    if (tile + 1 < num_tiles) load_tile<BN, DP>(ks, kg, p.k_strides.token, n0 + BN, p.k_len, p.head_dim, p.vec);
    mt::cp_async_commit();

    float rescale[2];  // softmax: exp2(old max - new max) of each row
    score_step<ACT>(s, rows, rescale, p, mask_row, n0, limit);
    mt::cp_async_wait<1>();  // this V tile (the next K tile may still be in flight)
    __syncthreads();

    add_tile_product<PREC, NT, KD, LD>(o, s, vs, rescale);  // O = O * rescale + P V
    __syncthreads();  // every warp is done with this V tile
    if (tile + 1 < num_tiles) load_tile<BN, DP>(vs, vg, p.v_strides.token, n0 + BN, p.k_len, p.head_dim, p.vec);
    mt::cp_async_commit();
  }

  store_query_rows<ACT>(o, rows, p, head, q0 + 16 * warp);
}

// ---- backward ------------------------------------------------------------------------------------
template <int DP, int ACT, int PREC>
__global__ void __launch_bounds__(kThreads, BwConfig<DP>::kMinBlocks) attention_bw(const BwParams<float> p) {
  constexpr int BN = kBwKeys;
  constexpr int BM = BwConfig<DP>::kQueries;
  constexpr int QT = BM / 8;            // 8-query column tiles of S^T (and k steps of dV, dK)
  constexpr int KD = DP / 8;            // 8-wide steps over d (and column tiles of dK, dV, dQ)
  constexpr int MT = BM / 16;           // 16-query row slabs of dQ
  constexpr int DQ_TILES = KD * MT / kWarps;  // dQ column tiles per warp
  constexpr int LD = DP + 4;
  constexpr int LDT = BM + 4;
  static_assert(DQ_TILES * kWarps == KD * MT, "dQ tiles must divide evenly over the warps");
  extern __shared__ float4 smem_f4[];
  float* ks = reinterpret_cast<float*>(smem_f4);
  float* vs = ks + BN * LD;
  float* qs = vs + BN * LD;
  float* dos = qs + BM * LD;
  float* dst = dos + BM * LD;  // dS^T [BN][LDT]
  float* ls = dst + BN * LDT;  // lse of the query tile
  float* dis = ls + BM;        // D of the query tile

  const BlockTile block = block_tile();
  const int n0 = block.tile * BN;
  const int warp = threadIdx.x / 32;
  const int g = frag_g();
  const int t = frag_t();
  const Head head(p, block.bh);
  const float* qg = p.q + head.at(p.q_strides);
  const float* dog = p.dout + head.at(p.dout_strides);
  // The lane's keys: n0 + 16 warp + g (C elements 0, 1) and + 8 (elements 2, 3).
  float mask_add[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) mask_add[h] = key_mask<ACT>(p, head, n0 + 16 * warp + g + 8 * h);
  const int2 qt_range = query_tile_range<BM>(p, head, n0);
  const int qt_begin = qt_range.x, qt_end = qt_range.y;
  // dQ work of the warp: query slab dq_slab, column tiles dq_col0 .. dq_col0 + DQ_TILES - 1.
  const int dq_slab = warp % MT;
  const int dq_col0 = (warp / MT) * DQ_TILES;

  float dk[KD][4] = {};
  float dv[KD][4] = {};

  if (qt_begin < qt_end) {
    load_tile<BN, DP>(ks, p.k + head.at(p.k_strides), p.k_strides.token, n0, p.k_len, p.head_dim, p.vec);
    load_tile<BN, DP>(vs, p.v + head.at(p.v_strides), p.v_strides.token, n0, p.k_len, p.head_dim, p.vec);
    load_tile<BM, DP>(qs, qg, p.q_strides.token, qt_begin * BM, p.q_len, p.head_dim, p.vec);
    load_tile<BM, DP>(dos, dog, p.dout_strides.token, qt_begin * BM, p.q_len, p.head_dim, p.vec);
    load_row_stats<ACT, BM>(ls, dis, p, head, qt_begin * BM);
    mt::cp_async_commit();
  }
  for (int qt = qt_begin; qt < qt_end; ++qt) {
    const int m0 = qt * BM;
    mt::cp_async_wait<0>();
    __syncthreads();

    float st[QT][4] = {};
    float dpt[QT][4] = {};
#pragma unroll 1
    for (int kd = 0; kd < KD; ++kd) {
      const Tf32Frag<4> ka = load_a<PREC, LD>(ks, 16 * warp, 8 * kd);
      const Tf32Frag<4> va = load_a<PREC, LD>(vs, 16 * warp, 8 * kd);
#pragma unroll
      for (int j = 0; j < QT; ++j) {
        mt::mma_prec<PREC>(st[j], ka, load_b_transposed<PREC, LD>(qs, 8 * j, 8 * kd));
        mt::mma_prec<PREC>(dpt[j], va, load_b_transposed<PREC, LD>(dos, 8 * j, 8 * kd));
      }
    }

    probs_and_dscores<ACT>(st, dpt, p, head, n0 + 16 * warp, m0, mask_add, ls, dis);
#pragma unroll
    for (int j = 0; j < QT; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<float2*>(dst + (16 * warp + g + 8 * h) * LDT + 8 * j + 2 * t) =
            make_float2(dpt[j][2 * h], dpt[j][2 * h + 1]);
      }
    }

    const float keep[2] = {1.f, 1.f};
    add_tile_product<PREC, QT, KD, LD>(dv, st, dos, keep);  // dV += P^T dO
    add_tile_product<PREC, QT, KD, LD>(dk, dpt, qs, keep);  // dK += dS^T Q
    __syncthreads();  // dS^T complete; every warp is done with this Q and dO tile
    if (qt + 1 < qt_end) {
      load_tile<BM, DP>(qs, qg, p.q_strides.token, m0 + BM, p.q_len, p.head_dim, p.vec);
      load_tile<BM, DP>(dos, dog, p.dout_strides.token, m0 + BM, p.q_len, p.head_dim, p.vec);
      load_row_stats<ACT, BM>(ls, dis, p, head, m0 + BM);
    }
    mt::cp_async_commit();

    // dQ[16 dq_slab + r][8 dt + c] of this tile: A = dS (rows of dS^T's columns), B = K.
    float acc[DQ_TILES][4] = {};
#pragma unroll 1
    for (int kk = 0; kk < BN / 8; ++kk) {
      // A[r][k] = dS[16 dq_slab + r][key 8 kk + perm(k)] = dst[8 kk + perm(k)][16 dq_slab + r].
      const Tf32Frag<4> a = fragment<PREC>(dst + (8 * kk + 2 * t) * LDT + 16 * dq_slab + g, {0, 8, LDT, LDT + 8});
#pragma unroll
      for (int n = 0; n < DQ_TILES; ++n) {
        mt::mma_prec<PREC>(acc[n], a, load_b_permuted<PREC, LD>(ks, 8 * kk, 8 * (dq_col0 + n)));
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int query = m0 + 16 * dq_slab + g + 8 * h;
      if (query < p.q_len) {
        float* dq_row = p.dq + (head.row() + query) * p.head_dim;
#pragma unroll
        for (int n = 0; n < DQ_TILES; ++n) {
          atomic_add_pair(dq_row, 8 * (dq_col0 + n) + 2 * t, acc[n][2 * h], acc[n][2 * h + 1], p.head_dim, p.vec);
        }
      }
    }
  }

  store_key_rows(dk, dv, p, head, n0 + 16 * warp);
}

// ---- launchers ---------------------------------------------------------------------------------
// The forward (FwParams<float>) or backward (BwParams<float>) instance of head-dim bucket DP: blocks of query rows
// or of keys for every (batch, head).
template <int DP, int ACT, int PREC>
int launch_bucket(const FwParams<float>& p, int batch_heads, cudaStream_t stream) {
  const dim3 grid = tile_grid(batch_heads, (p.q_len + kFwRows - 1) / kFwRows, batch_heads);
  constexpr int kBytes = fw_smem_floats<DP>() * static_cast<int>(sizeof(float));
  return mt::launch_with_shared_memory<attention_fw<DP, ACT, PREC>>(grid, kThreads, kBytes, stream, p);
}

template <int DP, int ACT, int PREC>
int launch_bucket(const BwParams<float>& p, int batch_heads, cudaStream_t stream) {
  const dim3 grid = tile_grid(batch_heads, (p.k_len + kBwKeys - 1) / kBwKeys, batch_heads);
  constexpr int kBytes = bw_smem_floats<DP>() * static_cast<int>(sizeof(float));
  return mt::launch_with_shared_memory<attention_bw<DP, ACT, PREC>>(grid, kThreads, kBytes, stream, p);
}

template <int ACT, int PREC, class Params>
int launch_head_dim(const Params& p, int batch_heads, cudaStream_t stream) {
  if (p.head_dim <= 32) return launch_bucket<32, ACT, PREC>(p, batch_heads, stream);
  if (p.head_dim <= 64) return launch_bucket<64, ACT, PREC>(p, batch_heads, stream);
  return launch_bucket<128, ACT, PREC>(p, batch_heads, stream);
}

// The kernels of one activation and precision (runtime values: kSoftmax/kRelu, kHighest/kHigh).
template <class Params>
int launch_variant(const Params& p, int activation, int precision, int batch_heads, cudaStream_t stream) {
  if (precision == mt::kHighest) {
    return activation == kSoftmax ? launch_head_dim<kSoftmax, mt::kHighest>(p, batch_heads, stream)
                                  : launch_head_dim<kRelu, mt::kHighest>(p, batch_heads, stream);
  }
  return activation == kSoftmax ? launch_head_dim<kSoftmax, mt::kHigh>(p, batch_heads, stream)
                                : launch_head_dim<kRelu, mt::kHigh>(p, batch_heads, stream);
}

bool sizes_ok(int batch, int heads, int q_len, int k_len, int head_dim, int activation, int precision) {
  return mt_attn::sizes_ok(batch, heads, q_len, k_len, head_dim, activation) &&
         (precision == mt::kHighest || precision == mt::kHigh);
}

}  // namespace

MT_DEFINE_ERROR_STRING()

extern "C" int launch_attention_fw(float* out, float* lse, const float* q, const float* k, const float* v,
                                   const float* mask, int batch, int heads, int q_len, int k_len, int head_dim,
                                   int causal, int activation, int precision, float scale, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(out == nullptr || lse == nullptr || q == nullptr || k == nullptr || v == nullptr);
  MT_RETURN_IF_INVALID(!sizes_ok(batch, heads, q_len, k_len, head_dim, activation, precision));
  const bool vec4 = head_dim % 4 == 0 && mt::is_aligned16(out) && mt::is_aligned16(q) && mt::is_aligned16(k) &&
                    mt::is_aligned16(v);
  const Strides qs = contiguous_strides(heads, q_len, head_dim), ks = contiguous_strides(heads, k_len, head_dim);
  const FwParams<float> p = {out,   lse,   q,     k,     v,        mask,        qs,    ks,  ks,
                             qs,    heads, q_len, k_len, head_dim, causal != 0, scale, vec4};
  const int batch_heads = batch * heads;
  return launch_variant(p, activation, precision, batch_heads, stream);
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
                                   int k_len, int head_dim, int causal, int activation, int precision,
                                   float scale, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(dq == nullptr || dk == nullptr || dv == nullptr || grad_out == nullptr || q == nullptr ||
                       k == nullptr || v == nullptr);
  MT_RETURN_IF_INVALID(!sizes_ok(batch, heads, q_len, k_len, head_dim, activation, precision));
  MT_RETURN_IF_INVALID(activation == kSoftmax && (out == nullptr || lse == nullptr || workspace == nullptr));
  const bool vec4 = head_dim % 4 == 0 && mt::is_aligned16(dq) && mt::is_aligned16(dk) && mt::is_aligned16(dv) &&
                    mt::is_aligned16(grad_out) && mt::is_aligned16(q) && mt::is_aligned16(k) && mt::is_aligned16(v);
  const int batch_heads = batch * heads;
  const int rows = batch_heads * q_len;
  const Strides qs = contiguous_strides(heads, q_len, head_dim), ks = contiguous_strides(heads, k_len, head_dim);
  MT_RETURN_IF_ERROR(cudaMemsetAsync(dq, 0, static_cast<size_t>(rows) * head_dim * sizeof(float), stream));
  if (activation == kSoftmax) {
    attention_bw_dot<float><<<(rows + kDotWarps - 1) / kDotWarps, kDotWarps * 32, 0, stream>>>(
        workspace, grad_out, qs, out, qs, heads, q_len, rows, head_dim);
    MT_RETURN_IF_ERROR(cudaGetLastError());
  }
  const BwParams<float> p = {dq,    dk,    dv,    grad_out, q,     k,     v,        lse,         workspace,
                             mask,  ks,    ks,    qs,       qs,    ks,    ks,       heads,       q_len,
                             k_len, head_dim, causal != 0, scale, vec4};
  return launch_variant(p, activation, precision, batch_heads, stream);
}
