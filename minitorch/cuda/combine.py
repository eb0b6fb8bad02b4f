"""Bindings of combine.so (src/combine.cu): elementwise map/zip/fill/arange and reduce along a dim.

The scalar function of `map`/`zip`/`reduce` is one of minitorch.operators; it becomes an opcode of
the kernels (tables by position, checked against the names the library exports when it loads).

Storage: float32 and bfloat16 (runtime.KERNEL_STORAGE), math in float32.  All inputs of a launch
share one format: in a zip of a bfloat16 tensor with a float32 one the bfloat16 one is widened
first, with a bool one (float32 storage) the bool is narrowed (both exact), so that the output is
stored as the dtype the operands promote to.
A new output has its inputs' format (a comparison's, bool, is float32 storage); a given `out` may
have either.  Reductions accumulate in float32 and round once into a bfloat16 output.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Dict, Optional, Sequence, Tuple

from .. import operators
from ..dtypes import DType, bfloat16, bool_, float32
from ..tensor_data import TensorData, coalesce, prod, shape_broadcast, strides_from_shape
from .layout import MtLayout, elementwise_plan, layout, remember
from .runtime import (
    KERNEL_STORAGE, CudaShapeError, Runtime, check, check_names, empty, on_load, ptr, runtime, storage_code,
)

UNARY_OPS = (
    "id", "neg", "sigmoid", "relu", "log", "exp", "inv", "tanh", "gelu", "abs", "sqrt", "sin", "cos", "floor", "gelu_erf",
)  # fmt: skip
BINARY_OPS = (
    "add", "mul", "lt", "eq", "is_close", "max", "pow",
    "relu_back", "log_back", "inv_back", "sigmoid_back", "tanh_back", "gelu_back", "min", "div", "gelu_erf_back",
)  # fmt: skip
REDUCE_OPS = ("add", "mul", "max", "min")
COMPARISONS = ("lt", "eq", "is_close")  # their results are bool: float32 storage
UNARY_CODES: Dict[Callable, int] = {getattr(operators, n): i for i, n in enumerate(UNARY_OPS)}
BINARY_CODES: Dict[Callable, int] = {getattr(operators, n): i for i, n in enumerate(BINARY_OPS)}

_P, _I, _F, _LL, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_longlong, MtLayout
SIGNATURES = {
    "minitorch_unary_op_count": (_I, []),
    "minitorch_unary_op_name": (ctypes.c_char_p, [_I]),
    "minitorch_binary_op_count": (_I, []),
    "minitorch_binary_op_name": (ctypes.c_char_p, [_I]),
    "launch_map": (_I, [_I, _I, _I, _P, _L, _P, _L, _P]),
    "launch_map_scalar": (_I, [_I, _I, _I, _P, _L, _P, _L, _F, _P]),
    "launch_zip": (_I, [_I, _I, _I, _P, _L, _P, _L, _P, _L, _P]),
    "launch_fill": (_I, [_P, _L, _F, _P]),
    "launch_arange": (_I, [_P, _I, _P]),
    "reduce_workspace_floats": (_LL, [_I, _I, _I]),
    "launch_reduce": (_I, [_I, _I, _I, _P, _L, _P, _L, _I, _I, _F, _P, _LL, _P]),
}


def lib(rt: Runtime) -> ctypes.CDLL:
    return rt.lib("combine", SIGNATURES)


@on_load
def _check_opcode_tables(rt: Runtime) -> None:
    c = lib(rt)
    check_names("combine", "unary opcodes", c.minitorch_unary_op_count, c.minitorch_unary_op_name, UNARY_OPS, __name__)
    check_names("combine", "binary opcodes", c.minitorch_binary_op_count, c.minitorch_binary_op_name, BINARY_OPS, __name__)


def opcode(fn: Callable, table: Dict[Callable, int], kind: str, names: Sequence[str]) -> int:
    """The kernels' opcode of an operators function; ValueError naming the supported ones."""
    code = table.get(fn)
    if code is None:
        raise ValueError(
            f"CudaKernelOps.{kind}: {getattr(fn, '__name__', fn)!r} has no CUDA kernel; "
            f"supported minitorch.operators functions: {', '.join(names)}"
        )
    return code


