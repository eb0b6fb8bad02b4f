// Batched, broadcasting float32 matrix product on the tensor cores, with a fused epilogue:
//   out[i] = epilogue(A[i] @ B[i])   for every batch index i,
// A[i][r, k] = a[a_off(i) + r * a_row_stride + k * a_k_stride], B[i][k, c] = b[b_off(i) + k * b_k_stride +
// c * b_col_stride] (any strides: transposed views are read in place), out[i] contiguous [M, N].
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
// Grid: x = output tile (grouped by 8 tile rows so that consecutive blocks share A and B tiles in L2),
// y = K split, z = batch. When a problem has too few output tiles to fill the GPU and K is long, the
// launcher splits K: each split writes its partial product to the workspace and split_k_reduce adds
// them in a fixed order (deterministic) and applies the epilogue.
#include <cuda_runtime.h>

#include <cstdint>

#include "includes/cuda_check.cuh"
#include "includes/device_info.cuh"
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

enum Precision { kHighest = 0, kHigh = 1 };
enum Epilogue { kNone = 0, kBias = 1, kBiasGelu = 2, kBiasRelu = 3 };

struct MatmulParams {
  const float* a;
  const float* b;
  float* out;  // the output, or the split-K workspace
  const float* bias;
  float* pre_act;
  int M, N, K;
  int a_row_stride, a_k_stride, b_k_stride, b_col_stride;
  MtLayout a_batch, b_batch;
  int batch;
  int tiles_m, tiles_n;
  int k_tiles_per_split;
  long long split_stride;  // floats between the partial outputs of two splits
  int epilogue, accumulate;
  bool a_vec, b_vec;  // 16-byte copies allowed
  bool out_vec;       // 16-byte stores allowed (N % 4 == 0, aligned outputs)
};

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.f + tanhf(kGeluC * (x + kGeluA * x * x * x)));
}

