"""Bindings of int_kernel.so (src/int_kernel.cu): the ops of int64 tensors (elementwise, fill,
arange, reductions, casts to and from the float formats, row gathers) and the index ops of int64
and float32 tensors (arg_reduce, cumsum, sort_indices).

Elementwise ops name a minitorch.operators function; it becomes an opcode of the kernels (tables
by position, checked against the names the library exports when it loads).  The comparisons (lt,
eq) write float32 1.0/0.0, the storage of minitorch.bool.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Optional

from .. import operators
from ..dtypes import DType, float32, int64, no_kernel
from ..tensor_data import TensorData, strides_from_shape
from ..tensor_ops import typed_start
from .combine import map_layouts, out_layout, rows_plan, zip_layouts
from .layout import MtLayout
from .runtime import BUILD_HINT, CudaShapeError, Runtime, check, check_names, empty, on_load, ptr, runtime

UNARY_OPS = ("id", "neg", "abs")
BINARY_OPS = ("add", "mul", "max", "min", "floordiv", "remainder", "lt", "eq")
REDUCE_OPS = ("add", "mul", "max", "min")  # the first four binary opcodes
COMPARISONS = ("lt", "eq")
FLOAT_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}  # convert_kernel.cu's codes
VALUE_CODES = {"float32": 0, "int64": 3}  # the value types of the one-dim ops
MAX_SORT_ROW = 4096  # kMaxSortRow of the source, checked when the library loads

_P, _I, _LL, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, MtLayout
SIGNATURES = {
    "minitorch_int_unary_op_count": (_I, []),
    "minitorch_int_unary_op_name": (ctypes.c_char_p, [_I]),
    "minitorch_int_binary_op_count": (_I, []),
    "minitorch_int_binary_op_name": (ctypes.c_char_p, [_I]),
    "minitorch_int_max_sort_row": (_I, []),
    "launch_int_map": (_I, [_I, _P, _L, _P, _L, _P]),
    "launch_int_map_scalar": (_I, [_I, _P, _L, _P, _L, _LL, _P]),
    "launch_int_zip": (_I, [_I, _P, _L, _P, _L, _P, _L, _P]),
    "launch_int_fill": (_I, [_P, _L, _LL, _P]),
    "launch_int_arange": (_I, [_P, _I, _P]),
    "launch_to_int64": (_I, [_P, _L, _P, _I, _L, _P]),
    "launch_from_int64": (_I, [_P, _I, _L, _P, _L, _P]),
    "launch_int_reduce": (_I, [_I, _P, _L, _P, _L, _I, _I, _LL, _P]),
    "launch_arg_reduce": (_I, [_P, _L, _P, _I, _L, _I, _I, _I, _P]),
    "launch_cumsum": (_I, [_P, _L, _I, _P, _I, _L, _I, _I, _P]),
    "launch_sort_rows": (_I, [_P, _L, _I, _P, _I, _L, _I, _I, _I, _P]),
    "launch_int_gather_rows": (_I, [_P, _P, _P, _I, _I, _I, _P]),
}


def _lib(rt: Runtime) -> ctypes.CDLL:
    return rt.lib("int_kernel", SIGNATURES)


@on_load
def _check_tables(rt: Runtime) -> None:
    c = _lib(rt)
    check_names("int_kernel", "unary opcodes", c.minitorch_int_unary_op_count, c.minitorch_int_unary_op_name, UNARY_OPS, __name__)
    check_names("int_kernel", "binary opcodes", c.minitorch_int_binary_op_count, c.minitorch_int_binary_op_name, BINARY_OPS, __name__)
    if c.minitorch_int_max_sort_row() != MAX_SORT_ROW:
        raise RuntimeError(f"int_kernel.so sorts rows of up to {c.minitorch_int_max_sort_row()}, {__name__} expects {MAX_SORT_ROW}; {BUILD_HINT}")


def has_op(fn: Callable, names: tuple) -> bool:
    """Whether the int64 kernels have the operators function fn among names."""
    return getattr(fn, "__name__", None) in names and getattr(operators, fn.__name__, None) is fn


def _code(fn: Callable, names: tuple) -> int:
    return names.index(fn.__name__)


def _value_code(t: TensorData, op: str) -> int:
    code = VALUE_CODES.get(t.dtype.storage)
    if code is None:
        raise no_kernel(op, t.dtype)
    return code


def map_op(fn: Callable) -> Callable[..., TensorData]:
    """fn(a) elementwise on int64 a; `out`, if given, is written in place (a broadcasts to its shape)."""
    op = _code(fn, UNARY_OPS)

    def ret(a: TensorData, out: Optional[TensorData] = None) -> TensorData:
        out_l, a_l = map_layouts(f"int64 {fn.__name__}", a, out)
        o = empty(a.shape, int64) if out is None else out
        if o.size:
            rt = runtime()
            check(_lib(rt).launch_int_map(op, ptr(o), out_l, ptr(a), a_l, rt.stream()), _lib(rt), f"int64 {fn.__name__}")
        return o

    return ret


def map_scalar_op(fn: Callable) -> Callable[..., TensorData]:
    """fn(a, s) elementwise on int64 a and a Python int s."""
    op = _code(fn, BINARY_OPS)
    out_dtype = float32 if fn.__name__ in COMPARISONS else int64

    def ret(a: TensorData, s: int, out: Optional[TensorData] = None) -> TensorData:
        out_l, a_l = map_layouts(f"int64 {fn.__name__}", a, out)
        o = empty(a.shape, out_dtype) if out is None else out
        if o.size:
            rt = runtime()
            code = _lib(rt).launch_int_map_scalar(op, ptr(o), out_l, ptr(a), a_l, int(s), rt.stream())
            check(code, _lib(rt), f"int64 {fn.__name__} with a scalar")
        return o

    return ret


def zip_op(fn: Callable) -> Callable[[TensorData, TensorData], TensorData]:
    """fn(a, b) elementwise on int64 a and b with numpy broadcasting; a new contiguous result."""
    op = _code(fn, BINARY_OPS)
    out_dtype = float32 if fn.__name__ in COMPARISONS else int64

    def ret(a: TensorData, b: TensorData) -> TensorData:
        out_shape, out_l, a_l, b_l = zip_layouts(a, b)
        o = empty(out_shape, out_dtype)
        if o.size:
            rt = runtime()
            code = _lib(rt).launch_int_zip(op, ptr(o), out_l, ptr(a), a_l, ptr(b), b_l, rt.stream())
            check(code, _lib(rt), f"int64 {fn.__name__} {a.shape}, {b.shape}")
        return o

    return ret


def reduce_op(fn: Callable, start: float) -> Callable[[TensorData, int], TensorData]:
    """fold(fn, start) along one dim of int64 a, kept with size 1; fn add, mul, max or min."""
    op = _code(fn, REDUCE_OPS)

    def ret(a: TensorData, dim: int) -> TensorData:
        out_shape = a.shape[:dim] + (1,) + a.shape[dim + 1 :]
        out_l, outer_l, n_out, length, stride = rows_plan(a.shape, a.strides, dim, strides_from_shape(out_shape))
        o = empty(out_shape, int64)
        if n_out:
            rt = runtime()
            code = _lib(rt).launch_int_reduce(op, ptr(o), out_l, ptr(a), outer_l, length, stride, typed_start(start, a), rt.stream())
            check(code, _lib(rt), f"int64 reduce({fn.__name__}) of {a.shape} along {dim}")
        return o

    return ret


def fill(out: TensorData, value: int) -> None:
    """Every element of int64 out (any layout) set to value."""
    if out.size:
        rt = runtime()
        check(_lib(rt).launch_int_fill(ptr(out), out_layout(out), int(value), rt.stream()), _lib(rt), "int64 fill")


def arange(out: TensorData) -> None:
    """out[i] = i over a contiguous int64 tensor."""
    if not out.is_contiguous():
        raise CudaShapeError(f"arange needs a contiguous tensor, got {out.shape} strides {out.strides}")
    rt = runtime()
    check(_lib(rt).launch_int_arange(ptr(out), out.size, rt.stream()), _lib(rt), "int64 arange")


def cast(a: TensorData, dtype: DType, out: Optional[TensorData] = None) -> TensorData:
    """a's values in dtype where one side is int64 (floats truncate toward zero; int64 rounds to
    the nearest float32, then to a 16-bit format); into out (any layout) or a new contiguous tensor."""
    out_l, a_l = map_layouts("cast", a, out)
    o = empty(a.shape, dtype) if out is None else out
    if not o.size:
        return o
    rt = runtime()
    lib = _lib(rt)
    what = f"cast {a.dtype.name} {a.shape} -> {o.dtype.name}"
    if a.dtype.storage == o.dtype.storage:
        check(lib.launch_int_map(_code(operators.id, UNARY_OPS), ptr(o), out_l, ptr(a), a_l, rt.stream()), lib, what)
    elif o.dtype.storage == "int64":
        check(lib.launch_to_int64(ptr(o), out_l, ptr(a), FLOAT_CODES[a.dtype.storage], a_l, rt.stream()), lib, what)
    else:
        check(lib.launch_from_int64(ptr(o), FLOAT_CODES[o.dtype.storage], out_l, ptr(a), a_l, rt.stream()), lib, what)
    return o


def arg_reduce(a: TensorData, dim: int, largest: bool) -> TensorData:
    """int64 position of the first max (largest) or min along dim of float32 or int64 a, kept with
    size 1; NaN is the extreme."""
    code = _value_code(a, "argmax" if largest else "argmin")
    out_shape = a.shape[:dim] + (1,) + a.shape[dim + 1 :]
    out_l, outer_l, n_out, length, stride = rows_plan(a.shape, a.strides, dim, strides_from_shape(out_shape))
    o = empty(out_shape, int64)
    if n_out:
        rt = runtime()
        lib = _lib(rt)
        code = lib.launch_arg_reduce(ptr(o), out_l, ptr(a), code, outer_l, length, stride, int(largest), rt.stream())
        check(code, lib, f"arg_reduce of {a.shape} along {dim}")
    return o


def cumsum(a: TensorData, dim: int) -> TensorData:
    """Running sums along dim of float32 (in order) or int64 a, into a new contiguous tensor."""
    code = _value_code(a, "cumsum")
    out_strides = strides_from_shape(a.shape)
    out_l, outer_l, rows, length, stride = rows_plan(a.shape, a.strides, dim, out_strides)
    o = empty(a.shape, a.dtype)
    if rows and length:
        rt = runtime()
        lib = _lib(rt)
        step = out_strides[dim] if length > 1 else 1
        check(lib.launch_cumsum(ptr(o), out_l, step, ptr(a), code, outer_l, length, stride, rt.stream()), lib, f"cumsum of {a.shape}")
    return o


def sort_indices(a: TensorData, dim: int, descending: bool) -> TensorData:
    """int64 positions of a stable sort along dim of float32 or int64 a (rows of up to MAX_SORT_ROW)."""
    code = _value_code(a, "sort")
    if a.shape[dim] > MAX_SORT_ROW:
        raise CudaShapeError(
            f"sort on CUDA handles rows of up to {MAX_SORT_ROW} elements; dim {dim} of shape {a.shape} has {a.shape[dim]} "
            f"(topk with k <= 32 works on wider rows; or sort on the CPU)"
        )
    out_strides = strides_from_shape(a.shape)
    out_l, outer_l, rows, length, stride = rows_plan(a.shape, a.strides, dim, out_strides)
    o = empty(a.shape, int64)
    if rows and length:
        rt = runtime()
        lib = _lib(rt)
        step = out_strides[dim] if length > 1 else 1
        code = lib.launch_sort_rows(ptr(o), out_l, step, ptr(a), code, outer_l, length, stride, int(descending), rt.stream())
        check(code, lib, f"sort of {a.shape} along {dim}")
    return o


def contiguous(t: TensorData) -> TensorData:
    """An int64 t itself when row-major, else a row-major copy."""
    return t if t.is_contiguous() else cast(t, int64)


def gather_rows(table: TensorData, ids: TensorData) -> TensorData:
    """Rows of a contiguous int64 table [V, C] at contiguous int64 ids [...] -> [..., C] (0 outside [0, V))."""
    rows, cols = table.shape
    o = empty(ids.shape + (cols,), int64)
    if o.size:
        rt = runtime()
        lib = _lib(rt)
        check(lib.launch_int_gather_rows(ptr(o), ptr(table), ptr(ids), ids.size, rows, cols, rt.stream()), lib, "int64 gather")
    return o

