// The Hopper (sm_90a) path of matmul_kernel.cu: TMA loads, a warp-specialized pipeline and wgmma, for
// products whose operands the Tensor Memory Accelerator can read (a unit-stride dim, 16-byte aligned
// base and strides, at most one batch dim). Included by matmul_kernel.cu, whose MatmulParams,
// store_run, tile_coords and wgmma helpers it uses.
//
// Orientation. wgmma reads its A operand from registers in any layout we can load, and its B operand
// from shared memory only K-major (k contiguous) for TF32. The kernel computes rows x cols of
// A' @ B' with B' K-major: the product itself when B is K-major; out^T = B^T A^T (rows and cols
// swapped, the epilogue writing transposed) when only A is. When neither is (weight gradients
// x^T @ dy), "high" first copies the smaller operand K-major into the workspace (transpose_kernel) and
// takes one of those two ways; "highest", or a product without workspace, keeps B N-major and the
// transform warps transpose each staged tile.
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
// fresh accumulators per K tile; "high" rounds A to nearest TF32 in registers, and B where the
// transform writes it (an N-major B), otherwise wgmma truncates B.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>

namespace tma {

constexpr int kThreads = 384, kBM = 128, kABytes = kBM * kBK * 4, kBoxBytes = 32 * kBK * 4;
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

// What the kernel needs beyond the epilogue's MatmulParams (which keep the output's orientation).
// Work: the data-parallel units [0, dp_units) are output tiles, or (tile, K split) pairs whose partial
// products split_k_reduce adds up later (block c takes units c, c + grid, ...); then the K tiles of
// tiles [dp_units, tiles) (no K splits then) are dealt out in equal contiguous shares, one per block
// (stream-K), so that every block gets the same number of K tiles however few output tiles there are.
// A tile shared by several blocks is finished by the block holding its first K tiles: the others leave
// their partial sums in `partials` and raise their `flags` (to this launch's token).
struct Params {
  MatmulParams p;
  int rows, cols;     // the kernel's product: rows x cols
  bool transposed;    // kernel element (r, c) is output element (c, r)
  bool a_batched, b_batched;
  int tiles_m, tiles_n, k_tiles;  // tiles of one batch matrix; K tiles of one tile
  int splits, k_tiles_per_split;
  int dp_units;
  long long sk_iters;  // the K tiles of the stream-K tiles (those after the data-parallel units)
  float* partials;     // block c's partial tile at partials + c * kBM * BN, in the consumers' register order
  unsigned long long* flags;  // flags[8 c + w] = token once consumer warp w of block c wrote its part
  unsigned long long token;   // this launch's flag value (see launch_token)
};

struct Tile {
  int bi, row0, col0;
};

template <int BN>
__device__ __forceinline__ Tile tile_of(const Params& tp, int t) {
  const int per_batch = tp.tiles_m * tp.tiles_n;
  Tile w;
  w.bi = t / per_batch;
  int tm, tn;
  tile_coords(t - w.bi * per_batch, tp.tiles_m, tp.tiles_n, &tm, &tn);
  w.row0 = tm * kBM;
  w.col0 = tn * BN;
  return w;
}

// A block's piece of one tile: K tiles [kt0, kt0 + k_tiles), of K split `split`. kWhole: all of the
// tile's (or split's) K tiles; kHead: the first ones, and the block finishes the tile with the later
// blocks' parts; kTail: a later part, left in partials.
enum Role { kWhole, kHead, kTail };
struct Segment {
  int tile, split, kt0, k_tiles, role;
};

// First stream-K K tile of block c (c = gridDim.x: the end).
__device__ __forceinline__ long long sk_begin(const Params& tp, int c) {
  return static_cast<long long>(c) * tp.sk_iters / gridDim.x;
}

// The block whose stream-K share holds K tile i: the largest c with sk_begin(c) <= i.
__device__ __forceinline__ int sk_block(const Params& tp, long long i) {
  return static_cast<int>(((i + 1) * gridDim.x + tp.sk_iters - 1) / tp.sk_iters - 1);
}

// A block's walk over its work, in order: its data-parallel units, then its stream-K share (at most a
// kTail first and a kHead last). The producer, transform and consumer warps all walk it:
//   for (Walk wk = walk_start(tp); next_segment(tp, wk, sg);) ...
struct Walk {
  int u;             // the next data-parallel unit
  long long i, end;  // the stream-K K tiles left
};

__device__ __forceinline__ Walk walk_start(const Params& tp) {
  return Walk{static_cast<int>(blockIdx.x), sk_begin(tp, blockIdx.x), sk_begin(tp, blockIdx.x + 1)};
}

__device__ __forceinline__ bool next_segment(const Params& tp, Walk& wk, Segment& sg) {
  if (wk.u < tp.dp_units) {
    // Unit u: batch matrix, then K split, then tile: the blocks of a wave work on the same K range.
    const int per_batch = tp.tiles_m * tp.tiles_n;
    const int bi = wk.u / (per_batch * tp.splits), rem = wk.u - bi * per_batch * tp.splits;
    const int split = rem / per_batch, kt0 = split * tp.k_tiles_per_split;
    sg = Segment{bi * per_batch + rem - split * per_batch, split, kt0, min(tp.k_tiles_per_split, tp.k_tiles - kt0), kWhole};
    wk.u += gridDim.x;
    return true;
  }
  if (wk.i >= wk.end) return false;
  const int t = static_cast<int>(wk.i / tp.k_tiles);
  const int kt0 = static_cast<int>(wk.i - static_cast<long long>(t) * tp.k_tiles);
  const int n = static_cast<int>(min(static_cast<long long>(tp.k_tiles - kt0), wk.end - wk.i));
  sg = Segment{tp.dp_units + t, 0, kt0, n, kt0 > 0 ? kTail : n < tp.k_tiles ? kHead : kWhole};
  wk.i += n;
  return true;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Box (c0, c1, c2) of the tensor map into shared memory at dst; completion counted on bar.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap& map, uint32_t bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// Descriptor of a K-major, 128-byte-swizzled tile at shared address addr (1024-byte aligned rows of 8):
// 8-row groups 1024 bytes apart; one k8 step further along k is addr + 32 bytes (descriptor + 2).
__device__ __forceinline__ uint64_t swizzled_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | 1ull << 16 | static_cast<uint64_t>(1024 >> 4) << 32 |
         1ull << 62;
}

// d (+)= a b for one m64nNk8 TF32 product (N = 256, 192), A from registers; returns before the product
// is done.
#define MT_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MT_D16(i) MT_D4(i), MT_D4(i + 4), MT_D4(i + 8), MT_D4(i + 12)
__device__ __forceinline__ void wgmma_m64n256k8_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b_desc,
                                                   int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "
      "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "
      "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
      "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, "
      "%123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
      : MT_D16(0), MT_D16(16), MT_D16(32), MT_D16(48), MT_D16(64), MT_D16(80), MT_D16(96), MT_D16(112)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_m64n192k8_rs(float (&d)[96], const uint32_t (&a)[4], uint64_t b_desc,
                                                   int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "
      "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "
      "%92, %93, %94, %95"
      "}, {%96, %97, %98, %99}, %100, p, 1, 1;\n}\n"
      : MT_D16(0), MT_D16(16), MT_D16(32), MT_D16(48), MT_D16(64), MT_D16(80)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate));
}
#undef MT_D16
#undef MT_D4

