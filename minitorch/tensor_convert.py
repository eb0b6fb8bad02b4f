"""Conversions of a Tensor (a mixin of Tensor): NumPy arrays, lists, Python numbers, torch tensors,
other backends, and its printed form; the dtypes minitorch.float32 and minitorch.bool."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

import numpy as np

from .fast_ops import FastOps
from .tensor_data import TensorData
from .tensor_ops import TensorBackend

if TYPE_CHECKING:
    from .tensor import Tensor

float32 = np.dtype(np.float32)
bool_ = np.dtype(np.bool_)  # minitorch.bool: 1.0/0.0 values (stored as float32) that index as a mask


def as_backend(spec: Union[str, TensorBackend]) -> TensorBackend:
    """A TensorBackend, or "cpu" (FastOps) / "cuda" (CudaKernelOps) as one."""
    if isinstance(spec, TensorBackend):
        return spec
    if spec == "cpu":
        return TensorBackend(FastOps)
    if spec == "cuda":
        from .cuda_kernel_ops import CudaKernelOps

        return TensorBackend(CudaKernelOps)
    raise ValueError(f"expected a minitorch.TensorBackend, 'cpu' or 'cuda', got {spec!r}")


class Conversions:
    """Reading a tensor's values out, and moving it; mixed into Tensor."""

    def to_numpy(self: "Tensor") -> np.ndarray:
        """A float32 numpy copy of the values (a device->host copy for GPU tensors)."""
        if self.size == 0:
            return np.zeros(self.shape, dtype=np.float32)
        span = 1 + sum((n - 1) * st for n, st in zip(self.shape, self._tensor.strides))
        flat = self.backend.ops.storage_to_numpy(self._tensor._storage[:span])
        item = flat.itemsize
        view = np.lib.stride_tricks.as_strided(
            flat, shape=self.shape, strides=tuple(s * item for s in self._tensor.strides)
        )
        return np.array(view, dtype=np.float32, copy=True)

    def numpy(self: "Tensor") -> np.ndarray:
        """A numpy copy of the values in this tensor's dtype (float32, or bool)."""
        return self.to_numpy().astype(self._dtype, copy=False)

    def tolist(self: "Tensor") -> Any:
        """The values as (nested) Python lists of floats (bools for a bool tensor); a number for 0 dims."""
        return self.numpy().tolist()

    def item(self: "Tensor") -> float:
        """The single value of a one-element tensor."""
        if self.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return float(self.to_numpy().reshape(-1)[0])

    def __float__(self: "Tensor") -> float:
        return self.item()

    def __int__(self: "Tensor") -> int:
        return int(self.item())

    def __bool__(self: "Tensor") -> bool:
        if self.size != 1:
            raise RuntimeError(f"the truth value of a tensor of shape {self.shape} is ambiguous: use .all() or .any()")
        return self.item() != 0.0

    def to(self: "Tensor", backend: Union[str, TensorBackend]) -> "Tensor":
        """A copy on another backend (the same tensor if it is already there); backend may be a
        TensorBackend or "cpu" / "cuda".  The copy is a new leaf: it keeps the requires_grad flag but
        not the history."""
        backend = as_backend(backend)
        if backend.ops is self.backend.ops:
            return self
        out = type(self)(TensorData(backend.ops.storage_from_numpy(self.to_numpy()), self.shape), backend=backend)
        return self._keep_dtype(out.requires_grad_(self.requires_grad()))

    def to_torch(self: "Tensor") -> Any:
        """A torch tensor sharing this tensor's memory (zero-copy on both CPU and GPU)."""
        import torch

        storage = self._tensor._storage
        base = torch.from_numpy(storage) if isinstance(storage, np.ndarray) else storage
        return base.as_strided(self.shape, self._tensor.strides)

    def __repr__(self: "Tensor") -> str:
        text = np.array2string(self.numpy(), precision=4, separator=", ", threshold=200, edgeitems=3, prefix="tensor(")
        extra = f", backend={self.backend.ops.__name__}"
        if self._dtype is not float32:
            extra += ", dtype=minitorch.bool"
        if self.requires_grad():
            extra += ", requires_grad=True"
        return f"tensor({text}{extra})"
