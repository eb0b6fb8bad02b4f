// The Hopper (sm_90a) kernel of matmul_bf16_kernel.cu: TMA loads, a warp-specialized pipeline and
// wgmma with both operands from shared memory, for products whose operands the Tensor Memory
// Accelerator can read (a unit-stride dim, 16-byte aligned base and strides, at most one batch dim).
//
// Block BM x BN x 64 (128 x 256, 192 or 128; 192 x 128; 64 x 128; bf16_cluster.cuh runs the tiles whose
// products are m64n96 through the same pieces: 192 x 96, 192 x 192 in two 96-row halves of a K-major B,
// and 64 x 96 in clusters of 8), one block per SM, persistent
// over its units (output tile, K split, batch matrix; block c takes units c, c + grid, ...; within a batch
// matrix and split, tiles in tile_coords' grouped order):
//   warp 0 (lane 0)   the producer: per K tile, waits for a free ring slot, then TMA-loads the A tile
//                     (BM x 64) and the B tile (BN x 64) into it, the slot's `full` barrier counting
//                     the bytes;
//   warpgroups 1..    BM / 64 consumers of 64 rows each: per K tile, four wgmma.m64nBNk16 reading A and
//                     B from the slot through descriptors; one K tile's products stay in flight while
//                     the next tile's are issued, and a slot is released (its `empty` barrier, one
//                     arrival per consumer warp) once the products reading it are done. At the end of a
//                     unit the epilogue (store_tile): 64 columns at a time, each warpgroup writes its
//                     float32 sums into a staging buffer in shared memory (64 rows, or 32 at a time
//                     where that buys the ring a slot), then every thread takes one run of 4 columns of
//                     every 8th row from it (bias, activation, pre-activation, accumulation, the
//                     output's dtype, or a K split's partial sums), a 16-thread group per row. A bf16
//                     output with no epilogue or + bias (nothing accumulated or split) goes through
//                     store_tile_tma instead (bf16_tma_store.cuh): bf16 boxes written with stmatrix
//                     into the staging, TMA-stored by one thread while the warpgroup starts its next
//                     unit.
// setmaxnreg gives the producer warpgroup's registers to the consumers (24 / 240 a thread with two
// consumer warpgroups, 24 / 160 with three: at 232 the 256-wide consumers spilled).
//
// Shared memory tiles use the swizzles of TMA and wgmma. 128-byte swizzle: a tile row of 64 bf16 is 128
// bytes and the 16-byte chunk c of row r sits at chunk c ^ (r % 8). wgmma reads 16-bit operands K-major
// or MN-major (its transpose bits), so each operand is staged as it lies in memory:
//   K-major (k contiguous):   one box [rows][64 k]; 8-row groups 1024 bytes apart (the descriptor's
//                             stride offset); k16 step j starts 32 j bytes further;
//   MN-major (rows contiguous): boxes [64 k][64 rows], 8 KB each, one per 64 rows (the descriptor's
//                             leading offset, 8192), 8-k groups 1024 bytes apart (stride offset); k16
//                             step j starts 2048 j bytes further.
// A consumer warpgroup's 64 rows of A start 8192 bytes into the A tile either way.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "../includes/dependent_launch.cuh"
#include "../includes/ptx.cuh"
#include "../includes/tma.cuh"
#include "bf16_common.cuh"
#include "bf16_tma_store.cuh"

