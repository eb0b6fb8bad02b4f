"""Bindings of embedding_kernel.so (src/embedding_kernel.cu): row gather and its scatter-add, and the
row gather over rows of their own strides (gather_rows: the KV cache's reorder by row ids).

Ids live on the device, so they cannot be checked without a copy: an id that is not an integer in
[0, num_embeddings) gives a row of zeros forward and is skipped backward.

Rows are float32 or bfloat16 (runtime.KERNEL_STORAGE) on either side of a gather: bfloat16 rows of a
float32 master are rounded once; the scatter-add sums in float32.
"""

from __future__ import annotations

import ctypes
from typing import Dict, Optional, Tuple

from ..dtypes import DType, float32
from ..tensor_data import TensorData
from .combine import contiguous, copy, fill
from .convert import cast
from .layout import remember
from .runtime import CudaShapeError, check, empty, ptr, runtime, storage_code

_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
SIGNATURES = {
    "launch_embedding_fw": (_I, [_I, _I, _P, _P, _P, _I, _I, _I, _P]),
    "embedding_bw_workspace_bytes": (_L, [_I, _I]),
    "launch_embedding_bw": (_I, [_I, _P, _P, _P, _I, _I, _I, _P, _L, _P]),
    "launch_gather_rows": (_I, [_I, _I, _P, _L, _P, _L, _P, _I, _I, _I, _P]),
}

_workspace: Dict[Tuple[int, int], int] = {}  # (positions, num_embeddings) -> the backward's workspace bytes


def bw_workspace_bytes(lib: ctypes.CDLL, positions: int, num_embeddings: int) -> int:
    """Bytes of workspace the scatter-add of `positions` rows into a table of num_embeddings rows uses
    (the radix sort of the positions by row), asked of the library once per size."""
    key = (positions, num_embeddings)
    found = _workspace.get(key)
    if found is None:
        found = int(lib.embedding_bw_workspace_bytes(positions, num_embeddings))
        if found < 0:
            raise CudaShapeError(f"embedding_bw: no workspace size for {positions} positions into {num_embeddings} rows")
        remember(_workspace, key, found)
    return found


def embedding_fw(weight: TensorData, ids: TensorData, dtype: Optional[DType] = None) -> TensorData:
    """weight [V, C] rows picked by ids [...] -> [..., C] of dtype (default weight's: float32, bool
    or bfloat16)."""
    V, C = weight.shape
    out = empty(ids.shape + (C,), dtype or weight.dtype)
    if out.size:
        rt = runtime()
        lib = rt.lib("embedding_kernel", SIGNATURES)
        w, i = contiguous(weight), contiguous(ids)
        code = lib.launch_embedding_fw(
            storage_code(out), storage_code(w), ptr(out), ptr(w), ptr(i), ids.size, V, C, rt.stream()
        )
        check(code, lib, "embedding_fw")
    return out


def embedding_bw(
    grad_out: TensorData, ids: TensorData, num_embeddings: int, dtype: Optional[DType] = None,
    initial: Optional[TensorData] = None, in_place: bool = False,
) -> TensorData:  # fmt: skip
    """Scatter-add of the rows of grad_out [..., C] into a zeroed [num_embeddings, C] of dtype
    (default grad_out's), or into a float32 copy of initial [num_embeddings, C] (one pass that
    replaces the zeros and a later sum with the table's other gradient), summed in float32. With
    in_place the rows go into initial itself, the caller's contiguous float32 table (no pass at all:
    the tied LM head's gradient, which backward hands over)."""
    C = grad_out.shape[-1]
    shape = (num_embeddings, C)
    if initial is not None and initial.shape != shape:
        raise CudaShapeError(f"embedding_bw: initial table {initial.shape} for a gradient of shape {shape}")
    if in_place and initial is not None:
        out = initial
    else:
        out = empty(shape)
        if initial is None:
            fill(out, 0.0)
        else:
            copy(initial, out)
    if grad_out.size:
        rt = runtime()
        lib = rt.lib("embedding_kernel", SIGNATURES)
        g, i = contiguous(grad_out), contiguous(ids)
        ws_bytes = bw_workspace_bytes(lib, ids.size, num_embeddings)
        ws = rt.buffer(-(-ws_bytes // 4))  # the caching allocator's blocks are 512-byte aligned
        code = lib.launch_embedding_bw(
            storage_code(g), ptr(out), ptr(g), ptr(i), ids.size, num_embeddings, C, ws.data_ptr(), ws_bytes, rt.stream()
        )
        check(code, lib, "embedding_bw")
    dtype = dtype or grad_out.dtype
    return out if dtype.storage == float32.storage else cast(out, dtype)


def gather_rows(out: TensorData, source: TensorData, ids: TensorData) -> None:
    """out[r, :] = source[ids[r], :] for out [rows, n] and source [m, n], each row at its own stride
    (unit stride within a row); in place."""
    rows, n = out.shape
    for t, what in ((out, "output"), (source, "source")):
        if n > 1 and t.strides[1] != 1:
            raise CudaShapeError(f"gather_rows' {what} needs a unit stride within rows, got strides {t.strides}")
    if rows * n:
        rt = runtime()
        lib = rt.lib("embedding_kernel", SIGNATURES)
        code = lib.launch_gather_rows(
            storage_code(out), storage_code(source), ptr(out), out.strides[0], ptr(source), source.strides[0],
            ptr(contiguous(ids)), rows, source.shape[0], n, rt.stream(),
        )  # fmt: skip
        check(code, lib, f"gather_rows {source.shape} -> {out.shape}")
