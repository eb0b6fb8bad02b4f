// Batched, broadcasting float32 matrix product on the tensor cores, with a fused epilogue:
//   out[i] = epilogue(A[i] @ B[i])   for every batch index i,
// A[i][r, k] = a[a_off(i) + r * a_row_stride + k * a_k_stride], B[i][k, c] = b[b_off(i) + k * b_k_stride +
// c * b_col_stride] (any strides: transposed views are read in place), out[i] [M, N] with rows ldc apart.
// Epilogues: none, + bias[c], gelu(x + bias[c]) (tanh form, as minitorch.operators.gelu), relu(x + bias[c]);
// the pre-activation x + bias can be stored too, and out += result instead of out = result.
//
// Precision. "highest" is 3xTF32 (includes/mma_tf32.cuh): each operand element is split once per
// fragment load into hi + lo, and a b ~= lo_a hi_b + hi_a lo_b + hi_a hi_b. The tensor core's adder
// truncates, so a sum over long K drifts; each K tile of 32 is summed in fresh accumulators that are
// then added in float32, which keeps the error at float32 level for any K. "high" is one TF32 product
// with the operands rounded to nearest TF32 (as cuBLAS's TF32 mode), accumulated in the tensor core.
//
// mma.sync kernel (sm_80+), block tile BM x BN x 32, warps of WM x WN outputs made of m16n8k8 tiles
// (fragment layout in mma_tf32.cuh). Operands stream through a STAGES-deep cp.async ring. Each operand
// tile keeps the global memory's contiguous dim contiguous in shared memory, so 16-byte copies work for
// transposed views too:
//   k-contiguous tile:    [rows][32 + 8]   (a thread reads k = 2t, 2t + 1 of a row as one float2),
//   rows-contiguous tile: [32][rows + 4]   (k = 2t and 2t + 1 from two rows).
// Reading k = 2t, 2t + 1 into the fragment slots of k = t, t + 4 permutes k the same way in A and B,
// which leaves the product unchanged and makes every fragment read free of bank conflicts.
// 16-byte copies need the contiguous dim at stride 1, 16-byte aligned rows and base; the copy of a
// chunk that crosses the matrix edge reads only its valid part and zero-fills the rest. Other layouts
// take 4-byte copies.
//
// On sm_90a builds, products whose operands TMA can read (a unit-stride dim, 16-byte strides, at most
// one batch dim) run on matmul_tma.cuh's warp-specialized TMA + wgmma kernel (which also shares out
// few-tile products by stream-K), and the other big tiles on matmul_wgmma.cuh's wgmma kernel.
//
// Grid: x = output tile (grouped by 8 tile rows so that consecutive blocks share A and B tiles in L2),
// y = K split, z = batch. When a problem has too few output tiles to fill the GPU and K is long, the
// launcher splits K: each split writes its partial product to the workspace and split_k_reduce adds
// them in a fixed order (deterministic) and applies the epilogue.
#include <cuda_runtime.h>

#include <cstdint>

#include "includes/cuda_check.cuh"
#include "includes/device_info.cuh"
#include "includes/launch_utils.cuh"
#include "includes/layout.cuh"
#include "includes/mma_tf32.cuh"
#include "includes/ptx.cuh"
#include "includes/vec.cuh"

namespace {

constexpr int kBK = 32;
constexpr int kTileGroup = 8;  // tile rows per group of the grid swizzle
constexpr int kMaxSplits = 16;
constexpr int kMaxGridZ = 65535;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

using mt::ceil_div;
using mt::kHigh;
using mt::kHighest;
using mt::round_tf32;
using mt::set_operand;
enum Epilogue { kNone = 0, kBias = 1, kBiasGelu = 2, kBiasRelu = 3 };

struct MatmulParams {
  const float* a;
  const float* b;
  float* out;  // the output, or the split-K workspace
  const float* bias;
  float* pre_act;
  int M, N, K;
  int ldc;  // floats between output rows (>= N): out[i] row r at out + (i * M + r) * ldc
  int a_row_stride, a_k_stride, b_k_stride, b_col_stride;
  MtLayout a_batch, b_batch;
  int batch;
  int tiles_m, tiles_n;
  int k_tiles_per_split;
  long long split_stride;  // floats between the partial outputs of two splits
  int epilogue, accumulate;
  bool a_vec, b_vec;  // 16-byte copies allowed
  bool out_vec;       // 16-byte stores allowed (ldc % 4 == 0, aligned outputs)
};

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.f + tanhf(kGeluC * (x + kGeluA * x * x * x)));
}

