"""Bindings of convert_kernel.so (src/convert_kernel.cu): conversions between float32, bfloat16 and
float16 storage and copies of one 16-bit dtype, over any layouts: the CUDA backend's `cast`."""

from __future__ import annotations

import ctypes
from typing import Optional

from ..dtypes import DType, float32
from ..tensor_data import TensorData
from .combine import copy, map_layouts
from .layout import MtLayout
from .runtime import Runtime, check, check_names, empty, on_load, ptr, runtime

STORAGE_CODES = ("float32", "bfloat16", "float16")  # the kernels' dtype codes, by position

_P, _I, _L = ctypes.c_void_p, ctypes.c_int, MtLayout
SIGNATURES = {
    "minitorch_convert_dtype_count": (_I, []),
    "minitorch_convert_dtype_name": (ctypes.c_char_p, [_I]),
    "launch_convert": (_I, [_P, _I, _L, _P, _I, _L, _P]),
}


def _lib(rt: Runtime) -> ctypes.CDLL:
    return rt.lib("convert_kernel", SIGNATURES)


@on_load
def _check_dtype_codes(rt: Runtime) -> None:
    c = _lib(rt)
    check_names("convert_kernel", "dtype codes", c.minitorch_convert_dtype_count, c.minitorch_convert_dtype_name, STORAGE_CODES, __name__)


def cast(a: TensorData, dtype: DType, out: Optional[TensorData] = None) -> TensorData:
    """a's values in dtype, into out (any layout, of dtype; a broadcasts to it) or into a new
    contiguous tensor.  Between float32 storages (float32 and bool) the copy kernel of combine.so
    runs; anything involving a 16-bit storage, the conversion kernel.  No value test: a cast to bool
    is composed above (TensorBackend.cast)."""
    out_l, a_l = map_layouts("cast", a, out)
    o = empty(a.shape, dtype) if out is None else out
    if a.dtype.storage == float32.storage and o.dtype.storage == float32.storage:
        return copy(a, o)
    if o.size:
        rt = runtime()
        c = _lib(rt)
        src, dst = STORAGE_CODES.index(a.dtype.storage), STORAGE_CODES.index(o.dtype.storage)
        code = c.launch_convert(ptr(a), src, a_l, ptr(o), dst, out_l, rt.stream())
        check(code, c, f"cast {a.dtype.name} {a.shape} -> {o.dtype.name} {o.shape}")
    return o
