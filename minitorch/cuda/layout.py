"""Layout planning: the by-value shape/stride structs the kernels take, and plan caches.

Elementwise and reduce kernels index through `MtLayout` (src/includes/layout.cuh).  Dims of size
1 are dropped and neighbours contiguous in every operand merged, so a contiguous tensor becomes one
dim of stride 1.  Plans depend only on shapes and strides, so each is computed once and cached.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Sequence, Tuple

from ..tensor_data import MAX_DIMS, prod
from .runtime import INT_LIMIT, CudaShapeError

_CACHE_LIMIT = 4096


class MtLayout(ctypes.Structure):
    """The by-value layout struct of src/includes/layout.cuh: shape and strides, outermost dim first."""

    _fields_ = [("ndim", ctypes.c_int), ("shape", ctypes.c_int * MAX_DIMS), ("strides", ctypes.c_int * MAX_DIMS)]


def coalesce(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> Tuple[Tuple[int, ...], List[List[int]]]:
    """Drop size-1 dims and merge neighbours that are contiguous in every operand."""
    out_shape: List[int] = []
    out_strides: List[List[int]] = [[] for _ in strides]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        if out_shape and all(o[-1] == s[d] * size for o, s in zip(out_strides, strides)):
            out_shape[-1] *= size
            for o, s in zip(out_strides, strides):
                o[-1] = s[d]
        else:
            out_shape.append(size)
            for o, s in zip(out_strides, strides):
                o.append(s[d])
    if not out_shape:
        return (1,), [[1] for _ in strides]
    return tuple(out_shape), out_strides


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


def broadcast_strides(shape: Tuple[int, ...], strides: Tuple[int, ...], out_shape: Tuple[int, ...]) -> List[int]:
    """Strides of a tensor viewed with the broadcast shape out_shape (0 on broadcast dims)."""
    pad = len(out_shape) - len(shape)
    return [0 if d < pad or shape[d - pad] != out_shape[d] else strides[d - pad] for d in range(len(out_shape))]


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
