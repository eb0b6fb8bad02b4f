"""Bindings of classifier_kernel.so (src/classifier_kernel.cu) and the chunked LM-head driver of
fused linear cross-entropy.

Everything [rows, V]-sized lives in one reused buffer: each chunk's logits, which the fused
classifier overwrites with their gradient.  Its rows are a multiple of 16 bytes apart (padded to a
multiple of 4 floats or 8 bf16), and the weight is read in place with its own strides (the tied LM
head is a transposed view, whose gradient is written in that layout too), so the products get the
16-byte strides of the matmul libraries' TMA paths wherever the weight's own strides allow it.  The
float32 products run through the matmul library directly, on raw pointers into row blocks of the
inputs and outputs (no copies, no views); the library splits the long vocab dim of
dhidden = dlogits @ weight^T itself.

bfloat16 hidden states and weight (the autocast working copy) take the bf16 matmul library
(matmul_bf16, on torch views of the same buffers) for the three products, with bf16 logits (as torch
autocast's LM head gives them): the classifier reads them into float32 (the loss, the log-sum-exp,
the bias and label smoothing are float32) and writes their gradient back rounded to bf16, the
operand of dhidden (bf16) and dweight (float32, accumulated over the chunks in float32) as it lies.
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Tuple

from .. import operators
from ..dtypes import bfloat16, float32
from ..tensor_data import TensorData
from . import matmul_bf16
from .combine import add_into, column_sums, contiguous, reduce_op
from .convert import cast
from .matmul import raw_matmul
from .runtime import INT_LIMIT, CudaShapeError, check, empty, ptr, require_float32, runtime

_P, _I = ctypes.c_void_p, ctypes.c_int
_LAUNCH = (_I, [_P, _I, _P, _I, _P, _P, _P, _P, _P, _I, _I, ctypes.c_float, _I, _P])
SIGNATURES = {"launch_fused_classifier": _LAUNCH, "launch_fused_classifier_bf16": _LAUNCH}
_F32 = 4  # bytes per element
_sum0 = reduce_op(operators.add, 0.0)


class _ChunkBias:
    """dbias of the chunk products: the column sums of a chunk's dlogits (self.buffer, rows self.ld
    apart, of self.dtype), the first chunk's into dbias, later ones through a float32 scratch row."""

    dtype = float32
    scratch: Optional[Any] = None

    def bias_gradient(self, dbias: TensorData, n0: int, rows: int) -> None:
        """dbias (+)= the column sums of the chunk's dlogits."""
        if n0 == 0:
            column_sums(ptr(dbias), self.buffer.data_ptr(), self.V, rows, self.ld, self.dtype)
            return
        if self.scratch is None:
            self.scratch = runtime().buffer(self.V)
        column_sums(self.scratch.data_ptr(), self.buffer.data_ptr(), self.V, rows, self.ld, self.dtype)
        add_into(ptr(dbias), self.scratch.data_ptr(), self.V)


class _Float32Products(_ChunkBias):
    """The chunk products in float32: the matmul library on raw pointers into the buffers; float32
    logits (rows ld apart, 16-byte aligned), their gradient in place, dbias by column sums."""

    launcher = "launch_fused_classifier"

    row_multiple = 4  # elements: 16 bytes

    def __init__(self, h: TensorData, weight: TensorData, chunk: int, ld: int) -> None:
        self.hp, self.wp, self.w_strides = ptr(h), ptr(weight), weight.strides
        self.C, self.V, self.ld = h.shape[1], weight.shape[1], ld
        self.transposed = weight.is_transposed()
        self.buffer = runtime().buffer(chunk * self.ld)  # kept referenced: every chunk reuses it

    def logits(self, n0: int, rows: int) -> None:
        raw_matmul(self.buffer.data_ptr(), self.hp + _F32 * n0 * self.C, self.wp, rows, self.V, self.C, (self.C, 1),
                   self.w_strides, ldc=self.ld)  # fmt: skip

    def gradients(self, dhidden: TensorData, dweight: TensorData, n0: int, rows: int) -> None:
        C, V, ld, lg = self.C, self.V, self.ld, self.buffer.data_ptr()
        h_rows = self.hp + _F32 * n0 * C
        raw_matmul(ptr(dhidden) + _F32 * n0 * C, lg, self.wp, rows, C, V, (ld, 1), self.w_strides[::-1])
        if self.transposed:
            raw_matmul(ptr(dweight), lg, h_rows, V, C, rows, (1, ld), (C, 1), accumulate=n0 > 0)
        else:
            raw_matmul(ptr(dweight), h_rows, lg, C, V, rows, (1, C), (ld, 1), accumulate=n0 > 0)


