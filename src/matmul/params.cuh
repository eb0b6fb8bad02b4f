// What every kernel of the matmul library is given (MatmulParams: operands, sizes, strides, epilogue,
// split-K layout), the library's tile constants and the grid swizzle that orders output tiles.
#pragma once

#include <cuda_runtime.h>

#include "../includes/launch_utils.cuh"
#include "../includes/layout.cuh"
#include "../includes/mma_tf32.cuh"

namespace {

constexpr int kBK = 32;
constexpr int kTileGroup = 8;  // tile rows per group of the grid swizzle
constexpr int kMaxSplits = 16;
constexpr int kMaxGridZ = 65535;

using mt::ceil_div;
using mt::kHigh;
using mt::kHighest;

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

// Tile (tm, tn) of output tile ordinal pid: tiles go in groups of kTileGroup tile rows, column by
// column inside a group, so that consecutive blocks share A and B tiles in L2.
__device__ __forceinline__ void tile_coords(int pid, int tiles_m, int tiles_n, int* tm, int* tn) {
  const int group = pid / (kTileGroup * tiles_n);
  const int first_m = group * kTileGroup;
  const int size = min(tiles_m - first_m, kTileGroup);
  const int in_group = pid - group * kTileGroup * tiles_n;
  *tm = first_m + in_group % size;
  *tn = in_group / size;
}

}  // namespace
