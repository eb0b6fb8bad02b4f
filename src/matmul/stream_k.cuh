// Stream-K (Osama et al., 2023) for the persistent TMA kernels, float32 (tma_kernel.cuh) and bf16
// (bf16_wgmma.cuh): after the data-parallel units [0, dp_units) (output tiles, or (tile, K split) pairs;
// block c takes units c, c + grid, ...), the K tiles of tiles [dp_units, tiles) are dealt out in equal
// contiguous shares, one per block, so that every block gets the same number of K tiles however the
// tiles divide into waves. A tile shared by several blocks is finished by the block holding its first K
// tiles (its share's last segment); the later ones (each the first segment of its block's share, done
// first) leave their partial sums in the workspace and raise a flag. The walk serves any parameters with
// the work fields (tiles_m, tiles_n, k_tiles, splits, k_tiles_per_split, dp_units, sk_iters); the
// exchange, tiles of kSkRows rows in two consumer warpgroups.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

namespace tma {

constexpr int kSkRows = 128;  // rows of a tile stream-K shares

// Stream-K's exchange of partial tiles: block c's at partials + c * kSkRows * BN floats, in its consumers'
// register order (consumer thread ct of 256: float4 j of its BN / 2 sums at float4 256 j + ct);
// flags[8 c + w] = token once consumer warp w of block c wrote its part.
struct SkExchange {
  float* partials;
  unsigned long long* flags;
  unsigned long long token;  // this launch's flag value (see launch_token)
};

// A block's piece of one tile: K tiles [kt0, kt0 + k_tiles), of K split `split`. kWhole: all of the
// tile's (or split's) K tiles; kHead: the first ones, and the block finishes the tile with the later
// blocks' parts; kTail: a later part, left in partials.
enum Role { kWhole, kHead, kTail };
struct Segment {
  int tile, split, kt0, k_tiles, role;
};

// First stream-K K tile of block c (c = gridDim.x: the end).
template <class P>
__device__ __forceinline__ long long sk_begin(const P& tp, int c) {
  return static_cast<long long>(c) * tp.sk_iters / gridDim.x;
}

// The block whose stream-K share holds K tile i: the largest c with sk_begin(c) <= i.
template <class P>
__device__ __forceinline__ int sk_block(const P& tp, long long i) {
  return static_cast<int>(((i + 1) * gridDim.x + tp.sk_iters - 1) / tp.sk_iters - 1);
}

// A block's walk over its work, in order: its data-parallel units, then its stream-K share (at most a
// kTail first and a kHead last). The producer, transform and consumer warps all walk it:
//   for (Walk wk = walk_start(tp); next_segment(tp, wk, sg);) ...
struct Walk {
  int u;             // the next data-parallel unit
  long long i, end;  // the stream-K K tiles left
};

template <class P>
__device__ __forceinline__ Walk walk_start(const P& tp) {
  return Walk{static_cast<int>(blockIdx.x), sk_begin(tp, blockIdx.x), sk_begin(tp, blockIdx.x + 1)};
}

template <class P>
__device__ __forceinline__ bool next_segment(const P& tp, Walk& wk, Segment& sg) {
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

// A kTail's part of a tile in the 128 x BN tiles of two consumer warpgroups: consumer thread ct's sums
// into its block's partial tile, then its warp's (cwarp) flag raised.
template <int BN>
__device__ __forceinline__ void leave_part(const SkExchange& sk, const float (&acc)[BN / 2], int ct, int cwarp,
                                           int lane) {
  float4* mine = reinterpret_cast<float4*>(sk.partials) + static_cast<long long>(blockIdx.x) * (kSkRows * BN / 4) + ct;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    __stcg(mine + 256 * j, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
  }
  __threadfence();
  __syncwarp();
  if (lane == 0) atomicExch(sk.flags + 8 * blockIdx.x + cwarp, sk.token);
}

// A kHead's sums (segment sg) plus the parts the later blocks sharing its tile left (leave_part), in
// block order, each once its warp's flag is raised, which the head then clears: a launch leaves every
// flag it raised at 0.
template <int BN, class P>
__device__ __forceinline__ void add_parts(const P& tp, const SkExchange& sk, const Segment& sg, float (&acc)[BN / 2],
                                          int ct, int cwarp, int lane) {
  const long long first = static_cast<long long>(sg.tile - tp.dp_units) * tp.k_tiles;
  const int last = sk_block(tp, first + tp.k_tiles - 1);
  const float4* parts = reinterpret_cast<const float4*>(sk.partials) + ct;
  for (int c = blockIdx.x + 1; c <= last; ++c) {
    if (lane == 0) {
      unsigned long long* flag = sk.flags + 8 * c + cwarp;
      unsigned long long raised = 0;
      do {
        asm volatile("ld.acquire.gpu.global.b64 %0, [%1];\n" : "=l"(raised) : "l"(flag) : "memory");
      } while (raised != sk.token);
      *flag = 0;
    }
    __syncwarp();
    const float4* theirs = parts + static_cast<long long>(c) * (kSkRows * BN / 4);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const float4 v = __ldcg(theirs + 256 * j);
      acc[4 * j] += v.x, acc[4 * j + 1] += v.y, acc[4 * j + 2] += v.z, acc[4 * j + 3] += v.w;
    }
  }
}

// Stream-K's workspace: a partial tile (up to 128 x 256) per block, then 8 flags (64-bit) per block.
constexpr long long kPartialFloats = kSkRows * 256;
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

}  // namespace tma
