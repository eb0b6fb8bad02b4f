"""Bindings of optimizer_kernel.so (src/optimizer_kernel.cu): the fused AdamW update."""

from __future__ import annotations

import ctypes

from ..tensor_data import TensorData
from .combine import contiguous
from .runtime import check, ptr, runtime

_P, _I, _D, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_double, ctypes.c_longlong
SIGNATURES = {"launch_adamw": (_I, [_P, _P, _P, _P, _LL, _D, _D, _D, _D, _D, _I, _P])}


def adamw_step(
    param: TensorData, grad: TensorData, exp_avg: TensorData, exp_avg_sq: TensorData,
    lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
) -> None:  # fmt: skip
    """param, exp_avg and exp_avg_sq (contiguous) updated in place in one pass (28 bytes per element)."""
    rt = runtime()
    lib = rt.lib("optimizer_kernel", SIGNATURES)
    g = contiguous(grad)
    code = lib.launch_adamw(
        ptr(param), ptr(g), ptr(exp_avg), ptr(exp_avg_sq), param.size, lr, beta1, beta2, eps, weight_decay,
        int(step), rt.stream(),
    )  # fmt: skip
    check(code, lib, f"adamw_step {param.shape}")
