// The generic bf16 kernel of matmul_bf16_kernel.cu (sm_80+): mma.sync m16n8k16, any strides, any sizes.
//
// Block BM x BN x 32, warps of WM x WN outputs made of m16n8k16 tiles, float32 accumulators. Operands
// stream through a STAGES-deep ring in shared memory. Each operand tile keeps the global memory's
// contiguous dim contiguous in shared memory, so that 16-byte copies (8 elements) work for transposed
// views too, and ldmatrix (.trans where the tile is MN-contiguous) makes the fragments:
//   k-contiguous tile:    [rows][32 + 8]   (80-byte rows),
//   rows-contiguous tile: [32][rows + 8]   (rows + 8 elements: 16-byte aligned, 4 banks apart).
// Both pitches put the 8 rows that one ldmatrix matrix reads in 8 different 16-byte bank groups.
// Fragments (PTX ISA, g = lane / 4, t = lane % 4): A a0a1 = A[g][2t..], a2a3 = A[g + 8][2t..],
// a4a5 = A[g][2t + 8..], a6a7 = A[g + 8][2t + 8..]; B b0b1 = B[2t..][g], b2b3 = B[2t + 8..][g];
// C c0c1 = C[g][2t..], c2c3 = C[g + 8][2t..].
// 16-byte cp.async copies need the contiguous dim at stride 1, the other stride and the batch strides
// multiples of 8 elements and a 16-byte aligned base; a chunk crossing the matrix edge reads only its
// valid part and zero-fills the rest. Other layouts load element by element into registers.
//
// Grid: x = output tile (grouped, tile_coords), y = K split, z = batch (looping past 65535). The
// epilogue stores from the accumulators (store_run); a K split writes float32 partial sums instead.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "../includes/ptx.cuh"
#include "../includes/vec.cuh"
#include "bf16_common.cuh"

namespace bf16mm {

constexpr int kMmaBK = 32;

__device__ __forceinline__ void cp_async_16_partial(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(mt::shared_address(dst)), "l"(src), "r"(bytes)
               : "memory");
}

// Four 8 x 8 bf16 matrices from shared memory (rows at the addresses of lanes 8q .. 8q + 7 for matrix
// q), transposed where TRANS.
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* row) {
  if constexpr (TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mt::shared_address(row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mt::shared_address(row)));
  }
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One operand tile of ROWS x kMmaBK in shared memory; X[row, k] = x[row * row_stride + k * k_stride].
// The tile is cut into chunks of 8 elements along its contiguous dim, THREADS chunks per pass.
template <int ROWS, bool K_CONTIG, int THREADS>
struct OperandTile {
  static constexpr int kPitch = K_CONTIG ? kMmaBK + 8 : ROWS + 8;
  static constexpr int kElems = K_CONTIG ? ROWS * kPitch : kMmaBK * kPitch;
  static constexpr int kChunks = ROWS * kMmaBK / 8;
  static_assert(kChunks % THREADS == 0, "tile must split evenly over the threads");

  // Rows row0.. and k k0.. of X; rows >= rows and k >= k_end read as zeros.
  __device__ __forceinline__ static void load(__nv_bfloat16* tile, const __nv_bfloat16* x, int row0, int rows, int k0,
                                              int k_end, int row_stride, int k_stride, bool vec) {
#pragma unroll 1
    for (int i = 0; i < kChunks / THREADS; ++i) {
      const int c = threadIdx.x + i * THREADS;
      const int r = K_CONTIG ? c / (kMmaBK / 8) : (c % (ROWS / 8)) * 8;
      const int k = K_CONTIG ? (c % (kMmaBK / 8)) * 8 : c / (ROWS / 8);
      __nv_bfloat16* dst = tile + (K_CONTIG ? r * kPitch + k : k * kPitch + r);
      const int gr = row0 + r, gk = k0 + k;
      // Elements of the chunk inside the matrix along its contiguous dim, if the other index is inside.
      const bool inside = K_CONTIG ? gr < rows : gk < k_end;
      const int valid = inside ? max(0, min(8, K_CONTIG ? k_end - gk : rows - gr)) : 0;
      const __nv_bfloat16* src = x + (static_cast<long long>(gr) * row_stride + static_cast<long long>(gk) * k_stride);
      if (vec) {
        cp_async_16_partial(dst, valid > 0 ? src : x, valid * 2);
      } else {
        const long long step = K_CONTIG ? k_stride : row_stride;
        __align__(16) __nv_bfloat16 v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = e < valid ? src[e * step] : __float2bfloat16_rn(0.f);
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
      }
    }
  }

  // ldmatrix row address of this lane for the A fragment at tile rows row0.., k k0..: matrix q = lane / 8
  // covers rows row0 + 8 (q % 2).. and k k0 + 8 (q / 2).., so r = {a0a1, a2a3, a4a5, a6a7}.
  __device__ __forceinline__ static const __nv_bfloat16* a_row(const __nv_bfloat16* tile, int row0, int k0) {
    const int lane = threadIdx.x % 32, q = lane / 8, r = lane % 8;
    if (K_CONTIG) return tile + (row0 + 8 * (q % 2) + r) * kPitch + k0 + 8 * (q / 2);
    return tile + (k0 + 8 * (q / 2) + r) * kPitch + row0 + 8 * (q % 2);
  }

