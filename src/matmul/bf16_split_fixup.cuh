// K splits added inside the Hopper kernel (bf16_wgmma.cuh) instead of by split_k_reduce, for a split
// product of 128 x 128 tiles whose units all run at once (one wave, a unit a block): each consumer
// warpgroup writes its float32 sums to the workspace straight from its registers (float4 i of thread k
// at float4 128 i + k of its slot, so that a warp's 16-byte writes and reads are 512 contiguous bytes),
// then takes a ticket for its 64 rows of the tile. The warpgroup that takes the last ticket copies the
// other splits' sums into its half of the drained ring (cp.async, all in flight at once), adds every
// split's in split order (0 + s0 + s1 + ...: split_k_reduce's order, so the same bits whichever split
// comes last), its own from its registers, and runs the tile's epilogue; the others are done. No pass
// over the partial sums and no second launch: on GPT-2's attention projection weight gradient (768 x
// 768 x 4096, 3 splits) that pass took 4.7 us of 17.3 on an H100, the kernel 10.8 without its sums.
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
#include "../includes/ptx.cuh"

namespace bf16mm {

constexpr int kTicketSlots = 16, kTicketsPerSlot = 512;

__device__ unsigned g_split_tickets[kTicketSlots * kTicketsPerSlot];

// The tiles whose kernel adds its K splits: two consumer warpgroups, and ring enough for the other
// splits' sums.
__host__ __device__ constexpr bool adds_splits(int bm, int bn) { return bm == 128 && bn == 128; }

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

// Where a split product's sums go: `sums` (the workspace) holds a slot of 64 x BN floats per split,
// tile and consumer warpgroup, at ((split * tiles + tile) * 2 + cw) slots; tickets: the stream's set.
struct SplitSums {
  float* sums;
  unsigned* tickets;
};

// One consumer warpgroup's part of a tile split `splits` ways (split `split`, tile index `tile` of
// `tiles`): its sums acc go to its slot; whether it took the tile's last ticket, and if so acc holds the
// sum of every split's, in split order. landing: the warpgroup's (splits - 1) x 64 x BN floats of
// drained ring.
template <int BN>
__device__ __forceinline__ bool add_splits(float (&acc)[BN / 2], const SplitSums& f, int splits, int split, int tiles,
                                           int tile, int cw, float* landing, int bar_id) {
  constexpr int kSlot = 64 * BN / 4;  // float4s
  const int k = threadIdx.x % 128;
  const long long split_stride = static_cast<long long>(tiles) * 2 * kSlot;
  float4* first = reinterpret_cast<float4*>(f.sums) + (static_cast<long long>(tile) * 2 + cw) * kSlot;
  float4* mine = first + split * split_stride;
#pragma unroll
  for (int i = 0; i < BN / 8; ++i) {
    __stcg(mine + 128 * i + k, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
  }
  __threadfence();  // the sums are visible before the ticket that says so
  warpgroup_sync(bar_id);
  bool last = false;
  if (k == 0) {
    unsigned* ticket = f.tickets + tile * 2 + cw;
    last = atomicAdd(ticket, 1u) == static_cast<unsigned>(splits - 1);
    if (last) atomicExch(ticket, 0u);  // every split has arrived: ready for the next launch
  }
  if (!warpgroup_any(bar_id, last)) return false;
  __threadfence();
  for (int s = 0, j = 0; s < splits; ++s) {  // each thread copies, and later reads, its own float4s
    if (s == split) continue;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
      mt::cp_async_16(landing + 4 * (j * kSlot + 128 * i + k),
                      reinterpret_cast<const float*>(first + s * split_stride + 128 * i + k), true);
    }
    ++j;
  }
  mt::cp_async_commit();
  mt::cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < BN / 8; ++i) {
    float x[4] = {0.f, 0.f, 0.f, 0.f};
    for (int s = 0, j = 0; s < splits; ++s) {
      if (s == split) {
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] += acc[4 * i + e];
        continue;
      }
      const float4 v = *reinterpret_cast<const float4*>(landing + 4 * (j * kSlot + 128 * i + k));
      x[0] += v.x, x[1] += v.y, x[2] += v.z, x[3] += v.w;
      ++j;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[4 * i + e] = x[e];
  }
  return true;
}

// The ticket set of `stream` on the current device, or nullptr where every set is taken by other streams.
inline unsigned* stream_tickets(cudaStream_t stream) {
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
