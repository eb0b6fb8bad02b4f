"""Creating tensors: from numpy, nested lists, torch, or filled with constants, ranges or random numbers.

`dtype=` (a minitorch DType, default float32) gives the tensor's dtype: the values are made in float32
and cast (rounded to nearest even for the 16-bit floats)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .dtypes import DType, as_dtype, bfloat16, bool_, float32
from .rng import next_seed
from .tensor import Tensor, default_backend
from .tensor_convert import as_backend
from .tensor_data import TensorData, prod
from .tensor_ops import TensorBackend


def _backend(backend: Any) -> TensorBackend:
    """The default backend for None, else backend (a TensorBackend, "cpu" or "cuda")."""
    return default_backend() if backend is None else as_backend(backend)


def tensor_from_numpy(
    arr: Any, backend: Optional[TensorBackend] = None, requires_grad: bool = False, dtype: Optional[DType] = None
) -> Tensor:
    """A tensor holding a copy of a numpy array (any strides or memory order) in dtype: by default
    float32, or minitorch.bool for a bool array."""
    backend = _backend(backend)
    a = np.asarray(arr)
    if a.dtype.kind not in "fiub":
        raise TypeError(f"cannot make a tensor from a numpy array of dtype {a.dtype}")
    dtype = (bool_ if a.dtype.kind == "b" else float32) if dtype is None else as_dtype(dtype)
    shape = a.shape
    flat = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    data = TensorData(backend.ops.storage_from_numpy(flat), shape)
    if dtype is bool_ and a.dtype.kind == "b":
        data = data.with_dtype(bool_)
    return Tensor(data, backend=backend)._with_dtype(dtype).requires_grad_(requires_grad)


def tensor(
    data: Any, backend: Optional[TensorBackend] = None, requires_grad: bool = False, dtype: Optional[DType] = None
) -> Tensor:
    """A tensor from a number, (nested lists of) numbers or bools, a numpy array or a Tensor (whose
    dtype it keeps unless dtype says otherwise); a copy."""
    if isinstance(data, Tensor):
        dtype = data.dtype if dtype is None else dtype
        data = data.numpy()
    try:
        arr = np.array(data)
    except ValueError as e:
        raise ValueError(f"tensor() needs a rectangular nested list of numbers: {e}") from None
    if arr.dtype.kind not in "fiub":
        bad = next((x for x in np.asarray(arr, dtype=object).reshape(-1) if not isinstance(x, (int, float, bool, np.number, np.bool_))), None)
        raise TypeError(
            f"tensor() needs numbers or bools, got {type(bad).__name__} {bad!r} "
            f"(in {str(data)[:80]}); a ragged nested list or a None is not a tensor"
        )
    return tensor_from_numpy(arr, backend=backend, requires_grad=requires_grad, dtype=dtype)


def _empty(shape: Sequence[int], backend: Optional[TensorBackend], dtype: DType = float32) -> Tensor:
    backend = _backend(backend)
    shape = tuple(int(s) for s in shape)
    dtype = as_dtype(dtype)
    return Tensor(TensorData(backend.ops.storage_empty(prod(shape), dtype), shape, dtype=dtype), backend=backend)


def _filled(shape: Sequence[int], value: float, backend: Optional[TensorBackend], dtype: DType = float32) -> Tensor:
    out = _empty(shape, backend, dtype)
    out.backend.fill(out._tensor, value)
    return out


def zeros(
    shape: Sequence[int], backend: Optional[TensorBackend] = None, requires_grad: bool = False, dtype: DType = float32
) -> Tensor:
    """A tensor of zeros."""
    return _filled(shape, 0.0, backend, dtype).requires_grad_(requires_grad)


def ones(
    shape: Sequence[int], backend: Optional[TensorBackend] = None, requires_grad: bool = False, dtype: DType = float32
) -> Tensor:
    """A tensor of ones."""
    return _filled(shape, 1.0, backend, dtype).requires_grad_(requires_grad)


def full(shape: Sequence[int], value: float, backend: Optional[TensorBackend] = None, dtype: DType = float32) -> Tensor:
    """A tensor filled with one value (rounded to dtype)."""
    return _filled(shape, float(value), backend, dtype)


def rand(
    shape: Sequence[int], backend: Optional[TensorBackend] = None, requires_grad: bool = False, dtype: DType = float32
) -> Tensor:
    """Uniform [0, 1) numbers, drawn on the tensor's own device (seeded by manual_seed).  For a 16-bit
    dtype the float32 draws are scaled by 1 - 2^-(mantissa bits + 2) before rounding, so that none
    rounds up to 1."""
    dtype = as_dtype(dtype)
    out = _empty(shape, backend)
    out.backend.ops.uniform(out._tensor, next_seed())
    if dtype.rounds:
        out = out * (1.0 - 2.0 ** -(dtype.mantissa_bits + 2))
    return out._with_dtype(dtype).requires_grad_(requires_grad)


def from_torch(t: Any, backend: Optional[TensorBackend] = None) -> Tensor:
    """A minitorch tensor of a float32 or bfloat16 torch tensor's values: over its memory on CUDA
    (zero-copy when it is contiguous) and for a float32 one on the CPU; a CPU bfloat16 one is copied
    into the CPU backends' float32 storage.

    A CUDA torch tensor needs the CUDA backend (the default for it); a CPU one a CPU backend.
    """
    import torch

    if t.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"from_torch needs a float32 tensor, got {t.dtype} (a bfloat16 one works too)")
    dtype = bfloat16 if t.dtype == torch.bfloat16 else float32
    if backend is None:
        if t.is_cuda:
            from .cuda_kernel_ops import CudaKernelOps

            backend = TensorBackend(CudaKernelOps)
        else:
            backend = default_backend()
    if t.is_cuda != bool(backend.ops.is_cuda):
        raise TypeError(f"a {'CUDA' if t.is_cuda else 'CPU'} torch tensor cannot back a {backend.ops.__name__} tensor")
    flat = t.detach().contiguous().reshape(-1)
    if t.is_cuda:
        storage = flat
    else:
        storage = flat.numpy() if dtype is float32 else dtype.decode(flat.view(torch.int16).numpy().view(np.uint16))
    return Tensor(TensorData(storage, tuple(t.shape), dtype=dtype), backend=backend)


def zeros_like(t: Tensor, requires_grad: bool = False, dtype: Optional[DType] = None) -> Tensor:
    """Zeros of t's shape on t's backend, of t's dtype unless dtype says otherwise."""
    return zeros(t.shape, t.backend, requires_grad, t.dtype if dtype is None else dtype)


def ones_like(t: Tensor, requires_grad: bool = False, dtype: Optional[DType] = None) -> Tensor:
    """Ones of t's shape on t's backend, of t's dtype unless dtype says otherwise."""
    return ones(t.shape, t.backend, requires_grad, t.dtype if dtype is None else dtype)


def arange(
    start: float, end: Optional[float] = None, step: float = 1, backend: Optional[TensorBackend] = None,
    requires_grad: bool = False,
) -> Tensor:  # fmt: skip
    """start, start + step, ... up to but not including end (arange(n): 0 .. n - 1), as torch.arange."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange step must not be zero")
    n = max(0, int(np.ceil((end - start) / step)))
    out = _filled((n,), 0.0, backend)
    if n:
        out.backend.ops.arange(out._tensor)
    if start != 0 or step != 1:
        out = out * float(step) + float(start)
    return out.requires_grad_(requires_grad)
