"""Bindings of attention_kernel.so (src/attention_kernel.cu, float32) and attention_bf16_kernel.so
(src/attention_bf16_kernel.cu, bfloat16): attention without the [Tq, Tk] matrix.  The hooks dispatch on
the dtype of q, k and v (all float32 or all bfloat16; anything else raises NoKernelError).  The float32
products follow minitorch.set_float32_matmul_precision, as the matmul library's do; the bfloat16 ones
multiply bf16 operands with float32 accumulation.  lse is float32 in both; the mask is read as float32.

The float32 kernels take contiguous [B, H, T, D] operands; the bfloat16 ones any (batch, head, token)
strides with a contiguous last dim, so they read q, k, v and the output gradient in place and write
into views: attention_qkv_fw/bw run the packed [B, T, 3C] projection of fused_attention_qkv without a
layout copy (out laid out [B, T, H, D], dq, dk, dv written into the thirds of one [B, T, 3C] gradient)."""

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
_STRIDES = ctypes.POINTER(_LL)  # three a [B, H, T, D] operand: its batch, head and token strides
SIGNATURES = {
    "launch_attention_fw": (_I, [_P] * 6 + [_I] * 8 + [_F, _P]),
    "attention_bw_workspace_floats": (_LL, [_I, _I, _I]),
    "launch_attention_bw": (_I, [_P] * 11 + [_I] * 8 + [_F, _P]),
}
BF16_SIGNATURES = {
    "launch_attention_bf16_fw": (_I, [_P] * 6 + [_STRIDES] + [_I] * 7 + [_F, _P]),
    "attention_bf16_bw_workspace_floats": (_LL, [_I] * 4),
    "launch_attention_bf16_bw": (_I, [_P] * 11 + [_STRIDES] + [_I] * 7 + [_F, _P]),
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


def _rows(t: TensorData) -> TensorData:
    """t as the bfloat16 kernels read it: itself when its last dim is contiguous, else a contiguous copy."""
    return t if t.strides[-1] == 1 else contiguous(t)


def _strides(*tensors: TensorData) -> "ctypes.Array[ctypes.c_longlong]":
    """The (batch, head, token) strides of [B, H, T, D] operands, in order, for a bfloat16 launcher."""
    values = [s for t in tensors for s in t.strides[:3]]
    return (_LL * len(values))(*values)


def _packed(t: TensorData, heads: int, part: int) -> TensorData:
    """Part `part` (0 q, 1 k, 2 v) of a packed [B, T, 3C] tensor with a contiguous last dim, as a
    [B, H, T, D] view (strides (batch stride, D, token stride, 1))."""
    B, T, C3 = t.shape
    D = C3 // (3 * heads)
    return t.as_strided((B, heads, T, D), (t.strides[0], D, t.strides[1], 1), part * heads * D)


def _bf16_fw(
    out: TensorData, lse: TensorData, q: TensorData, k: TensorData, v: TensorData, mask: Optional[TensorData],
    causal: bool, activation: str, scale: float,
) -> None:  # fmt: skip
    """Writes out (a [B, H, Tq, D] view with a contiguous last dim) and lse of the bfloat16 kernel."""
    B, H, Tq, Tk, D = _sizes(q, k)
    rt = runtime()
    reads = [_rows(q), _rows(k), _rows(v)]
    keep: list = []
    mask_ptr = _mask_ptr(mask, keep)
    lib = rt.lib("attention_bf16_kernel", BF16_SIGNATURES)
    code = lib.launch_attention_bf16_fw(
        ptr(out), ptr(lse), *(ptr(t) for t in reads), mask_ptr, _strides(*reads, out), B, H, Tq, Tk, D,
        int(bool(causal)), ATTENTION_ACTIVATIONS.index(activation), float(scale), rt.stream(),
    )  # fmt: skip
    check(code, lib, f"fused_attention_fw bfloat16 q {q.shape} k {k.shape}")


def _bf16_bw(
    dq: TensorData, dk: TensorData, dv: TensorData, grad_out: TensorData, q: TensorData, k: TensorData,
    v: TensorData, out: TensorData, lse: TensorData, mask: Optional[TensorData], causal: bool, activation: str,
    scale: float,
) -> None:  # fmt: skip
    """Writes dq, dk, dv (views with a contiguous last dim) of the bfloat16 kernel; grad_out is read in
    place when it is bfloat16 with a contiguous last dim, else after one contiguous cast."""
    B, H, Tq, Tk, D = _sizes(q, k)
    rt = runtime()
    g = _rows(grad_out) if grad_out.dtype == bfloat16 else cast(grad_out, bfloat16)
    reads = [g, _rows(q), _rows(k), _rows(v), _rows(out)]
    stats = _as(lse, float32)
    keep: list = []
    mask_ptr = _mask_ptr(mask, keep)
    lib = rt.lib("attention_bf16_kernel", BF16_SIGNATURES)
    ws = rt.buffer(lib.attention_bf16_bw_workspace_floats(B, H, Tq, D))
    code = lib.launch_attention_bf16_bw(
        ptr(dq), ptr(dk), ptr(dv), *(ptr(t) for t in reads), ptr(stats), mask_ptr, ws.data_ptr(),
        _strides(dq, dk, dv, *reads), B, H, Tq, Tk, D, int(bool(causal)), ATTENTION_ACTIVATIONS.index(activation),
        float(scale), rt.stream(),
    )  # fmt: skip
    check(code, lib, f"fused_attention_bw bfloat16 q {q.shape} k {k.shape}")


def attention_fw(
    q: TensorData, k: TensorData, v: TensorData, mask: Optional[TensorData], causal: bool, activation: str, scale: float
) -> Tuple[TensorData, TensorData]:
    """(out [B, H, Tq, D] in q's dtype, lse [B, H, Tq] float32); lse is the softmax's log-sum-exp per
    query (-inf for a row with no key), 0 for relu."""
    B, H, Tq, Tk, D = _sizes(q, k)
    bf16 = _is_bf16("attention_fw", q, k, v)
    out, lse = empty(q.shape, q.dtype), empty((B, H, Tq))
    if out.size and bf16:
        _bf16_fw(out, lse, q, k, v, mask, causal, activation, scale)
    elif out.size:
        rt = runtime()
        keep = [contiguous(q), contiguous(k), contiguous(v)]
        head = (ptr(out), ptr(lse), *(ptr(t) for t in keep), _mask_ptr(mask, keep), B, H, Tq, Tk, D, int(bool(causal)))
        act = ATTENTION_ACTIVATIONS.index(activation)
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
    if bf16:
        _bf16_bw(dq, dk, dv, grad_out, q, k, v, out, lse, mask, causal, activation, scale)
        return dq, dk, dv
    rt = runtime()
    act = ATTENTION_ACTIVATIONS.index(activation)
    keep = [_as(grad_out, q.dtype), contiguous(q), contiguous(k), contiguous(v), contiguous(out), _as(lse, float32)]
    head = (ptr(dq), ptr(dk), ptr(dv), *(ptr(t) for t in keep), _mask_ptr(mask, keep))
    sizes = (B, H, Tq, Tk, D, int(bool(causal)), act)
    lib = rt.lib("attention_kernel", SIGNATURES)
    ws = rt.buffer(lib.attention_bw_workspace_floats(B, H, Tq) if act == 0 else 1)
    code = lib.launch_attention_bw(*head, ws.data_ptr(), *sizes, precision_code(), float(scale), rt.stream())
    check(code, lib, f"fused_attention_bw {q.dtype.name} q {q.shape} k {k.shape}")
    return dq, dk, dv


def attention_qkv_fw(
    qkv: TensorData, heads: int, mask: Optional[TensorData], causal: bool, activation: str, scale: float
) -> Optional[Tuple[TensorData, TensorData]]:
    """fused_attention_qkv's forward on a bfloat16 qkv [B, T, 3C], read in place: (out [B, H, T, D], a
    view of a [B, T, H, D] tensor, so that its permute to [B, T, H, D] is contiguous; lse [B, H, T]
    float32).  None for another dtype: the caller splits qkv into contiguous heads."""
    if qkv.dtype != bfloat16:
        return None
    qkv = _rows(qkv)
    B, T, C3 = qkv.shape
    out = empty((B, T, heads, C3 // (3 * heads)), bfloat16).permute(0, 2, 1, 3)
    lse = empty((B, heads, T))
    if out.size:
        _bf16_fw(out, lse, *(_packed(qkv, heads, i) for i in range(3)), mask, causal, activation, scale)
    return out, lse


def attention_qkv_bw(
    grad_out: TensorData, qkv: TensorData, out: TensorData, lse: TensorData, heads: int, mask: Optional[TensorData],
    causal: bool, activation: str, scale: float,
) -> TensorData:  # fmt: skip
    """The gradient [B, T, 3C] bfloat16 of attention_qkv_fw's qkv, dq, dk, dv written straight into its
    thirds.  grad_out [B, H, T, D] is read in place when it is bfloat16 with a contiguous last dim (the
    gradient of out through the module's permute and [B, T, C] view arrives with out's strides), else
    after one copy."""
    qkv = _rows(qkv)
    dqkv = empty(qkv.shape, bfloat16)
    if dqkv.size:
        dq, dk, dv = (_packed(dqkv, heads, i) for i in range(3))
        q, k, v = (_packed(qkv, heads, i) for i in range(3))
        _bf16_bw(dq, dk, dv, grad_out, q, k, v, out, lse, mask, causal, activation, scale)
    return dqkv