namespace bf16mm {

constexpr int kTmaBK = 64;
constexpr int kTmaBoxBytes = 64 * kTmaBK * 2;  // an MN-major box, and a consumer's 64 rows of a K-major A
// The epilogue's staging: per consumer warpgroup, 64 rows x 64 float32 columns.
constexpr int kStageRowBytes = 64 * 4;
constexpr int kTmaSmemLimit = 232448;  // an H100's opt-in shared memory per block (227 KB)
constexpr int kProducerRegs = 24;

// Ring slots of slot_bytes that fit in a block's shared memory beside `consumers` staging buffers of
// stage_bytes, the barriers (at most 8 stages) and the 1024-byte alignment; and the slots a ring takes
// (at most 8); and the dynamic shared memory of such a ring, its staging and its barriers (both kernels).
constexpr int ring_slots(int consumers, int stage_bytes, int slot_bytes) {
  return (kTmaSmemLimit - consumers * stage_bytes - 1024 - 128) / slot_bytes;
}
constexpr int ring_stages(int consumers, int stage_bytes, int slot_bytes) {
  return std::min(ring_slots(consumers, stage_bytes, slot_bytes), 8);
}
constexpr int ring_smem_bytes(int stages, int slot_bytes, int consumers, int stage_bytes) {
  return stages * slot_bytes + consumers * stage_bytes + 16 * stages + 1024;
}

// Registers a consumer thread takes with setmaxnreg when the block has `consumers` consumer warpgroups
// and a producer one: the block starts with 65536 / 128 (consumers + 1) a thread (rounded down to 8):
// 256, 168 or 128. The producer warpgroup keeps 24 and the consumers take up to the rest: 240 with one
// or two (at 232 the 256-wide consumers spilled), 160 with three. Asking for more than the producers
// give back would stall the consumers for good.
constexpr int consumer_regs(int consumers) { return consumers <= 2 ? 240 : 160; }

// The block of BM rows (64, 128 or 192: a consumer warpgroup per 64) x BN columns (256, 192 or 128 here;
// 96 in bf16_cluster.cuh's kernel, which takes its register split from here).
template <int BM, int BN>
struct TmaConfig {
  static constexpr int kConsumers = BM / 64;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kConsumerRegs = consumer_regs(kConsumers);
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 65536, "register split");
  static constexpr int kABytes = BM * kTmaBK * 2;
  static constexpr int kBBytes = BN * kTmaBK * 2;
  static constexpr int kSlotBytes = kABytes + kBBytes;  // 1024-byte aligned slots
  static_assert(kSlotBytes % 1024 == 0, "slots must keep the swizzle atoms aligned");
  // Ring slots left beside staging of R rows a warpgroup; 32-row staging where that buys the three
  // consumer warpgroups a slot (192 x 128: 5 stages against 4). With two, the slot it would buy 128 x 192
  // tiles did not pay (bf16_notes.md, twelfth session).
  static constexpr int slots_beside(int rows) { return ring_slots(kConsumers, rows * kStageRowBytes, kSlotBytes); }
  static constexpr int kStageRows = kConsumers == 3 && slots_beside(32) > slots_beside(64) ? 32 : 64;
  static constexpr int kStageBytes = kStageRows * kStageRowBytes;
  static constexpr int kStages = ring_stages(kConsumers, kStageBytes, kSlotBytes);
  static constexpr int kSmemBytes = ring_smem_bytes(kStages, kSlotBytes, kConsumers, kStageBytes);
  static_assert(kStages >= 3 && kSmemBytes <= kTmaSmemLimit, "ring and staging must fit");
};

// How the epilogue stores: store_tile (staged float32, any epilogue), store_tile_tma (through the
// output's tensor map), or store_tile_tma_t (a product run as its transpose, through the map of the
// output it transposes back into).
enum TmaStore : int { kStoreStaged = 0, kStoreTma = 1, kStoreTransposed = 2 };

// The kernels' instances by epilogue, a template argument so that each holds only the code its launches run
// (epilogue_kind picks one for a launch): the TMA stores (store_tile_tma, store_tile_tma_t), the staged
// stores of the plain sums (store_tile with no epilogue: either dtype, accumulation, a K split's partial
// sums), or the staged stores of any epilogue.
enum EpilogueKind : int { kTmaStores = 0, kStagedPlain = 1, kStagedAny = 2 };

inline int epilogue_kind(int store, int epilogue) {
  return store != kStoreStaged ? kTmaStores : epilogue == kNone ? kStagedPlain : kStagedAny;
}

// What the kernel needs beyond Params: whether each operand's tensor map has a batch dim (else every
// batch matrix reads matrix 0: broadcast), and how the epilogue stores.
struct TmaParams {
  Params p;
  bool a_batched, b_batched;
  int store;  // TmaStore
};

// One unit of a block's work: batch matrix, K split, output tile, and the split's K tiles.
struct Unit {
  int bi, split, row0, col0, kt0, k_tiles;
};