template <int BN>
__device__ __forceinline__ void wgmma_rs(float (&d)[BN / 2], const uint32_t (&a)[4], uint64_t b_desc, int accumulate) {
  if constexpr (BN == 256) {
    wgmma_m64n256k8_rs(d, a, b_desc, accumulate);
  } else if constexpr (BN == 192) {
    wgmma_m64n192k8_rs(d, a, b_desc, accumulate);
  } else {
    wgmma_m64n128k8(d, a, b_desc, accumulate);
  }
}

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
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&a_map)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&b_map)) : "memory");
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
          if constexpr (A_KMAJOR) {
            tma_load(slot, a_map, full(s), k0, w.row0, ba);
          } else {
#pragma unroll
            for (int i = 0; i < kBM / 32; ++i) tma_load(slot + i * kBoxBytes, a_map, full(s), w.row0 + 32 * i, k0, ba);
          }
          if constexpr (B_TRANSFORM) {
#pragma unroll
            for (int i = 0; i < BN / 32; ++i)
              tma_load(slot + kABytes + i * kBoxBytes, b_map, full(s), w.col0 + 32 * i, k0, bb);
          } else {
            tma_load(slot + kABytes, b_map, full(s), k0, w.col0, bb);
          }
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

// ------------------------------------------------------------------------------------------------
// Host: which products take this path, in which orientation, with which tiles and K splits.
// ------------------------------------------------------------------------------------------------
inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static bool looked = false;
  if (!looked) {
    looked = true;
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }
    cudaGetLastError();  // no entry point means no TMA path, not an error for the next launch
  }
  return fn;
}

