"""Bindings of kv_cache_kernel.so (src/kv_cache_kernel.cu): the KV cache's append at a slot held in
device memory and the attention of one query per row over the slots filled so far, so that one
captured decoding step replays at every slot.  Both take float32 or bfloat16 tensors (the cache, the
values written, q and the output in one dtype; slot and pads float32); the bf16 attention computes in
float32 and rounds only its output."""

from __future__ import annotations

import ctypes
from typing import Dict, Optional, Tuple

from ..dtypes import bfloat16
from ..tensor_data import TensorData
from .combine import contiguous
from .runtime import CudaShapeError, check, empty, ptr, require_float32, runtime

_P, _I, _L, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_float
_fits: Dict[Tuple[int, int, int], bool] = {}  # (width, heads, head dim): whether slot_attention's kernel runs them
SIGNATURES = {
    "launch_slot_write": (_I, [_P, _P, _L, _P, _I, _I, _I, _L, _L, _P]),
    "slot_attention_smem_bytes": (_L, [_I, _I, _I]),
    "launch_slot_attention": (_I, [_P, _P, _L, _P, _P, _L, _P, _P, _I, _I, _I, _I, _F, _P]),
    "launch_slot_write_bf16": (_I, [_P, _P, _L, _P, _I, _I, _I, _L, _L, _P]),
    "launch_slot_attention_bf16": (_I, [_P, _P, _L, _P, _P, _L, _P, _P, _I, _I, _I, _I, _F, _P]),
}


def _suffix(op: str, *tensors: TensorData) -> str:
    """The launcher suffix of the tensors' common dtype: "_bf16" or "" (float32); NoKernelError for
    any other dtype or a mix."""
    if all(t.dtype == bfloat16 for t in tensors):
        return "_bf16"
    require_float32(op, *tensors)
    return ""


def slot_write(buffer: TensorData, values: TensorData, slot: TensorData) -> None:
    """buffer[:, s, :] = values for buffer [rows, slots, n] and values [rows, n] (rows at any stride,
    e.g. a third of packed q/k/v), s = slot's one value, read by the kernel; in place."""
    rows, slots, n = buffer.shape
    suffix = _suffix("slot_write", buffer, values)
    require_float32("slot_write", slot)
    if n > 1 and buffer.strides[2] != 1:
        raise CudaShapeError(f"slot_write's buffer needs a unit stride in its last dim, got strides {buffer.strides}")
    if rows * n:
        if n > 1 and values.strides[1] != 1:
            values = contiguous(values)
        rt = runtime()
        lib = rt.lib("kv_cache_kernel", SIGNATURES)
        code = getattr(lib, "launch_slot_write" + suffix)(
            ptr(buffer), ptr(values), values.strides[0], ptr(contiguous(slot)), rows, slots, n, buffer.strides[0],
            buffer.strides[1], rt.stream(),
        )  # fmt: skip
        check(code, lib, f"slot_write {buffer.shape}")


def slot_attention(
    q: TensorData, keys: TensorData, values: TensorData, slot: TensorData, pads: TensorData, width: int, heads: int,
    scale: float,
) -> Optional[TensorData]:  # fmt: skip
    """out [rows, C]: row r's query q[r] [C] attending, head by head, over its keys and values [rows,
    slots, C] at slots [pads[r], min(s, width - 1)], s = slot's one value (both read by the kernel).
    None when the kernel cannot run these sizes (C over 2048, or the [heads, width] scores and the
    warps' [8, C] partial sums exceed a block's shared memory): the caller composes the op."""
    rows, C = q.shape
    suffix = _suffix("slot_attention", q, keys, values)
    require_float32("slot_attention", slot, pads)
    if keys.strides[1:] != (C, 1) or values.strides != keys.strides:
        raise CudaShapeError(
            f"slot_attention needs [rows, slots, C] caches with slot stride C, got strides {keys.strides} and "
            f"{values.strides}"
        )
    if C > 1 and q.strides[1] != 1:
        q = contiguous(q)
    rt = runtime()
    lib = rt.lib("kv_cache_kernel", SIGNATURES)
    key = (width, heads, C // heads)
    if key not in _fits:
        _fits[key] = lib.slot_attention_smem_bytes(*key) >= 0
    if not _fits[key]:
        return None
    out = empty((rows, C), q.dtype)
    if rows:
        code = getattr(lib, "launch_slot_attention" + suffix)(
            ptr(out), ptr(q), q.strides[0], ptr(keys), ptr(values), keys.strides[0], ptr(contiguous(slot)),
            ptr(contiguous(pads)), rows, width, heads, C // heads, float(scale), rt.stream(),
        )  # fmt: skip
        check(code, lib, f"slot_attention q {q.shape} over {keys.shape}")
    return out
