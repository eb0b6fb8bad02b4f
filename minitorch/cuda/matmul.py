"""Bindings of matmul_kernel.so (src/matmul_kernel.cu): batched, broadcasting products over any
strides on the tensor cores (3xTF32 "highest" or TF32 "high", see minitorch.precision), with
bias / GELU / ReLU epilogues.  The library balances few-tile products (weight gradients) over the
SMs (stream-K, or K splits) and may copy an operand K-major, in a workspace this binding allocates
from the caching allocator.

This module is also where the CUDA backend's products choose a kernel by dtype: float32 operands run
the library above, bfloat16 ones matmul_bf16_kernel.so (minitorch.cuda.matmul_bf16: float32 sums,
bfloat16 output, the weight gradients of a 16-bit Linear in float32); other dtypes have no product
kernel and raise NoKernelError."""

from __future__ import annotations

import ctypes
from typing import Dict, Optional, Tuple

from ..dtypes import arithmetic, bfloat16, float32, result_type
from ..precision import precision_code
from ..tensor_data import TensorData
from . import matmul_bf16
from .combine import add_into, column_sums, contiguous, fill
from .convert import cast
from .layout import MtLayout, layout, product_plan, remember
from .runtime import check, empty, fork, ptr, require_float32, runtime

_P, _I, _LL, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, MtLayout
SIGNATURES = {
    "matmul_workspace_floats": (_LL, [_I, _I, _I, _I, _I, _I, _I, _I, _I]),
    "launch_matmul": (_I, [_P, _I, _P, _P, _I, _I, _I, _I, _I, _I, _I, _L, _L, _P, _I, _P, _I, _I, _P, _LL, _P]),
}
EPILOGUES = {None: 0, "bias": 1, "gelu": 2, "relu": 3}
_SINGLE = layout((1,), (0,))  # the batch layout of one product

_plans: Dict[tuple, Tuple[Tuple[int, ...], Tuple[int, int, int, int], MtLayout, MtLayout]] = {}
_workspace: Dict[tuple, int] = {}  # (M, N, K, batch, strides, precision) -> the library's workspace floats


def _launch(
    out: int, a: int, b: int, M: int, N: int, K: int, strides: Tuple[int, int, int, int], a_batch: MtLayout,
    b_batch: MtLayout, batch: int, what: str, bias: Optional[int] = None, epilogue: int = 0,
    pre_act: Optional[int] = None, accumulate: bool = False, ldc: Optional[int] = None,
) -> None:  # fmt: skip
    rt = runtime()
    lib = rt.lib("matmul_kernel", SIGNATURES)
    precision = precision_code()
    key = (M, N, K, batch, strides, precision)
    ws_len = _workspace.get(key)
    if ws_len is None:
        ws_len = remember(_workspace, key, lib.matmul_workspace_floats(M, N, K, batch, *strides, precision))
    ws = rt.buffer(ws_len) if ws_len > 0 else None
    code = lib.launch_matmul(
        out, N if ldc is None else ldc, a, b, M, N, K, *strides, a_batch, b_batch, bias, epilogue, pre_act, int(accumulate), precision,
        None if ws is None else ws.data_ptr(), max(ws_len, 0), rt.stream(),
    )  # fmt: skip
    check(code, lib, what)


