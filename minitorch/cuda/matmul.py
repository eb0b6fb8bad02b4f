"""Bindings of matmul_kernel.so (src/matmul_kernel.cu): batched, broadcasting products over any
strides on the tensor cores (3xTF32 "highest" or TF32 "high", see minitorch.precision), with
bias / GELU / ReLU epilogues.  The library balances few-tile products (weight gradients) over the
SMs (stream-K, or K splits) and may copy an operand K-major, in a workspace this binding allocates
from the caching allocator."""

from __future__ import annotations

import ctypes
from typing import Dict, Optional, Tuple

from ..precision import precision_code
from ..tensor_data import TensorData, broadcast_strides, coalesce, prod, shape_broadcast
from .layout import MtLayout, layout, remember
from .runtime import INT_LIMIT, CudaShapeError, check, empty, ptr, require_float32, runtime

_P, _I, _LL, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, MtLayout
SIGNATURES = {
    "matmul_workspace_floats": (_LL, [_I, _I, _I, _I, _I, _I, _I, _I, _I]),
    "launch_matmul": (_I, [_P, _I, _P, _P, _I, _I, _I, _I, _I, _I, _I, _L, _L, _P, _I, _P, _I, _I, _P, _LL, _P]),
}
EPILOGUES = {None: 0, "bias": 1, "gelu": 2, "relu": 3}
_SINGLE = layout((1,), (0,))  # the batch layout of one product

_plans: Dict[tuple, Tuple[Tuple[int, ...], Tuple[int, int, int, int], MtLayout, MtLayout]] = {}
_workspace: Dict[tuple, int] = {}  # (M, N, K, batch, strides, precision) -> the library's workspace floats


def _plan(a: TensorData, b: TensorData) -> Tuple[Tuple[int, ...], Tuple[int, int, int, int], MtLayout, MtLayout]:
    batch = shape_broadcast(a.shape[:-2], b.shape[:-2])
    layout(a.shape, a.strides)  # rejects layouts beyond 32-bit offsets
    layout(b.shape, b.strides)
    a_bs = broadcast_strides(a.shape[:-2], a.strides[:-2], batch)
    b_bs = broadcast_strides(b.shape[:-2], b.strides[:-2], batch)
    merged, (a_st, b_st) = coalesce(batch, [a_bs, b_bs])
    out_shape = batch + (a.shape[-2], b.shape[-1])
    if prod(out_shape) >= INT_LIMIT:
        raise CudaShapeError(f"matmul {a.shape} @ {b.shape}: the result exceeds the CUDA kernels' 32-bit indexing")
    mat_strides = (a.strides[-2], a.strides[-1], b.strides[-2], b.strides[-1])
    return out_shape, mat_strides, layout(merged, a_st), layout(merged, b_st)


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
    its operands' dtype: float32 storage (float32, bool masks) runs the kernels below; the 16-bit
    dtypes have no product kernel yet and raise NoKernelError."""
    require_float32("matmul", a, b)
    key = (a.shape, a.strides, b.shape, b.strides)
    plan = _plans.get(key)
    if plan is None:
        plan = remember(_plans, key, _plan(a, b))
    out_shape, strides, a_batch, b_batch = plan
    out = empty(out_shape)
    if out.size:
        n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
        _launch(ptr(out), ptr(a), ptr(b), n, m, k, strides, a_batch, b_batch, out.size // (n * m), f"matmul {a.shape} @ {b.shape}")
    return out


def linear_fw(x: TensorData, weight: TensorData, bias: Optional[TensorData], activation: Optional[str]) -> Tuple[TensorData, Optional[TensorData]]:
    """(act(x @ weight + bias), x @ weight + bias kept for backward when act is set) for x [rows, in]
    and weight [in, out], bias [out] or None, activation None, "gelu" or "relu"."""
    rows, k = x.shape
    n = weight.shape[1]
    out = empty((rows, n))
    pre = empty((rows, n)) if activation is not None else None
    if out.size:
        epilogue = EPILOGUES[activation if activation is not None else ("bias" if bias is not None else None)]
        _launch(
            ptr(out), ptr(x), ptr(weight), rows, n, k, (x.strides[0], x.strides[1], weight.strides[0], weight.strides[1]),
            _SINGLE, _SINGLE, 1, f"linear {x.shape} @ {weight.shape}", None if bias is None else ptr(bias), epilogue,
            None if pre is None else ptr(pre),
        )  # fmt: skip
    return out, pre


def raw_matmul(
    out: int, a: int, b: int, M: int, N: int, K: int, a_strides: Tuple[int, int], b_strides: Tuple[int, int],
    accumulate: bool = False, ldc: Optional[int] = None,
) -> None:  # fmt: skip
    """out (+)= A @ B on raw pointers; out row r at out + r * ldc floats (ldc default N: contiguous
    [M, N]); A[r, k] = a[r * a_strides[0] + k * a_strides[1]], B[k, c] likewise with b."""
    _launch(out, a, b, M, N, K, (*a_strides, *b_strides), _SINGLE, _SINGLE, 1, f"matmul [{M}, {K}] @ [{K}, {N}]",
            accumulate=accumulate, ldc=ldc)
