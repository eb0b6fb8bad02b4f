// The mma.sync kernel (sm_80+): block tile BM x BN x 32, warps of WM x WN outputs made of m16n8k8
// tiles (fragment layout in includes/mma_tf32.cuh), operands staged by tiles.cuh's ring.
// Grid: x = output tile (tile_coords), y = K split, z = batch.
#pragma once

#include <cuda_runtime.h>

#include "../includes/layout.cuh"
#include "../includes/mma_tf32.cuh"
#include "../includes/ptx.cuh"
#include "params.cuh"
#include "tiles.cuh"

namespace {

using mt::set_operand;

template <int BM_, int BN_, int WARPS_M, int WARPS_N, int STAGES_>
struct MmaConfig {
  static constexpr int kBM = BM_, kBN = BN_, kWarpsN = WARPS_N, kStages = STAGES_;
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static constexpr int kMI = BM_ / WARPS_M / 16;  // m16 tiles per warp
  static constexpr int kNI = BN_ / WARPS_N / 8;   // n8 tiles per warp
};
// 64 x 32 outputs per warp: with "highest"'s second set of accumulators (the K tile's fresh sums)
// and split fragments that is ~220 registers, so one block per SM.
using BigMma = MmaConfig<128, 128, 2, 4, 4>;
using SmallMma = MmaConfig<64, 64, 2, 2, 4>;

template <class Cfg, bool A_KC, bool B_KC>
constexpr int mma_smem_bytes() {
  return Cfg::kStages * 4 *
         (OperandTile<Cfg::kBM, A_KC, Cfg::kThreads>::kFloats + OperandTile<Cfg::kBN, B_KC, Cfg::kThreads>::kFloats);
}

template <class Cfg, bool A_KC, bool B_KC, int PREC>
__global__ void __launch_bounds__(Cfg::kThreads, 1) matmul_mma_kernel(const MatmulParams p) {
  using ATile = OperandTile<Cfg::kBM, A_KC, Cfg::kThreads>;
  using BTile = OperandTile<Cfg::kBN, B_KC, Cfg::kThreads>;
  constexpr int MI = Cfg::kMI, NI = Cfg::kNI, STAGES = Cfg::kStages;
  extern __shared__ __align__(128) float smem[];
  float* a_smem = smem;
  float* b_smem = smem + STAGES * ATile::kFloats;

  const BlockWork w(p, Cfg::kBM, Cfg::kBN);
  const int row0 = w.row0, col0 = w.col0, k_tiles = w.k_tiles;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int wm0 = (warp / Cfg::kWarpsN) * MI * 16, wn0 = (warp % Cfg::kWarpsN) * NI * 8;

  for (int bi = blockIdx.z; bi < p.batch; bi += gridDim.z) {
    const float* A = p.a + mt::layout_offset(p.a_batch, bi);
    const float* B = p.b + mt::layout_offset(p.b_batch, bi);
    const auto load_stage = [&](int kt) { load_ring_stage<ATile, BTile, STAGES>(p, w, A, B, a_smem, b_smem, kt); };

    __syncthreads();  // the previous batch matrix's reads of the ring are done
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) load_stage(s);

    float acc[MI][NI][4] = {};
    for (int kt = 0; kt < k_tiles; ++kt) {
      mt::cp_async_wait<STAGES - 2>();
      __syncthreads();  // tile kt visible to all; slot (kt - 1) % STAGES free for tile kt + STAGES - 1
      load_stage(kt + STAGES - 1);
      const float* As = a_smem + (kt % STAGES) * ATile::kFloats;
      const float* Bs = b_smem + (kt % STAGES) * BTile::kFloats;
      float fresh[MI][NI][4] = {};
      float (&sum)[MI][NI][4] = PREC == kHighest ? fresh : acc;
#pragma unroll
      for (int k8 = 0; k8 < kBK; k8 += 8) {
        mt::Tf32Frag<4> af[MI];
        mt::Tf32Frag<2> bf[NI];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          const float2 top = ATile::pair(As, wm0 + mi * 16 + g, k8, t);
          const float2 bottom = ATile::pair(As, wm0 + mi * 16 + g + 8, k8, t);
          set_operand<PREC>(af[mi], 0, top.x);
          set_operand<PREC>(af[mi], 1, bottom.x);
          set_operand<PREC>(af[mi], 2, top.y);
          set_operand<PREC>(af[mi], 3, bottom.y);
        }
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          const float2 words = BTile::pair(Bs, wn0 + ni * 8 + g, k8, t);
          set_operand<PREC>(bf[ni], 0, words.x);
          set_operand<PREC>(bf[ni], 1, words.y);
        }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            mt::mma_prec<PREC>(sum[mi][ni], af[mi], bf[ni]);
          }
        }
      }
      if constexpr (PREC == kHighest) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] += fresh[mi][ni][e];
          }
        }
      }
    }
    mt::cp_async_wait<0>();
    __syncthreads();  // every warp is done with the ring, which now holds the output tile

    static_assert(Cfg::kBM * (Cfg::kBN + 8) <= STAGES * (ATile::kFloats + BTile::kFloats), "C tile must fit");
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) put_fragment<Cfg::kBN>(smem, wm0 + mi * 16 + g, wn0 + ni * 8 + 2 * t, acc[mi][ni]);
    }
    __syncthreads();
    store_tile<Cfg::kBM, Cfg::kBN, Cfg::kThreads>(p, smem, bi, row0, col0);
  }
}

}  // namespace