// Unit u: batch matrix, then K split, then tile, so that the blocks of a wave share a K range.
__device__ __forceinline__ Unit unit_of(const Params& p, int u, int bm, int bn) {
  const int per_batch = p.tiles_m * p.tiles_n;
  Unit w;
  w.bi = u / (per_batch * p.splits);
  const int rem = u - w.bi * per_batch * p.splits;
  w.split = rem / per_batch;
  int tm, tn;
  tile_coords(rem - w.split * per_batch, p.tiles_m, p.tiles_n, &tm, &tn);
  w.row0 = tm * bm;
  w.col0 = tn * bn;
  w.kt0 = w.split * p.k_tiles_per_split;
  w.k_tiles = min(p.k_tiles_per_split, p.k_tiles - w.kt0);
  return w;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using tma::fence_barrier_init;
using tma::load_operand_tile;
using tma::mbar_arrive;
using tma::mbar_expect_tx;
using tma::mbar_init;
using tma::mbar_wait;
using tma::prefetch_tensormap;

// Descriptor of a tile under the 128-byte swizzle at shared address addr: K-major, 8-row groups 1024
// bytes apart; MN-major, 8-k groups 1024 bytes apart, 64-row boxes 8192.
template <bool K_MAJOR>
__device__ __forceinline__ uint64_t tile_desc(uint32_t addr) {
  constexpr uint64_t leading = K_MAJOR ? 1 : kTmaBoxBytes >> 4;
  constexpr uint64_t stride = 1024 >> 4;
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | leading << 16 | stride << 32 | uint64_t{1} << 62;
}

// The descriptor's start-address step (16-byte units) from one k16 step to the next.
template <bool K_MAJOR>
constexpr uint64_t kDescStep = K_MAJOR ? 32 >> 4 : (16 * 128) >> 4;

// d (+)= a b for one m64nNk16 bf16 product with A and B from shared memory (TA, TB: MN-major), float32
// sums; d is overwritten where accumulate is 0. Returns before the product is done.
#define MT_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MT_D16(i) MT_D4(i), MT_D4(i + 4), MT_D4(i + 8), MT_D4(i + 12)
template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
      "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, "
      "%102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, "
      "%119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, %131, %132;\n}\n"
      : MT_D16(0), MT_D16(16), MT_D16(32), MT_D16(48), MT_D16(64), MT_D16(80), MT_D16(96), MT_D16(112)
      : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(TA), "n"(TB));
}

template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n192k16(float (&d)[96], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
      "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
      "}, %96, %97, p, 1, 1, %99, %100;\n}\n"
      : MT_D16(0), MT_D16(16), MT_D16(32), MT_D16(48), MT_D16(64), MT_D16(80)
      : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(TA), "n"(TB));
}

template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n96k16(float (&d)[48], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47"
      "}, %48, %49, p, 1, 1, %51, %52;\n}\n"
      : MT_D16(0), MT_D16(16), MT_D16(32)
      : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(TA), "n"(TB));
}

template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63"
      "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : MT_D16(0), MT_D16(16), MT_D16(32), MT_D16(48)
      : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(TA), "n"(TB));
}
#undef MT_D16
#undef MT_D4

template <int BN, int TA, int TB>
__device__ __forceinline__ void wgmma_bf16(float (&d)[BN / 2], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  if constexpr (BN == 256) {
    wgmma_m64n256k16<TA, TB>(d, a_desc, b_desc, accumulate);
  } else if constexpr (BN == 192) {
    wgmma_m64n192k16<TA, TB>(d, a_desc, b_desc, accumulate);
  } else if constexpr (BN == 128) {
    wgmma_m64n128k16<TA, TB>(d, a_desc, b_desc, accumulate);
  } else {
    wgmma_m64n96k16<TA, TB>(d, a_desc, b_desc, accumulate);
  }
}