_map_plans: Dict[tuple, Tuple[MtLayout, MtLayout]] = {}
_zip_plans: Dict[tuple, Tuple[Tuple[int, ...], MtLayout, MtLayout, MtLayout]] = {}
_out_plans: Dict[tuple, MtLayout] = {}
_reduce_plans: Dict[tuple, tuple] = {}
_column_workspace: Dict[tuple, int] = {}  # (n_out, n_rows, row_stride) -> column_sums' workspace floats


def out_layout(out: TensorData) -> MtLayout:
    """Layout of a tensor that an op only writes (fill, uniform)."""
    key = (out.shape, out.strides)
    plan = _out_plans.get(key)
    if plan is None:
        plan = remember(_out_plans, key, elementwise_plan(out.shape, out.strides, [])[0])
    return plan


def map_layouts(op: str, a: TensorData, out: Optional[TensorData]) -> Tuple[MtLayout, MtLayout]:
    """(out layout, a's layout) of an elementwise op of a into out (None: a new contiguous tensor)."""
    key = (a.shape, a.strides, None if out is None else (out.shape, out.strides))
    plan = _map_plans.get(key)
    if plan is None:
        if out is None:
            out_shape, out_strides = a.shape, strides_from_shape(a.shape)
        else:
            out_shape, out_strides = out.shape, out.strides
            if shape_broadcast(a.shape, out_shape) != out_shape:
                raise CudaShapeError(f"{op}: input of shape {a.shape} does not broadcast to out of shape {out_shape}")
        plan = remember(_map_plans, key, elementwise_plan(out_shape, out_strides, [(a.shape, a.strides)]))
    return plan  # type: ignore[return-value]


def fill(out: TensorData, value: float) -> None:
    """Set every element of out (any layout) to value."""
    if out.size:
        rt = runtime()
        c = lib(rt)
        check(c.launch_fill(ptr(out), out_layout(out), value, rt.stream()), c, "fill")


def arange(out: TensorData) -> None:
    """out[i] = i over the flat storage of a contiguous tensor."""
    if not out.is_contiguous():
        raise CudaShapeError(f"arange needs a contiguous tensor, got {out.shape} strides {out.strides}")
    rt = runtime()
    c = lib(rt)
    check(c.launch_arange(ptr(out), out.size, rt.stream()), c, "arange")


def result_dtype(a: TensorData, compare: bool = False) -> DType:
    """The storage dtype of a new output of an op whose inputs are stored like a: bfloat16 for
    bfloat16 inputs, else float32 (and float32 for a comparison's bool)."""
    return bfloat16 if not compare and a.dtype.storage == bfloat16.storage else float32


def map_op(fn: Callable[[float], float]) -> Callable[..., TensorData]:
    """fn(a) elementwise; `out`, if given, is written in place (a broadcasts to its shape)."""
    op = opcode(fn, UNARY_CODES, "map", UNARY_OPS)
    name = f"map({UNARY_OPS[op]})"

    def ret(a: TensorData, out: Optional[TensorData] = None) -> TensorData:
        out_l, a_l = map_layouts(name, a, out)
        o = empty(a.shape, result_dtype(a)) if out is None else out
        if o.size:
            rt = runtime()
            c = lib(rt)
            code = c.launch_map(op, storage_code(o), storage_code(a), ptr(o), out_l, ptr(a), a_l, rt.stream())
            check(code, c, name)
        return o

    return ret


