// matmul_simt.cu: C[b] = A[b] @ B[b] in fp32 on the CUDA cores (FFMA), with broadcast batch dims
// and arbitrary strides.
//
// A block computes a BM x BN tile of C (128x128 with 256 threads, or 64x64 with 64 threads when the
// big tiles would not fill the GPU); each thread holds an 8x8 register tile made of 2x2 sub-tiles of
// 4x4 spaced BM/2 and BN/2 apart, so its shared-memory reads are float4 and conflict-free. K
// advances in steps of BK = 8 with two shared-memory buffers: the next tile's global loads are
// issued before the current tile's FFMAs and stored after them (one barrier per step). Global loads
// run along whichever of the tile's dims is contiguous in memory (template flags), as float4 when
// the strides and alignment allow it; tiles are zero-padded at the edges so the inner loop has no
// bounds checks. blockIdx.x picks the tile, blockIdx.y strides over the batch.
//
// launch_matmul follows cuda_check.cuh's contract: device pointers, sizes by value and a
// cudaStream_t in, an int cudaError_t out (cudaErrorInvalidValue for bad sizes).
#include <cuda_runtime.h>

#include "includes/cuda_check.cuh"
#include "includes/device_info.cuh"
#include "includes/launch_utils.cuh"
#include "includes/layout.cuh"
#include "includes/vec.cuh"

namespace {

struct MatmulParams {
  const float* a;
  const float* b;
  float* c;  // contiguous [batch, M, N]
  int M, N, K;
  int a_row_stride, a_k_stride;  // A[i, p] = a[i * a_row_stride + p * a_k_stride]
  int b_k_stride, b_col_stride;  // B[p, j] = b[p * b_k_stride + j * b_col_stride]
  int batch;
  int tiles_n;
  MtLayout a_batch, b_batch;  // storage offset of batch matrix i: layout_offset(x_batch, i)
};

template <int BM, int BN>
struct MatmulConfig {
  static constexpr int kBK = 8;
  static constexpr int kThreadTile = 8;  // 8x8 outputs per thread
  static constexpr int kThreads = (BM / kThreadTile) * (BN / kThreadTile);
  static constexpr int kMinBlocks = 65536 / (kThreads * 128);  // allows up to 128 registers/thread
  static constexpr int kPad = 4;  // keeps float4 alignment and spreads transposed stores over banks
  static constexpr int kGroupsA = BM * kBK / 4 / kThreads;  // 4-element groups a thread loads
  static constexpr int kGroupsB = BN * kBK / 4 / kThreads;
  static_assert(kGroupsA * 4 * kThreads == BM * kBK, "A tile must split evenly over the threads");
  static_assert(kGroupsB * 4 * kThreads == BN * kBK, "B tile must split evenly over the threads");
};

// Loads this thread's groups of the A tile (rows row0.., k k0..) into registers, zero outside A.
// K_FAST: a group is 4 consecutive k of one row; else 4 consecutive rows at one k.
template <int BM, int BN, bool K_FAST>
__device__ __forceinline__ void load_a_tile(const float* A, const MatmulParams& p, int row0, int k0,
                                            bool vec, float (&stage)[MatmulConfig<BM, BN>::kGroupsA][4]) {
  using Cfg = MatmulConfig<BM, BN>;
#pragma unroll
  for (int g = 0; g < Cfg::kGroupsA; ++g) {
    const int e = threadIdx.x + g * Cfg::kThreads;
    const int r = K_FAST ? e / (Cfg::kBK / 4) : (e % (BM / 4)) * 4;
    const int kq = K_FAST ? (e % (Cfg::kBK / 4)) * 4 : e / (BM / 4);
    const int gr = row0 + r, gk = k0 + kq;
    if (K_FAST) {
      if (vec && gr < p.M && gk + 3 < p.K) {
        const float4 v = mt::load_float4(A + gr * p.a_row_stride + gk);
        stage[g][0] = v.x; stage[g][1] = v.y; stage[g][2] = v.z; stage[g][3] = v.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          stage[g][i] = (gr < p.M && gk + i < p.K) ? A[gr * p.a_row_stride + (gk + i) * p.a_k_stride] : 0.f;
        }
      }
    } else {
      if (vec && gr + 3 < p.M && gk < p.K) {
        const float4 v = mt::load_float4(A + gr + gk * p.a_k_stride);
        stage[g][0] = v.x; stage[g][1] = v.y; stage[g][2] = v.z; stage[g][3] = v.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          stage[g][i] = (gr + i < p.M && gk < p.K) ? A[(gr + i) * p.a_row_stride + gk * p.a_k_stride] : 0.f;
        }
      }
    }
  }
}

