"""Bindings of softmax_kernel.so (src/softmax_kernel.cu): fused attention softmax, forward and backward.

Scores, probabilities and their gradients are float32 or bfloat16 (runtime.KERNEL_STORAGE); the mask
is read as float32; the math is float32."""

from __future__ import annotations

import ctypes
from typing import Optional

from ..dtypes import float32
from ..tensor_data import TensorData
from .combine import contiguous
from .convert import cast
from .runtime import check, empty, ptr, runtime, storage_code

_P, _I = ctypes.c_void_p, ctypes.c_int
SIGNATURES = {
    "launch_attn_softmax": (_I, [_I, _P, _P, _P, _I, _I, _I, _I, _I, _P]),
    "launch_attn_softmax_bw": (_I, [_I, _P, _P, _P, _I, _I, _P]),
}


def attn_softmax_fw(inp: TensorData, mask: Optional[TensorData], causal: bool) -> TensorData:
    """Softmax over the last dim of scores [B, H, Tq, Tk] + mask [B, Tk], causal inside the kernel;
    the result has the scores' dtype."""
    B, H, Tq, Tk = inp.shape
    out = empty(inp.shape, inp.dtype)
    if out.size:
        rt = runtime()
        lib = rt.lib("softmax_kernel", SIGNATURES)
        x = contiguous(inp)
        if mask is not None and mask.dtype.storage != float32.storage:
            mask = cast(mask, float32)
        mask_ptr = None if mask is None else ptr(contiguous(mask))
        code = lib.launch_attn_softmax(
            storage_code(x), ptr(out), ptr(x), mask_ptr, B, H, Tq, Tk, int(bool(causal)), rt.stream()
        )
        check(code, lib, f"attn_softmax_fw {inp.shape}")
    return out


def attn_softmax_bw(grad_out: TensorData, soft_out: TensorData) -> TensorData:
    """soft_out * (grad_out - sum_lastdim(grad_out * soft_out)), in soft_out's dtype (a grad_out
    stored otherwise is cast to it first)."""
    out = empty(grad_out.shape, soft_out.dtype)
    if out.size:
        rt = runtime()
        lib = rt.lib("softmax_kernel", SIGNATURES)
        k_len = grad_out.shape[-1]
        if grad_out.dtype.storage != soft_out.dtype.storage:
            grad_out = cast(grad_out, soft_out.dtype)
        g, y = contiguous(grad_out), contiguous(soft_out)
        code = lib.launch_attn_softmax_bw(
            storage_code(y), ptr(out), ptr(g), ptr(y), out.size // k_len, k_len, rt.stream()
        )
        check(code, lib, f"attn_softmax_bw {grad_out.shape}")
    return out
