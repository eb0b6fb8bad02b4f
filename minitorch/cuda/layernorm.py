"""Bindings of layernorm_kernel.so (src/layernorm_kernel.cu): fused LayerNorm, forward and backward.

The input, output and their gradients are float32 or bfloat16 (runtime.KERNEL_STORAGE); gamma,
beta, their gradients and the saved mean and rstd are float32, and so is all the math."""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

from ..tensor_data import TensorData
from .combine import contiguous, fill
from .convert import cast
from .runtime import CudaShapeError, check, empty, ptr, runtime, storage_code

_P, _I, _F, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_longlong
SIGNATURES = {
    "launch_layernorm": (_I, [_I, _P, _P, _P, _P, _P, _P, _I, _I, _F, _P]),
    "layernorm_bw_workspace_floats": (_LL, [_I, _I]),
    "launch_layernorm_bw": (_I, [_I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _P]),
}


def layernorm_fw(inp: TensorData, gamma: TensorData, beta: TensorData, eps: float) -> Tuple[TensorData, TensorData, TensorData]:
    """(out [inp's dtype], mean [rows], rstd [rows]) of LayerNorm over the last dim."""
    C = inp.shape[-1]
    rows = inp.size // C
    out, mean, rstd = empty(inp.shape, inp.dtype), empty((rows,)), empty((rows,))
    if rows:
        rt = runtime()
        lib = rt.lib("layernorm_kernel", SIGNATURES)
        x, g, b = contiguous(inp), contiguous(gamma), contiguous(beta)
        code = lib.launch_layernorm(
            storage_code(x), ptr(out), ptr(mean), ptr(rstd), ptr(x), ptr(g), ptr(b), rows, C, float(eps), rt.stream()
        )
        check(code, lib, f"layernorm_fw {inp.shape}")
    return out, mean, rstd


def layernorm_bw(
    grad_out: TensorData, inp: TensorData, gamma: TensorData, mean: TensorData, rstd: TensorData,
    addend: Optional[TensorData] = None,
) -> Tuple[TensorData, TensorData, TensorData]:  # fmt: skip
    """(dinp [inp's dtype], dgamma, dbeta [float32]) of LayerNorm; a grad_out stored otherwise than
    inp is cast to inp's dtype first. addend (inp's shape and dtype): added to dinp in the kernel, in
    float32 before dinp's rounding (inp's gradient from its other uses)."""
    if addend is not None and (addend.shape != inp.shape or addend.dtype.storage != inp.dtype.storage):
        raise CudaShapeError(f"layernorm_bw addend {addend.dtype.name} {addend.shape} for input {inp.dtype.name} {inp.shape}")
    C = inp.shape[-1]
    rows = inp.size // C
    dinp, dgamma, dbeta = empty(inp.shape, inp.dtype), empty((C,)), empty((C,))
    if not rows:
        fill(dgamma, 0.0)
        fill(dbeta, 0.0)
        return dinp, dgamma, dbeta
    rt = runtime()
    lib = rt.lib("layernorm_kernel", SIGNATURES)
    ws_len = lib.layernorm_bw_workspace_floats(rows, C)
    if ws_len < 0:  # the size query itself failed: it returns minus the CUDA error code
        check(int(-ws_len), lib, f"layernorm_bw workspace query for [{rows}, {C}]")
    ws = rt.buffer(max(ws_len, 1))
    if grad_out.dtype.storage != inp.dtype.storage:
        grad_out = cast(grad_out, inp.dtype)
    tensors = tuple(contiguous(t) for t in (grad_out, inp, gamma, mean, rstd))
    add = None if addend is None else contiguous(addend)
    code = lib.launch_layernorm_bw(
        storage_code(inp), ptr(dinp), ptr(dgamma), ptr(dbeta), *(ptr(t) for t in tensors), None if add is None else ptr(add),
        ws.data_ptr(), rows, C, rt.stream(),
    )  # fmt: skip
    check(code, lib, f"layernorm_bw {inp.shape}")
    return dinp, dgamma, dbeta
