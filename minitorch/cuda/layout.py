"""Layout planning: the by-value shape/stride structs the kernels take, and plan caches.

Elementwise and reduce kernels index through `MtLayout` (src/includes/layout.cuh).  Dims of size
1 are dropped and neighbours contiguous in every operand merged, so a contiguous tensor becomes one
dim of stride 1.  Plans depend only on shapes and strides, so each is computed once and cached.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, Sequence, Tuple

from ..tensor_data import MAX_DIMS, broadcast_strides, coalesce, prod, shape_broadcast
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


def product_plan(a: Any, b: Any) -> Tuple[Tuple[int, ...], Tuple[int, int, int, int], MtLayout, MtLayout]:
    """(output shape, matrix strides (A row, A k, B k, B column), A batch layout, B batch layout) of
    the product a [..., M, K] @ b [..., K, N] (anything with shape and strides in elements), the
    batch dims broadcast and merged; rejects what exceeds the kernels' 32-bit indexing."""
    batch = shape_broadcast(a.shape[:-2], b.shape[:-2])
    layout(a.shape, a.strides)
    layout(b.shape, b.strides)
    a_bs = broadcast_strides(a.shape[:-2], a.strides[:-2], batch)
    b_bs = broadcast_strides(b.shape[:-2], b.strides[:-2], batch)
    merged, (a_st, b_st) = coalesce(batch, [a_bs, b_bs])
    out_shape = batch + (a.shape[-2], b.shape[-1])
    if prod(out_shape) >= INT_LIMIT:
        raise CudaShapeError(f"matmul {a.shape} @ {b.shape}: the result exceeds the CUDA kernels' 32-bit indexing")
    mat_strides = (a.strides[-2], a.strides[-1], b.strides[-2], b.strides[-1])
    return out_shape, mat_strides, layout(merged, a_st), layout(merged, b_st)


def remember(cache: Dict[Any, Any], key: Any, value: Any) -> Any:
    """cache[key] = value, clearing the cache first when it is full."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value
