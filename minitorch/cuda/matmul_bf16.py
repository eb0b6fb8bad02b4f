"""Bindings of matmul_bf16_kernel.so (src/matmul_bf16_kernel.cu): bf16 products on the tensor cores
(wgmma on sm_90a, mma.sync elsewhere) with float32 sums, over any strides and broadcast batch dims,
with bias / GELU / ReLU epilogues, the pre-activation stored, accumulation into the output, or the
product times GELU's or ReLU's derivative at a stored pre-activation (a backward through the
activation); the output in float32 or bf16.

Two levels: `launch` takes raw device pointers, strides and batch layouts (what a backend holds);
`matmul` takes torch CUDA tensors, checks them and returns the output.  Few-tile products split K
through a workspace: pass one (a torch CUDA tensor of at least `workspace_bytes(...)` bytes) to keep
a launch free of allocations, e.g. inside a CUDA graph; without one, it comes from PyTorch's caching
allocator."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any, Dict, Optional, Tuple

from .layout import MtLayout, layout, product_plan, remember
from .runtime import CudaShapeError, check, runtime

_P, _I, _LL, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, MtLayout
SIGNATURES = {
    "matmul_bf16_workspace_bytes": (_LL, [_I, _I, _I, _I, _I, _I, _I, _I]),
    "launch_matmul_bf16": (
        _I, [_P, _I, _I, _P, _P, _I, _I, _I, _I, _I, _I, _I, _L, _L, _P, _I, _P, _I, _P, _I, _P, _LL, _P],
    ),
}  # fmt: skip
EPILOGUES = {None: 0, "bias": 1, "gelu": 2, "relu": 3}
DERIVATIVE_EPILOGUES = {"gelu": 6, "relu": 7}  # keep="derivative": pre_act receives act'(x + bias)
GRAD_EPILOGUES = {"gelu": 4, "relu": 5, "derivative": 8}  # activation_grad: x * act'(pre_act), or x * pre_act
OUT_DTYPES = {"float32": 0, "bfloat16": 1}
_SINGLE = layout((1,), (0,))  # the batch layout of one product

_workspace: Dict[tuple, int] = {}  # (M, N, K, batch, strides) -> the library's workspace bytes


def _lib() -> ctypes.CDLL:
    return runtime().lib("matmul_bf16_kernel", SIGNATURES)


def workspace_bytes(M: int, N: int, K: int, batch: int, strides: Tuple[int, int, int, int]) -> int:
    """Bytes of workspace the library uses for this product on the current device (0: none).
    strides: (A row, A k, B k, B column) in elements."""
    key = (M, N, K, batch, strides)
    found = _workspace.get(key)
    if found is None:
        found = remember(_workspace, key, int(_lib().matmul_bf16_workspace_bytes(M, N, K, batch, *strides)))
    return found


def launch(
    out: int, out_dtype: str, ldc: int, a: int, b: int, M: int, N: int, K: int, strides: Tuple[int, int, int, int],
    a_batch: MtLayout = _SINGLE, b_batch: MtLayout = _SINGLE, *, bias: Optional[int] = None,
    activation: Optional[str] = None, pre_act: Optional[int] = None, accumulate: bool = False,
    addend: Optional[int] = None, activation_grad: Optional[str] = None, workspace: Optional[Any] = None,
    keep: str = "pre", split_k: bool = True, beside: bool = False, what: str = "matmul_bf16",
) -> None:  # fmt: skip
    """out[i] (+)= act(A[i] @ B[i] + bias) on raw device pointers, on the current stream: A[i][r, k] at
    a + offset_i + r * strides[0] + k * strides[1], B[i][k, c] at b + offset_i + k * strides[2] +
    c * strides[3] (bf16 elements; offset_i from a_batch / b_batch, same shape, stride 0 = broadcast);
    out[i] row r at out + (i * M + r) * ldc elements of out_dtype ("float32" or "bfloat16"), as are
    bias [N] and pre_act (which receives A @ B + bias where activation is "gelu" or "relu"; with
    keep="derivative" the activation's derivative there instead, e.g. GELU's, rounded once).
    activation None with a bias adds the bias; accumulate (no activation) adds what out holds, or with
    addend (a pointer laid out as out, e.g. a residual stream) what addend holds: out = A @ B + bias + addend.
    activation_grad "gelu" or "relu" (no bias, activation or accumulation): out = (A @ B) * act'(pre_act),
    pre_act read (laid out as out): the gradient through act of a product's input; "derivative":
    out = (A @ B) * pre_act, pre_act being what keep="derivative" wrote.
    workspace: a torch CUDA tensor of at least workspace_bytes(...) bytes, or None (allocated here).
    split_k False: the product's K is never split over blocks (no workspace, no reduction pass), for a
    product that runs beside other work (a weight gradient on the side stream), which fills the SMs
    its few output tiles leave.  beside: the product runs beside other work on another stream, so its
    tile shapes are picked to leave SMs to that work rather than to finish soonest alone (on an H100 a
    768 x 3072 weight gradient then takes 96 tiles of 128 x 192, not 128 of 192 x 96; a 4096 x 768
    input gradient keeps 128 tiles rather than its transpose's 132)."""
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"{what}: out_dtype {out_dtype!r} is not one of {sorted(OUT_DTYPES)}")
    if activation not in EPILOGUES or activation == "bias":
        raise ValueError(f"{what}: activation {activation!r} is not None, 'gelu' or 'relu'")
    if accumulate and activation is not None:
        raise ValueError(f"{what}: accumulate=True takes no activation")
    if addend is not None and not accumulate:
        raise ValueError(f"{what}: addend is read by accumulate=True")
    if keep not in ("pre", "derivative"):
        raise ValueError(f"{what}: keep {keep!r} is not 'pre' or 'derivative'")
    if activation_grad is not None:
        if activation_grad not in GRAD_EPILOGUES:
            raise ValueError(f"{what}: activation_grad {activation_grad!r} is not 'gelu', 'relu' or 'derivative'")
        if bias is not None or activation is not None or accumulate or pre_act is None:
            raise ValueError(f"{what}: activation_grad reads pre_act and takes no bias, activation or accumulate")
        epilogue = GRAD_EPILOGUES[activation_grad]
    elif activation is not None and keep == "derivative":
        epilogue = DERIVATIVE_EPILOGUES[activation]
    else:
        epilogue = EPILOGUES[activation if activation is not None else ("bias" if bias is not None else None)]
    batch = 1
    for d in range(a_batch.ndim):
        batch *= a_batch.shape[d]
    rt = runtime()
    if not split_k:
        workspace = None
    elif workspace is None and M and N and K and batch:
        needed = workspace_bytes(M, N, K, batch, strides)
        if needed:
            workspace = rt.torch.empty(needed, dtype=rt.torch.uint8, device=rt.device)
    ws_bytes = 0 if workspace is None else workspace.numel() * workspace.element_size()
    lib = _lib()
    code = lib.launch_matmul_bf16(
        out, OUT_DTYPES[out_dtype], ldc, a, b, M, N, K, *strides, a_batch, b_batch, bias, epilogue, pre_act,
        int(accumulate), addend, int(beside), None if workspace is None else workspace.data_ptr(), ws_bytes,
        rt.stream(),
    )  # fmt: skip
    check(code, lib, what)


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise CudaShapeError(message)