// Register dependency on every accumulator after a wait, so that no read of them moves above it.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Columns [64 PIECE, 64 PIECE + 64) of a consumer warpgroup's accumulators into its staging buffer: 64
// rows of 16 chunks of 4 floats, chunk q of row r at chunk q ^ (r % 8), so that a warp's fragment writes
// take 2 wavefronts and its row reads 4 per 512 bytes, no more. base: the thread's row wq * 16 + g and
// its word pair 2 (t % 2); y: its swizzle, ((g ^ t / 2) << 4) (chunk 2 j + t / 2 of the row holds
// columns 8 j + 2 t, + 1).
template <int BN, int PIECE>
__device__ __forceinline__ void stage_piece(const float (&acc)[BN / 2], uint32_t base, uint32_t y) {
  if constexpr (PIECE < (BN + 63) / 64) {
#pragma unroll
    for (int j = 0; j < 8 && 8 * PIECE + j < BN / 8; ++j) {  // a 96-wide tile's second piece: 32 columns
      const int jj = 8 * PIECE + j;  // the accumulators' column block
      const uint32_t at = base + ((32u * j) ^ y);
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(acc[4 * jj]), "f"(acc[4 * jj + 1]) : "memory");
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at + 8 * 256), "f"(acc[4 * jj + 2]), "f"(acc[4 * jj + 3])
                   : "memory");
    }
  }
}

// Rows i = 0, 8, .., 8 (NR - 1) (those below `rows`) of one thread's 4-column run in a staged piece, from the
// staging buffer at src (the thread's first row; rows 8 apart lie 2048 bytes apart and share the
// swizzle), through the epilogue EPI into out (the first row's run at out + first, rows ld elements
// apart, OUT_BF16 or float32), each run one 4-wide access: the loop the common products take, with no
// per-element branches (the epilogue and the dtype are template arguments, the rest uniform flags).
// An accumulating product reads all its rows' old values first, so that the 8 reads wait for memory
// once, not one after another behind the stores (the weight gradients accumulated over the LM head's
// chunks: bf16_notes.md, v6); a backward epilogue reads its pre-activations the same way.
template <int EPI, bool OUT_BF16, int NR>
__device__ __forceinline__ void store_rows(uint32_t src, void* out, void* pre_act, const void* addend, long long first,
                                           long long ld, int rows, const float (&bias)[4]) {
  constexpr bool kBack = EPI == kGeluBack || EPI == kReluBack || EPI == kScaleBack;
  const bool accumulate = addend != nullptr;
  float old[NR][4];  // the addend's values (accumulate) or the pre-activations (kBack)
  if (accumulate || kBack) {
#pragma unroll
    for (int i = 0; i < NR; ++i) {
      if (8 * i < rows) load_vec<4>(kBack ? pre_act : addend, first + 8 * i * ld, OUT_BF16, old[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    if (8 * i >= rows) break;
    float x[4];
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3])
                 : "r"(src + 2048 * i)
                 : "memory");
    const long long at = first + 8 * i * ld;
    if constexpr (kBack) {
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] = activation_grad(EPI, old[i][j], x[j]);
    } else if constexpr (EPI != kNone) {
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] += bias[j];
    }
    if constexpr (EPI == kBiasGelu || EPI == kBiasRelu) {
      if (pre_act != nullptr) store_vec<4>(pre_act, at, x, OUT_BF16);
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] = EPI == kBiasGelu ? gelu(x[j]) : fmaxf(x[j], 0.f);
    } else if constexpr (EPI == kBiasGeluD) {  // the gate once for both outputs
      float d[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float g = gelu_gate(x[j]);
        d[j] = gelu_derivative(x[j], g);
        x[j] *= g;
      }
      if (pre_act != nullptr) store_vec<4>(pre_act, at, d, OUT_BF16);
    } else if constexpr (EPI == kBiasReluD) {
      float d[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        d[j] = kept_value(EPI, x[j]);
        x[j] = fmaxf(x[j], 0.f);
      }
      if (pre_act != nullptr) store_vec<4>(pre_act, at, d, OUT_BF16);
    }
    if (accumulate && !kBack) {
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] += old[i][j];
    }
    store_vec<4>(out, at, x, OUT_BF16);
  }
}