// Stores x[0..n) (n <= W) at out[idx..] for columns col.. after the epilogue; pre_act gets x + bias. A
// full run goes out as one W-wide store when p.out_vec (ldc % 4 == 0, 16-byte aligned outputs).
template <int W>
__device__ __forceinline__ void store_run(const MatmulParams& p, float* out, float* pre, long long idx, int col,
                                          const float (&v)[W], int n) {
  float x[W];
  const bool act = p.epilogue == kBiasGelu || p.epilogue == kBiasRelu;
#pragma unroll
  for (int j = 0; j < W; ++j) x[j] = v[j] + (p.epilogue != kNone && p.bias != nullptr && j < n ? p.bias[col + j] : 0.f);
  if (W > 1 && n == W && p.out_vec) {
    // x as one W-wide value at dst (W = 2 or 4).
    const auto store_vec = [&](float* dst) {
      if constexpr (W == 4) mt::store_float4(dst, make_float4(x[0], x[1], x[2], x[3]));
      if constexpr (W == 2) *reinterpret_cast<float2*>(dst) = make_float2(x[0], x[1]);
    };
    if (act && pre != nullptr) store_vec(pre + idx);
#pragma unroll
    for (int j = 0; j < W; ++j) x[j] = !act ? x[j] : p.epilogue == kBiasGelu ? gelu(x[j]) : fmaxf(x[j], 0.f);
    if (p.accumulate) {
      if constexpr (W == 4) {
        const float4 o = mt::load_float4(out + idx);
        x[0] += o.x, x[1] += o.y, x[2] += o.z, x[3] += o.w;
      }
      if constexpr (W == 2) {
        const float2 o = *reinterpret_cast<const float2*>(out + idx);
        x[0] += o.x, x[1] += o.y;
      }
    }
    store_vec(out + idx);
    return;
  }
#pragma unroll
  for (int j = 0; j < W; ++j) {
    if (j >= n) break;
    if (act && pre != nullptr) pre[idx + j] = x[j];
    const float y = !act ? x[j] : p.epilogue == kBiasGelu ? gelu(x[j]) : fmaxf(x[j], 0.f);
    out[idx + j] = p.accumulate ? out[idx + j] + y : y;
  }
}