// One operand as the kernel reads it: element (i, o) of batch matrix b at
// base[i + o * outer_stride + b * batch_stride] (floats), i along the unit-stride dim.
struct Operand {
  const float* base;
  long long inner, outer, outer_stride, batch_stride;
};

// Tensor map of op in boxes of box_inner x box_outer, 128-byte swizzled, zeros outside; false where
// TMA cannot read it (alignment) or the driver refuses it.
inline bool encode(CUtensorMap* map, const Operand& op, long long batches, int box_inner, int box_outer) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = encode_tiled();
  if (fn == nullptr || !mt::is_aligned16(op.base) || op.outer_stride % 4 != 0 || op.batch_stride % 4 != 0) return false;
  const long long matrix = ((op.outer * op.outer_stride + 3) / 4) * 4;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(op.inner), static_cast<cuuint64_t>(op.outer),
                              static_cast<cuuint64_t>(op.batch_stride != 0 ? batches : 1)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(op.outer_stride) * 4,
                                 static_cast<cuuint64_t>(op.batch_stride != 0 ? op.batch_stride : matrix) * 4};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_inner), static_cast<cuuint32_t>(box_outer), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(op.base), dims, strides, box, element_strides,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The work plan: tile width, data-parallel units (tiles, or tiles x K splits), stream-K K tiles, grid.
struct Plan {
  int bn, k_tiles, splits, k_tiles_per_split, dp_units, grid;  // bn 0: no plan (too many tiles)
  long long sk_iters;
};

// Least estimated time over tile widths and ways to share the work. One K tile of one output tile
// costs 2 x 128 x BN x 32 flops at an SM's rate (TF32 ~3 TFLOP/s at BN 256, 2.9 at 192, 2.6 at 128;
// "highest" does three products, ~1). BN 192 fits widths such as 768 and 4096 to the 132 SMs in fewer
// waves than 256 (768 x 4096: 132 tiles against 96). Data-parallel work takes ceil(units / sms) waves
// of its units' K tiles; K splits add their partial products' traffic (written and read once,
// ~2.5 TB/s). Stream-K (where allowed) keeps all but the last whole wave of tiles data-parallel and
// gives every block the same share of the rest's K tiles; it adds the time a finishing block takes to
// read the partial tiles of the blocks sharing its tile (and to write its own), at one SM's share of L2
// bandwidth (~100 GB/s): the blocks do this side by side. A plan must win by 3% to replace the simpler
// one before it.
inline Plan plan(int rows, int cols, int K, long long batch, int sms, int precision, bool transform, bool stream_k,
                 int max_splits) {
  const long long k_tiles = ceil_div(K, kBK);
  Plan best{};
  double best_cost = 1e300;
  const auto consider = [&](double cost, const Plan& pl) {
    if (cost < best_cost * 0.97) best_cost = cost, best = pl;
  };
  for (const int bn : {256, 192, 128}) {
    if (bn > 128 && (precision != kHigh || transform)) continue;
    const double rate = precision == kHighest ? 1.0e12 : bn == 256 ? 3.0e12 : bn == 192 ? 2.9e12 : 2.6e12;
    const double k_tile_time = 2.0 * kBM * bn * kBK / rate;
    const long long tiles = ceil_div(rows, kBM) * ceil_div(cols, bn) * batch;
    if (tiles * max_splits > INT32_MAX) continue;
    const int kt = static_cast<int>(k_tiles);
    for (int s = 1; s <= max_splits; ++s) {
      const long long per_split = ceil_div(k_tiles, s);
      if (s > 1 && (per_split < 4 || ceil_div(k_tiles, per_split) < s)) break;
      const long long units = tiles * s;
      consider(ceil_div(units, sms) * per_split * k_tile_time + (s > 1 ? 8.0 * s * batch * rows * cols / 2.5e12 : 0.0),
               Plan{bn, kt, s, static_cast<int>(per_split), static_cast<int>(units),
                    static_cast<int>(std::min<long long>(units, sms)), 0});
    }
    if (!stream_k || tiles % sms == 0) continue;
    const long long dp = tiles / sms > 0 ? (tiles / sms - 1) * sms : 0, shared = tiles - dp;
    const long long iters = shared * k_tiles;
    const int grid = static_cast<int>(std::min<long long>(iters, sms));
    const double parts = static_cast<double>(ceil_div(grid, shared) + 1) * kBM * bn * 4;
    consider((dp / sms * k_tiles + ceil_div(iters, grid)) * k_tile_time + parts / 1e11,
             Plan{bn, kt, 1, kt, static_cast<int>(dp), grid, iters});
  }
  return best;
}