template <int EPI, int NR>
__device__ __forceinline__ void store_rows_dtype(const Params& p, uint32_t src, long long first, int rows,
                                                 const float (&bias)[4]) {
  if (p.out_bf16) {
    store_rows<EPI, true, NR>(src, p.out, p.pre_act, p.accumulate ? p.addend : nullptr, first, p.ldc, rows, bias);
  } else {
    store_rows<EPI, false, NR>(src, p.out, p.pre_act, p.accumulate ? p.addend : nullptr, first, p.ldc, rows, bias);
  }
}

// A backward epilogue reads its tile's pre-activations, an accumulating one its addend (`from`, laid
// out as out: the warpgroup's 64 rows from row0, BN columns from col0), only after the products: asking
// L2 for them as the tile starts takes their memory latency out of the epilogue, where the tensor cores
// wait. One prefetch per 128-byte line, the warpgroup's threads taking turns.
template <int BN>
__device__ __forceinline__ void prefetch_tile(const Params& p, const void* from, int bi, int row0, int col0) {
  const int bytes = p.out_bf16 ? 2 : 4;
  const int per_row = (BN * bytes + 127) / 128;
  for (int i = threadIdx.x % 128; i < 64 * per_row; i += 128) {
    const int r = row0 + i / per_row, c = col0 + (i % per_row) * (128 / bytes);
    if (r < p.M && c < p.N) {
      const long long at = ((static_cast<long long>(bi) * p.M + r) * p.ldc + c) * bytes;
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(static_cast<const char*>(from) + at));
    }
  }
}

// The epilogue of one consumer warpgroup's 64 rows (kernel rows row0.., columns col0.. of batch matrix
// bi), 64 columns at a time through the staging buffer at `stage` (all 64 rows at once, or with
// STAGE_ROWS 32 the first two warps' rows, then the last two's); barrier bar_id is the warpgroup's.
// Thread k of the warpgroup takes the 4-column run k % 16 of the staged rows k / 16 + 8 i: through
// store_rows where the run is whole and 4-wide accesses fit the layout, else store_run per row. Only the
// staging is unrolled over the accumulators (their indices must be constants). wq: the warp in the
// warpgroup; g, t: lane / 4, lane % 4.
template <int BN, int STAGE_ROWS, bool EPILOGUES>
__device__ __forceinline__ void store_tile(const Params& p, const float (&acc)[BN / 2], uint32_t stage, int bar_id,
                                           int split, int bi, int row0, int col0, int wq, int g, int t) {
  constexpr int NR = STAGE_ROWS / 8;  // a thread's rows per staged part
  constexpr int kWarpsPerPart = STAGE_ROWS / 16;
  const int part_of_warp = wq / kWarpsPerPart;
  const uint32_t base = stage + (wq % kWarpsPerPart * 16 + g) * 256 + 8 * (t & 1), y = ((g ^ (t >> 1)) & 7) << 4;
  const int q = threadIdx.x % 16, rr = threadIdx.x % 128 / 16;
  const uint32_t src = stage + rr * 256 + ((q ^ rr) << 4);
  const bool partials = p.partials != nullptr;
  const bool whole_runs = partials ? p.N % 4 == 0 : p.vec4;
#pragma unroll 1
  for (int piece = 0; piece < (BN + 63) / 64; ++piece) {
#pragma unroll 1
    for (int part = 0; part < 64 / STAGE_ROWS; ++part) {
      warpgroup_sync(bar_id);  // the previous part has been read
      if (part_of_warp == part) {
        switch (piece) {
          case 0: stage_piece<BN, 0>(acc, base, y); break;
          case 1: stage_piece<BN, 1>(acc, base, y); break;
          case 2: stage_piece<BN, 2>(acc, base, y); break;
          default: stage_piece<BN, 3>(acc, base, y); break;
        }
      }
      warpgroup_sync(bar_id);
      const int c = col0 + 64 * piece + 4 * q, r0 = row0 + part * STAGE_ROWS + rr;
      const int rows = p.M - r0;  // the thread's rows r0 + 8 i below M: 8 i < rows
      if (c >= p.N || c >= col0 + BN || rows <= 0) continue;
      const long long row = static_cast<long long>(bi) * p.M + r0;
      if (c + 4 <= p.N && whole_runs) {
        float bias[4] = {0.f, 0.f, 0.f, 0.f};
        if (partials) {
          store_rows<kNone, false, NR>(src, p.partials + split * p.split_stride, nullptr, nullptr, row * p.N + c, p.N,
                                       rows, bias);
          continue;
        }
        const long long first = row * p.ldc + c;
        if constexpr (!EPILOGUES) {
          store_rows_dtype<kNone, NR>(p, src, first, rows, bias);
          continue;
        }
        if (p.epilogue != kNone && !backward_epilogue(p.epilogue) && p.bias != nullptr) {
          load_vec<4>(p.bias, c, p.out_bf16 != 0, bias);
        }
        switch (p.epilogue) {
          case kNone: store_rows_dtype<kNone, NR>(p, src, first, rows, bias); break;
          case kBias: store_rows_dtype<kBias, NR>(p, src, first, rows, bias); break;
          case kBiasGelu: store_rows_dtype<kBiasGelu, NR>(p, src, first, rows, bias); break;
          case kBiasRelu: store_rows_dtype<kBiasRelu, NR>(p, src, first, rows, bias); break;
          case kGeluBack: store_rows_dtype<kGeluBack, NR>(p, src, first, rows, bias); break;
          case kReluBack: store_rows_dtype<kReluBack, NR>(p, src, first, rows, bias); break;
          case kBiasGeluD: store_rows_dtype<kBiasGeluD, NR>(p, src, first, rows, bias); break;
          case kBiasReluD: store_rows_dtype<kBiasReluD, NR>(p, src, first, rows, bias); break;
          default: store_rows_dtype<kScaleBack, NR>(p, src, first, rows, bias); break;
        }
        continue;
      }
#pragma unroll 1
      for (int i = 0; 8 * i < rows && i < NR; ++i) {
        float x[4];
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3])
                     : "r"(src + 2048 * i)
                     : "memory");
        store_run<4>(p, split, bi, r0 + 8 * i, c, x, min(4, p.N - c));
      }
    }
  }
}

