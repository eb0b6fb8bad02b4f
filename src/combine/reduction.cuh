// Reduce along one dim with a start value (sum, product, max), for combine.cu.
//   "rows":    the reduced dim is contiguous (stride 1): one warp per output, lanes stride over the
//              row with float4 loads, then a shuffle reduction.
//   "columns": any other stride: a 32x8 block, x over 32 consecutive outputs (coalesced when the
//              outputs are adjacent in memory), y over the reduced dim, then a shared-memory
//              reduction over y. Where the outputs are adjacent in the input and in the output (the
//              column sums of a row-major block: a bias gradient, a sum over the batch) and the rows
//              are aligned for it, a thread takes 4 adjacent outputs with one 4-element load a row.
// With few outputs and a long reduced dim both split the reduced dim over more warps/blocks, write
// partials to a caller-provided workspace, and a second launch reduces the partials (deterministic, no
// atomics). The input's storage TI and the output's TO are float or bfloat16; accumulation, partials
// and the start value are float.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../includes/cuda_check.cuh"
#include "../includes/launch_utils.cuh"
#include "../includes/layout.cuh"
#include "../includes/reduce.cuh"
#include "../includes/storage.cuh"
#include "../includes/vec.cuh"

namespace {

// Reduce along one dim. `outer` maps an output ordinal to the storage offset of the first element
// reduced into it; `out_l` maps the same ordinal to the output's storage offset.
// ------------------------------------------------------------------------------------------------
constexpr int kReduceThreads = 256;
constexpr int kColsX = 32;
constexpr int kColsY = 8;

// One warp per (output, split) unit. Elements [split * chunk, min(len, (split + 1) * chunk)) of the
// row; a scalar head up to the first boundary of 4 elements, a body of 4-element vector loads (4 in
// flight), scalar tail.
template <class TO, class TI, class Op>
__global__ void __launch_bounds__(kReduceThreads)
reduce_rows_kernel(TO* out, const MtLayout out_l, const TI* a, const MtLayout outer,
                   long long units, int splits, int chunk, int reduce_len, float identity,
                   float start, float* partial, Op op) {
  mt::join_prior_grids();
  const int lane = threadIdx.x & 31;
  const long long warps_per_grid = static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
  for (long long unit = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       unit < units; unit += warps_per_grid) {
    const int o = static_cast<int>(unit / splits);
    const int lo = static_cast<int>(unit - static_cast<long long>(o) * splits) * chunk;
    const int len = min(reduce_len - lo, chunk);
    const TI* p = a + mt::layout_offset(outer, o) + lo;
    const int misalign =
        static_cast<int>((reinterpret_cast<std::uintptr_t>(p) & (4 * sizeof(TI) - 1)) / sizeof(TI));
    const int head = min(len, (4 - misalign) & 3);
    float acc0 = identity, acc1 = identity, acc2 = identity, acc3 = identity;
    if (lane < head) acc0 = op(acc0, mt::to_float(p[lane]));
    const TI* p4 = p + head;
    const int n4 = (len - head) >> 2;
    int j = lane;
    for (; j + 96 < n4; j += 128) {
      const float4 v0 = mt::load4(p4 + 4 * j), v1 = mt::load4(p4 + 4 * (j + 32));
      const float4 v2 = mt::load4(p4 + 4 * (j + 64)), v3 = mt::load4(p4 + 4 * (j + 96));
      acc0 = op(acc0, op(op(v0.x, v0.y), op(v0.z, v0.w)));
      acc1 = op(acc1, op(op(v1.x, v1.y), op(v1.z, v1.w)));
      acc2 = op(acc2, op(op(v2.x, v2.y), op(v2.z, v2.w)));
      acc3 = op(acc3, op(op(v3.x, v3.y), op(v3.z, v3.w)));
    }
    for (; j < n4; j += 32) {
      const float4 v = mt::load4(p4 + 4 * j);
      acc0 = op(acc0, op(op(v.x, v.y), op(v.z, v.w)));
    }
    const int tail = head + (n4 << 2) + lane;
    if (tail < len) acc1 = op(acc1, mt::to_float(p[tail]));
    float acc = op(op(acc0, acc1), op(acc2, acc3));
    acc = mt::warp_allreduce(acc, op);
    if (lane == 0) {
      if (partial != nullptr) {
        partial[unit] = acc;
      } else {
        out[mt::layout_offset(out_l, o)] = mt::from_float<TO>(op(start, acc));
      }
    }
  }
}

// Block (kColsX, kColsY): x picks one of 32 consecutive outputs, y strides over this block's part
// of the reduced dim (blockIdx.y selects the split); partials of the 8 rows meet in shared memory.
template <class TO, class TI, class Op>
__global__ void __launch_bounds__(kColsX* kColsY)
reduce_cols_kernel(TO* out, const MtLayout out_l, const TI* a, const MtLayout outer,
                   int n_out, int reduce_len, int reduce_stride, int chunk, float identity,
                   float start, float* partial, Op op) {
  mt::join_prior_grids();
  __shared__ float tile[kColsY][kColsX + 1];
  const int o = blockIdx.x * kColsX + threadIdx.x;
  const int lo = blockIdx.y * chunk;
  const int hi = min(reduce_len, lo + chunk);
  float acc = identity;
  if (o < n_out) {
    const TI* p = a + mt::layout_offset(outer, o);
    int r = lo + threadIdx.y;
    float acc1 = identity, acc2 = identity, acc3 = identity;
    for (; r + 3 * kColsY < hi; r += 4 * kColsY) {
      const float v0 = mt::to_float(p[r * reduce_stride]);
      const float v1 = mt::to_float(p[(r + kColsY) * reduce_stride]);
      const float v2 = mt::to_float(p[(r + 2 * kColsY) * reduce_stride]);
      const float v3 = mt::to_float(p[(r + 3 * kColsY) * reduce_stride]);
      acc = op(acc, v0);
      acc1 = op(acc1, v1);
      acc2 = op(acc2, v2);
      acc3 = op(acc3, v3);
    }
    for (; r < hi; r += kColsY) acc = op(acc, mt::to_float(p[r * reduce_stride]));
    acc = op(op(acc, acc1), op(acc2, acc3));
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < n_out) {
    float v = tile[0][threadIdx.x];
#pragma unroll
    for (int y = 1; y < kColsY; ++y) v = op(v, tile[y][threadIdx.x]);
    if (partial != nullptr) {
      partial[static_cast<long long>(blockIdx.y) * n_out + o] = v;
    } else {
      out[mt::layout_offset(out_l, o)] = mt::from_float<TO>(op(start, v));
    }
  }
}

// reduce_cols_kernel for outputs o adjacent in the input and the output (a[o + r * reduce_stride],
// out[o]), 4 a thread: one load4 a row, four rows in flight; the partials of the 8 rows meet in shared
// memory laid out [row][output of the thread][thread], so that the writes are conflict-free.
template <class TO, class TI, class Op>
__global__ void __launch_bounds__(kColsX* kColsY)
reduce_cols4_kernel(TO* out, const TI* a, int n_out, int reduce_len, int reduce_stride, int chunk, float identity,
                    float start, float* partial, Op op) {
  mt::join_prior_grids();
  __shared__ float tile[kColsY][4][kColsX];
  const int o = (blockIdx.x * kColsX + threadIdx.x) * 4;
  const int lo = blockIdx.y * chunk;
  const int hi = min(reduce_len, lo + chunk);
  float4 acc = make_float4(identity, identity, identity, identity);
  if (o < n_out) {
    const TI* p = a + o;
    const auto fold = [&](float4 v) { acc = mt::apply4(op, acc, v); };
    const auto row = [&](int r) {
      const TI* q = p + static_cast<long long>(r) * reduce_stride;
      if (o + 4 <= n_out) return mt::load4(q);
      float4 v = make_float4(identity, identity, identity, identity);
      v.x = mt::to_float(q[0]);
      if (o + 1 < n_out) v.y = mt::to_float(q[1]);
      if (o + 2 < n_out) v.z = mt::to_float(q[2]);
      return v;
    };
    int r = lo + threadIdx.y;
    for (; r + 3 * kColsY < hi; r += 4 * kColsY) {
      const float4 v0 = row(r), v1 = row(r + kColsY), v2 = row(r + 2 * kColsY), v3 = row(r + 3 * kColsY);
      fold(mt::apply4(op, mt::apply4(op, v0, v1), mt::apply4(op, v2, v3)));
    }
    for (; r < hi; r += kColsY) fold(row(r));
  }
  tile[threadIdx.y][0][threadIdx.x] = acc.x;
  tile[threadIdx.y][1][threadIdx.x] = acc.y;
  tile[threadIdx.y][2][threadIdx.x] = acc.z;
  tile[threadIdx.y][3][threadIdx.x] = acc.w;
  __syncthreads();
  const int c = threadIdx.y;  // threads y < 4 finish one output each
  if (c < 4 && o + c < n_out) {
    float v = tile[0][c][threadIdx.x];
#pragma unroll
    for (int y = 1; y < kColsY; ++y) v = op(v, tile[y][c][threadIdx.x]);
    if (partial != nullptr) {
      partial[static_cast<long long>(blockIdx.y) * n_out + o + c] = v;
    } else {
      out[o + c] = mt::from_float<TO>(op(start, v));
    }
  }
}

struct ReducePlan {
  bool rows;   // reduce_rows_kernel (else reduce_cols_kernel)
  int splits;  // parts the reduced dim is cut into (1: no workspace, no second pass)
  int chunk;   // elements of the reduced dim per part
};

// Splitting only pays when there are too few outputs to fill the GPU and each part still has
// enough elements to amortize the second pass. per_thread: the column kernel's outputs a thread (1, or
// 4 for reduce_cols4_kernel).
ReducePlan plan_reduce(int n_out, int reduce_len, int reduce_stride, int sms, bool allow_split, int per_thread) {
  ReducePlan plan{reduce_stride == 1 && reduce_len >= 32, 1, reduce_len};
  if (!allow_split) return plan;
  long long splits = 1;
  if (plan.rows) {
    const long long target_warps = static_cast<long long>(sms) * 32;
    if (n_out < target_warps && reduce_len >= 2048) {
      splits = mt::ceil_div(target_warps, n_out);
      if (splits > reduce_len / 1024) splits = reduce_len / 1024;
      if (splits > 1) {
        const long long chunk = mt::ceil_div(mt::ceil_div(reduce_len, splits), 128) * 128;
        plan.chunk = static_cast<int>(chunk);
        splits = mt::ceil_div(reduce_len, chunk);
      }
    }
  } else {
    const long long blocks = mt::ceil_div(n_out, kColsX * per_thread);
    const long long target_blocks = static_cast<long long>(sms) * 8;
    if (blocks < target_blocks && reduce_len >= 256) {
      splits = mt::ceil_div(target_blocks, blocks);
      if (splits > reduce_len / 64) splits = reduce_len / 64;
      if (splits > 65535) splits = 65535;
      if (splits > 1) {
        const long long chunk = mt::ceil_div(reduce_len, splits);
        plan.chunk = static_cast<int>(chunk);
        splits = mt::ceil_div(reduce_len, chunk);
      }
    }
  }
  plan.splits = static_cast<int>(splits);
  if (plan.splits == 1) plan.chunk = reduce_len;
  return plan;
}

long long workspace_floats(const ReducePlan& plan, int n_out) {
  return plan.splits > 1 ? static_cast<long long>(plan.splits) * n_out : 0;
}

// Whether reduce_cols4_kernel can take this reduction: outputs adjacent in a (1-D outer, stride 1)
// and in out, and every row 4-element aligned.
template <class TI>
bool columns_by_four(const MtLayout& out_l, const TI* a, const MtLayout& outer, int reduce_stride) {
  return outer.ndim == 1 && outer.strides[0] == 1 && out_l.ndim == 1 && out_l.strides[0] == 1 && mt::is_aligned4(a) &&
         reduce_stride % 4 == 0;
}

template <class Op, class TO, class TI>
int reduce_pass(Op op, TO* out, const MtLayout& out_l, const TI* a, const MtLayout& outer,
                int n_out, int reduce_len, int reduce_stride, float identity, float start,
                float* workspace, long long workspace_len, bool allow_split, int sms,
                cudaStream_t stream) {
  const bool by_four = columns_by_four(out_l, a, outer, reduce_stride);
  const ReducePlan plan = plan_reduce(n_out, reduce_len, reduce_stride, sms, allow_split, by_four ? 4 : 1);
  const long long need = workspace_floats(plan, n_out);
  MT_RETURN_IF_INVALID(need > 0 && (workspace == nullptr || workspace_len < need));
  float* partial = need > 0 ? workspace : nullptr;
  if (plan.rows) {
    const long long units = static_cast<long long>(n_out) * plan.splits;
    const int warps_per_block = kReduceThreads / 32;
    long long blocks = mt::ceil_div(units, warps_per_block);
    if (blocks > mt::kMaxInt) blocks = mt::kMaxInt;
    MT_RETURN_IF_ERROR(static_cast<cudaError_t>(mt::launch_dependent(
        reduce_rows_kernel<TO, TI, Op>, dim3(static_cast<unsigned>(blocks)), dim3(kReduceThreads), 0, stream, out, out_l,
        a, outer, units, plan.splits, plan.chunk, reduce_len, identity, start, partial, op)));
  } else if (by_four) {
    const dim3 grid(static_cast<unsigned>(mt::ceil_div(n_out, 4 * kColsX)), static_cast<unsigned>(plan.splits));
    MT_RETURN_IF_ERROR(static_cast<cudaError_t>(
        mt::launch_dependent(reduce_cols4_kernel<TO, TI, Op>, grid, dim3(kColsX, kColsY), 0, stream, out, a, n_out,
                             reduce_len, reduce_stride, plan.chunk, identity, start, partial, op)));
  } else {
    const dim3 grid(static_cast<unsigned>(mt::ceil_div(n_out, kColsX)), static_cast<unsigned>(plan.splits));
    MT_RETURN_IF_ERROR(static_cast<cudaError_t>(
        mt::launch_dependent(reduce_cols_kernel<TO, TI, Op>, grid, dim3(kColsX, kColsY), 0, stream, out, out_l, a,
                             outer, n_out, reduce_len, reduce_stride, plan.chunk, identity, start, partial, op)));
  }
  if (partial == nullptr) return 0;
  // Second pass over the partials: [n_out, splits] after the row kernel, [splits, n_out] after the
  // column kernel (both keep their writes coalesced).
  MtLayout partial_outer{};
  partial_outer.ndim = 1;
  partial_outer.shape[0] = n_out;
  partial_outer.strides[0] = plan.rows ? plan.splits : 1;
  const int partial_stride = plan.rows ? 1 : n_out;
  return reduce_pass(op, out, out_l, static_cast<const float*>(partial), partial_outer, n_out, plan.splits, partial_stride,
                     identity, start, nullptr, 0, false, sms, stream);
}

}  // namespace
