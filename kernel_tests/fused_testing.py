"""Helpers shared by the GPU kernel tests: the error measure, cached kernel libraries, and the
fused-vs-unfused speed line each fused-kernel test file prints (visible with pytest -s)."""

from typing import Any, Callable

import numpy as np

from minitorch.cuda.libraries import kernel_library

# A kernel library by name (built from src/<name>.cu), loaded once per process by the runtime.
kernel_lib = kernel_library


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """max|out - ref| / max|ref|; infinite when out has a nan or inf."""
    out = np.asarray(out, dtype=np.float64)
    if not np.isfinite(out).all():
        return float("inf")
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-30)
    return float(np.abs(out - ref).max(initial=0.0)) / scale


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
