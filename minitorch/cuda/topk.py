"""Bindings of topk_kernel.so (src/topk_kernel.cu): the k best entries of every row, on the device."""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

from ..dtypes import FLOAT32_EXACT_INTEGERS
from ..tensor_data import TensorData
from .combine import contiguous
from .runtime import BUILD_HINT, Runtime, check, empty, on_load, ptr, runtime

_P, _I = ctypes.c_void_p, ctypes.c_int
SIGNATURES = {
    "minitorch_topk_max_k": (_I, []),
    "launch_topk_rows": (_I, [_P, _P, _P, _I, _I, _I, _P]),
}
MAX_K = 32  # the kernel's largest k (kMaxK in the source; checked when the library loads)
MAX_WIDTH = FLOAT32_EXACT_INTEGERS  # indices come back as float32, exact below this


def top_k(scores: TensorData, k: int) -> Optional[Tuple[TensorData, TensorData]]:
    """(values, indices) [rows, k] of scores [rows, width], best first; None when k > MAX_K or the
    row is too wide for float32 indices (the caller composes then)."""
    rows, width = scores.shape
    if k > MAX_K or width >= MAX_WIDTH:
        return None
    values, indices = empty((rows, k)), empty((rows, k))
    if rows:
        rt = runtime()
        lib = rt.lib("topk_kernel", SIGNATURES)
        code = lib.launch_topk_rows(ptr(values), ptr(indices), ptr(contiguous(scores)), rows, width, k, rt.stream())
        check(code, lib, f"top_k k={k} of {scores.shape}")
    return values, indices


@on_load
def _check_max_k(rt: Runtime) -> None:
    built = rt.lib("topk_kernel", SIGNATURES).minitorch_topk_max_k()
    if built != MAX_K:
        raise RuntimeError(f"topk_kernel.so takes k <= {built}, minitorch/cuda/topk.py expects {MAX_K}; {BUILD_HINT}")
