// The Hopper (sm_90a) TMA kernel of the matmul library: TMA loads, a warp-specialized pipeline and
// wgmma, for products whose operands the Tensor Memory Accelerator can read (a unit-stride dim,
// 16-byte aligned base and strides, at most one batch dim; tma_launch.cuh picks the orientation).
//
// Block 128 x BN x 32 (BN 128; 192 or 256 for "high" without the transform), 384 threads, one block
// per SM, persistent over its work (see Params: output tiles, or tiles x K splits, and a stream-K share
// of K tiles), grouped as tile_coords orders them:
//   warp 0 (lane 0)    the producer: per K tile, waits for a free ring slot, then TMA-loads A' (128 x 32)
//                      and B' (BN x 32) into it, the slot's `full` barrier counting the bytes;
//   warps 1-3          the transform (where needed): per K tile, from the landed B' tile, write the
//                      K-major TF32 words wgmma reads: B_lo = b - hi(b) ("highest"), and for an N-major
//                      B the transposed hi words (rounded to nearest for "high"); then `conv` barrier;
//   warpgroups 1, 2    consumers of 64 rows each: A fragments from shared memory into registers
//                      (split into hi + lo, or rounded), wgmma.m64nBNk8 with B from shared memory,
//                      then the slot's `empty` barrier; at the end of a tile, the epilogue: each warp
//                      stages its accumulators in shared memory, 16 x 32 at a time, and writes them
//                      to global memory as whole output rows (a stream-K part that does not finish
//                      its tile goes to the workspace instead).
// setmaxnreg moves registers from the producer warpgroup (40, or 120 where it transforms) to the
// consumers (232, or 192).
//
// Shared memory tiles use the 128-byte swizzle of TMA and wgmma: a tile row of 32 floats is 128 bytes,
// and the 16-byte chunk c of row r sits at chunk c ^ (r % 8). K-major tiles (A or B' with k
// contiguous) are [rows][32 k]; an M-major A and an N-major B arrive as boxes of [32 k][32 rows].
// Precision as in the mma.sync kernel: "highest" splits A in registers and uses B's raw words as hi
// (wgmma reads the top 19 bits) with B_lo from the transform, three products per k8 step summed into
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../includes/mma_tf32.cuh"
#include "../includes/ptx.cuh"
#include "../includes/tma.cuh"
#include "epilogue.cuh"
#include "params.cuh"
#include "tma_work.cuh"
#include "wgmma_ops.cuh"