class _Bfloat16Products(_ChunkBias):
    """The chunk products of bf16 hidden states and weight: matmul_bf16 on torch views of the buffers,
    bf16 logits (rows a multiple of 8 elements apart, for the library's TMA path), their gradient
    rounded to bf16 in place by the classifier and read as it lies by dhidden and dweight; dbias
    (float32) by column sums of the bf16 gradient."""

    launcher = "launch_fused_classifier_bf16"

    dtype = bfloat16

    row_multiple = 8

    def __init__(self, h: TensorData, weight: TensorData, chunk: int, ld: int) -> None:
        rt = runtime()
        N, C = h.shape
        self.V, self.ld, self.transposed = weight.shape[1], ld, weight.is_transposed()
        self.h = h._storage[: N * C].view(N, C)
        self.w = rt.torch.as_strided(weight._storage, weight.shape, weight.strides)
        # kept referenced: every chunk reuses it; the classifier zeros each gradient row's pad columns,
        # which the 16-byte reads of a row's last columns (dbias) cross
        self.buffer = rt.storage(chunk * ld, bfloat16)

    def _chunk(self, rows: int) -> Any:
        return self.buffer[: rows * self.ld].view(rows, self.ld)[:, : self.V]

    def logits(self, n0: int, rows: int) -> None:
        matmul_bf16.matmul(self.h[n0 : n0 + rows], self.w, out=self._chunk(rows))

    def gradients(self, dhidden: TensorData, dweight: TensorData, n0: int, rows: int) -> None:
        V, C = self.V, self.h.shape[1]
        dl, h_rows = self._chunk(rows), self.h[n0 : n0 + rows]
        matmul_bf16.matmul(dl, self.w.t(), out=dhidden._storage[n0 * C : (n0 + rows) * C].view(rows, C))
        if self.transposed:
            matmul_bf16.matmul(dl.t(), h_rows, out=dweight._storage.view(V, C), accumulate=n0 > 0)
        else:
            matmul_bf16.matmul(h_rows.t(), dl, out=dweight._storage.view(C, V), accumulate=n0 > 0)


