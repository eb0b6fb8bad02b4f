"""Conversions of a Tensor (a mixin of Tensor): NumPy arrays (also through NumPy's __array__
protocol: np.asarray(x)), lists, Python numbers, torch tensors, other backends (cpu(), cuda(),
to(device)) and dtypes (float(), long(), int(), bfloat16(), half(); double() refuses: minitorch
has no float64), and its printed form."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from . import tensor_functions as F
from .dtypes import DType, as_dtype, bfloat16, float16, float32, int64
from .fast_ops import FastOps
from .tensor_data import TensorData
from .tensor_ops import TensorBackend

if TYPE_CHECKING:
    from .tensor import Tensor


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
        """A numpy copy of the values (a device->host copy for GPU tensors): int64 for int64, float32
        for every other dtype (a bool's 1.0/0.0, a 16-bit float's values widened)."""
        if self.numel() == 0:
            return np.zeros(self.shape, dtype=np.int64 if self.dtype.is_integer else np.float32)
        span = 1 + sum((n - 1) * st for n, st in zip(self.shape, self._tensor.strides))
        flat = self.backend.ops.storage_to_numpy(self._tensor._storage[:span])
        item = flat.itemsize
        view = np.lib.stride_tricks.as_strided(
            flat, shape=self.shape, strides=tuple(s * item for s in self._tensor.strides)
        )
        return np.array(view, copy=True)

    def numpy(self: "Tensor") -> np.ndarray:
        """A numpy copy of the values in this tensor's dtype (float32, float16, int64 or bool);
        bfloat16, which NumPy lacks, as float32."""
        return self.to_numpy().astype(self.dtype.numpy or np.float32, copy=False)

    def __array__(self: "Tensor", dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        """NumPy's protocol: np.asarray(x) and np.array(x) give numpy() (in dtype if given)."""
        values = self.numpy()
        return values if dtype is None else values.astype(dtype, copy=False)

    def tolist(self: "Tensor") -> Any:
        """The values as (nested) Python lists of floats, ints or bools by dtype; a number for 0 dims."""
        return self.numpy().tolist()

    def item(self: "Tensor") -> Any:
        """The single value of a one-element tensor as a Python number: an int for int64, a bool for
        bool, a float otherwise."""
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.numpy().reshape(-1)[0].item()

    def __float__(self: "Tensor") -> float:
        return float(self.item())

    def __int__(self: "Tensor") -> int:
        return int(self.item())

    def __index__(self: "Tensor") -> int:
        """A one-element int64 tensor as an index (range(n), list[i]), as in torch."""
        if not self.dtype.is_integer or self.numel() != 1:
            raise TypeError(f"only one-element int64 tensors can be used as an index, not {self.dtype.name} {self.shape}")
        return int(self.item())

    def __bool__(self: "Tensor") -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"the truth value of a tensor of shape {self.shape} is ambiguous: use .all() or .any()")
        return bool(self.item() != 0)

    def to(
        self: "Tensor", *args: Union[str, TensorBackend, DType], dtype: Optional[DType] = None,
        device: Optional[Union[str, TensorBackend]] = None,
    ) -> "Tensor":  # fmt: skip
        """This tensor on another backend and/or in another dtype: to(backend), to(dtype),
        to(backend, dtype), or the keywords device= and dtype=; backend a TensorBackend or "cpu" /
        "cuda", dtype a minitorch dtype (or its name, or its NumPy equivalent).  The same tensor where
        nothing changes.  A dtype change alone is an autodiff op (its gradient is cast back to this
        dtype); a move to another backend is a copy that is a new leaf: it keeps the requires_grad flag
        but not the history."""
        backend: Optional[TensorBackend] = None
        dtype = None if dtype is None else as_dtype(dtype)
        for arg in args + (() if device is None else (device,)):
            if isinstance(arg, DType):
                dtype = arg
            elif isinstance(arg, TensorBackend) or (isinstance(arg, str) and arg.split(":")[0] in ("cpu", "cuda")):
                backend = as_backend(arg.split(":")[0] if isinstance(arg, str) else arg)
            else:
                dtype = as_dtype(arg)
        out = self
        if backend is not None and backend.ops is not self.backend.ops:
            data = TensorData(backend.ops.storage_from_numpy(self.to_numpy()), self.shape, dtype=int64 if self.dtype.is_integer else float32)
            out = type(self)(data, backend=backend)._with_dtype(self.dtype if dtype is None else dtype)
            return out.requires_grad_(self.requires_grad and out.dtype.is_floating)
        if dtype is None or dtype is self.dtype:
            return out
        return F.Cast.apply(self, dtype)

    def _with_dtype(self: "Tensor", dtype: DType) -> "Tensor":
        """This tensor's values in dtype as a tensor without history (itself when it has that dtype)."""
        return self if dtype is self.dtype else type(self)(self.backend.cast(self._tensor, dtype), backend=self.backend)

    def float(self: "Tensor") -> "Tensor":
        """This tensor as float32 (a bool tensor's 1.0/0.0 values as numbers); see to()."""
        return self.to(float32)

    def long(self: "Tensor") -> "Tensor":
        """This tensor as int64 (floats truncated toward zero, as in torch); see to()."""
        return self.to(int64)

    def int(self: "Tensor") -> "Tensor":
        """This tensor as int64: minitorch's one integer dtype stands in for torch's int32 too."""
        return self.to(int64)

    def double(self: "Tensor") -> "Tensor":
        """Refused: minitorch has no float64 (its kernels compute in float32); TypeError saying so."""
        raise TypeError(
            f"minitorch has no float64 dtype: double() of a {self.dtype.name} tensor {self.shape} cannot be made; "
            f"use .float() (float32), or .numpy().astype('float64') for float64 values on the host"
        )

    def cpu(self: "Tensor") -> "Tensor":
        """This tensor on the CPU (FastOps) backend (itself when it is on a CPU backend)."""
        return self if not self.backend.cuda else self.to("cpu")

    def cuda(self: "Tensor") -> "Tensor":
        """This tensor on the CUDA backend (itself when it is there)."""
        return self.to("cuda")

    def bfloat16(self: "Tensor") -> "Tensor":
        """This tensor as bfloat16 (rounded to nearest, ties to even); see to()."""
        return self.to(bfloat16)

    def half(self: "Tensor") -> "Tensor":
        """This tensor as float16 (rounded to nearest, ties to even); see to()."""
        return self.to(float16)

    def to_torch(self: "Tensor") -> Any:
        """A torch tensor sharing this tensor's memory (zero-copy on both CPU and GPU), of its storage's
        dtype: float32 on the CPU backends whatever the dtype, the dtype's own on CUDA."""
        import torch

        storage = self._tensor._storage
        base = torch.from_numpy(storage) if isinstance(storage, np.ndarray) else storage
        return base.as_strided(self.shape, self._tensor.strides)

    def __repr__(self: "Tensor") -> str:
        text = np.array2string(self.numpy(), precision=4, separator=", ", threshold=200, edgeitems=3, prefix="tensor(")
        extra = f", backend={self.backend.ops.__name__}"
        if self.dtype is not float32:
            extra += f", dtype={self.dtype!r}"
        if self.requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({text}{extra})"