namespace tma {

using mt::round_tf32;

constexpr int kThreads = 384, kABytes = kBM * kBK * 4, kBoxBytes = 32 * kBK * 4;
constexpr int kRingBudget = 192 * 1024;
// The block starts with 168 registers a thread (65536 / 384, rounded down to 8): 384 x 168 = 128 x 40 +
// 256 x 232 = 128 x 120 + 256 x 192. Asking the consumers for more than the producers give back would
// stall them for good. Where the transform warps run (BN 128), they get the registers to hold all their
// blocks of a tile at once; elsewhere the consumers get them.
template <bool B_TRANSFORM>
constexpr int kProducerRegs = B_TRANSFORM ? 120 : 40;
template <bool B_TRANSFORM>
constexpr int kConsumerRegs = B_TRANSFORM ? 192 : 232;
static_assert(128 * kProducerRegs<true> + 256 * kConsumerRegs<true> == 384 * 168, "register split");
static_assert(128 * kProducerRegs<false> + 256 * kConsumerRegs<false> == 384 * 168, "register split");
// The epilogue stages each consumer warp's results 16 kernel rows x 32 kernel columns at a time, as
// output rows: [16][kLdN] in the kernel's orientation, [32][kLdT] transposed. These row pitches make
// the fragment writes free of bank conflicts.
constexpr int kLdN = 40, kLdT = 20, kStageFloats = 16 * kLdN;
constexpr int kStageBytes = 8 * kStageFloats * 4;
static_assert(32 * kLdT <= kStageFloats, "a transposed piece must fit the staging buffer");

template <int PREC, bool A_KMAJOR, bool B_TRANSFORM, int BN>
struct Config {
  // Converted B tiles per slot: B_lo for "highest", the transposed hi words for an N-major B.
  static constexpr int kConv = (PREC == kHighest ? 1 : 0) + (B_TRANSFORM ? 1 : 0);
  static constexpr int kBBytes = BN * kBK * 4;
  static constexpr int kSlotBytes = kABytes + kBBytes * (1 + kConv);
  static constexpr int kStages = kRingBudget / kSlotBytes > 8 ? 8 : kRingBudget / kSlotBytes;
  // + epilogue staging, barriers, alignment
  static constexpr int kSmemBytes = kStages * kSlotBytes + kStageBytes + 3 * 8 * kStages + 1024;
  static constexpr int kTxBytes = kABytes + kBBytes;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ float tf32_hi(float x) { return __uint_as_float(__float_as_uint(x) & 0xffffe000u); }

// The transform warps' work on one landed slot (96 threads, t96 = 0..95).
template <int PREC, bool B_TRANSFORM, int BN>
__device__ __forceinline__ void transform_slot(uint8_t* raw, uint8_t* conv, int t96) {
  constexpr int kBBytes = BN * kBK * 4;
  if constexpr (!B_TRANSFORM) {
    // B_lo of a K-major B: same positions as the raw words.
    for (int i = t96; i < BN * kBK / 4; i += 96) {
      const float4 v = reinterpret_cast<const float4*>(raw)[i];
      reinterpret_cast<float4*>(conv)[i] =
          make_float4(v.x - tf32_hi(v.x), v.y - tf32_hi(v.y), v.z - tf32_hi(v.z), v.w - tf32_hi(v.w));
    }
  } else {
    // N-major boxes [32 k][32 n] -> K-major [BN n][32 k], 4 x 4 blocks per thread. Block (box, d, x) is
    // n0 = 32 box + 4 x, k0 = 4 (x ^ d): the 8 threads of a quarter warp (one d, x = 0..7) then read
    // and write 8 different 16-byte chunks of the swizzled rows (no bank conflicts). A thread loads all
    // its blocks before it writes any, so that their shared-memory latencies overlap.
    constexpr int kBlocks = 2 * BN, kPer = (kBlocks + 95) / 96;
    float v[kPer][4][4];  // v[i][e][c] = B(n0 + c, k0 + e) of the thread's block i
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int b = t96 + 96 * i;
      if (b >= kBlocks) break;
      const int box = b >> 6, d = (b >> 3) & 7, x = b & 7, k0 = 4 * (x ^ d);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = k0 + e;
        const float4 w = *reinterpret_cast<const float4*>(raw + box * kBoxBytes + k * 128 + ((x ^ (k & 7)) << 4));
        v[i][e][0] = w.x, v[i][e][1] = w.y, v[i][e][2] = w.z, v[i][e][3] = w.w;
      }
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int b = t96 + 96 * i;
      if (b >= kBlocks) break;
      const int box = b >> 6, d = (b >> 3) & 7, x = b & 7;
      const int n0 = 32 * box + 4 * x, k0 = 4 * (x ^ d);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int n = n0 + c;
        const int at = n * 128 + (((k0 >> 2) ^ (n & 7)) << 4);
        float4 hi, lo;
        if constexpr (PREC == kHighest) {
          hi = make_float4(tf32_hi(v[i][0][c]), tf32_hi(v[i][1][c]), tf32_hi(v[i][2][c]), tf32_hi(v[i][3][c]));
          lo = make_float4(v[i][0][c] - hi.x, v[i][1][c] - hi.y, v[i][2][c] - hi.z, v[i][3][c] - hi.w);
          *reinterpret_cast<float4*>(conv + kBBytes + at) = lo;
        } else {
          hi = make_float4(__uint_as_float(round_tf32(v[i][0][c])), __uint_as_float(round_tf32(v[i][1][c])),
                           __uint_as_float(round_tf32(v[i][2][c])), __uint_as_float(round_tf32(v[i][3][c])));
        }
        *reinterpret_cast<float4*>(conv + at) = hi;
      }
    }
  }
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MT_TMA_THREADS 384
#else
#define MT_TMA_THREADS 1
#endif

