"""Creating tensors: from numpy, nested lists, torch, or filled with constants, ranges or random numbers."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .rng import next_seed
from .tensor import Tensor, default_backend
from .tensor_convert import as_backend, bool_
from .tensor_data import TensorData, prod
from .tensor_ops import TensorBackend


def _backend(backend: Any) -> TensorBackend:
    """The default backend for None, else backend (a TensorBackend, "cpu" or "cuda")."""
    return default_backend() if backend is None else as_backend(backend)


def tensor_from_numpy(
    arr: Any, backend: Optional[TensorBackend] = None, requires_grad: bool = False
) -> Tensor:
    """A tensor holding a float32 copy of a numpy array (any strides or memory order); a bool array
    gives a tensor of dtype minitorch.bool."""
    backend = _backend(backend)
    a = np.asarray(arr)
    if a.dtype.kind not in "fiub":
        raise TypeError(f"cannot make a tensor from a numpy array of dtype {a.dtype}")
    shape = a.shape
    flat = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    t = Tensor(TensorData(backend.ops.storage_from_numpy(flat), shape), backend=backend)
    if a.dtype.kind == "b":
        t._dtype = bool_
    return t.requires_grad_(requires_grad)


def tensor(data: Any, backend: Optional[TensorBackend] = None, requires_grad: bool = False) -> Tensor:
    """A tensor from a number, (nested lists of) numbers or bools, or a numpy array; a copy."""
    if isinstance(data, Tensor):
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
    return tensor_from_numpy(arr, backend=backend, requires_grad=requires_grad)


def _filled(shape: Sequence[int], value: float, backend: Optional[TensorBackend]) -> Tensor:
    backend = _backend(backend)
    shape = tuple(int(s) for s in shape)
    out = Tensor(TensorData(backend.ops.storage_empty(prod(shape)), shape), backend=backend)
    backend.ops.fill(out._tensor, value)
    return out


def zeros(shape: Sequence[int], backend: Optional[TensorBackend] = None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros."""
    return _filled(shape, 0.0, backend).requires_grad_(requires_grad)


def ones(shape: Sequence[int], backend: Optional[TensorBackend] = None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones."""
    return _filled(shape, 1.0, backend).requires_grad_(requires_grad)


def full(shape: Sequence[int], value: float, backend: Optional[TensorBackend] = None) -> Tensor:
    """A tensor filled with one value."""
    return _filled(shape, float(value), backend)


def rand(shape: Sequence[int], backend: Optional[TensorBackend] = None, requires_grad: bool = False) -> Tensor:
    """Uniform [0, 1) numbers, drawn on the tensor's own device (seeded by manual_seed)."""
    backend = _backend(backend)
    shape = tuple(int(s) for s in shape)
    out = Tensor(TensorData(backend.ops.storage_empty(prod(shape)), shape), backend=backend)
    backend.ops.uniform(out._tensor, next_seed())
    return out.requires_grad_(requires_grad)


def from_torch(t: Any, backend: Optional[TensorBackend] = None) -> Tensor:
    """A minitorch tensor over a float32 torch tensor's memory (zero-copy when it is contiguous).

    A CUDA torch tensor needs the CUDA backend (the default for it); a CPU one a CPU backend.
    """
    import torch

    if t.dtype != torch.float32:
        raise TypeError(f"from_torch needs a float32 tensor, got {t.dtype}")
    if backend is None:
        if t.is_cuda:
            from .cuda_kernel_ops import CudaKernelOps

            backend = TensorBackend(CudaKernelOps)
        else:
            backend = default_backend()
    if t.is_cuda != bool(backend.ops.is_cuda):
        raise TypeError(f"a {'CUDA' if t.is_cuda else 'CPU'} torch tensor cannot back a {backend.ops.__name__} tensor")
    flat = t.detach().contiguous().reshape(-1)
    storage = flat if t.is_cuda else flat.numpy()
    return Tensor(TensorData(storage, tuple(t.shape)), backend=backend)


def zeros_like(t: Tensor, requires_grad: bool = False) -> Tensor:
    """Zeros of t's shape on t's backend."""
    return zeros(t.shape, t.backend, requires_grad)


def ones_like(t: Tensor, requires_grad: bool = False) -> Tensor:
    """Ones of t's shape on t's backend."""
    return ones(t.shape, t.backend, requires_grad)


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