// Stores x (n of its elements, 1..4) at out[idx..] for columns col.. after the epilogue; pre_act gets
// x + bias. Four elements with p.out_vec go out as 16-byte stores.
__device__ __forceinline__ void store_chunk(const MatmulParams& p, float* out, float* pre, long long idx, int col,
                                            float4 v, int n) {
  float x[4] = {v.x, v.y, v.z, v.w};
  const bool act = p.epilogue == kBiasGelu || p.epilogue == kBiasRelu;
  if (p.epilogue != kNone && p.bias != nullptr) {
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] += j < n ? p.bias[col + j] : 0.f;
  }
  if (n == 4 && p.out_vec) {
    if (act && pre != nullptr) mt::store_float4(pre + idx, make_float4(x[0], x[1], x[2], x[3]));
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = !act ? x[j] : p.epilogue == kBiasGelu ? gelu(x[j]) : fmaxf(x[j], 0.f);
    if (p.accumulate) {
      const float4 o = mt::load_float4(out + idx);
      x[0] += o.x, x[1] += o.y, x[2] += o.z, x[3] += o.w;
    }
    mt::store_float4(out + idx, make_float4(x[0], x[1], x[2], x[3]));
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
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

  // Rows row0.. and k k0.. of X; rows >= rows and k >= k_end read as zeros.
  __device__ __forceinline__ static void load(float* tile, const float* x, int row0, int rows, int k0, int k_end,
                                              int row_stride, int k_stride, bool vec) {
#pragma unroll
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

  // Fragment words for k = k8 + 2t and k8 + 2t + 1 of tile row `row`.
  __device__ __forceinline__ static float2 pair(const float* tile, int row, int k8, int t) {
    if (K_CONTIG) return *reinterpret_cast<const float2*>(tile + row * kStride + k8 + 2 * t);
    return make_float2(tile[(k8 + 2 * t) * kStride + row], tile[(k8 + 2 * t + 1) * kStride + row]);
  }
};

template <int BM_, int BN_, int WARPS_M, int WARPS_N, int STAGES_>
struct MmaConfig {
  static constexpr int kBM = BM_, kBN = BN_, kWarpsN = WARPS_N, kStages = STAGES_;
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static constexpr int kMI = BM_ / WARPS_M / 16;  // m16 tiles per warp
  static constexpr int kNI = BN_ / WARPS_N / 8;   // n8 tiles per warp
};
// "highest" holds a second set of accumulators (the K tile's fresh sums): 32 x 32 outputs per warp
// keep both sets and the split fragments within 255 registers; "high" affords 64 x 32.
using BigHighestMma = MmaConfig<128, 128, 2, 4, 4>;
using BigHighMma = MmaConfig<128, 128, 2, 4, 4>;
using SmallMma = MmaConfig<64, 64, 2, 2, 4>;

template <class Cfg, bool A_KC, bool B_KC>
constexpr int mma_smem_bytes() {
  return Cfg::kStages * 4 *
         (OperandTile<Cfg::kBM, A_KC, Cfg::kThreads>::kFloats + OperandTile<Cfg::kBN, B_KC, Cfg::kThreads>::kFloats);
}

// Word of a TF32 operand rounded to nearest (ties away from zero): the tensor core reads only the top
// 19 bits, so adding half of the dropped part's range rounds instead of truncating.
__device__ __forceinline__ uint32_t round_tf32(float x) { return __float_as_uint(x) + 0x1000u; }

template <class Cfg, bool A_KC, bool B_KC, int PREC>
__global__ void __launch_bounds__(Cfg::kThreads, 1) matmul_mma_kernel(const MatmulParams p) {
  using ATile = OperandTile<Cfg::kBM, A_KC, Cfg::kThreads>;
  using BTile = OperandTile<Cfg::kBN, B_KC, Cfg::kThreads>;
  constexpr int MI = Cfg::kMI, NI = Cfg::kNI, STAGES = Cfg::kStages;
  extern __shared__ __align__(16) float smem[];
  float* a_smem = smem;
  float* b_smem = smem + STAGES * ATile::kFloats;

  int tm, tn;
  tile_coords(blockIdx.x, p.tiles_m, p.tiles_n, &tm, &tn);
  const int row0 = tm * Cfg::kBM, col0 = tn * Cfg::kBN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int wm0 = (warp / Cfg::kWarpsN) * MI * 16, wn0 = (warp % Cfg::kWarpsN) * NI * 8;
  const int total_k_tiles = (p.K + kBK - 1) / kBK;
  const int kt_begin = blockIdx.y * p.k_tiles_per_split;
  const int k_tiles = max(0, min(p.k_tiles_per_split, total_k_tiles - kt_begin));
  const int k_end = min(p.K, (kt_begin + k_tiles) * kBK);

  for (int bi = blockIdx.z; bi < p.batch; bi += gridDim.z) {
    const float* A = p.a + mt::layout_offset(p.a_batch, bi);
    const float* B = p.b + mt::layout_offset(p.b_batch, bi);
    const auto load_stage = [&](int kt) {
      if (kt < k_tiles) {
        const int slot = kt % STAGES, k0 = (kt_begin + kt) * kBK;
        ATile::load(a_smem + slot * ATile::kFloats, A, row0, p.M, k0, k_end, p.a_row_stride, p.a_k_stride, p.a_vec);
        BTile::load(b_smem + slot * BTile::kFloats, B, col0, p.N, k0, k_end, p.b_col_stride, p.b_k_stride, p.b_vec);
      }
      mt::cp_async_commit();  // empty groups too, so that wait<STAGES - 2> always means "tile kt landed"
    };

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
#pragma unroll 1
      for (int k8 = 0; k8 < kBK; k8 += 8) {
        float2 a_top[MI], a_bottom[MI], b_words[NI];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          a_top[mi] = ATile::pair(As, wm0 + mi * 16 + g, k8, t);
          a_bottom[mi] = ATile::pair(As, wm0 + mi * 16 + g + 8, k8, t);
        }
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) b_words[ni] = BTile::pair(Bs, wn0 + ni * 8 + g, k8, t);
        if constexpr (PREC == kHighest) {
          mt::Tf32Frag<4> af[MI];
          mt::Tf32Frag<2> bf[NI];
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
            af[mi].set(0, a_top[mi].x);
            af[mi].set(1, a_bottom[mi].x);
            af[mi].set(2, a_top[mi].y);
            af[mi].set(3, a_bottom[mi].y);
          }
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            bf[ni].set(0, b_words[ni].x);
            bf[ni].set(1, b_words[ni].y);
          }
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) mt::mma_3xtf32(fresh[mi][ni], af[mi], bf[ni]);
          }
        } else {
          uint32_t af[MI][4], bf[NI][2];
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
            af[mi][0] = round_tf32(a_top[mi].x);
            af[mi][1] = round_tf32(a_bottom[mi].x);
            af[mi][2] = round_tf32(a_top[mi].y);
            af[mi][3] = round_tf32(a_bottom[mi].y);
          }
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            bf[ni][0] = round_tf32(b_words[ni].x);
            bf[ni][1] = round_tf32(b_words[ni].y);
          }
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) mt::mma_tf32(acc[mi][ni], af[mi], bf[ni]);
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

    // Fragments to a [BM][BN + 8] tile (float2 writes without bank conflicts), then rows out as chunks
    // of 4 columns: a warp writes 128 consecutive columns.
    constexpr int kCStride = Cfg::kBN + 8;
    static_assert(Cfg::kBM * kCStride <= STAGES * (ATile::kFloats + BTile::kFloats), "C tile must fit the ring");
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        float* c = smem + (wm0 + mi * 16 + g) * kCStride + wn0 + ni * 8 + 2 * t;
        *reinterpret_cast<float2*>(c) = make_float2(acc[mi][ni][0], acc[mi][ni][1]);
        *reinterpret_cast<float2*>(c + 8 * kCStride) = make_float2(acc[mi][ni][2], acc[mi][ni][3]);
      }
    }
    __syncthreads();
    const long long mat = static_cast<long long>(bi) * p.M * p.N;
    float* out = p.out + blockIdx.y * p.split_stride + mat;
    float* pre = p.pre_act != nullptr ? p.pre_act + mat : nullptr;
    for (int c = threadIdx.x; c < Cfg::kBM * Cfg::kBN / 4; c += Cfg::kThreads) {
      const int r = c / (Cfg::kBN / 4), cc = (c % (Cfg::kBN / 4)) * 4;
      const int row = row0 + r, col = col0 + cc;
      if (row < p.M && col < p.N) {
        store_chunk(p, out, pre, static_cast<long long>(row) * p.N + col, col,
                    mt::load_float4(smem + r * kCStride + cc), min(4, p.N - col));
      }
    }
  }
}

