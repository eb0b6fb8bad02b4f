"""FastOps: the CPU default backend, numba-compiled and parallel over output elements.

Elementwise and reduce kernels run over a coalesced layout (size-1 dims dropped, dims contiguous in
every operand merged, broadcast dims at stride 0): parallel over rows of the last dim, computing a
row's storage positions once, with unit-stride loops the compiler vectorizes.  Matmul goes to
NumPy's BLAS on strided views of the storages (no copies).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numba
import numpy as np
from numba import njit, prange

from . import operators
from .dtypes import float32, int64
from .simple_ops import SimpleOps
from .tensor_data import TensorData, broadcast_strides, coalesce, shape_broadcast
from .tensor_ops import TensorOps, as_array, emulated, empty, host_argsort, new_output, typed_start

_jit_cache: dict = {}


def _inline(fn: Callable) -> Any:
    """The numba version of a scalar function, compiled once and inlined into kernels."""
    if fn not in _jit_cache:
        _jit_cache[fn] = njit(inline="always")(fn)
    return _jit_cache[fn]


@njit(inline="always")
def _row_start(r: int, shape: np.ndarray, strides: np.ndarray) -> int:
    """Storage position of the first element of row r, rows being every index of shape[:-1]."""
    pos = 0
    rest = r
    for d in range(len(shape) - 2, -1, -1):
        pos += (rest % shape[d]) * strides[d]
        rest //= shape[d]
    return pos


@njit(inline="always")
def _rows(shape: np.ndarray) -> int:
    n = 1
    for d in range(len(shape) - 1):
        n *= shape[d]
    return n


# Kernels index with unsigned integers: that spares numba its negative-index wraparound, which keeps
# LLVM from vectorizing the loops (several times slower); every stride here is >= 0.
_U = np.uint64


def _unary_kernel(fn: Callable) -> Any:
    """out = fn(a) over a coalesced layout (see _plan): parallel over rows (all dims but the last),
    or over the elements of a single row."""
    f = _inline(fn)

    def kernel(out, so, a, sa, shape):  # type: ignore[no-untyped-def]
        last = len(shape) - 1
        inner, o1, a1 = _U(shape[last]), _U(so[last]), _U(sa[last])
        rows = _rows(shape)
        if rows == 1:
            for j in prange(inner):
                out[j * o1] = f(a[j * a1])
            return
        for rr in prange(rows):
            r = np.int64(rr)  # prange indices can be unsigned; mixing them with int64 would give floats
            o, p = _U(_row_start(r, shape, so)), _U(_row_start(r, shape, sa))
            for j in range(inner):
                out[o + j * o1] = f(a[p + j * a1])

    return njit(parallel=True)(kernel)


def _binary_kernel(fn: Callable) -> Any:
    """out = fn(a, b) over a coalesced layout, as _unary_kernel; a or b may be broadcast (stride 0)."""
    f = _inline(fn)

    def kernel(out, so, a, sa, b, sb, shape):  # type: ignore[no-untyped-def]
        last = len(shape) - 1
        inner, o1, a1, b1 = _U(shape[last]), _U(so[last]), _U(sa[last]), _U(sb[last])
        rows = _rows(shape)
        if rows == 1:
            for j in prange(inner):
                out[j * o1] = f(a[j * a1], b[j * b1])
            return
        for rr in prange(rows):
            r = np.int64(rr)
            o, p, q = _U(_row_start(r, shape, so)), _U(_row_start(r, shape, sa)), _U(_row_start(r, shape, sb))
            for j in range(inner):
                out[o + j * o1] = f(a[p + j * a1], b[q + j * b1])

    return njit(parallel=True)(kernel)


_REDUCE_BLOCK = 512  # output columns one task of a column reduction keeps hot in cache


def _reduce_kernel(fn: Callable) -> Any:
    """out = fold(fn, start) over n elements at stride rs, for every position of a coalesced outer
    layout.  When the outer layout's last dim is contiguous and the reduced stride is not 1 (a column
    reduction), rows are folded into blocks of the output, which streams the input in order;
    otherwise each output element walks its own elements."""
    f = _inline(fn)

    def kernel(out, so, a, sa, shape, n, rs, start):  # type: ignore[no-untyped-def]
        last = len(shape) - 1
        inner, o1, a1 = shape[last], _U(so[last]), _U(sa[last])
        rows = _rows(shape)
        step = _U(rs)
        if a1 == 1 and o1 == 1 and rs != 1 and inner > 1:
            blocks = (inner + _REDUCE_BLOCK - 1) // _REDUCE_BLOCK
            for tt in prange(rows * blocks):
                t = np.int64(tt)
                r, k0 = t // blocks, (t % blocks) * _REDUCE_BLOCK
                width = _U(min(inner, k0 + _REDUCE_BLOCK) - k0)
                o, p = _U(_row_start(r, shape, so) + k0), _U(_row_start(r, shape, sa) + k0)
                for k in range(width):
                    out[o + k] = start
                for j in range(_U(n)):
                    pj = p + j * step
                    for k in range(width):
                        out[o + k] = f(out[o + k], a[pj + k])
            return
        for tt in prange(rows * inner):
            t = np.int64(tt)
            r, k = t // inner, _U(t % inner)
            p = _U(_row_start(r, shape, sa)) + k * a1
            acc = start
            for j in range(_U(n)):
                acc = f(acc, a[p + j * step])
            out[_U(_row_start(r, shape, so)) + k * o1] = acc

    return njit(parallel=True)(kernel)


# Below this many elements a kernel runs on one thread.  A parallel region waits for every thread
# to be scheduled: microseconds on an idle machine, but a whole scheduler time slice (~15 ms,
# measured on a busy 2-core machine) when other processes hold the cores, while one thread streams
# 2M floats in about 2 ms.
PARALLEL_MIN_ELEMENTS = 1 << 21


def _launch(kernel: Any, work: int, *args: Any) -> None:
    if work >= PARALLEL_MIN_ELEMENTS:
        kernel(*args)
        return
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        kernel(*args)
    finally:
        numba.set_num_threads(threads)


_plans: Dict[tuple, tuple] = {}


def _plan(shape: Tuple[int, ...], operands: Sequence[Tuple[Tuple[int, ...], Tuple[int, ...]]]) -> tuple:
    """(shape, strides of each operand) as int64 arrays, operands broadcast to shape and dims coalesced
    (size-1 dims dropped, neighbours contiguous in every operand merged); cached by layout."""
    key = (shape,) + tuple(operands)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= 4096:
            _plans.clear()
        merged, strides = coalesce(shape, [broadcast_strides(s, st, shape) for s, st in operands])
        plan = (np.array(merged, dtype=np.int64),) + tuple(np.array(st, dtype=np.int64) for st in strides)
        _plans[key] = plan
    return plan


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


@njit(parallel=True)
def _arg_reduce_kernel(out, a, bases, n, step, largest):  # type: ignore[no-untyped-def]
    for rr in prange(bases.size):
        r = np.int64(rr)
        p = bases[r]
        best = a[p]
        at = 0
        j = 1
        while j < n and best == best:  # a NaN is the extreme: the first one ends the search
            v = a[p + j * step]
            if v != v or (v > best if largest else v < best):
                best = v
                at = j
            j += 1
        out[r] = at


@njit(parallel=True)
def _cumsum_kernel(out, out_bases, out_step, a, bases, n, step):  # type: ignore[no-untyped-def]
    for rr in prange(bases.size):
        r = np.int64(rr)
        acc = a[bases[r]]
        out[out_bases[r]] = acc
        for j in range(1, n):
            acc += a[bases[r] + j * step]
            out[out_bases[r] + j * out_step] = acc


def _row_bases(t: TensorData, dim: int) -> np.ndarray:
    """Storage positions of t's elements whose index along dim is 0, in row-major order."""
    bases = np.zeros((1,) * t.dims, dtype=np.int64)
    for d, (size, stride) in enumerate(zip(t.shape, t.strides)):
        if d != dim:
            bases = bases + (np.arange(size, dtype=np.int64) * stride).reshape((1,) * d + (size,) + (1,) * (t.dims - d - 1))
    return bases.reshape(-1)


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
        kernel = _unary_kernel(fn)

        def ret(x: TensorData, out: Optional[TensorData] = None) -> TensorData:
            o = new_output(FastOps, x.shape, fn, x) if out is None else out
            if o.size:
                shape, so, sa = _plan(o.shape, ((o.shape, o.strides), (x.shape, x.strides)))
                _launch(kernel, o.size, o._storage, so, x._storage, sa, shape)
            return o

        return ret

    @staticmethod
    def map_scalar(fn: Callable[[float, float], float]) -> Callable[..., TensorData]:
        op = FastOps.zip(fn)
        return lambda x, s, out=None: op(x, TensorData(np.array([s], dtype=np.int64 if isinstance(s, int) else np.float32), ()), out)

    @staticmethod
    def zip(fn: Callable[[float, float], float]) -> Callable[[TensorData, TensorData], TensorData]:
        kernel = _binary_kernel(fn)

        def ret(x: TensorData, y: TensorData, out: Optional[TensorData] = None) -> TensorData:
            o = new_output(FastOps, shape_broadcast(x.shape, y.shape), fn, x) if out is None else out
            if o.size:
                shape, so, sa, sb = _plan(o.shape, ((o.shape, o.strides), (x.shape, x.strides), (y.shape, y.strides)))
                _launch(kernel, o.size, o._storage, so, x._storage, sa, y._storage, sb, shape)
            return o

        return ret

    @staticmethod
    def reduce(fn: Callable[[float, float], float], start: float = 0.0) -> Callable[[TensorData, int], TensorData]:
        kernel = _reduce_kernel(fn)

        def ret(x: TensorData, dim: int) -> TensorData:
            o = new_output(FastOps, x.shape[:dim] + (1,) + x.shape[dim + 1 :], fn, x)
            if o.size:
                outer = x.shape[:dim] + (1,) + x.shape[dim + 1 :]
                shape, so, sa = _plan(outer, ((o.shape, o.strides), (outer, x.strides[:dim] + (0,) + x.strides[dim + 1 :])))
                n = x.shape[dim]
                step = x.strides[dim] if n > 1 else 1
                _launch(kernel, x.size, o._storage, so, x._storage, sa, shape, n, step, typed_start(start, x))
            return o

        return ret

    @staticmethod
    def matrix_multiply(x: TensorData, y: TensorData) -> TensorData:
        """Batched, broadcasting x @ y by NumPy's matmul (BLAS gemm per matrix) on strided views of
        the storages, so transposed and permuted operands are read in place, without copies."""
        batch = shape_broadcast(x.shape[:-2], y.shape[:-2])
        o = new_output(FastOps, batch + (x.shape[-2], y.shape[-1]), None, x)
        if o.size:
            np.matmul(as_array(x), as_array(y), out=as_array(o))
        return o

    @staticmethod
    def arg_reduce(x: TensorData, dim: int, largest: bool) -> TensorData:
        """See TensorOps: the position of the first max/min along dim (NaN the extreme), int64."""
        o = empty(FastOps, x.shape[:dim] + (1,) + x.shape[dim + 1 :], int64)
        if o.size:
            bases = _row_bases(x, dim)
            _launch(_arg_reduce_kernel, x.size, o._storage, x._storage, bases, x.shape[dim], x.strides[dim], largest)
        return o

    @staticmethod
    def cumsum(x: TensorData, dim: int) -> TensorData:
        """Running sums along dim, in x's storage type (float32 sums in float32, in order)."""
        o = empty(FastOps, x.shape, int64 if x.dtype.is_integer else float32)
        if o.size:
            args = (o._storage, _row_bases(o, dim), o.strides[dim], x._storage, _row_bases(x, dim), x.shape[dim], x.strides[dim])
            _launch(_cumsum_kernel, x.size, *args)
        return o

    sort_indices = staticmethod(host_argsort)

    @staticmethod
    def embedding_fw(weight: TensorData, ids: TensorData) -> TensorData:
        """weight [V, C] rows picked by integral ids [...] -> [..., C]; ids outside [0, V) raise."""
        V, C = weight.shape
        flat = _check_ids(ids, V)
        o = empty(FastOps, ids.shape + (C,), weight.dtype)
        _launch(_gather_kernel, o.size, o._storage, weight._storage, weight.np_strides, flat, ids.size, C, V)
        return o

    @staticmethod
    def embedding_bw(grad_out: TensorData, ids: TensorData, num_embeddings: int) -> TensorData:
        """Scatter-add of grad_out rows [..., C] into a zeroed [num_embeddings, C] gradient."""
        C = grad_out.shape[-1]
        flat = _check_ids(ids, num_embeddings)
        o = empty(FastOps, (num_embeddings, C))
        o._storage[:] = 0.0
        _scatter_add_kernel(o._storage, _contiguous(grad_out)._storage, flat, ids.size, C)
        return emulated(o, grad_out.dtype)