// cp.async of 16 bytes that reads only the first `bytes` (0..16) and zero-fills the rest.
__device__ __forceinline__ void cp_async_16_partial(float* dst, const float* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(mt::shared_address(dst)), "l"(src),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void tile_coords(int pid, int tiles_m, int tiles_n, int* tm, int* tn) {
  const int group = pid / (kTileGroup * tiles_n);
  const int first_m = group * kTileGroup;
  const int size = min(tiles_m - first_m, kTileGroup);
  const int in_group = pid - group * kTileGroup * tiles_n;
  *tm = first_m + in_group % size;
  *tn = in_group / size;
}

// One operand tile of ROWS x kBK in shared memory; X[row, k] = x[row * row_stride + k * k_stride].
// The tile is cut into chunks of 4 elements along its contiguous dim, THREADS chunks per pass.
template <int ROWS, bool K_CONTIG, int THREADS>
struct OperandTile {
  static constexpr int kStride = K_CONTIG ? kBK + 8 : ROWS + 4;
  static constexpr int kFloats = K_CONTIG ? ROWS * kStride : kBK * kStride;
  static constexpr int kChunks = ROWS * kBK / 4;
  static_assert(kChunks % THREADS == 0, "tile must split evenly over the threads");

  // Rows row0.. and k k0.. of X; rows >= rows and k >= k_end read as zeros. Any strides.
  __device__ __forceinline__ static void load(float* tile, const float* x, int row0, int rows, int k0, int k_end,
                                              int row_stride, int k_stride, bool vec) {
    // Rolled: unrolled, the compiler keeps every chunk's address live across the K loop.
#pragma unroll 1
    for (int i = 0; i < kChunks / THREADS; ++i) {
      const int c = threadIdx.x + i * THREADS;
      const int r = K_CONTIG ? c / (kBK / 4) : (c % (ROWS / 4)) * 4;
      const int k = K_CONTIG ? (c % (kBK / 4)) * 4 : c / (ROWS / 4);
      float* dst = tile + (K_CONTIG ? r * kStride + k : k * kStride + r);
      const int gr = row0 + r, gk = k0 + k;
      // Elements of this chunk inside the matrix along its contiguous dim, and whether the other
      // index is inside.
      const int along = K_CONTIG ? k_end - gk : rows - gr;
      const bool inside = K_CONTIG ? gr < rows : gk < k_end;
      const int valid = inside ? max(0, min(4, along)) : 0;
      const float* src = x + (static_cast<long long>(gr) * row_stride + static_cast<long long>(gk) * k_stride);
      if (vec) {
        cp_async_16_partial(dst, valid > 0 ? src : x, valid * 4);
      } else {
        const long long step = K_CONTIG ? k_stride : row_stride;
#pragma unroll
        for (int e = 0; e < 4; ++e) mt::cp_async_4(dst + e, e < valid ? src + e * step : x, e < valid);
      }
    }
  }

  // The same for a K tile inside the matrix (k0 + kBK <= k_end) with 16-byte copies, at a few
  // instructions per chunk: a thread's chunks share their position along the contiguous dim and step
  // by a fixed number of lines, so only the row bound varies.
  __device__ __forceinline__ static void load_interior(float* tile, const float* x, int row0, int rows, int k0,
                                                       int row_stride, int k_stride) {
    constexpr int kPerLine = K_CONTIG ? kBK / 4 : ROWS / 4;  // chunks along the contiguous dim
    constexpr int kLines = THREADS / kPerLine;                // lines (rows, or k) one pass covers
    static_assert(THREADS % kPerLine == 0, "a pass must cover whole lines");
    const int line0 = threadIdx.x / kPerLine, along = (threadIdx.x % kPerLine) * 4;
    float* dst = tile + line0 * kStride + along;
    if (K_CONTIG) {
      const float* src = x + static_cast<long long>(row0 + line0) * row_stride + k0 + along;
#pragma unroll
      for (int i = 0; i < kChunks / THREADS; ++i) {
        const bool inside = row0 + line0 + i * kLines < rows;
        cp_async_16_partial(dst + i * kLines * kStride,
                            inside ? src + static_cast<long long>(i * kLines) * row_stride : x, inside ? 16 : 0);
      }
    } else {
      const int valid = max(0, min(4, rows - row0 - along));
      const float* src = x + row0 + along + static_cast<long long>(k0 + line0) * k_stride;
#pragma unroll
      for (int i = 0; i < kChunks / THREADS; ++i) {
        cp_async_16_partial(dst + i * kLines * kStride,
                            valid > 0 ? src + static_cast<long long>(i * kLines) * k_stride : x, valid * 4);
      }
    }
  }

  // Fragment words for k = k8 + 2t and k8 + 2t + 1 of tile row `row`.
  __device__ __forceinline__ static float2 pair(const float* tile, int row, int k8, int t) {
    if (K_CONTIG) return *reinterpret_cast<const float2*>(tile + row * kStride + k8 + 2 * t);
    return make_float2(tile[(k8 + 2 * t) * kStride + row], tile[(k8 + 2 * t + 1) * kStride + row]);
  }
};

// The block's outputs leave through shared memory: each thread puts its C fragments into a
// [BM][BN + 8] tile (float2 writes without bank conflicts), then rows go out as chunks of 4 columns,
// a warp covering 128 consecutive columns.
template <int BN>
__device__ __forceinline__ void put_fragment(float* tile, int row, int col, const float* c) {
  *reinterpret_cast<float2*>(tile + row * (BN + 8) + col) = make_float2(c[0], c[1]);
  *reinterpret_cast<float2*>(tile + (row + 8) * (BN + 8) + col) = make_float2(c[2], c[3]);
}

template <int BM, int BN, int THREADS>
__device__ __forceinline__ void store_tile(const MatmulParams& p, const float* tile, int bi, int row0, int col0) {
  const long long mat = static_cast<long long>(bi) * p.M * p.ldc;
  float* out = p.out + blockIdx.y * p.split_stride + mat;
  float* pre = p.pre_act != nullptr ? p.pre_act + mat : nullptr;
  for (int c = threadIdx.x; c < BM * BN / 4; c += THREADS) {
    const int r = c / (BN / 4), cc = (c % (BN / 4)) * 4;
    const int row = row0 + r, col = col0 + cc;
    if (row < p.M && col < p.N) {
      const float4 v = mt::load_float4(tile + r * (BN + 8) + cc);
      store_run<4>(p, out, pre, static_cast<long long>(row) * p.ldc + col, col, {v.x, v.y, v.z, v.w}, min(4, p.N - col));
    }
  }
}

// Stages K tile k0.. of both operands (rows row0.. of A, columns col0.. of B).
template <class ATile, class BTile>
__device__ __forceinline__ void load_k_tile(const MatmulParams& p, const float* A, const float* B, float* a_dst,
                                            float* b_dst, int row0, int col0, int k0, int k_end) {
  const bool interior = k0 + kBK <= k_end;
  if (p.a_vec && interior) {
    ATile::load_interior(a_dst, A, row0, p.M, k0, p.a_row_stride, p.a_k_stride);
  } else {
    ATile::load(a_dst, A, row0, p.M, k0, k_end, p.a_row_stride, p.a_k_stride, p.a_vec);
  }
  if (p.b_vec && interior) {
    BTile::load_interior(b_dst, B, col0, p.N, k0, p.b_col_stride, p.b_k_stride);
  } else {
    BTile::load(b_dst, B, col0, p.N, k0, k_end, p.b_col_stride, p.b_k_stride, p.b_vec);
  }
}

// What a block computes: the BM x BN output tile at (row0, col0) over its split's K tiles.
struct BlockWork {
  int row0, col0, kt_begin, k_tiles, k_end;

  __device__ BlockWork(const MatmulParams& p, int BM, int BN) {
    int tm, tn;
    tile_coords(blockIdx.x, p.tiles_m, p.tiles_n, &tm, &tn);
    row0 = tm * BM, col0 = tn * BN;
    kt_begin = blockIdx.y * p.k_tiles_per_split;
    k_tiles = max(0, min(p.k_tiles_per_split, (p.K + kBK - 1) / kBK - kt_begin));
    k_end = min(p.K, (kt_begin + k_tiles) * kBK);
  }
};

// Queues the copies of K tile kt of the block's work into ring slot kt % STAGES (none past the last
// tile) and commits a group either way, so that cp_async_wait<STAGES - 2> always means "tile kt landed".
template <class ATile, class BTile, int STAGES>
__device__ __forceinline__ void load_ring_stage(const MatmulParams& p, const BlockWork& w, const float* A, const float* B,
                                                float* a_smem, float* b_smem, int kt) {
  if (kt < w.k_tiles) {
    const int slot = kt % STAGES;
    load_k_tile<ATile, BTile>(p, A, B, a_smem + slot * ATile::kFloats, b_smem + slot * BTile::kFloats, w.row0, w.col0,
                              (w.kt_begin + kt) * kBK, w.k_end);
  }
  mt::cp_async_commit();
}

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

#include "matmul_wgmma.cuh"

namespace {

// out = epilogue(sum over splits s of partial[s * total + i]) for the i < total (= batch * M * N) elements
// of the contiguous partial products (row i / N, column i % N), in chunks of 4 consecutive elements
// of a row (single elements unless out_vec and N % 4 == 0).
__global__ void split_k_reduce(MatmulParams p, const float* partial, float* out, long long total, int splits) {
  const int width = p.out_vec && p.N % 4 == 0 ? 4 : 1;
  const long long chunks = total / width;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks; i += stride) {
    const long long idx = i * width;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < splits; ++s) {
      const float* src = partial + s * total + idx;
      if (width == 4) {
        const float4 v = mt::load_float4(src);
        x.x += v.x, x.y += v.y, x.z += v.z, x.w += v.w;
      } else {
        x.x += *src;
      }
    }
    const long long row = idx / p.N;
    const int col = static_cast<int>(idx - row * p.N);
    store_run<4>(p, out, p.pre_act, row * p.ldc + col, col, {x.x, x.y, x.z, x.w}, width);
  }
}

