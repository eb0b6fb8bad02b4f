// K splits added inside the Hopper kernel (bf16_wgmma.cuh) instead of by split_k_reduce: where a split
// product's units all run at once (one wave) on tiles of 128 rows, each consumer warpgroup writes its
// float32 sums to the workspace straight from its registers (in their own order: float4 i of thread k at
// float4 128 i + k of the warpgroup's slot, so that a warp's 16-byte writes and reads are 512
// contiguous bytes), then takes a ticket for its 64 rows of the tile. The warpgroup that takes the last
// ticket adds every split's sums in split order (0 + s0 + s1 + ...: the same bits as split_k_reduce,
// whichever split comes last), its own from its registers, and runs the tile's epilogue; the others are
// done. No pass over the partial sums, no second launch.
//
// Tickets count to the split count and the last one sets its counter back to 0, so they stay zero
// between launches without a clear: they live in this library's own device memory, a set of them per
// stream (a launch and the next on one stream never overlap: a dependent launch waits for the kernel
// before it before it touches memory), for the first kTicketSlots streams of a process; a product on
// a further stream, or with more tiles than a set holds, has its splits added by split_k_reduce.
#pragma once

#include <cuda_runtime.h>

#include <mutex>

#include "../includes/device_info.cuh"

namespace bf16mm {

constexpr int kTicketSlots = 16, kTicketsPerSlot = 512;

// The tiles whose kernel adds its K splits: two consumer warpgroups, and registers for the sums beside
// the accumulators (with 192 or 256 columns the kernel spilled).
__host__ __device__ constexpr bool adds_splits(int bm, int bn) { return bm == 128 && bn == 128; }

__device__ unsigned g_split_tickets[kTicketSlots * kTicketsPerSlot];

// Barrier of one consumer warpgroup (128 threads; ids 1.., 0 being __syncthreads).
__device__ __forceinline__ void warpgroup_sync(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }

// Barrier of one warpgroup that returns to every thread whether any of them passed `pred`.
__device__ __forceinline__ bool warpgroup_any(int id, bool pred) {
  uint32_t any = 0;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, 128, p;\n selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred)), "r"(id)
      : "memory");
  return any != 0;
}

// One consumer warpgroup's part of a tile split `splits` ways (split `split`): its sums acc go to its
// slot of `fix` (slot index: (split * tiles + tile) * consumers + cw, 64 x BN floats each); whether it
// took the tile's last ticket, and if so acc holds the sum of every split's, in split order. G: the
// float4s a thread reads at once per split (registers: acc, the running sums and the reads).
template <int BN, int G>
__device__ __forceinline__ bool add_splits(float (&acc)[BN / 2], float* fix, unsigned* tickets, int splits, int split,
                                           int tiles, int tile, int consumers, int cw, int bar_id) {
  static_assert((BN / 8) % G == 0, "whole groups of float4s");
  const int k = threadIdx.x % 128;
  const long long slot_floats = 64LL * BN;
  float4* mine = reinterpret_cast<float4*>(fix + ((static_cast<long long>(split) * tiles + tile) * consumers + cw) *
                                                     slot_floats);
#pragma unroll
  for (int i = 0; i < BN / 8; ++i) {
    __stcg(mine + 128 * i + k, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
  }
  __threadfence();  // the sums are visible before the ticket that says so
  warpgroup_sync(bar_id);
  bool last = false;
  if (k == 0) {
    unsigned* ticket = tickets + tile * consumers + cw;
    last = atomicAdd(ticket, 1u) == static_cast<unsigned>(splits - 1);
    if (last) atomicExch(ticket, 0u);  // every split has arrived: ready for the next launch
  }
  if (!warpgroup_any(bar_id, last)) return false;
  __threadfence();
  const long long split_floats = static_cast<long long>(tiles) * consumers * slot_floats;
  const float4* first = reinterpret_cast<const float4*>(fix + (static_cast<long long>(tile) * consumers + cw) *
                                                                  slot_floats);
#pragma unroll
  for (int i0 = 0; i0 < BN / 8; i0 += G) {
    float x[4 * G];
#pragma unroll
    for (int i = 0; i < 4 * G; ++i) x[i] = 0.f;
    for (int s = 0; s < splits; ++s) {
      if (s == split) {
#pragma unroll
        for (int i = 0; i < 4 * G; ++i) x[i] += acc[4 * i0 + i];
        continue;
      }
      const float4* from = first + s * (split_floats / 4);
      float4 v[G];
#pragma unroll
      for (int i = 0; i < G; ++i) v[i] = __ldcg(from + 128 * (i0 + i) + k);
#pragma unroll
      for (int i = 0; i < G; ++i) {
        x[4 * i] += v[i].x, x[4 * i + 1] += v[i].y, x[4 * i + 2] += v[i].z, x[4 * i + 3] += v[i].w;
      }
    }
#pragma unroll
    for (int i = 0; i < 4 * G; ++i) acc[4 * i0 + i] = x[i];
  }
  return true;
}

// The ticket set of `stream` on the current device, or nullptr where every set is taken by other streams.
inline unsigned* split_tickets(cudaStream_t stream) {
  struct Owner {
    int device;
    cudaStream_t stream;
  };
  static std::mutex mutex;
  static Owner owners[kTicketSlots];
  static int taken = 0;
  static void* bases[mt::kMaxDevicesCached] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= mt::kMaxDevicesCached) return nullptr;
  const std::lock_guard<std::mutex> lock(mutex);
  if (bases[device] == nullptr && cudaGetSymbolAddress(&bases[device], g_split_tickets) != cudaSuccess) {
    cudaGetLastError();
    bases[device] = nullptr;
    return nullptr;
  }
  int slot = 0;
  while (slot < taken && (owners[slot].device != device || owners[slot].stream != stream)) ++slot;
  if (slot == taken) {
    if (taken == kTicketSlots) return nullptr;
    owners[taken++] = Owner{device, stream};
  }
  return static_cast<unsigned*>(bases[device]) + slot * kTicketsPerSlot;
}

}  // namespace bf16mm