// out[i] = epilogue(sum over splits s of partial[s * total + i]) for i < total (= batch * M * N), in
// chunks of 4 consecutive elements of a row (single elements unless out_vec).
__global__ void split_k_reduce(MatmulParams p, const float* partial, float* out, long long total, int splits) {
  const int width = p.out_vec ? 4 : 1;
  const long long chunks = total / width;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks; i += stride) {
    const long long idx = i * width;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < splits; ++s) {
      const float* src = partial + s * total + idx;
      if (p.out_vec) {
        const float4 v = mt::load_float4(src);
        x.x += v.x, x.y += v.y, x.z += v.z, x.w += v.w;
      } else {
        x.x += *src;
      }
    }
    store_chunk(p, out, p.pre_act, idx, static_cast<int>(idx % p.N), x, width);
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

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

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

bool valid_layout(const MtLayout& l) {
  if (l.ndim < 0 || l.ndim > MT_MAX_DIMS) return false;
  for (int d = 0; d < l.ndim; ++d) {
    if (l.shape[d] < 0) return false;
  }
  return true;
}

bool same_shape(const MtLayout& x, const MtLayout& y) {
  if (x.ndim != y.ndim) return false;
  for (int d = 0; d < x.ndim; ++d) {
    if (x.shape[d] != y.shape[d]) return false;
  }
  return true;
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

template <class Cfg, int PREC, bool A_KC, bool B_KC>
int launch_mma_layout(const MatmulParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int smem = mma_smem_bytes<Cfg, A_KC, B_KC>();
  const auto kernel = matmul_mma_kernel<Cfg, A_KC, B_KC, PREC>;
  MT_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(p);
  return mt_launch_status();
}

// A tile is k-contiguous unless the operand's rows (columns for B) are its unit-stride dim.
template <class Cfg, int PREC>
int launch_mma(MatmulParams p, bool a_kc, bool b_kc, int splits, cudaStream_t stream) {
  p.tiles_m = static_cast<int>(ceil_div(p.M, Cfg::kBM));
  p.tiles_n = static_cast<int>(ceil_div(p.N, Cfg::kBN));
  p.a_vec = a_kc ? vec_operand(p.a, p.a_k_stride, p.a_row_stride, p.a_batch)
                 : vec_operand(p.a, p.a_row_stride, p.a_k_stride, p.a_batch);
  p.b_vec = b_kc ? vec_operand(p.b, p.b_k_stride, p.b_col_stride, p.b_batch)
                 : vec_operand(p.b, p.b_col_stride, p.b_k_stride, p.b_batch);
  const dim3 grid(p.tiles_m * p.tiles_n, splits, min(p.batch, kMaxGridZ));
  if (a_kc && b_kc) return launch_mma_layout<Cfg, PREC, true, true>(p, grid, stream);
  if (a_kc) return launch_mma_layout<Cfg, PREC, true, false>(p, grid, stream);
  if (b_kc) return launch_mma_layout<Cfg, PREC, false, true>(p, grid, stream);
  return launch_mma_layout<Cfg, PREC, false, false>(p, grid, stream);
}

}  // namespace

