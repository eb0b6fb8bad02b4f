"""Bindings of kv_cache_kernel.so (src/kv_cache_kernel.cu): the KV cache's append at a slot held in
device memory, so that one captured decoding step replays at every slot."""

from __future__ import annotations

import ctypes

from ..tensor_data import TensorData
from .combine import contiguous
from .runtime import CudaShapeError, check, ptr, runtime

_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
SIGNATURES = {
    "launch_slot_write": (_I, [_P, _P, _P, _I, _I, _I, _L, _L, _P]),
}


def slot_write(buffer: TensorData, values: TensorData, slot: TensorData) -> None:
    """buffer[:, s, :] = values for buffer [rows, slots, n] and values [rows, n], s = slot's one value,
    read by the kernel; in place."""
    rows, slots, n = buffer.shape
    if n > 1 and buffer.strides[2] != 1:
        raise CudaShapeError(f"slot_write's buffer needs a unit stride in its last dim, got strides {buffer.strides}")
    if rows * n:
        rt = runtime()
        lib = rt.lib("kv_cache_kernel", SIGNATURES)
        code = lib.launch_slot_write(
            ptr(buffer), ptr(contiguous(values)), ptr(contiguous(slot)), rows, slots, n, buffer.strides[0],
            buffer.strides[1], rt.stream(),
        )  # fmt: skip
        check(code, lib, f"slot_write {buffer.shape}")
