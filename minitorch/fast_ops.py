"""FastOps: the CPU default backend, numba-compiled and parallel over output elements.

Every kernel walks its output in row-major order and computes storage positions from the flat
index directly (no per-element index arrays), with a straight-line fast path when input and output
share one contiguous layout.  Matmul runs i-k-j loops so the innermost loop streams a row of b and
a row of out, which the compiler vectorizes.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Tuple

import numpy as np
from numba import njit, prange

from . import operators
from .tensor_data import TensorData, shape_broadcast
from .tensor_ops import SimpleOps, TensorOps, empty

_jit_cache: dict = {}


def _inline(fn: Callable) -> Any:
    """The numba version of a scalar function, compiled once and inlined into kernels."""
    if fn not in _jit_cache:
        _jit_cache[fn] = njit(inline="always")(fn)
    return _jit_cache[fn]


@njit
def _position(i: int, out_shape: np.ndarray, in_shape: np.ndarray, in_strides: np.ndarray) -> int:
    """Storage position in an input (broadcast to out_shape) of the i-th output element."""
    offset = len(out_shape) - len(in_shape)
    pos = 0
    rest = np.int64(i)  # prange indices can be unsigned; mixing them with int64 would give floats
    for d in range(len(out_shape) - 1, -1, -1):
        idx = rest % out_shape[d]
        rest = rest // out_shape[d]
        dd = d - offset
        if dd >= 0 and in_shape[dd] > 1:
            pos += idx * in_strides[dd]
    return pos


@njit
def _same_contiguous(a_shape: np.ndarray, a_strides: np.ndarray, b_shape: np.ndarray, b_strides: np.ndarray) -> bool:
    if len(a_shape) != len(b_shape):
        return False
    expected = 1
    for d in range(len(a_shape) - 1, -1, -1):
        if a_shape[d] != b_shape[d]:
            return False
        if a_shape[d] != 1 and (a_strides[d] != expected or b_strides[d] != expected):
            return False
        expected *= a_shape[d]
    return True


def _map_kernel(fn: Callable) -> Any:
    f = _inline(fn)

    def kernel(out, out_shape, out_strides, a, a_shape, a_strides):  # type: ignore[no-untyped-def]
        size = 1
        for d in range(len(out_shape)):
            size *= out_shape[d]
        if _same_contiguous(out_shape, out_strides, a_shape, a_strides):
            for i in prange(size):
                out[i] = f(a[i])
        else:
            for i in prange(size):
                out[_position(i, out_shape, out_shape, out_strides)] = f(a[_position(i, out_shape, a_shape, a_strides)])

    return njit(parallel=True)(kernel)


def _map_scalar_kernel(fn: Callable) -> Any:
    f = _inline(fn)

    def kernel(out, out_shape, out_strides, a, a_shape, a_strides, s):  # type: ignore[no-untyped-def]
        size = 1
        for d in range(len(out_shape)):
            size *= out_shape[d]
        if _same_contiguous(out_shape, out_strides, a_shape, a_strides):
            for i in prange(size):
                out[i] = f(a[i], s)
        else:
            for i in prange(size):
                out[_position(i, out_shape, out_shape, out_strides)] = f(a[_position(i, out_shape, a_shape, a_strides)], s)

    return njit(parallel=True)(kernel)


def _zip_kernel(fn: Callable) -> Any:
    f = _inline(fn)

    def kernel(out, out_shape, out_strides, a, a_shape, a_strides, b, b_shape, b_strides):  # type: ignore[no-untyped-def]
        size = 1
        for d in range(len(out_shape)):
            size *= out_shape[d]
        if _same_contiguous(out_shape, out_strides, a_shape, a_strides) and _same_contiguous(
            out_shape, out_strides, b_shape, b_strides
        ):
            for i in prange(size):
                out[i] = f(a[i], b[i])
        else:
            for i in prange(size):
                out[i] = f(a[_position(i, out_shape, a_shape, a_strides)], b[_position(i, out_shape, b_shape, b_strides)])

    return njit(parallel=True)(kernel)


def _reduce_kernel(fn: Callable) -> Any:
    f = _inline(fn)

    def kernel(out, out_shape, a, a_shape, a_strides, dim, start):  # type: ignore[no-untyped-def]
        size = 1
        for d in range(len(out_shape)):
            size *= out_shape[d]
        n = a_shape[dim]
        step = a_strides[dim]
        for i in prange(size):
            pos = _position(i, out_shape, a_shape, a_strides)
            acc = start
            for j in range(n):
                acc = f(acc, a[pos + j * step])
            out[i] = acc

    return njit(parallel=True)(kernel)


@njit(parallel=True)
def _matmul_kernel(out, a, a_base, a_strides, b, b_base, b_strides, n, k, m):  # type: ignore[no-untyped-def]
    """out[batch, i, :] = sum_k a[batch, i, k] * b[batch, k, :], batches given by base positions."""
    batches = len(a_base)
    a_si, a_sk = a_strides[0], a_strides[1]
    b_sk, b_sj = b_strides[0], b_strides[1]
    for rr in prange(batches * n):
        r = np.int64(rr)
        bt = r // n
        i = r % n
        acc = np.zeros(m, dtype=np.float32)
        arow = a_base[bt] + i * a_si
        bb = b_base[bt]
        if b_sj == 1:
            for kk in range(k):
                aik = a[arow + kk * a_sk]
                # Unsigned positions spare numba its negative-index wraparound, which otherwise
                # keeps LLVM from vectorizing this loop (about 5x slower).
                brow = np.uint64(bb + kk * b_sk)
                for j in range(np.uint64(m)):
                    acc[j] += aik * b[brow + j]
        else:
            for kk in range(k):
                aik = a[arow + kk * a_sk]
                brow = bb + kk * b_sk
                for j in range(m):
                    acc[j] += aik * b[brow + j * b_sj]
        o = r * m
        for j in range(m):
            out[o + j] = acc[j]


@njit(parallel=True)
def _gather_kernel(out, weight, w_strides, ids, n, c, v):  # type: ignore[no-untyped-def]
    for rr in prange(n):
        r = np.int64(rr)
        row = int(ids[r])
        if row < 0 or row >= v:
            for j in range(c):
                out[r * c + j] = 0.0
        else:
            for j in range(c):
                out[r * c + j] = weight[row * w_strides[0] + j * w_strides[1]]


@njit
def _scatter_add_kernel(out, grad, ids, n, c):  # type: ignore[no-untyped-def]
    for r in range(n):
        row = int(ids[r])
        for j in range(c):
            out[row * c + j] += grad[r * c + j]


def _batch_bases(shape: Tuple[int, ...], batch: Tuple[int, ...], strides: Tuple[int, ...]) -> np.ndarray:
    """Storage position of the [0, 0] element of every (broadcast) batch matrix."""
    lead = shape[:-2]
    lead_strides = strides[:-2]
    offset = len(batch) - len(lead)
    count = 1
    for s in batch:
        count *= s
    bases = np.zeros(count, dtype=np.int64)
    for i in range(count):
        rest = i
        pos = 0
        for d in range(len(batch) - 1, -1, -1):
            idx = rest % batch[d]
            rest //= batch[d]
            dd = d - offset
            if dd >= 0 and lead[dd] > 1:
                pos += idx * lead_strides[dd]
        bases[i] = pos
    return bases


def _check_ids(ids: TensorData, num_embeddings: int) -> np.ndarray:
    flat = _contiguous(ids)._storage[: ids.size]
    if ids.size and (flat.min() < 0 or flat.max() >= num_embeddings or np.any(flat != np.floor(flat))):
        raise IndexError(
            f"embedding ids must be integers in [0, {num_embeddings}), got values in [{flat.min()}, {flat.max()}]"
        )
    return flat


def _contiguous(t: TensorData) -> TensorData:
    return t if t.is_contiguous() else _copy_op()(t)


@functools.lru_cache(maxsize=None)
def _copy_op() -> Callable[..., TensorData]:
    return FastOps.map(operators.id)


class FastOps(TensorOps):
    """numba-parallel CPU backend (the default)."""

    storage_empty = SimpleOps.storage_empty
    storage_from_numpy = SimpleOps.storage_from_numpy
    storage_to_numpy = SimpleOps.storage_to_numpy
    storage_upload = SimpleOps.storage_upload
    fill = SimpleOps.fill
    arange = SimpleOps.arange
    uniform = SimpleOps.uniform

    @staticmethod
    def map(fn: Callable[[float], float]) -> Callable[..., TensorData]:
        kernel = _map_kernel(fn)

        def ret(x: TensorData, out: Optional[TensorData] = None) -> TensorData:
            o = empty(FastOps, x.shape) if out is None else out
            kernel(o._storage, o.np_shape, o.np_strides, x._storage, x.np_shape, x.np_strides)
            return o

        return ret

    @staticmethod
    def map_scalar(fn: Callable[[float, float], float]) -> Callable[..., TensorData]:
        kernel = _map_scalar_kernel(fn)

        def ret(x: TensorData, s: float, out: Optional[TensorData] = None) -> TensorData:
            o = empty(FastOps, x.shape) if out is None else out
            kernel(o._storage, o.np_shape, o.np_strides, x._storage, x.np_shape, x.np_strides, float(s))
            return o

        return ret

    @staticmethod
    def zip(fn: Callable[[float, float], float]) -> Callable[[TensorData, TensorData], TensorData]:
        kernel = _zip_kernel(fn)

        def ret(x: TensorData, y: TensorData) -> TensorData:
            o = empty(FastOps, shape_broadcast(x.shape, y.shape))
            kernel(o._storage, o.np_shape, o.np_strides, x._storage, x.np_shape, x.np_strides,
                   y._storage, y.np_shape, y.np_strides)
            return o

        return ret

    @staticmethod
    def reduce(fn: Callable[[float, float], float], start: float = 0.0) -> Callable[[TensorData, int], TensorData]:
        kernel = _reduce_kernel(fn)

        def ret(x: TensorData, dim: int) -> TensorData:
            shape = list(x.shape)
            shape[dim] = 1
            o = empty(FastOps, tuple(shape))
            kernel(o._storage, o.np_shape, x._storage, x.np_shape, x.np_strides, dim, float(start))
            return o

        return ret

    @staticmethod
    def matrix_multiply(x: TensorData, y: TensorData) -> TensorData:
        n, k, m = x.shape[-2], x.shape[-1], y.shape[-1]
        batch = shape_broadcast(x.shape[:-2], y.shape[:-2])
        o = empty(FastOps, batch + (n, m))
        _matmul_kernel(
            o._storage,
            x._storage, _batch_bases(x.shape, batch, x.strides), x.np_strides[-2:].copy(),
            y._storage, _batch_bases(y.shape, batch, y.strides), y.np_strides[-2:].copy(),
            n, k, m,
        )
        return o

    @staticmethod
    def embedding_fw(weight: TensorData, ids: TensorData) -> TensorData:
        """weight [V, C] rows picked by integral ids [...] -> [..., C]; ids outside [0, V) raise."""
        V, C = weight.shape
        flat = _check_ids(ids, V)
        o = empty(FastOps, ids.shape + (C,))
        _gather_kernel(o._storage, weight._storage, weight.np_strides, flat, ids.size, C, V)
        return o

    @staticmethod
    def embedding_bw(grad_out: TensorData, ids: TensorData, num_embeddings: int) -> TensorData:
        """Scatter-add of grad_out rows [..., C] into a zeroed [num_embeddings, C] gradient."""
        C = grad_out.shape[-1]
        flat = _check_ids(ids, num_embeddings)
        o = empty(FastOps, (num_embeddings, C))
        o._storage[:] = 0.0
        _scatter_add_kernel(o._storage, _contiguous(grad_out)._storage, flat, ids.size, C)
        return o
