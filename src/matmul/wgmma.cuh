// The first Hopper kernel of the matmul library (sm_90a): cp.async staging as in the mma.sync kernel
// (tiles.cuh), B converted by all threads, products on wgmma. It serves the big tiles whose operands
// the TMA path (tma_kernel.cuh) cannot read.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../includes/layout.cuh"
#include "../includes/mma_tf32.cuh"
#include "../includes/ptx.cuh"
#include "params.cuh"
#include "tiles.cuh"
#include "wgmma_ops.cuh"

namespace {

using mt::set_operand;

// ------------------------------------------------------------------------------------------------
// wgmma kernel (sm_90a): the same tiles and ring, products on Hopper's warpgroup MMA.
// Block 128 x 128 x 32, two warpgroups of 64 rows each; per K tile each warpgroup issues
// wgmma.m64n128k8 with A from registers (fragments read from the staged A tile, as in the mma.sync
// kernel, split or rounded there) and B from shared memory. wgmma reads a TF32 B only K-major, in 8-row
// x 16-byte core matrices: all threads first convert the staged B tile (either layout) into that form,
// as hi (and lo) words, with k permuted as the A fragments permute it. Element (n, slot s) of k8 step j
// sits at word j * 8 * BN + (s / 4) * 4 * BN + (n / 8) * 32 + (n % 8) * 4 + s % 4: the core matrices of
// one k half are 128 bytes apart along n (stride offset) and the two halves 4 * BN words apart (leading
// offset). Tile kt's products run while the threads convert tile kt + 1 into the other of two buffers;
// they are waited for (and, for "highest", added to the running sums) just before tile kt + 1's issue.
// The body exists only where the sm_90a instructions were compiled. Elsewhere the kernel declares a
// 1-thread limit, which the host reads (cudaFuncGetAttributes) to know whether it can launch it.
// ------------------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MT_WGMMA_THREADS 256
#else
#define MT_WGMMA_THREADS 1
#endif
constexpr int kWgThreads = 256, kWgBM = 128, kWgBN = 128;
// Ring depth and blocks per SM. "high" is bound by the L2 -> SM traffic of its float32 tiles (32 flops
// per byte); two blocks per SM (fewer stages to fit) keep more of it in flight and overlap one block's
// conversion with the other's products. "highest", 3x the products per byte, needs the registers of a
// whole SM-half for its fresh accumulators.
template <int PREC>
struct WgmmaShape {
  static constexpr int kStages = PREC == kHigh ? 2 : 3, kBlocksPerSm = PREC == kHigh ? 2 : 1;
};

template <int PREC, bool A_KC, bool B_KC>
constexpr int wgmma_smem_bytes() {
  constexpr int ring = OperandTile<kWgBM, A_KC, kWgThreads>::kFloats + OperandTile<kWgBN, B_KC, kWgThreads>::kFloats;
  return 4 * (2 * (PREC == kHighest ? 2 : 1) * kWgBN * kBK + WgmmaShape<PREC>::kStages * ring);
}

template <int PREC, bool A_KC, bool B_KC>
__global__ void __launch_bounds__(MT_WGMMA_THREADS, WgmmaShape<PREC>::kBlocksPerSm)
    matmul_wgmma_kernel(const MatmulParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using ATile = OperandTile<kWgBM, A_KC, kWgThreads>;
  using BTile = OperandTile<kWgBN, B_KC, kWgThreads>;
  constexpr int STAGES = WgmmaShape<PREC>::kStages, BN = kWgBN, kConv = BN * kBK, kConvSets = PREC == kHighest ? 2 : 1;
  extern __shared__ __align__(128) float smem[];
  float* conv = smem;  // two buffers of B hi (then B lo for "highest")
  float* a_smem = smem + 2 * kConvSets * kConv;
  float* b_smem = a_smem + STAGES * ATile::kFloats;

  const BlockWork w(p, kWgBM, BN);
  const int row0 = w.row0, col0 = w.col0, k_tiles = w.k_tiles;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int arow = (threadIdx.x / 128) * 64 + (threadIdx.x / 32 % 4) * 16 + g;  // fragment rows arow, arow + 8

  for (int bi = blockIdx.z; bi < p.batch; bi += gridDim.z) {
    const float* A = p.a + mt::layout_offset(p.a_batch, bi);
    const float* B = p.b + mt::layout_offset(p.b_batch, bi);
    const auto load_stage = [&](int kt) { load_ring_stage<ATile, BTile, STAGES>(p, w, A, B, a_smem, b_smem, kt); };

    __syncthreads();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) load_stage(s);

    float acc[64] = {}, fresh[64];
    // Waits for the products in flight; "highest" adds them (tile kt - 1's fresh sums) to acc.
    const auto finish_products = [&](bool pending) {
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      fence_registers(PREC == kHighest ? fresh : acc);
      if (PREC == kHighest && pending) {
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] += fresh[i];
      }
    };
    for (int kt = 0; kt < k_tiles; ++kt) {
      mt::cp_async_wait<STAGES - 2>();
      __syncthreads();  // tile kt landed; the products of tile kt - 2 (which read this conv buffer) are done
      const float* As = a_smem + (kt % STAGES) * ATile::kFloats;
      const float* Bs = b_smem + (kt % STAGES) * BTile::kFloats;
      float* cb = conv + (kt & 1) * kConvSets * kConv;
#pragma unroll
      for (int i = 0; i < BN * 4 / kWgThreads; ++i) {  // unit: 8 k (one k8 step) of one column n
        const int u = threadIdx.x + i * kWgThreads, n = u % BN, j = u / BN;
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
          const float2 w = BTile::pair(Bs, n, 8 * j, e / 2);
          v[e] = w.x, v[e + 1] = w.y;
        }
        float* dst = cb + j * 8 * BN + (n / 8) * 32 + (n % 8) * 4;
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // slots 0-3 hold k = 8j, 8j + 2, .., slots 4-7 k = 8j + 1, ..
          mt::Tf32Frag<4> f;
#pragma unroll
          for (int s = 0; s < 4; ++s) set_operand<PREC>(f, s, v[2 * s + h]);
          *reinterpret_cast<uint4*>(dst + h * 4 * BN) = *reinterpret_cast<const uint4*>(f.hi);
          if constexpr (PREC == kHighest) *reinterpret_cast<uint4*>(dst + kConv + h * 4 * BN) = *reinterpret_cast<const uint4*>(f.lo);
        }
      }
      // The stores must be visible to wgmma (the async proxy). The fence waits for all of this
      // thread's outstanding memory operations, so the next tile's copies are issued after it.
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
      load_stage(kt + STAGES - 1);  // into the slot of tile kt - 1, which every thread has consumed

      finish_products(kt > 0);  // tile kt - 1's products ran during the conversion above
      mt::Tf32Frag<4> af[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 top = ATile::pair(As, arow, 8 * j, t), bottom = ATile::pair(As, arow + 8, 8 * j, t);
        set_operand<PREC>(af[j], 0, top.x);
        set_operand<PREC>(af[j], 1, bottom.x);
        set_operand<PREC>(af[j], 2, top.y);
        set_operand<PREC>(af[j], 3, bottom.y);
      }
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint64_t b_hi = smem_desc(cb + j * 8 * BN, 4 * BN * 4, 128);
        if constexpr (PREC == kHighest) {
          const uint64_t b_lo = smem_desc(cb + kConv + j * 8 * BN, 4 * BN * 4, 128);
          wgmma_m64n128k8(fresh, af[j].lo, b_hi, j > 0);
          wgmma_m64n128k8(fresh, af[j].hi, b_lo, 1);
          wgmma_m64n128k8(fresh, af[j].hi, b_hi, 1);
        } else {
          wgmma_m64n128k8(acc, af[j].hi, b_hi, 1);
        }
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    }
    finish_products(k_tiles > 0);
    mt::cp_async_wait<0>();
    __syncthreads();
    static_assert(kWgBM * (BN + 8) <= 2 * kConv + STAGES * (ATile::kFloats + BTile::kFloats), "C tile must fit");
#pragma unroll
    for (int j = 0; j < 16; ++j) put_fragment<BN>(smem, arow, 8 * j + 2 * t, acc + 4 * j);
    __syncthreads();
    store_tile<kWgBM, BN, kWgThreads>(p, smem, bi, row0, col0);
  }
#endif
}

}  // namespace