// ------------------------------------------------------------------------------------------------
// Planning: tile configuration and K splits.
// ------------------------------------------------------------------------------------------------
enum TileConfig { kSmallTiles = 0, kBigTiles = 1 };

struct Plan {
  TileConfig config;
  int splits;
  int k_tiles_per_split;
};

// Picks the configuration and split count with the least estimated time: waves of blocks times the
// K each block covers, in units of a big tile's time per K element, plus the split-K traffic. Small
// tiles run at about 60% of the big ones' rate per output; a split writes and re-reads the outputs
// once, costing about as much as 100 K elements of the tile's product ("highest" at ~100 TFLOP/s
// against 3 TB/s). The plan depends only on the sizes and the GPU, so matmul_workspace_floats and
// launch_matmul agree on it.
Plan plan_matmul(int M, int N, int K, long long batch, int sms) {
  const long long k_tiles = ceil_div(K, kBK);
  Plan best{kBigTiles, 1, static_cast<int>(k_tiles)};
  double best_cost = 1e300;
  for (int config = kSmallTiles; config <= kBigTiles; ++config) {
    const int tile = config == kBigTiles ? 128 : 64;
    const int per_sm = config == kBigTiles ? 1 : 2;
    const double tile_cost = config == kBigTiles ? 1.0 : 0.5 / 0.6;
    const long long tiles = ceil_div(M, tile) * ceil_div(N, tile) * batch;
    for (int s = 1; s <= kMaxSplits; ++s) {
      const long long per_split = ceil_div(k_tiles, s);
      if (s > 1 && (per_split < 4 || ceil_div(k_tiles, per_split) < s)) break;
      const long long waves = ceil_div(tiles * s, static_cast<long long>(sms) * per_sm);
      const double cost = waves * tile_cost * (per_split * kBK) +
                          (s > 1 ? 100.0 * s * tiles * tile_cost / (static_cast<double>(sms) * per_sm) : 0.0);
      if (cost < best_cost * 0.97) {
        best_cost = cost;
        best = {static_cast<TileConfig>(config), s, static_cast<int>(per_split)};
      }
    }
  }
  return best;
}

