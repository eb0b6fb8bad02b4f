"""The elementwise and reduce kernels of FastOps, written once for a scalar function `f`.

This file is a template: fast_ops.kernels(fn) loads a copy of it per function of
minitorch.operators, as a module named `minitorch_kernels_<digest>__<function name>`, whose `f` is
that function; numba caches each copy's machine code on disk (`cache=True`) beside the copy, which
would be wrong for one file shared by several functions (numba names a cache by its source file).

The kernels run over a coalesced layout (see fast_ops._plan): parallel over rows (all dims but the
last), or over the elements of a single row.  They index with unsigned integers: that spares numba
its negative-index wraparound, which keeps LLVM from vectorizing the loops (several times slower);
every stride here is >= 0.
"""

import numpy as np
from numba import njit, prange

from minitorch import operators

_FUNCTION = __name__.partition("__")[2]  # empty when this file is imported as itself, not as a copy
f = njit(inline="always")(getattr(operators, _FUNCTION)) if _FUNCTION else None

_U = np.uint64
_REDUCE_BLOCK = 512  # output columns one task of a column reduction keeps hot in cache


@njit(inline="always")
def _row_start(r, shape, strides):  # type: ignore[no-untyped-def]
    """Storage position of the first element of row r, rows being every index of shape[:-1]."""
    pos = 0
    rest = r
    for d in range(len(shape) - 2, -1, -1):
        pos += (rest % shape[d]) * strides[d]
        rest //= shape[d]
    return pos


@njit(inline="always")
def _rows(shape):  # type: ignore[no-untyped-def]
    n = 1
    for d in range(len(shape) - 1):
        n *= shape[d]
    return n


@njit(parallel=True, cache=True)
def unary(out, so, a, sa, shape):  # type: ignore[no-untyped-def]
    """out = f(a)."""
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


@njit(parallel=True, cache=True)
def binary(out, so, a, sa, b, sb, shape):  # type: ignore[no-untyped-def]
    """out = f(a, b); a or b may be broadcast (stride 0)."""
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


@njit(parallel=True, cache=True)
def reduce(out, so, a, sa, shape, n, rs, start):  # type: ignore[no-untyped-def]
    """out = fold(f, start) over n elements at stride rs, for every position of the outer layout.
    When its last dim is contiguous and the reduced stride is not 1 (a column reduction), rows are
    folded into blocks of the output, which streams the input in order; otherwise each output
    element walks its own elements."""
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
