// Split-K: where a product has too few output tiles to fill the GPU and a long K, each K split writes
// its partial product to the workspace (partial_params) and split_k_reduce adds them in a fixed order
// (deterministic) and applies the epilogue.
#pragma once

#include <cuda_runtime.h>

#include "../includes/cuda_check.cuh"
#include "../includes/vec.cuh"
#include "epilogue.cuh"
#include "params.cuh"

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