long long plan_workspace(const Plan& plan, int M, int N, long long batch) {
  return plan.splits > 1 ? plan.splits * batch * M * N : 0;
}

// Whether 16-byte copies can stage an operand: its contiguous dim at stride 1, the other stride and
// every batch stride multiples of 4, and a 16-byte aligned base.
bool vec_operand(const float* x, int contiguous_stride, int other_stride, const MtLayout& batch) {
  if (contiguous_stride != 1 || other_stride % 4 != 0 || !mt::is_aligned16(x)) return false;
  for (int d = 0; d < batch.ndim; ++d) {
    if (batch.shape[d] > 1 && batch.strides[d] % 4 != 0) return false;
  }
  return true;
}

// Launches one kernel instance; `configured` is that instance's own (see mt::allow_shared_memory).
template <class Kernel>
int launch_kernel(Kernel kernel, int threads, int smem, const MatmulParams& p, dim3 grid, cudaStream_t stream,
                  std::atomic<unsigned long long>* configured) {
  MT_RETURN_IF_ERROR(mt::allow_shared_memory(kernel, smem, configured));
  kernel<<<grid, threads, smem, stream>>>(p);
  return mt_launch_status();
}

template <class Cfg, int PREC>
struct MmaKernels {
  template <bool A_KC, bool B_KC>
  static int launch(const MatmulParams& p, dim3 grid, cudaStream_t stream) {
    static std::atomic<unsigned long long> configured{0};
    return launch_kernel(matmul_mma_kernel<Cfg, A_KC, B_KC, PREC>, Cfg::kThreads, mma_smem_bytes<Cfg, A_KC, B_KC>(), p,
                         grid, stream, &configured);
  }
};

template <int PREC>
struct WgmmaKernels {
  template <bool A_KC, bool B_KC>
  static int launch(const MatmulParams& p, dim3 grid, cudaStream_t stream) {
    static std::atomic<unsigned long long> configured{0};
    return launch_kernel(matmul_wgmma_kernel<PREC, A_KC, B_KC>, kWgThreads, wgmma_smem_bytes<PREC, A_KC, B_KC>(), p,
                         grid, stream, &configured);
  }
};

