"""Bindings of attention_kernel.so (src/attention_kernel.cu, float32) and attention_bf16_kernel.so
(src/attention_bf16_kernel.cu, bfloat16): attention without the [Tq, Tk] matrix.  The hooks dispatch on
the dtype of q, k and v (all float32 or all bfloat16; anything else raises NoKernelError).  The float32
products follow minitorch.set_float32_matmul_precision, as the matmul library's do; the bfloat16 ones
multiply bf16 operands with float32 accumulation.  lse is float32 in both; the mask is read as float32."""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

from ..dtypes import DType, bfloat16, float32
from ..precision import precision_code
from ..tensor_data import TensorData
from ..tensor_ops import ATTENTION_ACTIVATIONS
from .combine import contiguous, fill
from .convert import cast
from .runtime import CudaShapeError, check, empty, ptr, require_float32, runtime

MAX_HEAD_DIM = 128
_P, _I, _F, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_longlong
SIGNATURES = {
    "launch_attention_fw": (_I, [_P] * 6 + [_I] * 8 + [_F, _P]),
    "attention_bw_workspace_floats": (_LL, [_I, _I, _I]),
    "launch_attention_bw": (_I, [_P] * 11 + [_I] * 8 + [_F, _P]),
}
BF16_SIGNATURES = {
    "launch_attention_bf16_fw": (_I, [_P] * 6 + [_I] * 7 + [_F, _P]),
    "attention_bf16_bw_workspace_floats": (_LL, [_I] * 4),
    "launch_attention_bf16_bw": (_I, [_P] * 11 + [_I] * 7 + [_F, _P]),
}


def _sizes(q: TensorData, k: TensorData) -> Tuple[int, int, int, int, int]:
    B, H, Tq, D = q.shape
    if D > MAX_HEAD_DIM:
        raise CudaShapeError(f"fused attention: the CUDA kernels take head dims up to {MAX_HEAD_DIM}, got q {q.shape}")
    return B, H, Tq, k.shape[2], D


def _is_bf16(op: str, *tensors: TensorData) -> bool:
    """True when every tensor is bfloat16; False when all are float32; NoKernelError otherwise."""
    if all(t.dtype == bfloat16 for t in tensors):
        return True
    require_float32(op, *tensors)
    return False


def _as(t: TensorData, dtype: DType) -> TensorData:
    """t contiguous in dtype (no copy when it already is)."""
    return contiguous(t) if t.dtype == dtype else cast(t, dtype)


def _mask_ptr(mask: Optional[TensorData], keep: list) -> Optional[int]:
    """Pointer to the mask as contiguous float32; the tensor goes into `keep`, which the caller holds
    until the kernel is queued (so that no later allocation reuses its memory before the kernel reads it)."""
    if mask is None:
        return None
    keep.append(_as(mask, float32))
    return ptr(keep[-1])


def attention_fw(
    q: TensorData, k: TensorData, v: TensorData, mask: Optional[TensorData], causal: bool, activation: str, scale: float
) -> Tuple[TensorData, TensorData]:
    """(out [B, H, Tq, D] in q's dtype, lse [B, H, Tq] float32); lse is the softmax's log-sum-exp per
    query (-inf for a row with no key), 0 for relu."""
    B, H, Tq, Tk, D = _sizes(q, k)
    bf16 = _is_bf16("attention_fw", q, k, v)
    out, lse = empty(q.shape, q.dtype), empty((B, H, Tq))
    if out.size:
        rt = runtime()
        keep = [contiguous(q), contiguous(k), contiguous(v)]
        head = (ptr(out), ptr(lse), *(ptr(t) for t in keep), _mask_ptr(mask, keep), B, H, Tq, Tk, D, int(bool(causal)))
        act = ATTENTION_ACTIVATIONS.index(activation)
        if bf16:
            lib = rt.lib("attention_bf16_kernel", BF16_SIGNATURES)
            code = lib.launch_attention_bf16_fw(*head, act, float(scale), rt.stream())
        else:
            lib = rt.lib("attention_kernel", SIGNATURES)
            code = lib.launch_attention_fw(*head, act, precision_code(), float(scale), rt.stream())
        check(code, lib, f"fused_attention_fw {q.dtype.name} q {q.shape} k {k.shape}")
    return out, lse


def attention_bw(
    grad_out: TensorData, q: TensorData, k: TensorData, v: TensorData, out: TensorData, lse: TensorData,
    mask: Optional[TensorData], causal: bool, activation: str, scale: float,
) -> Tuple[TensorData, TensorData, TensorData]:  # fmt: skip
    """(dq, dk, dv) in q's dtype, recomputing the scores tile by tile from q, k, v and lse (grad_out is
    taken in q's dtype).  dq is accumulated with float32 atomics, so its last bits may vary from run to
    run."""
    B, H, Tq, Tk, D = _sizes(q, k)
    bf16 = _is_bf16("attention_bw", q, k, v, out)
    dq, dk, dv = empty(q.shape, q.dtype), empty(k.shape, k.dtype), empty(v.shape, v.dtype)
    if q.size == 0:
        zeros = empty(k.shape)
        fill(zeros, 0.0)
        return dq, cast(zeros, k.dtype, dk), cast(zeros, v.dtype, dv)
    rt = runtime()
    act = ATTENTION_ACTIVATIONS.index(activation)
    keep = [_as(grad_out, q.dtype), contiguous(q), contiguous(k), contiguous(v), contiguous(out), _as(lse, float32)]
    head = (ptr(dq), ptr(dk), ptr(dv), *(ptr(t) for t in keep), _mask_ptr(mask, keep))
    sizes = (B, H, Tq, Tk, D, int(bool(causal)), act)
    if bf16:
        lib = rt.lib("attention_bf16_kernel", BF16_SIGNATURES)
        ws = rt.buffer(lib.attention_bf16_bw_workspace_floats(B, H, Tq, D))
        code = lib.launch_attention_bf16_bw(*head, ws.data_ptr(), *sizes, float(scale), rt.stream())
    else:
        lib = rt.lib("attention_kernel", SIGNATURES)
        ws = rt.buffer(lib.attention_bw_workspace_floats(B, H, Tq) if act == 0 else 1)
        code = lib.launch_attention_bw(*head, ws.data_ptr(), *sizes, precision_code(), float(scale), rt.stream())
    check(code, lib, f"fused_attention_bw {q.dtype.name} q {q.shape} k {k.shape}")
    return dq, dk, dv
