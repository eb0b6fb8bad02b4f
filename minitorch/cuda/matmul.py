"""Bindings of the matmul library: batched, broadcasting products over any strides.

Split-K: a product with few output tiles and a long inner dimension (the weight gradients
x^T @ dy: [C, tokens] @ [tokens, C']) would leave most SMs idle, so K is cut into `split` slices
computed as a batch of products (slice s reads A and B from s * K/split on) and then summed.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Dict, Tuple

from ..tensor_data import TensorData, prod, shape_broadcast
from .combine import column_sums
from .layout import MtLayout, broadcast_strides, coalesce, layout, remember
from .runtime import INT_LIMIT, CudaShapeError, check, empty, ptr, runtime

_P, _I, _L = ctypes.c_void_p, ctypes.c_int, MtLayout
SIGNATURES = {"launch_matmul": (_I, [_P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _L, _L, _P])}
LIBRARY = "matmul_simt"
_TILE = 128
_SPLIT_K_MIN_SLICE = 256

_plans: Dict[tuple, Tuple[Tuple[int, ...], Tuple[int, int, int, int], MtLayout, MtLayout]] = {}


def _lib() -> Tuple[object, ctypes.CDLL]:
    rt = runtime()
    return rt, rt.lib(LIBRARY, SIGNATURES)


@functools.lru_cache(maxsize=1024)
def _split_k(n: int, m: int, k: int, sm_count: int) -> int:
    """How many K slices fill about two waves of the GPU (1: no split); slices divide K evenly."""
    tiles = -(-n // _TILE) * -(-m // _TILE)
    if tiles >= sm_count or k < 2 * _SPLIT_K_MIN_SLICE:
        return 1
    want = min(-(-2 * sm_count // tiles), k // _SPLIT_K_MIN_SLICE)
    return max((s for s in range(1, want + 1) if k % s == 0), default=1)


def _plan(a: TensorData, b: TensorData) -> Tuple[Tuple[int, ...], Tuple[int, int, int, int], MtLayout, MtLayout]:
    batch = shape_broadcast(a.shape[:-2], b.shape[:-2])
    layout(a.shape, a.strides)  # rejects layouts beyond 32-bit offsets
    layout(b.shape, b.strides)
    a_bs = broadcast_strides(a.shape[:-2], a.strides[:-2], batch)
    b_bs = broadcast_strides(b.shape[:-2], b.strides[:-2], batch)
    merged, (a_st, b_st) = coalesce(batch, [a_bs, b_bs])
    out_shape = batch + (a.shape[-2], b.shape[-1])
    if prod(out_shape) >= INT_LIMIT:
        raise CudaShapeError(f"matmul {a.shape} @ {b.shape}: the result exceeds the CUDA kernels' 32-bit indexing")
    mat_strides = (a.strides[-2], a.strides[-1], b.strides[-2], b.strides[-1])
    return out_shape, mat_strides, layout(merged, a_st), layout(merged, b_st)


def matrix_multiply(a: TensorData, b: TensorData) -> TensorData:
    """a [..., n, k] @ b [..., k, m] -> [broadcast(...), n, m], any strides."""
    rt, lib = _lib()
    key = (a.shape, a.strides, b.shape, b.strides)
    plan = _plans.get(key)
    if plan is None:
        plan = remember(_plans, key, _plan(a, b))
    out_shape, strides, a_batch, b_batch = plan
    n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
    if len(out_shape) == 2:
        split = _split_k(n, m, k, rt.sm_count)
        if split > 1:
            part = k // split
            partial = empty((split, n, m))
            a_slices = layout((split,), (part * strides[1],))
            b_slices = layout((split,), (part * strides[2],))
            code = lib.launch_matmul(ptr(partial), ptr(a), ptr(b), n, m, part, *strides, a_slices, b_slices, rt.stream())
            check(code, lib, f"matmul {a.shape} @ {b.shape} (split-K {split})")
            out = empty((n, m))
            column_sums(ptr(out), ptr(partial), n * m, split, n * m)
            return out
    out = empty(out_shape)
    if out.size:
        code = lib.launch_matmul(ptr(out), ptr(a), ptr(b), n, m, k, *strides, a_batch, b_batch, rt.stream())
        check(code, lib, f"matmul {a.shape} @ {b.shape}")
    return out


def raw_matmul(
    out: int, a: int, b: int, M: int, N: int, K: int, a_strides: Tuple[int, int], b_strides: Tuple[int, int],
    batch: int = 1, batch_offset: int = 0,
) -> None:  # fmt: skip
    """out[i] = A[i] @ B[i] for i < batch on raw pointers, out contiguous [batch, M, N]; A[i][r, k] =
    a[i * batch_offset + r * a_strides[0] + k * a_strides[1]], B[i][k, c] likewise with b."""
    rt, lib = _lib()
    slices = layout((batch,), (batch_offset,))
    code = lib.launch_matmul(out, a, b, M, N, K, *a_strides, *b_strides, slices, slices, rt.stream())
    check(code, lib, f"matmul [{M}, {K}] @ [{K}, {N}] x{batch}")