// Launches Kernels' instance for the operand layouts on BM x BN tiles. A tile is k-contiguous unless
// the operand's rows (columns for B) are its unit-stride dim.
template <class Kernels, int BM, int BN>
int launch_tiles(MatmulParams p, int splits, cudaStream_t stream) {
  const bool a_kc = !(p.a_row_stride == 1 && p.a_k_stride != 1);
  const bool b_kc = !(p.b_col_stride == 1 && p.b_k_stride != 1);
  p.tiles_m = static_cast<int>(ceil_div(p.M, BM));
  p.tiles_n = static_cast<int>(ceil_div(p.N, BN));
  p.a_vec = a_kc ? vec_operand(p.a, p.a_k_stride, p.a_row_stride, p.a_batch)
                 : vec_operand(p.a, p.a_row_stride, p.a_k_stride, p.a_batch);
  p.b_vec = b_kc ? vec_operand(p.b, p.b_k_stride, p.b_col_stride, p.b_batch)
                 : vec_operand(p.b, p.b_col_stride, p.b_k_stride, p.b_batch);
  const dim3 grid(p.tiles_m * p.tiles_n, splits, min(p.batch, kMaxGridZ));
  if (a_kc && b_kc) return Kernels::template launch<true, true>(p, grid, stream);
  if (a_kc) return Kernels::template launch<true, false>(p, grid, stream);
  if (b_kc) return Kernels::template launch<false, true>(p, grid, stream);
  return Kernels::template launch<false, false>(p, grid, stream);
}

// Whether the wgmma kernel's body was built for the current device (see its comment).
bool wgmma_available() {
  static int cached[mt::kMaxDevicesCached] = {0};  // 0 unknown, 1 yes, 2 no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (device < mt::kMaxDevicesCached && cached[device] != 0) return cached[device] == 1;
  cudaFuncAttributes attr{};
  const bool yes = cudaFuncGetAttributes(&attr, matmul_wgmma_kernel<kHighest, true, true>) == cudaSuccess &&
                   attr.maxThreadsPerBlock >= kWgThreads;
  cudaGetLastError();  // a missing image is an answer here, not an error for the next launch
  if (device < mt::kMaxDevicesCached) cached[device] = yes ? 1 : 2;
  return yes;
}

int launch_products(const MatmulParams& p, int precision, TileConfig config, int splits, cudaStream_t stream) {
  if (config == kBigTiles && wgmma_available()) {
    return precision == kHighest ? launch_tiles<WgmmaKernels<kHighest>, kWgBM, kWgBN>(p, splits, stream)
                                 : launch_tiles<WgmmaKernels<kHigh>, kWgBM, kWgBN>(p, splits, stream);
  }
  if (config == kBigTiles) {
    return precision == kHighest ? launch_tiles<MmaKernels<BigMma, kHighest>, 128, 128>(p, splits, stream)
                                 : launch_tiles<MmaKernels<BigMma, kHigh>, 128, 128>(p, splits, stream);
  }
  return precision == kHighest ? launch_tiles<MmaKernels<SmallMma, kHighest>, 64, 64>(p, splits, stream)
                               : launch_tiles<MmaKernels<SmallMma, kHigh>, 64, 64>(p, splits, stream);
}

// out = epilogue(sum of the `splits` partial products at `partial`) for p's batch of M x N outputs.
int reduce_splits(const MatmulParams& p, const float* partial, int splits, int sms, cudaStream_t stream) {
  const long long total = static_cast<long long>(p.batch) * p.M * p.N;
  split_k_reduce<<<static_cast<unsigned>(min(ceil_div(total, 256), 8LL * sms)), 256, 0, stream>>>(p, partial, p.out,
                                                                                                  total, splits);
  return mt_launch_status();
}

// p writing its partial products to the split-K workspace; split_k_reduce then applies the epilogue.
MatmulParams partial_params(MatmulParams p, float* workspace) {
  p.out = workspace;
  p.ldc = p.N;
  p.split_stride = static_cast<long long>(p.batch) * p.M * p.N;
  p.epilogue = kNone;
  p.accumulate = 0;
  p.pre_act = nullptr;
  p.out_vec = p.N % 4 == 0;
  return p;
}

}  // namespace

#include "matmul_tma.cuh"

