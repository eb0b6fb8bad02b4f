"""The GPU timer of the benchmarks and kernel tests: median GPU milliseconds per call, from CUDA events.

Each timed batch of back-to-back calls is queued behind a spin kernel that lasts longer than the
queueing itself, so the events around the batch see the GPU work back to back and no Python or
launch overhead (as long as the GPU, not the host, is the bottleneck of a call).  Needs torch with
a CUDA device; it is imported on first use.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, List, Optional

_spin_cycles_per_ms: List[float] = []  # torch.cuda._sleep cycles per millisecond, measured once


def _spin_rate(torch: Any) -> float:
    if not _spin_cycles_per_ms:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(20_000_000)
        end.record()
        end.synchronize()
        _spin_cycles_per_ms.append(20_000_000 / start.elapsed_time(end))
    return _spin_cycles_per_ms[0]


def gpu_ms(
    fn: Callable[[], Any], warmup: int = 3, reps: int = 7, inner: Optional[int] = None, batch_ms: float = 3.0,
    max_inner: int = 200,
) -> float:  # fmt: skip
    """Median GPU milliseconds per call of fn() on the current CUDA stream.

    After `warmup` untimed calls, each of `reps` repetitions times `inner` back-to-back calls with
    CUDA events (queued behind a spin kernel, see the module doc) and divides by `inner`; the median
    over the repetitions is returned.  inner=None takes as many calls as last about `batch_ms`
    (from one timed call; at least 1, at most `max_inner`).  fn must not wait on the GPU itself.
    """
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if inner is None:
        start.record()
        fn()
        end.record()
        end.synchronize()
        inner = int(min(max_inner, max(1, math.ceil(batch_ms / max(start.elapsed_time(end), 1e-3)))))
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    enqueue_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    # The spin must outlast queueing a batch, so the first timed call starts after the last is queued.
    spin_cycles = int((2.0 * enqueue_ms + 1.0) * _spin_rate(torch))
    times = []
    for _ in range(reps):
        torch.cuda._sleep(spin_cycles)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)