  // B fragments of two n8 blocks (tile rows n0.. and n0 + 8..) at k k0..: matrix q covers n
  // n0 + 8 (q / 2).. and k k0 + 8 (q % 2).., so r = {b0b1, b2b3} of block n0, then of block n0 + 8.
  __device__ __forceinline__ static void fragment_b(uint32_t (&f)[4], const __nv_bfloat16* tile, int n0, int k0) {
    const int lane = threadIdx.x % 32, q = lane / 8, r = lane % 8;
    if (K_CONTIG) {
      ldmatrix_x4<false>(f, tile + (n0 + 8 * (q / 2) + r) * kPitch + k0 + 8 * (q % 2));
    } else {
      ldmatrix_x4<true>(f, tile + (k0 + 8 * (q % 2) + r) * kPitch + n0 + 8 * (q / 2));
    }
  }
};

template <int BM_, int BN_, int WARPS_M, int WARPS_N, int STAGES_, int BLOCKS_PER_SM>
struct MmaConfig {
  static constexpr int kBM = BM_, kBN = BN_, kWarpsN = WARPS_N, kStages = STAGES_, kBlocksPerSm = BLOCKS_PER_SM;
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static constexpr int kMI = BM_ / WARPS_M / 16;  // m16 tiles per warp
  static constexpr int kNI = BN_ / WARPS_N / 8;   // n8 tiles per warp
  static_assert(kNI % 2 == 0, "B fragments load two n8 blocks at a time");
};
using BigMma = MmaConfig<128, 128, 2, 4, 4, 2>;  // 64 x 32 outputs per warp, 80 KB
using SmallMma = MmaConfig<64, 64, 2, 2, 4, 4>;  // 32 x 32 outputs per warp, 40 KB

template <class Cfg, bool A_KC, bool B_KC>
constexpr int mma_smem_bytes() {
  return Cfg::kStages * 2 *
         (OperandTile<Cfg::kBM, A_KC, Cfg::kThreads>::kElems + OperandTile<Cfg::kBN, B_KC, Cfg::kThreads>::kElems);
}

template <class Cfg, bool A_KC, bool B_KC>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kBlocksPerSm) matmul_bf16_mma_kernel(const Params p, bool a_vec, bool b_vec) {
  using ATile = OperandTile<Cfg::kBM, A_KC, Cfg::kThreads>;
  using BTile = OperandTile<Cfg::kBN, B_KC, Cfg::kThreads>;
  constexpr int MI = Cfg::kMI, NI = Cfg::kNI, STAGES = Cfg::kStages;
  extern __shared__ __align__(128) __nv_bfloat16 smem[];
  __nv_bfloat16* a_smem = smem;
  __nv_bfloat16* b_smem = smem + STAGES * ATile::kElems;

  int tm, tn;
  tile_coords(blockIdx.x, p.tiles_m, p.tiles_n, &tm, &tn);
  const int row0 = tm * Cfg::kBM, col0 = tn * Cfg::kBN;
  const int kt_begin = blockIdx.y * p.k_tiles_per_split;
  const int k_tiles = max(0, min(p.k_tiles_per_split, p.k_tiles - kt_begin));
  const int k_end = min(p.K, (kt_begin + k_tiles) * kMmaBK);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int wm0 = (warp / Cfg::kWarpsN) * MI * 16, wn0 = (warp % Cfg::kWarpsN) * NI * 8;

  for (int bi = blockIdx.z; bi < p.batch; bi += gridDim.z) {
    const __nv_bfloat16* A = p.a + mt::layout_offset(p.a_batch, bi);
    const __nv_bfloat16* B = p.b + mt::layout_offset(p.b_batch, bi);
    // Queues K tile kt (none past the last) into slot kt % STAGES and commits a group either way, so
    // that cp_async_wait<STAGES - 2> always means "tile kt landed".
    const auto load_stage = [&](int kt) {
      if (kt < k_tiles) {
        const int slot = kt % STAGES, k0 = (kt_begin + kt) * kMmaBK;
        ATile::load(a_smem + slot * ATile::kElems, A, row0, p.M, k0, k_end, p.a_row_stride, p.a_k_stride, a_vec);
        BTile::load(b_smem + slot * BTile::kElems, B, col0, p.N, k0, k_end, p.b_col_stride, p.b_k_stride, b_vec);
      }
      mt::cp_async_commit();
    };

    __syncthreads();  // the previous batch matrix's reads of the ring are done
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) load_stage(s);

    float acc[MI][NI][4] = {};
    for (int kt = 0; kt < k_tiles; ++kt) {
      mt::cp_async_wait<STAGES - 2>();
      __syncthreads();  // tile kt visible to all; slot (kt - 1) % STAGES free for tile kt + STAGES - 1
      load_stage(kt + STAGES - 1);
      const __nv_bfloat16* As = a_smem + (kt % STAGES) * ATile::kElems;
      const __nv_bfloat16* Bs = b_smem + (kt % STAGES) * BTile::kElems;
#pragma unroll
      for (int k16 = 0; k16 < kMmaBK; k16 += 16) {
        uint32_t af[MI][4], bf[NI / 2][4];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) ldmatrix_x4<!A_KC>(af[mi], ATile::a_row(As, wm0 + mi * 16, k16));
#pragma unroll
        for (int nj = 0; nj < NI / 2; ++nj) BTile::fragment_b(bf[nj], Bs, wn0 + nj * 16, k16);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            const uint32_t* b = bf[ni / 2] + 2 * (ni % 2);
            mma_bf16(acc[mi][ni], af[mi], b[0], b[1]);
          }
        }
      }
    }
    mt::cp_async_wait<0>();