// Stores the staged A groups transposed, As[k][row], so the compute loop reads rows as float4.
template <int BM, int BN, bool K_FAST>
__device__ __forceinline__ void store_a_tile(float (*As)[BM + MatmulConfig<BM, BN>::kPad],
                                             const float (&stage)[MatmulConfig<BM, BN>::kGroupsA][4]) {
  using Cfg = MatmulConfig<BM, BN>;
#pragma unroll
  for (int g = 0; g < Cfg::kGroupsA; ++g) {
    const int e = threadIdx.x + g * Cfg::kThreads;
    if (K_FAST) {
      const int r = e / (Cfg::kBK / 4), kq = (e % (Cfg::kBK / 4)) * 4;
#pragma unroll
      for (int i = 0; i < 4; ++i) As[kq + i][r] = stage[g][i];
    } else {
      const int r = (e % (BM / 4)) * 4, kq = e / (BM / 4);
      mt::store_float4(&As[kq][r], make_float4(stage[g][0], stage[g][1], stage[g][2], stage[g][3]));
    }
  }
}

// B tile (k k0.., columns col0..). N_FAST: a group is 4 consecutive columns at one k; else 4
// consecutive k of one column.
template <int BM, int BN, bool N_FAST>
__device__ __forceinline__ void load_b_tile(const float* B, const MatmulParams& p, int col0, int k0,
                                            bool vec, float (&stage)[MatmulConfig<BM, BN>::kGroupsB][4]) {
  using Cfg = MatmulConfig<BM, BN>;
#pragma unroll
  for (int g = 0; g < Cfg::kGroupsB; ++g) {
    const int e = threadIdx.x + g * Cfg::kThreads;
    const int c = N_FAST ? (e % (BN / 4)) * 4 : e / (Cfg::kBK / 4);
    const int kq = N_FAST ? e / (BN / 4) : (e % (Cfg::kBK / 4)) * 4;
    const int gc = col0 + c, gk = k0 + kq;
    if (N_FAST) {
      if (vec && gk < p.K && gc + 3 < p.N) {
        const float4 v = mt::load_float4(B + gk * p.b_k_stride + gc);
        stage[g][0] = v.x; stage[g][1] = v.y; stage[g][2] = v.z; stage[g][3] = v.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          stage[g][i] = (gk < p.K && gc + i < p.N) ? B[gk * p.b_k_stride + (gc + i) * p.b_col_stride] : 0.f;
        }
      }
    } else {
      if (vec && gc < p.N && gk + 3 < p.K) {
        const float4 v = mt::load_float4(B + gc * p.b_col_stride + gk);
        stage[g][0] = v.x; stage[g][1] = v.y; stage[g][2] = v.z; stage[g][3] = v.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          stage[g][i] = (gc < p.N && gk + i < p.K) ? B[(gk + i) * p.b_k_stride + gc * p.b_col_stride] : 0.f;
        }
      }
    }
  }
}

template <int BM, int BN, bool N_FAST>
__device__ __forceinline__ void store_b_tile(float (*Bs)[BN + MatmulConfig<BM, BN>::kPad],
                                             const float (&stage)[MatmulConfig<BM, BN>::kGroupsB][4]) {
  using Cfg = MatmulConfig<BM, BN>;
#pragma unroll
  for (int g = 0; g < Cfg::kGroupsB; ++g) {
    const int e = threadIdx.x + g * Cfg::kThreads;
    if (N_FAST) {
      const int c = (e % (BN / 4)) * 4, kq = e / (BN / 4);
      mt::store_float4(&Bs[kq][c], make_float4(stage[g][0], stage[g][1], stage[g][2], stage[g][3]));
    } else {
      const int c = e / (Cfg::kBK / 4), kq = (e % (Cfg::kBK / 4)) * 4;
#pragma unroll
      for (int i = 0; i < 4; ++i) Bs[kq + i][c] = stage[g][i];
    }
  }
}