// A ring slot and the parity of its current use, stepped once a K tile by the producer and by each
// consumer in the same order: no division by the stage count in the K loops. The consumers' loop issues
// the products, and `(it - 1) % S` between them cost GPT-2's fc weight gradient 31.4-31.9 us against
// 29.9-31.0 without it on an H100 (bf16_notes.md, fifteenth session). The ring's barriers lie 8 bytes
// apart from bars: slot s's `full` (its tiles have landed) at s, its `empty` (its products are done) at S + s.
template <int S>
struct RingPos {
  static __device__ __forceinline__ uint32_t full(uint32_t bars, int s) { return bars + 8 * s; }
  static __device__ __forceinline__ uint32_t empty(uint32_t bars, int s) { return bars + 8 * (S + s); }
  // Every slot's barriers, by one thread: `full` takes the producer's arrival (and the slot's bytes),
  // `empty` `releases` arrivals; then made visible to the TMA units.
  static __device__ __forceinline__ void init(uint32_t bars, int releases) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full(bars, s), 1);
      mbar_init(empty(bars, s), releases);
    }
    fence_barrier_init();
  }
  int slot = 0, phase = 0;
  __device__ __forceinline__ void step() {
    if (++slot == S) {
      slot = 0;
      phase ^= 1;
    }
  }
};

// A consumer warp's release of a ring slot whose products are done: one arrival on the slot's `empty`
// barrier, from lane 0.
struct LocalRelease {
  bool arrives;  // lane 0
  __device__ __forceinline__ void operator()(uint32_t empty) const {
    if (arrives) mbar_arrive(empty);
  }
};

