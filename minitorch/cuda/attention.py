"""Bindings of attention_kernel.so (src/attention_kernel.cu): attention without the [Tq, Tk] matrix.
Its products follow minitorch.set_float32_matmul_precision, as the matmul library's do."""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

from ..precision import precision_code
from ..tensor_data import TensorData
from ..tensor_ops import ATTENTION_ACTIVATIONS
from .combine import contiguous, fill
from .runtime import CudaShapeError, check, empty, ptr, runtime

MAX_HEAD_DIM = 128
_P, _I, _F, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_longlong
SIGNATURES = {
    "launch_attention_fw": (_I, [_P] * 6 + [_I] * 8 + [_F, _P]),
    "attention_bw_workspace_floats": (_LL, [_I, _I, _I]),
    "launch_attention_bw": (_I, [_P] * 11 + [_I] * 8 + [_F, _P]),
}


def _sizes(q: TensorData, k: TensorData) -> Tuple[int, int, int, int, int]:
    B, H, Tq, D = q.shape
    if D > MAX_HEAD_DIM:
        raise CudaShapeError(f"fused attention: the CUDA kernels take head dims up to {MAX_HEAD_DIM}, got q {q.shape}")
    return B, H, Tq, k.shape[2], D


def attention_fw(
    q: TensorData, k: TensorData, v: TensorData, mask: Optional[TensorData], causal: bool, activation: str, scale: float
) -> Tuple[TensorData, TensorData]:
    """(out [B, H, Tq, D], lse [B, H, Tq]); lse is the softmax's log-sum-exp per query (-inf for a row
    with no key), 0 for relu."""
    B, H, Tq, Tk, D = _sizes(q, k)
    out, lse = empty(q.shape), empty((B, H, Tq))
    if out.size:
        rt = runtime()
        lib = rt.lib("attention_kernel", SIGNATURES)
        qc, kc, vc = contiguous(q), contiguous(k), contiguous(v)
        mask_ptr = None if mask is None else ptr(contiguous(mask))
        code = lib.launch_attention_fw(
            ptr(out), ptr(lse), ptr(qc), ptr(kc), ptr(vc), mask_ptr, B, H, Tq, Tk, D, int(bool(causal)),
            ATTENTION_ACTIVATIONS.index(activation), precision_code(), float(scale), rt.stream(),
        )  # fmt: skip
        check(code, lib, f"fused_attention_fw q {q.shape} k {k.shape}")
    return out, lse


def attention_bw(
    grad_out: TensorData, q: TensorData, k: TensorData, v: TensorData, out: TensorData, lse: TensorData,
    mask: Optional[TensorData], causal: bool, activation: str, scale: float,
) -> Tuple[TensorData, TensorData, TensorData]:  # fmt: skip
    """(dq, dk, dv), recomputing the scores tile by tile from q, k, v and lse.  dq is accumulated with
    atomics, so its last bits may vary from run to run."""
    B, H, Tq, Tk, D = _sizes(q, k)
    dq, dk, dv = empty(q.shape), empty(k.shape), empty(v.shape)
    if q.size == 0:
        fill(dk, 0.0)
        fill(dv, 0.0)
        return dq, dk, dv
    rt = runtime()
    lib = rt.lib("attention_kernel", SIGNATURES)
    act = ATTENTION_ACTIVATIONS.index(activation)
    ws = rt.buffer(lib.attention_bw_workspace_floats(B, H, Tq) if act == 0 else 1)
    tensors = tuple(contiguous(t) for t in (grad_out, q, k, v, out, lse))
    mask_ptr = None if mask is None else ptr(contiguous(mask))
    code = lib.launch_attention_bw(
        ptr(dq), ptr(dk), ptr(dv), *(ptr(t) for t in tensors), mask_ptr, ws.data_ptr(), B, H, Tq, Tk, D,
        int(bool(causal)), act, precision_code(), float(scale), rt.stream(),
    )  # fmt: skip
    check(code, lib, f"fused_attention_bw q {q.shape} k {k.shape}")
    return dq, dk, dv