def _check_operand(torch: Any, x: Any, name: str, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what}: {name} is a {type(x).__name__}, not a torch tensor")
    if x.dtype != torch.bfloat16 or not x.is_cuda:
        raise ValueError(f"{what}: {name} must be a bfloat16 CUDA tensor, got {x.dtype} on {x.device}")
    _require(x.dim() >= 2, f"{what}: {name} of shape {tuple(x.shape)} needs at least 2 dims")


def _check_output(x: Any, name: str, shape: Tuple[int, ...], dtype: Any, what: str) -> int:
    """The row stride (ldc) of an output tensor (out or pre_act) laid out as the kernel writes it: unit
    stride along N, rows ldc >= N apart, batch matrices one after another (M * ldc apart)."""
    if x.dtype != dtype or not x.is_cuda:
        raise ValueError(f"{what}: {name} must be a {dtype} CUDA tensor, got {x.dtype} on {x.device}")
    _require(tuple(x.shape) == shape, f"{what}: {name} has shape {tuple(x.shape)}, the product {shape}")
    strides = x.stride()
    rows, cols = shape[-2:]
    ldc = strides[-2] if rows > 1 else max(strides[-2], cols)
    matrices = 1  # matrices in one step of batch dim d: those of the dims after it
    batch_ok = True
    for d in reversed(range(len(shape) - 2)):
        batch_ok = batch_ok and (shape[d] == 1 or strides[d] == rows * ldc * matrices)
        matrices *= shape[d]
    _require(
        x.numel() == 0 or ((strides[-1] == 1 or cols == 1) and ldc >= cols and batch_ok),
        f"{what}: {name} strides {tuple(strides)} are not unit-stride rows with batch matrices one after another",
    )
    return ldc