def map_scalar_op(fn: Callable[[float, float], float]) -> Callable[..., TensorData]:
    """fn(a, s) elementwise with a Python float s; `out`, if given, is written in place (a broadcasts
    to its shape)."""
    op = opcode(fn, BINARY_CODES, "map_scalar", BINARY_OPS)
    name = f"map_scalar({BINARY_OPS[op]})"
    compare = BINARY_OPS[op] in COMPARISONS

    def ret(a: TensorData, s: float, out: Optional[TensorData] = None) -> TensorData:
        out_l, a_l = map_layouts(name, a, out)
        o = empty(a.shape, result_dtype(a, compare)) if out is None else out
        if o.size:
            rt = runtime()
            c = lib(rt)
            code = c.launch_map_scalar(op, storage_code(o), storage_code(a), ptr(o), out_l, ptr(a), a_l, s, rt.stream())
            check(code, c, name)
        return o

    return ret


def zip_op(fn: Callable[[float, float], float]) -> Callable[[TensorData, TensorData], TensorData]:
    """fn(a, b) elementwise with numpy broadcasting; the result is a new contiguous tensor."""
    op = opcode(fn, BINARY_CODES, "zip", BINARY_OPS)
    name = f"zip({BINARY_OPS[op]})"
    compare = BINARY_OPS[op] in COMPARISONS

    def ret(a: TensorData, b: TensorData) -> TensorData:
        if a.dtype.storage != b.dtype.storage:
            a, b = common_storage(a, b)
        out_shape, out_l, a_l, b_l = zip_layouts(a, b)
        o = empty(out_shape, result_dtype(a, compare))
        if o.size:
            rt = runtime()
            c = lib(rt)
            code = c.launch_zip(op, storage_code(o), storage_code(a), ptr(o), out_l, ptr(a), a_l, ptr(b), b_l, rt.stream())
            check(code, c, name)
        return o

    return ret


def zip_layouts(a: TensorData, b: TensorData) -> Tuple[Tuple[int, ...], MtLayout, MtLayout, MtLayout]:
    """(broadcast shape, out layout, a's layout, b's layout) of an elementwise op of a and b into a
    new contiguous tensor."""
    key = (a.shape, a.strides, b.shape, b.strides)
    plan = _zip_plans.get(key)
    if plan is None:
        out_shape = shape_broadcast(a.shape, b.shape)
        layouts = elementwise_plan(out_shape, strides_from_shape(out_shape), [(a.shape, a.strides), (b.shape, b.strides)])
        plan = remember(_zip_plans, key, (out_shape,) + layouts)
    return plan  # type: ignore[return-value]


def common_storage(a: TensorData, b: TensorData) -> Tuple[TensorData, TensorData]:
    """a and b (one bfloat16, one float32 storage) in one storage: a bool operand narrowed to
    bfloat16 (a bool and a bfloat16 promote to bfloat16), else the bfloat16 one widened to float32."""
    if bool_ in (a.dtype, b.dtype):
        return tuple(copy(t, empty(t.shape, bfloat16)) if t.dtype is bool_ else t for t in (a, b))  # type: ignore[return-value]
    return tuple(t if t.dtype.storage == float32.storage else copy(t, empty(t.shape)) for t in (a, b))  # type: ignore[return-value]


def reduce_op(fn: Callable[[float, float], float], start: float = 0.0) -> Callable[[TensorData, int], TensorData]:
    """fold(fn, start) along one dim, which is kept with size 1; fn is add, mul, max or min.  A bfloat16
    input gives a bfloat16 output (float32 accumulation, one rounding)."""
    op = opcode(fn, BINARY_CODES, "reduce", REDUCE_OPS)
    if BINARY_OPS[op] not in REDUCE_OPS:
        raise ValueError(f"CudaKernelOps.reduce supports {', '.join(REDUCE_OPS)}, not {BINARY_OPS[op]}")
    name = f"reduce({BINARY_OPS[op]})"
    start = float(start)

    def ret(a: TensorData, dim: int) -> TensorData:
        rt = runtime()
        c = lib(rt)
        key = (a.shape, a.strides, dim)
        plan = _reduce_plans.get(key)
        if plan is None:
            plan = remember(_reduce_plans, key, _reduce_plan(c, a.shape, a.strides, dim))
        out_shape, out_l, outer_l, n_out, reduce_len, reduce_stride, ws_len = plan
        o = empty(out_shape, result_dtype(a))
        if n_out:
            ws = rt.buffer(ws_len) if ws_len else None
            fmt = storage_code(a)
            code = c.launch_reduce(
                op, fmt, fmt, ptr(o), out_l, ptr(a), outer_l, reduce_len, reduce_stride, start,
                None if ws is None else ws.data_ptr(), ws_len, rt.stream(),
            )  # fmt: skip
            check(code, c, name)
        return o

    return ret


