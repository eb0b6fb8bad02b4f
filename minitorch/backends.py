"""Choosing a backend by name, saying why, and the peak memory a backend's tensors held.

"auto" picks the CUDA backend where it can run (torch with a CUDA GPU, and every kernel library
built and up to date) and the numba CPU backend otherwise; "cuda" insists on CUDA and raises a
ValueError naming the reason and the fix where it cannot run; "cpu" is the CPU backend.

    choice = minitorch.choose_backend("auto")
    print(choice)                      # backend cpu (auto: CUDA unavailable: ...)
    model = minitorch.DecoderLM(..., backend=choice.backend)
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any, Dict, Optional

from .cuda.libraries import LIBRARIES, kernel_library
from .cuda.runtime import unavailable_reason
from .cuda_kernel_ops import CudaKernelOps, cuda_memory_stats
from .fast_ops import FastOps
from .tensor_ops import TensorBackend

BACKEND_NAMES = ("auto", "cuda", "cpu")


@dataclass(frozen=True)
class BackendChoice:
    """What choose_backend picked: the backend, its name ("cuda" or "cpu") and why it was picked."""

    backend: TensorBackend
    name: str
    reason: str

    def __str__(self) -> str:
        return f"backend {self.name} ({self.reason})"


def cuda_unavailable_reason() -> Optional[str]:
    """Why the CUDA backend cannot run here (no torch, no CUDA GPU, a kernel library missing or out
    of date: the message names the fix), or None when it can; loads every kernel library on success."""
    reason = unavailable_reason()
    if reason is not None:
        return reason
    try:
        for name in LIBRARIES:
            kernel_library(name)
    except RuntimeError as err:
        return str(err)
    return None


def choose_backend(name: str = "auto") -> BackendChoice:
    """The backend called `name`: "auto" (CUDA where it can run, else the CPU), "cuda" or "cpu".

    Raises ValueError for another name, and for "cuda" where it cannot run (with the reason and the
    fix: build the kernels, or choose "cpu" or "auto")."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}: expected one of {', '.join(map(repr, BACKEND_NAMES))}")
    if name == "cpu":
        return BackendChoice(TensorBackend(FastOps), "cpu", "requested: numba FastOps")
    reason = cuda_unavailable_reason()
    if reason is None:
        why = "requested" if name == "cuda" else "auto: a CUDA GPU and the built kernels are present"
        return BackendChoice(TensorBackend(CudaKernelOps), "cuda", why)
    if name == "cuda":
        raise ValueError(
            f"the cuda backend cannot run here: {reason}. Fix: on a machine with an NVIDIA GPU build the "
            f"kernels with `bash compile_cuda.sh`, or choose the cpu or auto backend (--backend cpu / --backend auto)"
        )
    return BackendChoice(TensorBackend(FastOps), "cpu", f"auto: CUDA unavailable: {reason}")


def peak_memory_mb(backend: TensorBackend, reset: bool = True) -> Dict[str, Any]:
    """{"peak_memory_mb": MiB, "memory_kind": what was measured}.  CUDA ("cuda_allocated"): the most
    device memory tensors held since the last reset (minitorch.cuda_memory_stats; reset=True starts
    a new window after the reading).  CPU ("host_rss"): the process's peak resident size so far,
    which cannot be reset."""
    if backend.cuda:
        peak = cuda_memory_stats(reset=reset)["peak"]
        return {"peak_memory_mb": peak / 2**20, "memory_kind": "cuda_allocated"}
    return {"peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "memory_kind": "host_rss"}