// One unit's k_tiles K tiles for a consumer warpgroup whose RB row blocks of 64 start a_at bytes into a
// slot (8 KB apart) and whose B tile starts b_at bytes into it: per K tile, wait for the slot's `full`
// barrier, four k16 steps of RB wgmma.m64nBNk16 on it (acc[i]: row block i), and release the slot before
// it (each warp: release(its `empty` barrier), a LocalRelease, or bf16_cluster.cuh's release in every
// block that loads into it) once that slot's products are done. bars: the ring's barriers (RingPos).
// KEEP_LAST: the last K tile's slot is not released but returned (its `empty` barrier), for the caller to
// stage its epilogue in and release after (k_tiles >= 1); else the return value is of no use.
template <bool A_KMAJOR, bool B_KMAJOR, int BN, int S, int SLOT_BYTES, bool KEEP_LAST = false, int RB, class Release>
__device__ __forceinline__ uint32_t consume_k_tiles(float (&acc)[RB][BN / 2], uint32_t a_at, uint32_t b_at,
                                                    uint32_t base, uint32_t bars, int k_tiles, RingPos<S>& pos,
                                                    const Release& release) {
  uint32_t held = 0;  // the `empty` barrier of the slot whose products are in flight
  for (int kt = 0; kt < k_tiles; ++kt, pos.step()) {
    mbar_wait(RingPos<S>::full(bars, pos.slot), pos.phase);
    const uint32_t slot = base + pos.slot * SLOT_BYTES;
    const uint64_t a_desc = tile_desc<A_KMAJOR>(slot + a_at);
    const uint64_t b_desc = tile_desc<B_KMAJOR>(slot + b_at);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int j = 0; j < kTmaBK / 16; ++j) {
#pragma unroll
      for (int i = 0; i < RB; ++i) {
        wgmma_bf16<BN, !A_KMAJOR, !B_KMAJOR>(acc[i], a_desc + j * kDescStep<A_KMAJOR> + i * (kTmaBoxBytes >> 4),
                                             b_desc + j * kDescStep<B_KMAJOR>, kt > 0 || j > 0);
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    if (kt > 0) release(held);  // the previous K tile's products are done
    held = RingPos<S>::empty(bars, pos.slot);
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
  for (int i = 0; i < RB; ++i) fence_registers(acc[i]);
  if (!KEEP_LAST) release(held);
  return held;
}

// What the epilogue will read beside the products, which prefetch_tile asks L2 for as a tile starts:
// the pre-activations, or an addend that is not out itself (a residual; an accumulation into out keeps
// v6's batched reads: the LM head's float32 weight-gradient chunks ran 253 -> 262 us with this prefetch).
__device__ __forceinline__ const void* epilogue_reads(const Params& p) {
  return p.partials != nullptr                 ? nullptr
         : backward_epilogue(p.epilogue)       ? p.pre_act
         : p.accumulate && p.addend != p.out ? p.addend
                                               : nullptr;
}

// The epilogue of a consumer warpgroup's 64 rows of unit w from row0, BN columns from col0, through its
// staging at `stage` and its barrier bar_id: acc[4 j], acc[4 j + 1] are row wq * 16 + g of the 64, columns
// 8 j + 2 t, + 1; acc[4 j + 2], acc[4 j + 3] the same columns 8 rows further. KIND: the kernel instance's
// EpilogueKind; with the TMA stores, tp.store kStoreTma, or kStoreTransposed where TRANSPOSABLE (the tiles a
// transposed product runs on: launch_tma transposes only onto 128- and 192-row tiles).
template <int KIND, bool TRANSPOSABLE, int BN, int STAGE_BYTES, int STAGE_ROWS>
__device__ __forceinline__ void store_unit(const TmaParams& tp, const float (&acc)[BN / 2], const CUtensorMap& out_map,
                                           uint32_t stage, int bar_id, const Unit& w, int row0, int col0, int wq, int g,
                                           int t, int& box) {
  const Params& p = tp.p;
  if constexpr (KIND != kTmaStores) {
    store_tile<BN, STAGE_ROWS, KIND == kStagedAny>(p, acc, stage, bar_id, w.split, w.bi, row0, col0, wq, g, t);
  } else if (TRANSPOSABLE && tp.store == kStoreTransposed) {
    store_tile_tma_t<BN, STAGE_BYTES>(p, acc, out_map, stage, bar_id, w.bi, row0, col0, wq, box);
  } else {
    store_tile_tma<BN, STAGE_BYTES>(p, acc, out_map, stage, bar_id, w.bi, row0, col0, wq, t, box);
  }
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MT_BF16_TMA_THREADS(BM) (128 * ((BM) / 64 + 1))
#else
#define MT_BF16_TMA_THREADS(BM) 1
#endif

// The body exists only where the sm_90a instructions were compiled. Elsewhere the kernel declares a
// 1-thread limit, which the host reads (cudaFuncGetAttributes) to know whether it can launch it.
template <bool A_KMAJOR, bool B_KMAJOR, int BM, int BN, int KIND>
__global__ void __launch_bounds__(MT_BF16_TMA_THREADS(BM), 1)
    matmul_bf16_tma_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                           const __grid_constant__ CUtensorMap out_map, const TmaParams tp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(BN % 64 == 0, "B in 64-row boxes: the 96-wide tiles run on bf16_cluster.cuh's kernel");
  using Cfg = TmaConfig<BM, BN>;
  constexpr int S = Cfg::kStages;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = mt::shared_address(smem_raw);
  const uint32_t base = (raw_addr + 1023) & ~1023u;
  const uint32_t staging = base + S * Cfg::kSlotBytes;  // one Cfg::kStageBytes buffer per consumer warpgroup
  const uint32_t bars = staging + Cfg::kConsumers * Cfg::kStageBytes;
  using Ring = RingPos<S>;
  const Params& p = tp.p;
  const int units = p.batch * p.splits * p.tiles_m * p.tiles_n;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  if (threadIdx.x == 0) {
    Ring::init(bars, 4 * Cfg::kConsumers);  // every consumer warp releases
    prefetch_tensormap(a_map);
    prefetch_tensormap(b_map);
    if (KIND == kTmaStores) prefetch_tensormap(out_map);
  }
  __syncthreads();
  mt::join_prior_grids();  // launched as dependent: set up while the kernel before ends

  if (warp < 4) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (threadIdx.x != 0) return;
    Ring pos;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const Unit w = unit_of(p, u, BM, BN);
      const int ba = tp.a_batched ? w.bi : 0, bb = tp.b_batched ? w.bi : 0;
      for (int kt = 0; kt < w.k_tiles; ++kt, pos.step()) {
        const int s = pos.slot, k0 = (w.kt0 + kt) * kTmaBK;
        const uint32_t full = Ring::full(bars, s);
        mbar_wait(Ring::empty(bars, s), pos.phase ^ 1);
        mbar_expect_tx(full, Cfg::kSlotBytes);
        const uint32_t slot = base + s * Cfg::kSlotBytes;
        load_operand_tile<A_KMAJOR, BM, 64>(slot, a_map, full, k0, w.row0, ba, kTmaBoxBytes);
        load_operand_tile<B_KMAJOR, BN, 64>(slot + Cfg::kABytes, b_map, full, k0, w.col0, bb, kTmaBoxBytes);
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Cfg::kConsumerRegs));
  // The warpgroup index broadcast from lane 0, which ptxas then knows to be warp-uniform: the A tiles'
  // descriptors stay in uniform registers instead of being moved there (R2UR) before every product.
  const int cw = __shfl_sync(0xffffffffu, warp / 4, 0) - 1, wq = warp % 4, g = lane / 4, t = lane % 4;
  float acc[1][BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[0][i] = 0.f;
  Ring pos;
  int box = 0;
  const void* prefetch = epilogue_reads(p);
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_of(p, u, BM, BN);
    if (prefetch != nullptr) prefetch_tile<BN>(p, prefetch, w.bi, w.row0 + cw * 64, w.col0);
    consume_k_tiles<A_KMAJOR, B_KMAJOR, BN, S, Cfg::kSlotBytes>(acc, cw * kTmaBoxBytes, Cfg::kABytes, base, bars,
                                                              w.k_tiles, pos, LocalRelease{lane == 0});
    store_unit<KIND, BM >= 128, BN, Cfg::kStageBytes, Cfg::kStageRows>(
        tp, acc[0], out_map, staging + cw * Cfg::kStageBytes, 1 + cw, w, w.row0 + cw * 64, w.col0, wq, g, t, box);
  }
  if (KIND == kTmaStores && threadIdx.x % 128 == 0) tma::bulk_wait_all();  // the staging outlives its stores
#endif
}

}  // namespace bf16mm