template <int PREC, bool A_KMAJOR, bool B_TRANSFORM, int BN>
__global__ void __launch_bounds__(MT_TMA_THREADS, 1)
    matmul_tma_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                      const Params tp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = Config<PREC, A_KMAJOR, B_TRANSFORM, BN>;
  constexpr int S = Cfg::kStages;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = mt::shared_address(smem_raw);
  const uint32_t base = (raw_addr + 1023) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw_addr);
  float* const staging = reinterpret_cast<float*>(smem + S * Cfg::kSlotBytes);
  const uint32_t bars = base + S * Cfg::kSlotBytes + kStageBytes;
  const auto full = [&](int s) { return bars + 8 * s; };
  const auto conv = [&](int s) { return bars + 8 * (S + s); };
  const auto empty = [&](int s) { return bars + 8 * (2 * S + s); };
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full(s), 1);
      mbar_init(conv(s), 3);
      mbar_init(empty(s), 8);  // every consumer warp
    }
    fence_barrier_init();
    prefetch_tensormap(a_map);
    prefetch_tensormap(b_map);
  }
  __syncthreads();

  if (warp < 4) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs<B_TRANSFORM>));
    if (warp == 0) {
      if (lane != 0) return;
      int it = 0;
      Segment sg;
      for (Walk wk = walk_start(tp); next_segment(tp, wk, sg);) {
        const Tile w = tile_of<BN>(tp, sg.tile);
        const int ba = tp.a_batched ? w.bi : 0, bb = tp.b_batched ? w.bi : 0;
        for (int kt = 0; kt < sg.k_tiles; ++kt, ++it) {
          const int s = it % S, k0 = (sg.kt0 + kt) * kBK;
          mbar_wait(empty(s), ((it / S) & 1) ^ 1);
          mbar_expect_tx(full(s), Cfg::kTxBytes);
          const uint32_t slot = base + s * Cfg::kSlotBytes;
          load_operand_tile<A_KMAJOR, kBM, 32>(slot, a_map, full(s), k0, w.row0, ba, kBoxBytes);
          load_operand_tile<!B_TRANSFORM, BN, 32>(slot + kABytes, b_map, full(s), k0, w.col0, bb, kBoxBytes);
        }
      }
    } else if constexpr (Cfg::kConv > 0) {
      int it = 0;
      Segment sg;
      for (Walk wk = walk_start(tp); next_segment(tp, wk, sg);) {
        for (int kt = 0; kt < sg.k_tiles; ++kt, ++it) {
          const int s = it % S;
          mbar_wait(full(s), (it / S) & 1);
          uint8_t* slot = smem + s * Cfg::kSlotBytes;
          transform_slot<PREC, B_TRANSFORM, BN>(slot + kABytes, slot + kABytes + Cfg::kBBytes, threadIdx.x - 32);
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the words are for wgmma
          __syncwarp();
          if (lane == 0) mbar_arrive(conv(s));
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs<B_TRANSFORM>));
  const int cw = warp / 4 - 1, wq = warp % 4, g = lane / 4, t = lane % 4;
  const int tile_row = cw * 64 + wq * 16 + g;  // fragment rows tile_row and tile_row + 8
  // Byte offsets in the A tile of this thread's fragment words for k8 step 0 (h = 0: k = t, h = 1:
  // k = t + 4; rows tile_row, tile_row + 8); step j adds j * 32 bytes (K-major) or j * 1024 (M-major).
  int a_off[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (A_KMAJOR) {
        a_off[h][r] = (tile_row + 8 * r) * 128 + ((h ^ g) << 4) + 4 * t;
      } else {
        const int box = cw * 2 + (wq >> 1), chunk = (wq & 1) * 4 + 2 * r + (g >> 2);
        a_off[h][r] = box * kBoxBytes + (4 * h + t) * 128 + ((chunk ^ (4 * h + t)) << 4) + 4 * (g & 3);
      }
    }
  }
  // A fragment words of k8 step j from the slot (a0..a3 as the mma_tf32.cuh layout, natural k order).
  const auto a_words = [&](const uint8_t* a_tile, int j, float (&x)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = i >> 1, r = i & 1;
      const int off = A_KMAJOR ? (a_off[h][r] ^ (2 * j << 4)) : a_off[h][r] + j * 1024;
      x[i] = *reinterpret_cast<const float*>(a_tile + off);
    }
  };
  const auto wait_slot = [&](int s, int parity) {
    mbar_wait(full(s), parity);
    if constexpr (Cfg::kConv > 0) mbar_wait(conv(s), parity);
  };
  const uint32_t b_hi_off = kABytes + (B_TRANSFORM ? Cfg::kBBytes : 0);
  const uint32_t b_lo_off = kABytes + Cfg::kBBytes * (B_TRANSFORM ? 2 : 1);

  const int ct = threadIdx.x - 128, cwarp = warp - 4;  // consumer thread 0..255, consumer warp 0..7
  int it = 0;
  Segment sg;
  for (Walk wk = walk_start(tp); next_segment(tp, wk, sg);) {
    const Tile w = tile_of<BN>(tp, sg.tile);
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    if constexpr (PREC == kHighest) {
      float fresh[BN / 2];
      for (int kt = 0; kt < sg.k_tiles; ++kt, ++it) {
        const int s = it % S;
        wait_slot(s, (it / S) & 1);
        const uint8_t* slot = smem + s * Cfg::kSlotBytes;
        mt::Tf32Frag<4> af[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float x[4];
          a_words(slot, j, x);
#pragma unroll
          for (int i = 0; i < 4; ++i) af[j].set(i, x[i]);
        }
        const uint64_t b_hi = swizzled_desc(base + s * Cfg::kSlotBytes + b_hi_off);
        const uint64_t b_lo = swizzled_desc(base + s * Cfg::kSlotBytes + b_lo_off);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          wgmma_rs<BN>(fresh, af[j].lo, b_hi + 2 * j, j > 0);
          wgmma_rs<BN>(fresh, af[j].hi, b_lo + 2 * j, 1);
          wgmma_rs<BN>(fresh, af[j].hi, b_hi + 2 * j, 1);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        fence_registers(fresh);
        if (lane == 0) mbar_arrive(empty(s));
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] += fresh[i];
      }
    } else {
      // One K tile's products stay in flight while the next tile's fragments load: two register sets.
      uint32_t a0[4][4], a1[4][4];
      int prev = -1;
      const auto step = [&](uint32_t (&a)[4][4]) {
        const int s = it % S;
        wait_slot(s, (it / S) & 1);
        const uint8_t* slot = smem + s * Cfg::kSlotBytes;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float x[4];
          a_words(slot, j, x);
#pragma unroll
          for (int i = 0; i < 4; ++i) a[j][i] = round_tf32(x[i]);
        }
        const uint64_t b_hi = swizzled_desc(base + s * Cfg::kSlotBytes + b_hi_off);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int j = 0; j < 4; ++j) wgmma_rs<BN>(acc, a[j], b_hi + 2 * j, 1);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (prev >= 0 && lane == 0) mbar_arrive(empty(prev));
        prev = s;
        ++it;
      };
      int kt = 0;
      for (; kt + 1 < sg.k_tiles; kt += 2) {  // no branch between the two steps: ptxas would serialize the products
        step(a0);
        step(a1);
      }
      if (kt < sg.k_tiles) step(a0);
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      fence_registers(acc);
      if (prev >= 0 && lane == 0) mbar_arrive(empty(prev));
    }

    // Stream-K: a kTail leaves its sums in its block's partial tile (float4 j of consumer thread ct at
    // 4 (256 j + ct)) and raises its warp's flag; a kHead adds the later blocks' parts, warp by warp.
    float4* const parts = reinterpret_cast<float4*>(tp.partials) + ct;
    if (sg.role == kTail) {
      float4* mine = parts + static_cast<long long>(blockIdx.x) * (kBM * BN / 4);
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) __stcg(mine + 256 * j, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
      __threadfence();
      __syncwarp();
      if (lane == 0) atomicExch(tp.flags + 8 * blockIdx.x + cwarp, tp.token);
      continue;
    }
    if (sg.role == kHead) {
      const long long first = static_cast<long long>(sg.tile - tp.dp_units) * tp.k_tiles;
      const int last = sk_block(tp, first + tp.k_tiles - 1);
      for (int c = blockIdx.x + 1; c <= last; ++c) {
        if (lane == 0) {  // wait for the part, then clear its flag: a launch leaves every flag it raised at 0
          unsigned long long* flag = tp.flags + 8 * c + cwarp;
          unsigned long long raised = 0;
          do {
            asm volatile("ld.acquire.gpu.global.b64 %0, [%1];\n" : "=l"(raised) : "l"(flag) : "memory");
          } while (raised != tp.token);
          *flag = 0;
        }
        __syncwarp();
        const float4* theirs = parts + static_cast<long long>(c) * (kBM * BN / 4);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const float4 v = __ldcg(theirs + 256 * j);
          acc[4 * j] += v.x, acc[4 * j + 1] += v.y, acc[4 * j + 2] += v.z, acc[4 * j + 3] += v.w;
        }
      }
    }

    // Epilogue: fragment j holds rows tile_row (+ 8) and columns 8 j + 2 t, + 1 of the kernel's tile.
    // A whole tile stored as it is (no bias, activation or accumulation; the kernel's orientation;
    // 8-byte aligned rows) goes straight from the accumulators: each store fills one 32-byte sector of
    // 8 rows, and the four stores of a 32-column block fill whole 128-byte lines. Otherwise each 16 x 32
    // piece of the warp's rows goes through its staging buffer, so that the stores write whole output
    // rows four floats per lane: 128 contiguous bytes per row (64 when transposed). Staging cost more
    // than it saved where it was not needed: fc proj dX "high" 75.6 -> 68.3 us without it.
    const MatmulParams& p = tp.p;
    const long long mat = static_cast<long long>(w.bi) * p.M * p.ldc;
    float* out = p.out + sg.split * p.split_stride + mat;
    float* pre = p.pre_act != nullptr ? p.pre_act + mat : nullptr;
    float* stage = staging + cwarp * kStageFloats;
    const int strip = w.row0 + cw * 64 + wq * 16;  // the warp's first kernel row
    if (p.epilogue == kNone && !p.accumulate && p.out_vec && !tp.transposed && w.row0 + kBM <= tp.rows &&
        w.col0 + BN <= tp.cols) {
      float* row = out + static_cast<long long>(strip + g) * p.ldc + w.col0 + 2 * t;  // rows strip + g, + 8
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        *reinterpret_cast<float2*>(row + 8 * j) = make_float2(acc[4 * j], acc[4 * j + 1]);
        *reinterpret_cast<float2*>(row + 8 * p.ldc + 8 * j) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
      }
      continue;
    }
