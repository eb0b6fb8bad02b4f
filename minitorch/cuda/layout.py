"""Layout planning: the by-value shape/stride structs the kernels take, and plan caches.

Elementwise and reduce kernels index through `MtLayout` (src/includes/layout.cuh).  Dims of size
1 are dropped and neighbours contiguous in every operand merged, so a contiguous tensor becomes one
dim of stride 1.  Plans depend only on shapes and strides, so each is computed once and cached.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, Sequence, Tuple

from ..tensor_data import MAX_DIMS, broadcast_strides, coalesce, prod
from .runtime import INT_LIMIT, CudaShapeError

_CACHE_LIMIT = 4096


class MtLayout(ctypes.Structure):
    """The by-value layout struct of src/includes/layout.cuh: shape and strides, outermost dim first."""

    _fields_ = [("ndim", ctypes.c_int), ("shape", ctypes.c_int * MAX_DIMS), ("strides", ctypes.c_int * MAX_DIMS)]


def layout(shape: Sequence[int], strides: Sequence[int]) -> MtLayout:
    """The struct of one layout; rejects layouts beyond the kernels' 32-bit offsets."""
    span = sum((s - 1) * st for s, st in zip(shape, strides))
    if prod(shape) >= INT_LIMIT or span >= INT_LIMIT or any(st < 0 for st in strides):
        raise CudaShapeError(
            f"layout shape {tuple(shape)} strides {tuple(strides)} exceeds the CUDA kernels' 32-bit indexing"
        )
    out = MtLayout()
    out.ndim = len(shape)
    for d, (s, st) in enumerate(zip(shape, strides)):
        out.shape[d] = s
        out.strides[d] = st
    return out


def elementwise_plan(
    out_shape: Tuple[int, ...], out_strides: Tuple[int, ...], inputs: Sequence[Tuple[Tuple[int, ...], Tuple[int, ...]]]
) -> Tuple[MtLayout, ...]:
    """(out layout, input layouts...) of an elementwise op with broadcasting inputs."""
    strides = [list(out_strides)] + [broadcast_strides(s, st, out_shape) for s, st in inputs]
    shape, merged = coalesce(out_shape, strides)
    return tuple(layout(shape, st) for st in merged)


def remember(cache: Dict[Any, Any], key: Any, value: Any) -> Any:
    """cache[key] = value, clearing the cache first when it is full."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value