def rows_plan(
    shape: Tuple[int, ...], strides: Tuple[int, ...], dim: int, out_strides: Tuple[int, ...]
) -> Tuple[MtLayout, MtLayout, int, int, int]:
    """The rows along dim of a tensor (shape, strides) and of an output (shape with dim of size 1 or
    kept; out_strides): (output rows' layout, input rows' layout, rows, length, stride along dim),
    the layouts mapping a row's ordinal to the offset of its first element."""
    layout(shape, strides)  # rejects layouts beyond 32-bit offsets
    keep = [d for d in range(len(shape)) if d != dim]
    outer_shape = [shape[d] for d in keep]
    merged_shape, (out_st, in_st) = coalesce(outer_shape, [[out_strides[d] for d in keep], [strides[d] for d in keep]])
    length = shape[dim]
    # A dim of size 1 has an arbitrary stride; 1 keeps it on the row kernel's path.
    stride = strides[dim] if length > 1 else 1
    return layout(merged_shape, out_st), layout(merged_shape, in_st), prod(outer_shape), length, stride


def _reduce_plan(c: ctypes.CDLL, shape: Tuple[int, ...], strides: Tuple[int, ...], dim: int) -> tuple:
    out_shape = shape[:dim] + (1,) + shape[dim + 1 :]
    out_l, outer_l, n_out, reduce_len, reduce_stride = rows_plan(shape, strides, dim, strides_from_shape(out_shape))
    # The workspace size depends only on the sizes and the device, so it is planned once too.
    ws_len = c.reduce_workspace_floats(n_out, reduce_len, reduce_stride) if n_out else 0
    return out_shape, out_l, outer_l, n_out, reduce_len, reduce_stride, ws_len


def column_sums(
    out: int, a: int, n_out: int, n_rows: int, row_stride: int, dtype: DType = float32, column_stride: int = 1
) -> None:  # fmt: skip
    """out[o] = sum over r < n_rows of a[o * column_stride + r * row_stride], for o < n_out: raw pointers,
    a of dtype (float32 or bfloat16), float32 out and sums, deterministic (a bias gradient: one 4-column
    load a row where the columns are adjacent)."""
    rt = runtime()
    c = lib(rt)
    key = (n_out, n_rows, row_stride)
    ws_len = _column_workspace.get(key)
    if ws_len is None:  # depends only on the sizes and the device, as _reduce_plan's
        ws_len = remember(_column_workspace, key, c.reduce_workspace_floats(n_out, n_rows, row_stride))
    ws = rt.buffer(ws_len) if ws_len else None
    code = c.launch_reduce(
        BINARY_CODES[operators.add], 0, KERNEL_STORAGE.index(dtype.storage), out, layout((n_out,), (1,)), a,
        layout((n_out,), (column_stride,)), n_rows, row_stride, 0.0, None if ws is None else ws.data_ptr(), ws_len,
        rt.stream(),
    )  # fmt: skip
    check(code, c, f"column sums of [{n_rows}, {n_out}] {dtype}")


def add_into(dst: int, src: int, n: int) -> None:
    """dst[i] += src[i] for i < n (raw pointers)."""
    rt = runtime()
    c = lib(rt)
    flat = layout((n,), (1,))
    code = c.launch_zip(BINARY_CODES[operators.add], 0, 0, dst, flat, dst, flat, src, flat, rt.stream())
    check(code, c, f"accumulate {n} floats")


def contiguous(t: TensorData) -> TensorData:
    """t itself when row-major, else a row-major copy."""
    return t if t.is_contiguous() else copy(t)


copy = map_op(operators.id)  # a into out (any storage of both), or into a new contiguous tensor of its storage