template <int BM, int BN, bool A_K_FAST, bool B_N_FAST>
__global__ void __launch_bounds__(MatmulConfig<BM, BN>::kThreads, MatmulConfig<BM, BN>::kMinBlocks)
matmul_kernel(const MatmulParams p) {
  using Cfg = MatmulConfig<BM, BN>;
  constexpr int BK = Cfg::kBK;
  __shared__ __align__(16) float As[2][BK][BM + Cfg::kPad];
  __shared__ __align__(16) float Bs[2][BK][BN + Cfg::kPad];

  const int tile_m = blockIdx.x / p.tiles_n;
  const int tile_n = blockIdx.x - tile_m * p.tiles_n;
  const int row0 = tile_m * BM, col0 = tile_n * BN;
  const int tx = threadIdx.x % (BN / 8), ty = threadIdx.x / (BN / 8);
  const int num_k_tiles = (p.K + BK - 1) / BK;
  const bool a_vec_layout = A_K_FAST ? (p.a_k_stride == 1 && p.a_row_stride % 4 == 0)
                                     : (p.a_row_stride == 1 && p.a_k_stride % 4 == 0);
  const bool b_vec_layout = B_N_FAST ? (p.b_col_stride == 1 && p.b_k_stride % 4 == 0)
                                     : (p.b_k_stride == 1 && p.b_col_stride % 4 == 0);
  const bool c_vec = p.N % 4 == 0 && mt::is_aligned16(p.c);

  for (int bi = blockIdx.y; bi < p.batch; bi += gridDim.y) {
    const float* A = p.a + mt::layout_offset(p.a_batch, bi);
    const float* B = p.b + mt::layout_offset(p.b_batch, bi);
    float* C = p.c + static_cast<long long>(bi) * p.M * p.N;
    const bool a_vec = a_vec_layout && mt::is_aligned16(A);
    const bool b_vec = b_vec_layout && mt::is_aligned16(B);

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
    }
    float a_stage[Cfg::kGroupsA][4];
    float b_stage[Cfg::kGroupsB][4];

    load_a_tile<BM, BN, A_K_FAST>(A, p, row0, 0, a_vec, a_stage);
    load_b_tile<BM, BN, B_N_FAST>(B, p, col0, 0, b_vec, b_stage);
    __syncthreads();  // the previous batch matrix's last reads of buffer 0 are done
    store_a_tile<BM, BN, A_K_FAST>(As[0], a_stage);
    store_b_tile<BM, BN, B_N_FAST>(Bs[0], b_stage);
    __syncthreads();

    for (int t = 0; t < num_k_tiles; ++t) {
      const int cur = t & 1;
      const bool has_next = t + 1 < num_k_tiles;
      if (has_next) {
        load_a_tile<BM, BN, A_K_FAST>(A, p, row0, (t + 1) * BK, a_vec, a_stage);
        load_b_tile<BM, BN, B_N_FAST>(B, p, col0, (t + 1) * BK, b_vec, b_stage);
      }
      // Unrolled by 2, not 8: full unrolling lets the compiler prefetch fragments of every kk and
      // pushes the kernel past 128 registers (2 blocks/SM), spilling the tile loaders' addresses.
#pragma unroll 2
      for (int kk = 0; kk < BK; ++kk) {
        const float4 a0 = mt::load_float4(&As[cur][kk][ty * 4]);
        const float4 a1 = mt::load_float4(&As[cur][kk][BM / 2 + ty * 4]);
        const float4 b0 = mt::load_float4(&Bs[cur][kk][tx * 4]);
        const float4 b1 = mt::load_float4(&Bs[cur][kk][BN / 2 + tx * 4]);
        const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
      }
      if (has_next) {
        store_a_tile<BM, BN, A_K_FAST>(As[cur ^ 1], a_stage);
        store_b_tile<BM, BN, B_N_FAST>(Bs[cur ^ 1], b_stage);
      }
      __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = row0 + (i < 4 ? ty * 4 + i : BM / 2 + ty * 4 + (i - 4));
      if (r < p.M) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = col0 + h * (BN / 2) + tx * 4;
          float* dst = C + static_cast<long long>(r) * p.N + c;
          if (c_vec && c + 3 < p.N) {
            mt::store_float4(dst, make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2],
                                              acc[i][4 * h + 3]));
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if (c + j < p.N) dst[j] = acc[i][4 * h + j];
            }
          }
        }
      }
    }
  }
}

