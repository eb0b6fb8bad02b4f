// The host side of the TMA path: which products take it, in which orientation, with which tile width
// and work sharing (tma_plan.cuh), and their launch (tma_kernel.cuh).
//
// Orientation. wgmma reads its A operand from registers in any layout we can load, and its B operand
// from shared memory only K-major (k contiguous) for TF32. The kernel computes rows x cols of
// A' @ B' with B' K-major: the product itself when B is K-major; out^T = B^T A^T (rows and cols
// swapped, the epilogue writing transposed) when only A is. When neither is (weight gradients
// x^T @ dy), "high" first copies the smaller operand K-major into the workspace (transpose_kernel) and
// takes one of those two ways; "highest", or a product without workspace, keeps B N-major and the
// transform warps transpose each staged tile.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>

#include "../includes/cuda_check.cuh"
#include "../includes/launch_utils.cuh"
#include "../includes/layout.cuh"
#include "../includes/tma.cuh"
#include "../includes/vec.cuh"
#include "params.cuh"
#include "split_k.cuh"
#include "tma_kernel.cuh"
#include "tma_plan.cuh"
#include "tma_work.cuh"

namespace tma {

// One operand as the kernel reads it: element (i, o) of batch matrix b at
// base[i + o * outer_stride + b * batch_stride] (floats), i along the unit-stride dim.
struct Operand {
  const float* base;
  long long inner, outer, outer_stride, batch_stride;
};

// Tensor map of op in boxes of box_inner x box_outer (encode_operand).
inline bool encode(CUtensorMap* map, const Operand& op, long long batches, int box_inner, int box_outer) {
  return encode_operand(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, op.base, op.inner, op.outer, op.outer_stride,
                        op.batch_stride, batches, box_inner, box_outer);
}

// The transposes of op's matrices: element (i, o) of matrix z to dst[z * inner * ld + i * ld + o],
// through 32 x 32 tiles of shared memory (32 x 8 threads; grid: inner / 32, outer / 32, matrices).
__global__ void transpose_kernel(const Operand op, float* dst, int ld) {
  __shared__ float tile[32][33];
  const int inner = static_cast<int>(op.inner), outer = static_cast<int>(op.outer);
  const int i0 = blockIdx.x * 32, o0 = blockIdx.y * 32;
  const float* src = op.base + blockIdx.z * op.batch_stride;
  dst += static_cast<long long>(blockIdx.z) * inner * ld;
#pragma unroll
  for (int r = threadIdx.y; r < 32; r += 8) {
    const int o = o0 + r, i = i0 + threadIdx.x;
    if (o < outer && i < inner) tile[r][threadIdx.x] = src[o * op.outer_stride + i];
  }
  __syncthreads();
#pragma unroll
  for (int r = threadIdx.y; r < 32; r += 8) {
    const int i = i0 + r, o = o0 + threadIdx.x;
    if (i < inner && o < outer) dst[static_cast<long long>(i) * ld + o] = tile[threadIdx.x][r];
  }
}

template <int PREC, bool A_KMAJOR, bool B_TRANSFORM, int BN>
int launch_instance(const CUtensorMap& a_map, const CUtensorMap& b_map, const Params& tp, int grid,
                    cudaStream_t stream) {
  using Cfg = Config<PREC, A_KMAJOR, B_TRANSFORM, BN>;
  static std::atomic<unsigned long long> configured{0};
  const auto kernel = matmul_tma_kernel<PREC, A_KMAJOR, B_TRANSFORM, BN>;
  MT_RETURN_IF_ERROR(mt::allow_shared_memory(kernel, Cfg::kSmemBytes, &configured));
  kernel<<<grid, kThreads, Cfg::kSmemBytes, stream>>>(a_map, b_map, tp);
  return mt_launch_status();
}

// The non-transform instance of tile width BN for A K-major or M-major.
template <int PREC, int BN>
int launch_width(const CUtensorMap& a_map, const CUtensorMap& b_map, const Params& tp, bool a_kmajor, int grid,
                 cudaStream_t stream) {
  return a_kmajor ? launch_instance<PREC, true, false, BN>(a_map, b_map, tp, grid, stream)
                  : launch_instance<PREC, false, false, BN>(a_map, b_map, tp, grid, stream);
}

template <int PREC>
int launch_precision(const CUtensorMap& a_map, const CUtensorMap& b_map, const Params& tp, bool a_kmajor,
                     bool transform, int bn, int grid, cudaStream_t stream) {
  if (transform) return launch_instance<PREC, false, true, 128>(a_map, b_map, tp, grid, stream);
  if constexpr (PREC == kHigh) {
    if (bn == 256) return launch_width<PREC, 256>(a_map, b_map, tp, a_kmajor, grid, stream);
    if (bn == 192) return launch_width<PREC, 192>(a_map, b_map, tp, a_kmajor, grid, stream);
  }
  return launch_width<PREC, 128>(a_map, b_map, tp, a_kmajor, grid, stream);
}

constexpr int kNotTaken = -1;

// Runs the product p on this path, with up to workspace_floats floats of `workspace` for the operand
// copy, then stream-K or K splits (each left out where the workspace cannot hold it). kNotTaken when the
// operands do not fit the path: the caller runs the other kernels.
inline int launch(const MatmulParams& p, int precision, float* workspace, long long workspace_floats, int sms,
                  cudaStream_t stream) {
  if (p.K == 0) return kNotTaken;
  int batch_dim = -1;  // the one batch dim with more than one matrix, if any
  if (!mt::at_most_one_dim(p.a_batch, &batch_dim)) return kNotTaken;
  // The operands as read: A[r, k] = a[r * a_rs + k * a_ks + i * a_bs], B[k, c] = b[k * b_ks + c * b_cs + i * b_bs].
  const float *a = p.a, *b = p.b;
  int a_rs = p.a_row_stride, a_ks = p.a_k_stride, b_ks = p.b_k_stride, b_cs = p.b_col_stride;
  long long a_bs = batch_dim >= 0 ? p.a_batch.strides[batch_dim] : 0;
  long long b_bs = batch_dim >= 0 ? p.b_batch.strides[batch_dim] : 0;
  float* ws = mt::is_aligned16(workspace) ? workspace : nullptr;
  long long ws_left = ws != nullptr ? workspace_floats : 0;

  // The smaller operand's K-major copy, where copies_operand asks for one: the copied operand (inner:
  // its rows, outer: K; no base: none) goes to [mats][rows][copy_ld] at copy_dst.
  Operand copy{};
  float* copy_dst = nullptr;
  int copy_ld = 0;
  long long copy_mats = 0;
  if (copies_operand(precision, tma_major(a_rs, a_ks), tma_major(b_cs, b_ks))) {
    const bool of_a = p.M <= p.N;
    const long long bs = of_a ? a_bs : b_bs;
    copy_mats = bs != 0 ? p.batch : 1;
    const long long floats = copy_floats(p.M, p.N, p.K, copy_mats);
    if (floats <= ws_left && copy_mats <= kMaxGridZ) {
      copy = of_a ? Operand{a, p.M, p.K, a_ks, bs} : Operand{b, p.N, p.K, b_ks, bs};
      copy_dst = ws;
      copy_ld = static_cast<int>(ceil_div(p.K, 4) * 4);
      const long long matrix = copy_mats > 1 ? copy.inner * copy_ld : 0;
      if (of_a) {
        a = ws, a_rs = copy_ld, a_ks = 1, a_bs = matrix;
      } else {
        b = ws, b_ks = 1, b_cs = copy_ld, b_bs = matrix;
      }
      ws += floats;
      ws_left -= floats;
    }
  }

  const bool a_kmajor = tma_major(a_ks, a_rs), a_mmajor = tma_major(a_rs, a_ks);
  const bool b_kmajor = tma_major(b_ks, b_cs), b_nmajor = tma_major(b_cs, b_ks);
  Params tp{};
  tp.p = p;
  Operand a_op, b_op;  // the kernel's A' (rows: inner or outer) and B' (K-major, or N-major to transform)
  bool kernel_a_kmajor, transform = false;
  if (b_kmajor && (a_kmajor || a_mmajor)) {
    tp.rows = p.M, tp.cols = p.N;
    kernel_a_kmajor = a_kmajor;
    a_op = a_kmajor ? Operand{a, p.K, p.M, a_rs, a_bs} : Operand{a, p.M, p.K, a_ks, a_bs};
    b_op = Operand{b, p.K, p.N, b_cs, b_bs};
  } else if (a_kmajor && b_nmajor) {  // out^T = B^T A^T
    tp.rows = p.N, tp.cols = p.M, tp.transposed = true;
    kernel_a_kmajor = false;
    a_op = Operand{b, p.N, p.K, b_ks, b_bs};
    b_op = Operand{a, p.K, p.M, a_rs, a_bs};
  } else if (a_mmajor && b_nmajor) {
    tp.rows = p.M, tp.cols = p.N;
    kernel_a_kmajor = false;
    transform = true;
    a_op = Operand{a, p.M, p.K, a_ks, a_bs};
    b_op = Operand{b, p.N, p.K, b_ks, b_bs};
  } else {
    return kNotTaken;
  }
  tp.a_batched = a_op.batch_stride != 0;
  tp.b_batched = b_op.batch_stride != 0;
  const bool stream_k = uses_stream_k(precision) && ws_left >= stream_k_floats(sms);
  Plan pl = plan(tp.rows, tp.cols, p.K, p.batch, sms, precision, transform, stream_k, kMaxSplits);
  if (pl.splits > 1 && pl.splits * static_cast<long long>(p.batch) * p.M * p.N > ws_left) {
    pl = plan(tp.rows, tp.cols, p.K, p.batch, sms, precision, transform, stream_k, 1);
  }
  if (pl.bn == 0) return kNotTaken;
  CUtensorMap a_map, b_map;
  const bool mapped = (kernel_a_kmajor ? encode(&a_map, a_op, p.batch, kBK, kBM) : encode(&a_map, a_op, p.batch, 32, 32)) &&
                      (transform ? encode(&b_map, b_op, p.batch, 32, 32) : encode(&b_map, b_op, p.batch, kBK, pl.bn));
  if (!mapped) return kNotTaken;
  tp.tiles_m = static_cast<int>(ceil_div(tp.rows, kBM));
  tp.tiles_n = static_cast<int>(ceil_div(tp.cols, pl.bn));
  tp.k_tiles = pl.k_tiles;
  tp.splits = pl.splits;
  tp.k_tiles_per_split = pl.k_tiles_per_split;
  tp.dp_units = pl.dp_units;
  tp.sk_iters = pl.sk_iters;
  if (copy.base != nullptr) {
    const dim3 grid(static_cast<unsigned>(ceil_div(copy.inner, 32)), static_cast<unsigned>(ceil_div(copy.outer, 32)),
                    static_cast<unsigned>(copy_mats));
    transpose_kernel<<<grid, dim3(32, 8), 0, stream>>>(copy, copy_dst, copy_ld);
    MT_RETURN_IF_ERROR(cudaGetLastError());
  }
  if (pl.splits > 1) tp.p = partial_params(p, ws);
  if (pl.sk_iters > 0) {
    tp.partials = ws;
    tp.flags = reinterpret_cast<unsigned long long*>(ws + sms * kPartialFloats);
    tp.token = launch_token();
  }
  const int status =
      precision == kHighest
          ? launch_precision<kHighest>(a_map, b_map, tp, kernel_a_kmajor, transform, pl.bn, pl.grid, stream)
          : launch_precision<kHigh>(a_map, b_map, tp, kernel_a_kmajor, transform, pl.bn, pl.grid, stream);
  return status != 0 || pl.splits == 1 ? status : reduce_splits(p, ws, pl.splits, sms, stream);
}

}  // namespace tma