def matrix_multiply(a: TensorData, b: TensorData) -> TensorData:
    """a [..., n, k] @ b [..., k, m] -> [broadcast(...), n, m], any strides.  Every product of the
    backend comes here (MatMul, the composed references), so this is where a product dispatches on
    its dtype, the operands' promoted one (an operand of another dtype is cast to it first, exactly):
    float32 storage (float32, bool masks) runs the float32 kernels, bfloat16 the bf16 library (float32
    sums, bfloat16 output); float16 has no product kernel and raises NoKernelError."""
    dtype = arithmetic(a.dtype if a.dtype is b.dtype else result_type(a, b))
    a, b = (t if t.dtype is dtype else cast(t, dtype) for t in (a, b))
    if dtype is not bfloat16:
        require_float32("matmul", a, b)
    key = (a.shape, a.strides, b.shape, b.strides)
    plan = _plans.get(key)
    if plan is None:
        plan = remember(_plans, key, product_plan(a, b))
    out_shape, strides, a_batch, b_batch = plan
    out = empty(out_shape, dtype)
    if out.size:
        n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
        what = f"matmul {a.shape} @ {b.shape}"
        if dtype is bfloat16:
            matmul_bf16.launch(ptr(out), "bfloat16", m, ptr(a), ptr(b), n, m, k, strides, a_batch, b_batch, what=what)
        else:
            _launch(ptr(out), ptr(a), ptr(b), n, m, k, strides, a_batch, b_batch, out.size // (n * m), what)
    return out


def linear_fw(
    x: TensorData, weight: TensorData, bias: Optional[TensorData], activation: Optional[str],
    residual: Optional[TensorData] = None, derivative: bool = False,
) -> Tuple[TensorData, Optional[TensorData], Optional[str]]:  # fmt: skip
    """(act(x @ weight.T + bias) (+ residual), what is kept for backward when act is set, its kind)
    for x [rows, in] and weight [out, in] (torch's layout, read transposed in place), bias [out] or
    None, activation None, "gelu" or "relu", residual [rows, out] or None (activation None), all of one
    dtype: float32, or bfloat16 (float32 sums and epilogue, the residual added there too, the outputs
    rounded once to bfloat16). The kept tensor is x @ weight.T + bias (kind "pre"), or with derivative
    and bfloat16 the activation's derivative there (kind "derivative": computed beside the activation
    in the epilogue, so that linear_bw's product only multiplies by it); None (kind None) without act."""
    rows, k = x.shape
    n = weight.shape[0]
    dtype = x.dtype
    if dtype is not bfloat16:
        require_float32("linear_fw", x, weight, bias, residual)
    if residual is not None:
        residual = contiguous(residual)
    out = empty((rows, n), dtype)
    pre = empty((rows, n), dtype) if activation is not None else None
    kind = None if activation is None else ("derivative" if derivative and dtype is bfloat16 else "pre")
    if not out.size:
        return out, pre, kind
    strides = (x.strides[0], x.strides[1], weight.strides[1], weight.strides[0])
    what = f"linear {x.shape} @ {weight.shape}.T"
    bias_ptr, pre_ptr = (None if t is None else ptr(t) for t in (bias, pre))
    if dtype is bfloat16:
        matmul_bf16.launch(ptr(out), "bfloat16", n, ptr(x), ptr(weight), rows, n, k, strides, bias=bias_ptr,
                           activation=activation, pre_act=pre_ptr, accumulate=residual is not None,
                           addend=None if residual is None else ptr(residual), keep=kind or "pre",
                           what=what)  # fmt: skip
    else:
        epilogue = EPILOGUES[activation if activation is not None else ("bias" if bias is not None else None)]
        _launch(ptr(out), ptr(x), ptr(weight), rows, n, k, strides, _SINGLE, _SINGLE, 1, what, bias_ptr, epilogue, pre_ptr)
        if residual is not None:
            add_into(ptr(out), ptr(residual), out.size)
    return out, pre, kind


# The most rows (dweight's K) for which a weight gradient on the side stream runs without K splits.
# GPT-2 124M's step on an H100: B 4 (4,096 rows) 10.15 -> 10.08 ms without them, B 16 (16,384 rows,
# each tile four times as long, the last ones a tail after the rest of backward) 35.26 -> 35.81 ms.
# Up to these rows the next read of d or x also waits for the unsplit products (runtime.fork's
# readers_wait): B 4 10.03-10.05 -> 10.09-10.13 ms when the next layer's products run beside their
# long tiles instead, while the split ones of B 16 gain from it (34.91-34.99 -> 34.77-34.82 ms).
SIDE_UNSPLIT_ROWS = 4096


def linear_bw(
    d: TensorData, x: TensorData, weight: TensorData, has_bias: bool, x_pre: Optional[TensorData] = None,
    x_activation: Optional[str] = None,
) -> Optional[Tuple[TensorData, TensorData, Optional[TensorData]]]:
    """The products of a Linear's backward from d [rows, out], its pre-activation gradient, when d,
    x [rows, in] and weight [out, in] are bfloat16: (dx = d @ weight in bfloat16, dweight = d^T @ x
    [out, in] in float32, dbias = the column sums of d in float32, or None without a bias), the products
    bf16 with float32 sums, dbias a column reduction (combine.column_sums).  None for other dtypes: the
    caller composes.
    With x_pre [rows, in] (bfloat16) and x_activation "gelu" or "relu", where x = x_activation(x_pre), dx
    is x_pre's gradient: the product times the activation's derivative at x_pre, in its epilogue;
    x_activation "derivative": x_pre is that derivative (linear_fw's kind "derivative"), multiplied.

    dweight runs on a side stream beside dx (runtime.fork): the weight gradient's tiles rarely fill the
    GPU in whole waves (96 to 108 tiles of GPT-2's layers for 132 SMs), and dx's blocks take the SMs
    its last wave leaves idle.  Both launch as beside other work: dx keeps its own 128 tiles rather than
    a transpose's 132, which would leave dweight no SM (GPT-2 B 4 lost 0.04 ms a step on an H200).  It
    is returned in flight (TensorData.in_flight), and d and x, which it reads, are marked read beside
    (TensorData.read_beside): nothing waits for it until something reads it or writes into d or x, so
    it also runs beside what backward does next (a transformer's attention, its LayerNorms, which read
    d as the residual's gradient).  Up to SIDE_UNSPLIT_ROWS rows dweight's K is not split over blocks
    (the work beside it fills the SMs its few output tiles leave, without split-K's partial sums and
    reduction pass), and the next read of d or x waits for it too.
    dbias follows dx on the current stream: beside dweight it lengthened the side stream, which the
    next LayerNorm waits for (GPT-2 124M bf16 on an H100, three runs each way: B 4 10.04-10.08 ->
    9.91-9.97 ms; B 16 34.79-34.86 -> 34.45-34.50)."""
    if not d.dtype is x.dtype is weight.dtype is bfloat16:
        return None
    if x_pre is not None and (x_pre.dtype is not bfloat16 or not x_pre.is_contiguous()):
        return None  # the epilogue reads x_pre laid out as dx
    rows, k = x.shape
    n = weight.shape[0]
    unsplit = rows <= SIDE_UNSPLIT_ROWS
    dx, dweight = empty((rows, k), bfloat16), empty((n, k), float32)
    dbias = empty((n,), float32) if has_bias else None
    shapes = f"d {d.shape}, x {x.shape}, weight {weight.shape}"
    d_rows = (d.strides[0], d.strides[1])

    def input_and_bias_gradients() -> None:
        if dx.size:  # n == 0 is a product over nothing: zeros, as are dweight and dbias for rows == 0
            matmul_bf16.launch(ptr(dx), "bfloat16", k, ptr(d), ptr(weight), rows, k, n,
                               (*d_rows, weight.strides[0], weight.strides[1]),
                               pre_act=None if x_pre is None else ptr(x_pre), activation_grad=x_activation,
                               beside=True, what=f"linear dx of {shapes}")  # fmt: skip
        if dbias is not None and n and rows:
            column_sums(ptr(dbias), ptr(d), n, rows, d.strides[0], bfloat16, d.strides[1])
        elif dbias is not None and n:
            fill(dbias, 0.0)

    def weight_gradient() -> None:
        if dweight.size:
            matmul_bf16.launch(ptr(dweight), "float32", k, ptr(d), ptr(x), n, k, rows,
                               (d.strides[1], d.strides[0], x.strides[0], x.strides[1]),
                               split_k=not unsplit, beside=True, what=f"linear dweight of {shapes}")  # fmt: skip

    fork(weight_gradient, input_and_bias_gradients, reads=[d, x], writes=[dweight], readers_wait=unsplit)
    return dx, dweight, dbias


def raw_matmul(
    out: int, a: int, b: int, M: int, N: int, K: int, a_strides: Tuple[int, int], b_strides: Tuple[int, int],
    accumulate: bool = False, ldc: Optional[int] = None,
) -> None:  # fmt: skip
    """out (+)= A @ B on raw pointers; out row r at out + r * ldc floats (ldc default N: contiguous
    [M, N]); A[r, k] = a[r * a_strides[0] + k * a_strides[1]], B[k, c] likewise with b."""
    _launch(out, a, b, M, N, K, (*a_strides, *b_strides), _SINGLE, _SINGLE, 1, f"matmul [{M}, {K}] @ [{K}, {N}]",
            accumulate=accumulate, ldc=ldc)
