"""Creating tensors: from numpy, nested lists, torch, or filled with constants or random numbers."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .rng import next_seed
from .tensor import Tensor, default_backend
from .tensor_data import TensorData, prod
from .tensor_ops import TensorBackend


def tensor_from_numpy(
    arr: Any, backend: Optional[TensorBackend] = None, requires_grad: bool = False
) -> Tensor:
    """A tensor holding a float32 copy of a numpy array (any strides or memory order)."""
    backend = backend if backend is not None else default_backend()
    a = np.asarray(arr)
    if a.dtype.kind not in "fiub":
        raise TypeError(f"cannot make a tensor from a numpy array of dtype {a.dtype}")
    shape = a.shape
    flat = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    t = Tensor(TensorData(backend.ops.storage_from_numpy(flat), shape), backend=backend)
    return t.requires_grad_(requires_grad)


def tensor(data: Any, backend: Optional[TensorBackend] = None, requires_grad: bool = False) -> Tensor:
    """A tensor from (nested lists of) numbers."""
    try:
        arr = np.array(data, dtype=np.float32)
    except ValueError as e:
        raise ValueError(f"tensor() needs a rectangular nested list of numbers: {e}") from None
    return tensor_from_numpy(arr, backend=backend, requires_grad=requires_grad)


def _filled(shape: Sequence[int], value: float, backend: Optional[TensorBackend]) -> Tensor:
    backend = backend if backend is not None else default_backend()
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
    backend = backend if backend is not None else default_backend()
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