def linear_cross_entropy_fw(
    hidden: TensorData, weight: TensorData, bias: Optional[TensorData], targets: TensorData,
    token_weights: TensorData, chunk_size: int, need_grad: bool, label_smoothing: float = 0.0,
    classes: Optional[int] = None,
) -> Tuple[TensorData, Optional[TensorData], Optional[TensorData], Optional[TensorData]]:  # fmt: skip
    """(loss (1,), dhidden, dweight, dbias) chunk by chunk; a target outside [0, classes) on a token
    with a non-zero weight makes the loss NaN (checking would need a device-to-host copy).
    label_smoothing and classes (default: all V columns of weight): see
    minitorch.fused_linear_cross_entropy; the products run over all V columns, the classifier over
    the first `classes` (the others' gradient columns zeros).  hidden and weight both float32, or both
    bfloat16 (then dhidden is bfloat16; the loss, dweight and dbias are float32 either way; a bias is
    read as float32)."""
    bf16 = hidden.dtype == bfloat16 and weight.dtype == bfloat16
    if not bf16:
        require_float32("linear_cross_entropy_fw", hidden, weight, bias)
    require_float32("linear_cross_entropy_fw", targets, token_weights)
    rt = runtime()
    N, C = hidden.shape
    V = weight.shape[1]
    classes = V if classes is None else classes
    chunk = min(chunk_size, N)
    # A weight that is the transpose of a contiguous [V, C] (the tied LM head) gets its gradient in
    # the same layout: written as dweight^T [V, C], returned as a [C, V] view.
    transposed = weight.is_transposed()
    h, ids, tw = (contiguous(t) for t in (hidden, targets, token_weights))
    b = None if bias is None else (contiguous(bias) if bias.dtype == float32 else cast(bias, float32))
    kind = _Bfloat16Products if bf16 else _Float32Products
    ld = -(-V // kind.row_multiple) * kind.row_multiple  # elements between logits rows
    if chunk * ld >= INT_LIMIT:
        raise CudaShapeError(
            f"fused_linear_cross_entropy: a chunk of {chunk} rows x {V} classes exceeds the kernels' 32-bit "
            f"indexing; pass chunk_size <= {(INT_LIMIT - 1) // ld}"
        )
    products = kind(h, weight, chunk, ld)
    lib = rt.lib("classifier_kernel", SIGNATURES)
    launch = getattr(lib, products.launcher)
    bp = None if b is None else ptr(b)
    weight_sum = _sum0(tw, 0)
    losses = empty((N,))
    dhidden = dweight = dbias = None
    if need_grad:
        dhidden, dweight = empty((N, C), hidden.dtype), empty((V, C) if transposed else (C, V))
        dbias = None if b is None else empty((V,))
    for n0 in range(0, N, chunk):
        rows = min(chunk, N - n0)
        products.logits(n0, rows)
        logits = products.buffer.data_ptr()  # the gradient overwrites it in place
        code = launch(
            logits, products.ld, logits, products.ld, ptr(losses) + _F32 * n0, bp, ptr(ids) + _F32 * n0,
            ptr(tw) + _F32 * n0, ptr(weight_sum), rows, classes, label_smoothing, int(need_grad), rt.stream(),
        )  # fmt: skip
        check(code, lib, f"fused classifier [{rows}, {classes} of {V}]")
        if dhidden is None or dweight is None:
            continue
        products.gradients(dhidden, dweight, n0, rows)
        if dbias is not None:
            products.bias_gradient(dbias, n0, rows)
    if transposed and dweight is not None:
        dweight = dweight.permute(1, 0)
    return _sum0(losses, 0), dhidden, dweight, dbias


def softmax_loss_fw(logits: TensorData, targets: TensorData, label_smoothing: float) -> TensorData:
    """The cross-entropy of each row of logits [N, V] (float32 or bfloat16; float32 math) against the
    float32 ids targets [N], smoothed by label_smoothing (see launch_fused_classifier): [N] float32,
    NaN where a target is not an integer in [0, V).  One read of the logits."""
    losses, _ = _softmax_loss(logits, targets, None, label_smoothing)
    return losses


def softmax_loss_bw(logits: TensorData, targets: TensorData, grad: TensorData, label_smoothing: float) -> TensorData:
    """The gradient of sum_r grad[r] * loss_r (softmax_loss_fw's rows) with respect to logits:
    (softmax(row) - q) * grad[r], in the logits' dtype (float32 math, rounded once); a row whose grad
    is 0 is zeros without being read.  The logits stay as they are."""
    _, dlogits = _softmax_loss(logits, targets, grad, label_smoothing)
    return dlogits


def _softmax_loss(
    logits: TensorData, targets: TensorData, grad: Optional[TensorData], label_smoothing: float
) -> Tuple[TensorData, Optional[TensorData]]:
    """(losses, dlogits or None) from one classifier launch: the losses scaled by grad (weights of 1
    when None: the forward losses) and, with a grad, the rows' gradients written to a new buffer."""
    rt = runtime()
    N, V = logits.shape
    require_float32("softmax_loss", targets, grad)
    x, ids = contiguous(logits), contiguous(targets)
    losses = empty((N,))
    dlogits = None if grad is None else empty((N, V), logits.dtype)
    lib = rt.lib("classifier_kernel", SIGNATURES)
    launch = getattr(lib, _Bfloat16Products.launcher if x.dtype == bfloat16 else _Float32Products.launcher)
    code = launch(
        ptr(x), V, None if dlogits is None else ptr(dlogits), V, ptr(losses), None, ptr(ids),
        None if grad is None else ptr(contiguous(grad)), None, N, V, label_smoothing, int(dlogits is not None),
        rt.stream(),
    )  # fmt: skip
    check(code, lib, f"cross-entropy rows [{N}, {V}]")
    return losses, dlogits