// ================================================================================================
// C ABI
// ================================================================================================
extern "C" {

MT_DEFINE_ERROR_STRING()

// Floats of scratch that launch_matmul uses for a product of these sizes, operand strides (as
// launch_matmul's) and precision on the current device (0: none).
long long matmul_workspace_floats(int M, int N, int K, int batch, int a_row_stride, int a_k_stride, int b_k_stride,
                                  int b_col_stride, int precision) {
  int sms = 0;
  if (M <= 0 || N <= 0 || K <= 0 || batch <= 0 || mt::sm_count(&sms) != cudaSuccess) return 0;
  MatmulParams p{};
  p.M = M, p.N = N, p.K = K, p.batch = batch;
  p.a_row_stride = a_row_stride, p.a_k_stride = a_k_stride, p.b_k_stride = b_k_stride, p.b_col_stride = b_col_stride;
  return std::max(plan_workspace(plan_matmul(M, N, K, batch, sms), M, N, batch),
                  wgmma_available() ? tma::workspace_floats(p, precision, sms) : 0LL);
}

// out[i] = epilogue(A[i] @ B[i]) for every batch index i of a_batch / b_batch (same shape; their strides
// locate A[i] and B[i], 0 = broadcast); out[i] is [M, N] with rows ldc >= N floats apart, at out + i * M * ldc.
// precision: 0 "highest" (3xTF32), 1 "high" (one TF32 product). epilogue: 0 none, 1 + bias[c],
// 2 gelu(x + bias[c]), 3 relu(x + bias[c]) (bias may be NULL for 2 and 3). pre_act (epilogues 2, 3; may
// be NULL): receives x + bias. accumulate: out += result (epilogue 0 only). workspace: device scratch of
// workspace_floats floats; with fewer than matmul_workspace_floats(...) it runs without K splits, stream-K
// or the operand copy of the TMA path.
int launch_matmul(float* out, int ldc, const float* a, const float* b, int M, int N, int K, int a_row_stride,
                  int a_k_stride, int b_k_stride, int b_col_stride, MtLayout a_batch, MtLayout b_batch,
                  const float* bias, int epilogue, float* pre_act, int accumulate, int precision,
                  float* workspace, long long workspace_floats, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(M < 0 || N < 0 || K < 0 || ldc < N);
  MT_RETURN_IF_INVALID(!mt::valid_layout(a_batch) || !mt::valid_layout(b_batch) || !mt::same_shape(a_batch, b_batch));
  MT_RETURN_IF_INVALID(epilogue < kNone || epilogue > kBiasRelu || (accumulate && epilogue != kNone));
  MT_RETURN_IF_INVALID(precision != kHighest && precision != kHigh);
  MT_RETURN_IF_INVALID(epilogue == kBias && bias == nullptr);
  const long long batch = mt::layout_numel(a_batch);
  MT_RETURN_IF_INVALID(batch > (1LL << 31) - 1);
  if (batch == 0 || M == 0 || N == 0) return 0;
  int sms = 0;
  MT_RETURN_IF_ERROR(mt::sm_count(&sms));

  MatmulParams p{};
  p.a = a;
  p.b = b;
  p.out = out;
  p.bias = bias;
  p.pre_act = (epilogue == kBiasGelu || epilogue == kBiasRelu) ? pre_act : nullptr;
  p.M = M;
  p.N = N;
  p.K = K;
  p.ldc = ldc;
  p.a_row_stride = a_row_stride;
  p.a_k_stride = a_k_stride;
  p.b_k_stride = b_k_stride;
  p.b_col_stride = b_col_stride;
  p.a_batch = a_batch;
  p.b_batch = b_batch;
  p.batch = static_cast<int>(batch);
  p.epilogue = epilogue;
  p.accumulate = accumulate;
  p.out_vec = ldc % 4 == 0 && mt::is_aligned16(out) && (p.pre_act == nullptr || mt::is_aligned16(p.pre_act));

  if (wgmma_available()) {
    const int status = tma::launch(p, precision, workspace, workspace_floats, sms, stream);
    if (status != tma::kNotTaken) return status;
  }
  Plan plan = plan_matmul(M, N, K, batch, sms);
  const long long needed = plan_workspace(plan, M, N, batch);
  if (K == 0 || needed > workspace_floats || (needed > 0 && !mt::is_aligned16(workspace))) {
    plan.splits = 1;
    plan.k_tiles_per_split = static_cast<int>(ceil_div(K, kBK));
  }
  p.k_tiles_per_split = plan.k_tiles_per_split;
  const int status = launch_products(plan.splits > 1 ? partial_params(p, workspace) : p, precision, plan.config,
                                     plan.splits, stream);
  return status != 0 || plan.splits == 1 ? status : reduce_splits(p, workspace, plan.splits, sms, stream);
}

}  // extern "C"