#pragma unroll
    for (int piece = 0; piece < BN / 32; ++piece) {
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = g + 8 * h, c = 8 * jj + 2 * t, at = 4 * (4 * piece + jj) + 2 * h;
          if (!tp.transposed) {
            *reinterpret_cast<float2*>(stage + r * kLdN + c) = make_float2(acc[at], acc[at + 1]);
          } else {
            stage[c * kLdT + r] = acc[at];
            stage[(c + 1) * kLdT + r] = acc[at + 1];
          }
        }
      }
      __syncwarp();
      const int col0 = w.col0 + 32 * piece;
#pragma unroll 1
      for (int i = 0; i < 4; ++i) {
        // Kernel row r, column c: output (r, c), or (c, r) transposed; 4 consecutive output columns.
        const int pr = tp.transposed ? 4 * (lane % 4) : 4 * i + lane / 8;
        const int pc = tp.transposed ? 8 * i + lane / 4 : 4 * (lane % 8);
        const int r = strip + pr, c = col0 + pc;
        if (r >= tp.rows || c >= tp.cols) continue;
        const float4 v = *reinterpret_cast<const float4*>(stage + (tp.transposed ? pc * kLdT + pr : pr * kLdN + pc));
        if (!tp.transposed) {
          store_run<4>(p, out, pre, static_cast<long long>(r) * p.ldc + c, c, {v.x, v.y, v.z, v.w}, min(4, tp.cols - c));
        } else {
          store_run<4>(p, out, pre, static_cast<long long>(c) * p.ldc + r, r, {v.x, v.y, v.z, v.w}, min(4, tp.rows - r));
        }
      }
      __syncwarp();
    }
  }
#endif
}

}  // namespace tma