#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int c = col0 + wn0 + ni * 8 + 2 * t;
        if (c >= p.N) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = row0 + wm0 + mi * 16 + g + 8 * h;
          float x[2] = {acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]};
          if (r < p.M) store_run<2>(p, blockIdx.y, bi, r, c, x, c + 1 < p.N ? 2 : 1);
        }
      }
    }
  }
}

// Whether 16-byte copies can stage an operand: its contiguous dim at stride 1, the other stride and
// every batch stride multiples of 8 elements, and a 16-byte aligned base.
inline bool vec_operand(const void* x, int contiguous_stride, int other_stride, const MtLayout& batch) {
  if (contiguous_stride != 1 || other_stride % 8 != 0 || !mt::is_aligned16(x)) return false;
  for (int d = 0; d < batch.ndim; ++d) {
    if (batch.shape[d] > 1 && batch.strides[d] % 8 != 0) return false;
  }
  return true;
}

template <class Cfg, bool A_KC, bool B_KC>
int launch_mma_instance(const Params& p, bool a_vec, bool b_vec, dim3 grid, cudaStream_t stream) {
  static std::atomic<unsigned long long> configured{0};
  const auto kernel = matmul_bf16_mma_kernel<Cfg, A_KC, B_KC>;
  constexpr int smem = mma_smem_bytes<Cfg, A_KC, B_KC>();
  MT_RETURN_IF_ERROR(mt::allow_shared_memory(kernel, smem, &configured));
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(p, a_vec, b_vec);
  return mt_launch_status();
}

// Launches the instance of Cfg for the operand layouts over p's tiles and `splits` K splits. A tile is
// k-contiguous unless the operand's rows (columns for B) are its unit-stride dim.
template <class Cfg>
int launch_mma(Params p, int splits, cudaStream_t stream) {
  const bool a_kc = !(p.a_row_stride == 1 && p.a_k_stride != 1);
  const bool b_kc = !(p.b_col_stride == 1 && p.b_k_stride != 1);
  p.tiles_m = static_cast<int>(ceil_div(p.M, Cfg::kBM));
  p.tiles_n = static_cast<int>(ceil_div(p.N, Cfg::kBN));
  const bool a_vec = a_kc ? vec_operand(p.a, p.a_k_stride, p.a_row_stride, p.a_batch)
                          : vec_operand(p.a, p.a_row_stride, p.a_k_stride, p.a_batch);
  const bool b_vec = b_kc ? vec_operand(p.b, p.b_k_stride, p.b_col_stride, p.b_batch)
                          : vec_operand(p.b, p.b_col_stride, p.b_k_stride, p.b_batch);
  const dim3 grid(p.tiles_m * p.tiles_n, splits, std::min(p.batch, kMaxGridZ));
  if (a_kc && b_kc) return launch_mma_instance<Cfg, true, true>(p, a_vec, b_vec, grid, stream);
  if (a_kc) return launch_mma_instance<Cfg, true, false>(p, a_vec, b_vec, grid, stream);
  if (b_kc) return launch_mma_instance<Cfg, false, true>(p, a_vec, b_vec, grid, stream);
  return launch_mma_instance<Cfg, false, false>(p, a_vec, b_vec, grid, stream);
}

// The planner's view of the two configurations (mma.sync bf16 on an H100: ~2.5 TFLOP/s per SM with
// big tiles, two blocks each; small tiles ~60% of that, four blocks each).
constexpr TileShape kMmaShapes[] = {{128, 128, kMmaBK, BigMma::kBlocksPerSm, 2.5e12},
                                    {64, 64, kMmaBK, SmallMma::kBlocksPerSm, 1.5e12}};
constexpr int kMmaBigShape = 0;

// Runs p on the generic kernel by `plan` (of kMmaShapes); split products write their partial sums to
// `workspace` first and split_k_reduce applies the epilogue.
inline int launch_generic(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  Params q = plan.splits > 1 ? partial_params(p, workspace) : p;
  q.k_tiles = plan.k_tiles;
  q.k_tiles_per_split = plan.k_tiles_per_split;
  const int status = plan.shape == kMmaBigShape ? launch_mma<BigMma>(q, plan.splits, stream)
                                                : launch_mma<SmallMma>(q, plan.splits, stream);
  return status != 0 || plan.splits == 1 ? status : reduce_splits(p, workspace, plan.splits, stream);
}

}  // namespace bf16mm