template <int BM, int BN>
int launch_matmul_config(MatmulParams p, cudaStream_t stream) {
  using Cfg = MatmulConfig<BM, BN>;
  const long long tiles_m = mt::ceil_div(p.M, BM), tiles_n = mt::ceil_div(p.N, BN);
  MT_RETURN_IF_INVALID(tiles_m * tiles_n > mt::kMaxInt);
  p.tiles_n = static_cast<int>(tiles_n);
  const dim3 grid(static_cast<unsigned>(tiles_m * tiles_n), static_cast<unsigned>(p.batch < 65535 ? p.batch : 65535));
  // A is "k-fast" unless its rows are the contiguous dim (a transposed view); B is "n-fast" unless
  // its k dim is the contiguous one.
  const bool a_k_fast = !(p.a_row_stride == 1 && p.a_k_stride != 1);
  const bool b_n_fast = !(p.b_k_stride == 1 && p.b_col_stride != 1);
  if (a_k_fast && b_n_fast) {
    matmul_kernel<BM, BN, true, true><<<grid, Cfg::kThreads, 0, stream>>>(p);
  } else if (a_k_fast) {
    matmul_kernel<BM, BN, true, false><<<grid, Cfg::kThreads, 0, stream>>>(p);
  } else if (b_n_fast) {
    matmul_kernel<BM, BN, false, true><<<grid, Cfg::kThreads, 0, stream>>>(p);
  } else {
    matmul_kernel<BM, BN, false, false><<<grid, Cfg::kThreads, 0, stream>>>(p);
  }
  return mt_launch_status();
}

}  // namespace

extern "C" {

MT_DEFINE_ERROR_STRING()

// out[b] = A[b] @ B[b] for every batch index b of the (equal) shapes of a_batch and b_batch; out is
// contiguous [batch..., M, N]; A[b][i, p] = a[layout_offset(a_batch, b) + i * a_row_stride +
// p * a_k_stride], B[b][p, j] = b[layout_offset(b_batch, b) + p * b_k_stride + j * b_col_stride].
int launch_matmul(float* out, const float* a, const float* b, int M, int N, int K, int a_row_stride,
                  int a_k_stride, int b_k_stride, int b_col_stride, MtLayout a_batch,
                  MtLayout b_batch, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(M < 0 || N < 0 || K < 0);
  MT_RETURN_IF_INVALID(!mt::valid_layout(a_batch) || !mt::valid_layout(b_batch) ||
                       !mt::same_shape(a_batch, b_batch));
  const long long batch = mt::layout_numel(a_batch);
  MT_RETURN_IF_INVALID(batch > mt::kMaxInt || batch * M * N > mt::kMaxInt);
  if (batch == 0 || M == 0 || N == 0) return 0;
  int sms = 0;
  MT_RETURN_IF_ERROR(mt::sm_count(&sms));
  MatmulParams p{a, b, out, M, N, K, a_row_stride, a_k_stride, b_k_stride, b_col_stride,
                 static_cast<int>(batch), 0, a_batch, b_batch};
  // Big tiles do twice the work per shared-memory byte; small ones keep the SMs busy when the
  // problem has too few big tiles.
  const long long big_tiles = mt::ceil_div(M, 128) * mt::ceil_div(N, 128) * batch;
  if (big_tiles >= sms) return launch_matmul_config<128, 128>(p, stream);
  return launch_matmul_config<64, 64>(p, stream);
}

}  // extern "C"
