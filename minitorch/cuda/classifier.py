"""Bindings of classifier_kernel.so (src/classifier_kernel.cu) and the chunked LM-head driver of
fused linear cross-entropy.

Everything [rows, V]-sized lives in one reused buffer: each chunk's logits, which the fused
classifier overwrites with their gradient.  Its rows are padded to a multiple of 4 floats, and the
weight is read in place with its own strides (the tied LM head is a transposed view, whose gradient
is written in that layout too), so the products get the 16-byte strides of the matmul library's TMA
path wherever the weight's own strides allow it (a contiguous [C, V] weight needs V % 4 == 0).  The
products run through the matmul library directly, on raw pointers into row blocks of the inputs and
outputs (no copies, no views); the library splits the long vocab dim of dhidden = dlogits @ weight^T
itself.
"""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

from .. import operators
from ..tensor_data import TensorData
from .combine import add_into, column_sums, contiguous, reduce_op
from .matmul import raw_matmul
from .runtime import INT_LIMIT, CudaShapeError, check, empty, ptr, runtime

_P, _I = ctypes.c_void_p, ctypes.c_int
SIGNATURES = {
    "launch_fused_classifier": (_I, [_P, _I, _P, _P, _P, _P, _P, _I, _I, ctypes.c_float, _I, _P]),
}
_F32 = 4  # bytes per element
_sum0 = reduce_op(operators.add, 0.0)


def linear_cross_entropy_fw(
    hidden: TensorData, weight: TensorData, bias: Optional[TensorData], targets: TensorData,
    token_weights: TensorData, chunk_size: int, need_grad: bool, label_smoothing: float = 0.0,
) -> Tuple[TensorData, Optional[TensorData], Optional[TensorData], Optional[TensorData]]:  # fmt: skip
    """(loss (1,), dhidden, dweight, dbias) chunk by chunk; a target outside [0, V) on a token with a
    non-zero weight makes the loss NaN (checking would need a device-to-host copy).  label_smoothing:
    see minitorch.fused_linear_cross_entropy."""
    rt = runtime()
    lib = rt.lib("classifier_kernel", SIGNATURES)
    N, C = hidden.shape
    V = weight.shape[1]
    ld = -(-V // 4) * 4  # floats between logits rows
    chunk = min(chunk_size, N)
    if chunk * ld >= INT_LIMIT:
        raise CudaShapeError(
            f"fused_linear_cross_entropy: a chunk of {chunk} rows x {V} classes exceeds the kernels' 32-bit "
            f"indexing; pass chunk_size <= {(INT_LIMIT - 1) // ld}"
        )
    # A weight that is the transpose of a contiguous [V, C] (the tied LM head) gets its gradient in
    # the same layout: written as dweight^T [V, C], returned as a [C, V] view.
    transposed = weight.is_transposed()
    h, ids, tw = (contiguous(t) for t in (hidden, targets, token_weights))
    b = None if bias is None else contiguous(bias)
    hp, wp, bp = ptr(h), ptr(weight), None if b is None else ptr(b)
    w_strides, wt_strides = weight.strides, weight.strides[::-1]
    weight_sum = _sum0(tw, 0)
    losses = empty((N,))
    logits = rt.buffer(chunk * ld)  # kept referenced: every chunk reuses it
    lg = logits.data_ptr()
    dhidden = dweight = dbias = b_scratch = None
    if need_grad:
        dhidden, dweight = empty((N, C)), empty((V, C) if transposed else (C, V))
        dbias = None if b is None else empty((V,))
        # Later chunks' dbias contributions go through a scratch buffer and are added.
        b_scratch = rt.buffer(V) if N > chunk and b is not None else None
    for n0 in range(0, N, chunk):
        rows = min(chunk, N - n0)
        h_rows = hp + _F32 * n0 * C
        raw_matmul(lg, h_rows, wp, rows, V, C, (C, 1), w_strides, ldc=ld)
        code = lib.launch_fused_classifier(
            lg, ld, ptr(losses) + _F32 * n0, bp, ptr(ids) + _F32 * n0, ptr(tw) + _F32 * n0, ptr(weight_sum),
            rows, V, label_smoothing, int(need_grad), rt.stream(),
        )  # fmt: skip
        check(code, lib, f"fused classifier [{rows}, {V}]")
        if dhidden is None or dweight is None:
            continue
        raw_matmul(ptr(dhidden) + _F32 * n0 * C, lg, wp, rows, C, V, (ld, 1), wt_strides)
        first = n0 == 0
        if transposed:
            raw_matmul(ptr(dweight), lg, h_rows, V, C, rows, (1, ld), (C, 1), accumulate=not first)
        else:
            raw_matmul(ptr(dweight), h_rows, lg, C, V, rows, (1, C), (ld, 1), accumulate=not first)
        if dbias is not None:
            column_sums(ptr(dbias) if first else b_scratch.data_ptr(), lg, V, rows, ld)
            if not first:
                add_into(ptr(dbias), b_scratch.data_ptr(), V)
    if transposed and dweight is not None:
        dweight = dweight.permute(1, 0)
    return _sum0(losses, 0), dhidden, dweight, dbias