// Stream-K's workspace: a partial tile (up to 128 x 256) per block, then 8 flags (64-bit) per block.
constexpr long long kPartialFloats = kBM * 256;
inline long long stream_k_floats(int sms) { return sms * (kPartialFloats + 16); }

// The flags' value for one stream-K launch: never 0, and different for every launch of a process (a
// 64-bit count through the splitmix64 finalizer, a bijection). The workspace is not cleared before a
// launch (a memset cost attn proj dW "highest" ~1.5 us of 57): a flag counts as raised only when it
// holds this launch's token, which memory left by other work holds with probability 2^-64, and a head
// clears each flag it waited on, so a launch replayed from a CUDA graph (same token, same workspace)
// finds them cleared.
inline unsigned long long launch_token() {
  static std::atomic<unsigned long long> count{0};
  unsigned long long z = ++count * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z != 0 ? z : 1;
}

// Stream-K serves "highest" only. "high" runs close to the memory system's limits, and blocks that
// start their shares at scattered K positions re-read the operands from DRAM: on the GPT-2 products it
// ran up to 35% slower than K splits, whose blocks move through K together.
inline bool uses_stream_k(int precision) { return precision == kHighest; }

// Whether TMA reads an operand whose element (i, o) sits at i * unit + o * other along the unit dim i:
// unit stride 1 and 16-byte rows.
inline bool tma_major(int unit, int other) { return unit == 1 && other % 4 == 0; }

// Whether "high" copies one operand K-major first: weight gradients x^T @ dy, where neither operand is
// K-major. The copy (one read and write of the smaller operand) costs far less than transposing every
// staged B tile in the transform warps, which hold "high" to ~60% of its rate; "highest" runs at a third
// of that rate, where the transform keeps up, and skips the copy.
inline bool copies_operand(int precision, bool a_mmajor, bool b_nmajor) { return precision == kHigh && a_mmajor && b_nmajor; }

// Floats of the K-major copy of the smaller operand: [mats][rows][K rounded up to 4].
inline long long copy_floats(int M, int N, int K, long long mats) { return mats * std::min(M, N) * ceil_div(K, 4) * 4; }

// Floats of workspace that this path may use at these sizes and layouts: the operand copy, then what
// the plan of either orientation shares its work through (stream-K's partial tiles, or K splits).
inline long long workspace_floats(const MatmulParams& p, int precision, int sms) {
  const bool a_mmajor = tma_major(p.a_row_stride, p.a_k_stride), b_nmajor = tma_major(p.b_col_stride, p.b_k_stride);
  const bool copy = copies_operand(precision, a_mmajor, b_nmajor);
  long long most = 0;
  for (int swap = 0; swap < 2; ++swap) {
    const Plan pl = plan(swap ? p.N : p.M, swap ? p.M : p.N, p.K, p.batch, sms, precision, a_mmajor && b_nmajor && !copy,
                         uses_stream_k(precision), kMaxSplits);
    if (pl.sk_iters > 0) most = std::max(most, stream_k_floats(sms));
    if (pl.splits > 1) most = std::max(most, pl.splits * static_cast<long long>(p.batch) * p.M * p.N);
  }
  return most + (copy ? copy_floats(p.M, p.N, p.K, p.batch) : 0);
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
  for (int d = 0; d < p.a_batch.ndim; ++d) {
    if (p.a_batch.shape[d] == 1) continue;
    if (batch_dim >= 0) return kNotTaken;
    batch_dim = d;
  }
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
