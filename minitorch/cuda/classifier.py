"""Bindings of classifier_kernel.so (src/classifier_kernel.cu) and the chunked LM-head driver of
fused linear cross-entropy.

Everything [rows, V]-sized lives in one reused buffer: each chunk's logits, which the fused
classifier overwrites with their gradient.  The products run through the matmul library directly,
on raw pointers into row blocks of the inputs and outputs (no copies, no views).
"""

from __future__ import annotations

import ctypes
from typing import Dict, Optional, Tuple

from .. import operators
from ..tensor_data import TensorData
from .combine import add_into, column_sums, contiguous, reduce_op
from .matmul import raw_matmul
from .runtime import INT_LIMIT, CudaShapeError, check, empty, ptr, runtime

_P, _I = ctypes.c_void_p, ctypes.c_int
SIGNATURES = {
    "launch_fused_classifier": (_I, [_P, _P, _P, _P, _P, _P, _I, _I, ctypes.c_float, _I, _P]),
    "fused_loss_vocab_splits": (_I, [_I, _I, _I]),
}
_F32 = 4  # bytes per element
_sum0 = reduce_op(operators.add, 0.0)


def _slabs(lib: ctypes.CDLL, rows_set: set, C: int, V: int) -> Dict[int, Tuple[int, int, int, int]]:
    """dhidden = dlogits @ weight^T is split over `splits` vocab slabs of `slab` columns (one batched
    launch) plus, when slab does not divide V, a last short slab of `rest` columns; the partial
    products are then summed into dhidden's rows.  Planned per row count (full and last chunk)."""
    slabs = {}
    for rows in rows_set:
        splits = lib.fused_loss_vocab_splits(rows, C, V)
        slab = V // splits
        rest = V - splits * slab
        slabs[rows] = (splits, slab, rest, splits + (1 if rest else 0))
    return slabs


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
    chunk = min(chunk_size, N)
    if chunk * V >= INT_LIMIT:
        raise CudaShapeError(
            f"fused_linear_cross_entropy: a chunk of {chunk} rows x {V} classes exceeds the kernels' 32-bit "
            f"indexing; pass chunk_size <= {(INT_LIMIT - 1) // V}"
        )
    h, w, ids, tw = (contiguous(t) for t in (hidden, weight, targets, token_weights))
    b = None if bias is None else contiguous(bias)
    hp, wp, bp = ptr(h), ptr(w), None if b is None else ptr(b)
    weight_sum = _sum0(tw, 0)
    losses = empty((N,))
    logits = rt.buffer(chunk * V)  # kept referenced: every chunk reuses it
    lg = logits.data_ptr()
    dhidden = dweight = dbias = partial = w_scratch = b_scratch = None
    slabs: Dict[int, Tuple[int, int, int, int]] = {}
    if need_grad:
        dhidden, dweight = empty((N, C)), empty((C, V))
        dbias = None if b is None else empty((V,))
        slabs = _slabs(lib, {chunk, N - (N - 1) // chunk * chunk}, C, V)
        partial_len = max((n_parts * rows * C for rows, (_, _, _, n_parts) in slabs.items() if n_parts > 1), default=0)
        partial = rt.buffer(partial_len) if partial_len else None
        # Later chunks' contributions to dweight and dbias go through a scratch buffer and are added.
        w_scratch = rt.buffer(C * V) if N > chunk else None
        b_scratch = rt.buffer(V) if N > chunk and b is not None else None
    for n0 in range(0, N, chunk):
        rows = min(chunk, N - n0)
        h_rows = hp + _F32 * n0 * C
        raw_matmul(lg, h_rows, wp, rows, V, C, (C, 1), (V, 1))
        code = lib.launch_fused_classifier(
            lg, ptr(losses) + _F32 * n0, bp, ptr(ids) + _F32 * n0, ptr(tw) + _F32 * n0, ptr(weight_sum),
            rows, V, label_smoothing, int(need_grad), rt.stream(),
        )  # fmt: skip
        check(code, lib, f"fused classifier [{rows}, {V}]")
        if dhidden is None or dweight is None:
            continue
        dh_rows = ptr(dhidden) + _F32 * n0 * C
        splits, slab, rest, n_parts = slabs[rows]
        if n_parts == 1:
            raw_matmul(dh_rows, lg, wp, rows, C, V, (V, 1), (1, V))
        else:
            pp = partial.data_ptr()
            raw_matmul(pp, lg, wp, rows, C, slab, (V, 1), (1, V), batch=splits, batch_offset=slab)
            if rest:
                off = _F32 * splits * slab
                raw_matmul(pp + _F32 * splits * rows * C, lg + off, wp + off, rows, C, rest, (V, 1), (1, V))
            column_sums(dh_rows, pp, rows * C, n_parts, rows * C)
        first = n0 == 0
        raw_matmul(ptr(dweight) if first else w_scratch.data_ptr(), h_rows, lg, C, V, rows, (1, C), (V, 1))
        if not first:
            add_into(ptr(dweight), w_scratch.data_ptr(), C * V)
        if dbias is not None:
            column_sums(ptr(dbias) if first else b_scratch.data_ptr(), lg, V, rows, V)
            if not first:
                add_into(ptr(dbias), b_scratch.data_ptr(), V)
    return _sum0(losses, 0), dhidden, dweight, dbias