def matmul(
    a: Any, b: Any, *, out: Optional[Any] = None, out_dtype: Optional[Any] = None, bias: Optional[Any] = None,
    activation: Optional[str] = None, pre_act: Optional[Any] = None, accumulate: bool = False,
    addend: Optional[Any] = None, activation_grad: Optional[str] = None, workspace: Optional[Any] = None,
    keep: str = "pre", beside: bool = False,
) -> Any:  # fmt: skip
    """act(a @ b + bias) for bf16 torch CUDA tensors a [..., M, K], b [..., K, N] (any strides, batch
    dims broadcast), float32 sums, into `out` (a new contiguous tensor of out_dtype, default bfloat16,
    when None; else out's dtype, float32 or bfloat16, with unit column stride, rows at least N apart and
    batch matrices one after another).  bias [N] and pre_act (receives a @ b + bias, with activation
    "gelu" or "relu"; keep="derivative": the activation's derivative there) share out's dtype.
    accumulate: out += a @ b (+ bias).  addend (out's shape, dtype and row stride): out = a @ b + bias +
    addend, addend read in the epilogue.  activation_grad "gelu" or "relu": out = (a @ b) *
    act'(pre_act), pre_act read; "derivative": out = (a @ b) * pre_act.  beside: as launch's (tile
    shapes for a product that shares the GPU with work on another stream).  Returns out."""
    rt = runtime()
    torch = rt.torch
    what = "matmul_bf16"
    _check_operand(torch, a, "a", what)
    _check_operand(torch, b, "b", what)
    _require(a.shape[-1] == b.shape[-2], f"{what}: a {tuple(a.shape)} @ b {tuple(b.shape)}: inner sizes differ")
    what = f"matmul_bf16 {tuple(a.shape)} @ {tuple(b.shape)}"
    out_shape, strides, a_batch, b_batch = product_plan(
        SimpleNamespace(shape=tuple(a.shape), strides=tuple(a.stride())),
        SimpleNamespace(shape=tuple(b.shape), strides=tuple(b.stride())),
    )
    dtype = out.dtype if out is not None else (out_dtype if out_dtype is not None else torch.bfloat16)
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"{what}: the output dtype must be float32 or bfloat16, got {dtype}")
    if accumulate and out is None:
        raise ValueError(f"{what}: accumulate=True needs out")
    if out is None:
        out = torch.empty(out_shape, dtype=dtype, device=a.device)
    ldc = _check_output(out, "out", tuple(out_shape), dtype, what)
    if bias is not None:
        _require(tuple(bias.shape) == (out_shape[-1],), f"{what}: bias of shape {tuple(bias.shape)}, expected ({out_shape[-1]},)")
        if bias.dtype != dtype or not bias.is_cuda or bias.stride(0) != 1:
            raise ValueError(f"{what}: bias must be a contiguous {dtype} CUDA tensor, got {bias.dtype} on {bias.device}")
    if pre_act is not None:
        if activation is None and activation_grad is None:
            raise ValueError(f"{what}: pre_act is stored with activation or read with activation_grad 'gelu' or 'relu'")
        _require(_check_output(pre_act, "pre_act", tuple(out_shape), dtype, what) == ldc,
                 f"{what}: pre_act rows are {pre_act.stride(-2)} apart, out's {ldc}")  # fmt: skip
    if addend is not None:
        if activation is not None or addend.dtype != dtype or not addend.is_cuda:
            raise ValueError(f"{what}: addend must be a {dtype} CUDA tensor, with no activation")
        _require(_check_output(addend, "addend", tuple(out_shape), dtype, what) == ldc,
                 f"{what}: addend rows are {addend.stride(-2)} apart, out's {ldc}")  # fmt: skip
    M, K, N = out_shape[-2], a.shape[-1], out_shape[-1]
    if out.numel():
        launch(
            out.data_ptr(), "bfloat16" if dtype == torch.bfloat16 else "float32", ldc, a.data_ptr(), b.data_ptr(), M, N,
            K, strides, a_batch, b_batch, bias=None if bias is None else bias.data_ptr(), activation=activation,
            pre_act=None if pre_act is None else pre_act.data_ptr(), accumulate=accumulate or addend is not None,
            addend=None if addend is None else addend.data_ptr(),
            activation_grad=activation_grad, workspace=workspace, keep=keep, beside=beside, what=what,
        )  # fmt: skip
    return out
