"""The fused-vs-unfused speed line each fused-kernel test file prints (visible with pytest -s)."""

from typing import Any, Callable


def gpu_ms(fn: Callable[[], Any], iters: int = 20) -> float:
    """Mean GPU milliseconds per call of fn over `iters` back-to-back calls after 3 warm-up calls."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def print_speedup(label: str, fused: Callable[[], Any], unfused: Callable[[], Any]) -> None:
    """Time the fused op and minitorch's composed version of it on the same input; print the ratio."""
    fused_ms, unfused_ms = gpu_ms(fused), gpu_ms(unfused)
    print(f"{label}: fused {fused_ms * 1e3:8.1f} us, unfused {unfused_ms * 1e3:9.1f} us, "
          f"speedup {unfused_ms / fused_ms:6.1f}x")