// ================================================================================================
// C ABI
// ================================================================================================
extern "C" {

MT_DEFINE_ERROR_STRING()

// Floats of scratch that launch_matmul uses for these sizes on the current device (0: none).
long long matmul_workspace_floats(int M, int N, int K, int batch) {
  int sms = 0;
  if (M <= 0 || N <= 0 || K <= 0 || batch <= 0 || mt::sm_count(&sms) != cudaSuccess) return 0;
  return plan_workspace(plan_matmul(M, N, K, batch, sms), M, N, batch);
}

// out[i] = epilogue(A[i] @ B[i]) for every batch index i of a_batch / b_batch (same shape; their strides
// locate A[i] and B[i], 0 = broadcast); out[i] is contiguous [M, N] at out + i * M * N.
// precision: 0 "highest" (3xTF32), 1 "high" (one TF32 product). epilogue: 0 none, 1 + bias[c],
// 2 gelu(x + bias[c]), 3 relu(x + bias[c]) (bias may be NULL for 2 and 3). pre_act (epilogues 2, 3; may
// be NULL): receives x + bias. accumulate: out += result (epilogue 0 only). workspace: device scratch of
// workspace_floats floats; with fewer than matmul_workspace_floats(...) the product runs unsplit.
int launch_matmul(float* out, const float* a, const float* b, int M, int N, int K, int a_row_stride,
                  int a_k_stride, int b_k_stride, int b_col_stride, MtLayout a_batch, MtLayout b_batch,
                  const float* bias, int epilogue, float* pre_act, int accumulate, int precision,
                  float* workspace, long long workspace_floats, cudaStream_t stream) {
  MT_RETURN_IF_INVALID(M < 0 || N < 0 || K < 0);
  MT_RETURN_IF_INVALID(!valid_layout(a_batch) || !valid_layout(b_batch) || !same_shape(a_batch, b_batch));
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
  p.a_row_stride = a_row_stride;
  p.a_k_stride = a_k_stride;
  p.b_k_stride = b_k_stride;
  p.b_col_stride = b_col_stride;
  p.a_batch = a_batch;
  p.b_batch = b_batch;
  p.batch = static_cast<int>(batch);
  p.epilogue = epilogue;
  p.accumulate = accumulate;
  p.out_vec = N % 4 == 0 && mt::is_aligned16(out) && (p.pre_act == nullptr || mt::is_aligned16(p.pre_act));

  Plan plan = plan_matmul(M, N, K, batch, sms);
  const long long needed = plan_workspace(plan, M, N, batch);
  if (K == 0 || needed > workspace_floats || (needed > 0 && !mt::is_aligned16(workspace))) {
    plan.splits = 1;
    plan.k_tiles_per_split = static_cast<int>(ceil_div(K, kBK));
  }
  p.k_tiles_per_split = plan.k_tiles_per_split;
  MatmulParams tile_params = p;
  if (plan.splits > 1) {  // partial products first; the epilogue runs in the reduction
    tile_params.out = workspace;
    tile_params.split_stride = batch * M * N;
    tile_params.epilogue = kNone;
    tile_params.accumulate = 0;
    tile_params.pre_act = nullptr;
    tile_params.out_vec = N % 4 == 0;
  }
  const bool a_kc = !(a_row_stride == 1 && a_k_stride != 1);
  const bool b_kc = !(b_col_stride == 1 && b_k_stride != 1);
  int status;
  if (precision == kHighest) {
    status = plan.config == kBigTiles
                 ? launch_mma<BigHighestMma, kHighest>(tile_params, a_kc, b_kc, plan.splits, stream)
                 : launch_mma<SmallMma, kHighest>(tile_params, a_kc, b_kc, plan.splits, stream);
  } else {
    status = plan.config == kBigTiles ? launch_mma<BigHighMma, kHigh>(tile_params, a_kc, b_kc, plan.splits, stream)
                                      : launch_mma<SmallMma, kHigh>(tile_params, a_kc, b_kc, plan.splits, stream);
  }
  if (status != 0 || plan.splits == 1) return status;
  const long long total = batch * M * N;
  split_k_reduce<<<static_cast<unsigned>(min(ceil_div(total, 256), 8LL * sms)), 256, 0, stream>>>(
      p, workspace, out, total, plan.splits);
  return mt_launch_status();
}

}  // extern "C"
