"""Creating tensors, with PyTorch's signatures: from data (tensor, from_numpy, tensor_from_numpy,
from_torch), filled (zeros, ones, full, eye and the *_like), ranges (arange, linspace) and random
numbers (rand, randn).

Sizes are given as f(2, 3), f((2, 3)) or f([2, 3]).  Keywords: dtype= (a minitorch dtype, its name or
its NumPy equivalent), device= ("cpu" or "cuda"; or backend=, minitorch's name: a TensorBackend or
"cpu" / "cuda") and requires_grad= (a bool; floating dtypes only).  Without dtype=, data keeps its
kind as in PyTorch: integers give int64, bools bool, floats float32 (minitorch has no float64: a
float64 array becomes float32)."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import numpy as np

from .dtypes import DType, as_dtype, bfloat16, bool_, float32, int64
from .rng import next_seed
from .tensor import Tensor, default_backend
from .tensor_convert import as_backend
from .tensor_data import TensorData, prod
from .tensor_ops import TensorBackend

Device = Union[None, str, TensorBackend]


def _backend(backend: Device = None, device: Device = None) -> TensorBackend:
    """The backend of device= / backend= (the CPU default for neither); TypeError or ValueError for
    anything else, or for two that disagree."""
    if device is not None and backend is not None and as_backend(device) is not as_backend(backend):
        raise ValueError(f"device={device!r} and backend={backend!r} name different backends; pass one")
    spec = device if device is not None else backend
    if spec is None:
        return default_backend()
    if not isinstance(spec, (str, TensorBackend)):
        raise TypeError(f"device must be 'cpu', 'cuda' or a minitorch.TensorBackend, got {type(spec).__name__} {spec!r}")
    return as_backend(spec.split(":")[0] if isinstance(spec, str) else spec)


def _flag(requires_grad: Any) -> bool:
    if not isinstance(requires_grad, bool):
        raise TypeError(f"requires_grad must be a bool, got {type(requires_grad).__name__} {requires_grad!r}")
    return requires_grad


def _sizes(size: Sequence[Any], call: str) -> tuple:
    """Sizes given as f(2, 3), f((2, 3)) or f([2, 3]), checked to be non-negative ints."""
    sizes = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            hint = " (pass the backend as backend= or device=)" if isinstance(s, (str, TensorBackend)) else ""
            raise TypeError(f"{call}() sizes must be ints, got {type(s).__name__} {s!r} in {sizes}{hint}")
        if s < 0:
            raise ValueError(f"{call}() sizes must be non-negative, got {sizes}")
    return tuple(int(s) for s in sizes)


def _kind_dtype(a: np.ndarray) -> DType:
    """The dtype data of NumPy dtype a.dtype takes without dtype=: int64, bool or float32."""
    return int64 if a.dtype.kind in "iu" else bool_ if a.dtype.kind == "b" else float32


def tensor_from_numpy(
    arr: Any, backend: Device = None, requires_grad: bool = False, dtype: Any = None, *, device: Device = None
) -> Tensor:
    """A tensor holding a copy of a numpy array (any strides or memory order) in dtype: by default
    int64 for an integer array, bool for a bool one, float32 otherwise."""
    backend = _backend(backend, device)
    a = np.asarray(arr)
    if a.dtype.kind not in "fiub":
        raise TypeError(f"cannot make a tensor from a numpy array of dtype {a.dtype}")
    natural = _kind_dtype(a)
    dtype = natural if dtype is None else as_dtype(dtype)
    flat = np.ascontiguousarray(a, dtype=np.int64 if natural is int64 else np.float32).reshape(-1)
    data = TensorData(backend.ops.storage_from_numpy(flat), a.shape, dtype=natural)
    return Tensor(data, backend=backend)._with_dtype(dtype).requires_grad_(_flag(requires_grad))


def tensor(
    data: Any, *, dtype: Any = None, device: Device = None, requires_grad: bool = False, backend: Device = None
) -> Tensor:
    """A tensor from a number, (nested lists of) numbers or bools, a numpy array or a Tensor (whose
    dtype it keeps unless dtype says otherwise); a copy.  tensor([1, 2]) is int64, as in torch."""
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
    return tensor_from_numpy(arr, backend=backend, requires_grad=requires_grad, dtype=dtype, device=device)


def from_numpy(arr: np.ndarray) -> Tensor:
    """A CPU tensor over a NumPy array, as torch.from_numpy: it shares the array's memory (writes to
    either show in both) when the array is C-contiguous and float32 or int64; other arrays are
    copied (float64 as float32, other integers as int64, bools as bool)."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"from_numpy expects a numpy.ndarray, got {type(arr).__name__}")
    if arr.dtype in (np.float32, np.int64) and arr.flags.c_contiguous:
        dtype = int64 if arr.dtype == np.int64 else float32
        return Tensor(TensorData(arr.reshape(-1), arr.shape, dtype=dtype), backend=default_backend())
    return tensor_from_numpy(arr)


def _empty(shape: Sequence[int], backend: TensorBackend, dtype: DType = float32) -> Tensor:
    return Tensor(TensorData(backend.ops.storage_empty(prod(shape), dtype), tuple(shape), dtype=dtype), backend=backend)


def full(
    size: Sequence[int], fill_value: float, *, dtype: Any = None, device: Device = None, requires_grad: bool = False,
    backend: Device = None,
) -> Tensor:  # fmt: skip
    """A tensor of size filled with fill_value; its dtype by default that of the value (int64 for an
    int, bool for a bool, float32 for a float), as torch.full."""
    if isinstance(fill_value, bool):
        natural = bool_
    elif isinstance(fill_value, (int, np.integer)):
        natural = int64
    elif isinstance(fill_value, (float, np.floating)):
        natural = float32
    else:
        raise TypeError(f"full() fill_value must be a number, got {type(fill_value).__name__} {fill_value!r}")
    out = _empty(_sizes((size,), "full"), _backend(backend, device), natural if dtype is None else as_dtype(dtype))
    out.backend.fill(out._tensor, fill_value)
    return out.requires_grad_(_flag(requires_grad))


def zeros(*size: Any, dtype: Any = None, device: Device = None, requires_grad: bool = False, backend: Device = None) -> Tensor:
    """A float32 (or dtype) tensor of zeros: zeros(2, 3) or zeros((2, 3))."""
    return full(_sizes(size, "zeros"), 0.0, dtype=dtype, device=device, requires_grad=requires_grad, backend=backend)


def ones(*size: Any, dtype: Any = None, device: Device = None, requires_grad: bool = False, backend: Device = None) -> Tensor:
    """A float32 (or dtype) tensor of ones: ones(2, 3) or ones((2, 3))."""
    return full(_sizes(size, "ones"), 1.0, dtype=dtype, device=device, requires_grad=requires_grad, backend=backend)


def eye(n: int, m: Optional[int] = None, *, dtype: Any = None, device: Device = None, requires_grad: bool = False,
        backend: Device = None) -> Tensor:  # fmt: skip
    """The n x m (default n x n) identity matrix."""
    n, m = _sizes((n, n if m is None else m), "eye")
    backend = _backend(backend, device)
    rows = _empty((n, 1), backend, int64)
    cols = _empty((1, m), backend, int64)
    backend.ops.arange(rows._tensor)
    backend.ops.arange(cols._tensor)
    return (rows == cols).to(float32 if dtype is None else as_dtype(dtype)).requires_grad_(_flag(requires_grad))


def _like(t: Tensor, value: float, dtype: Any, requires_grad: bool) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"expected a minitorch.Tensor, got {type(t).__name__}")
    return full(t.shape, value, dtype=t.dtype if dtype is None else dtype, backend=t.backend, requires_grad=requires_grad)


def zeros_like(t: Tensor, *, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """Zeros of t's shape on t's backend, of t's dtype unless dtype says otherwise."""
    return _like(t, 0.0, dtype, requires_grad)


def ones_like(t: Tensor, *, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """Ones of t's shape on t's backend, of t's dtype unless dtype says otherwise."""
    return _like(t, 1.0, dtype, requires_grad)


def full_like(t: Tensor, fill_value: float, *, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """fill_value in t's shape on t's backend, of t's dtype unless dtype says otherwise."""
    return _like(t, fill_value, dtype, requires_grad)


def rand(*size: Any, dtype: Any = None, device: Device = None, requires_grad: bool = False, backend: Device = None) -> Tensor:
    """Uniform [0, 1) numbers, drawn on the tensor's own device (seeded by manual_seed).  For a 16-bit
    dtype the float32 draws are scaled by 1 - 2^-(mantissa bits + 2) before rounding, so that none
    rounds up to 1."""
    dtype = float32 if dtype is None else as_dtype(dtype)
    if not dtype.is_floating:
        raise TypeError(f"rand() makes floating-point numbers, not {dtype.name}")
    out = _empty(_sizes(size, "rand"), _backend(backend, device))
    out.backend.ops.uniform(out._tensor, next_seed())
    if dtype.rounds:
        out = out * (1.0 - 2.0 ** -(dtype.mantissa_bits + 2))
    return out._with_dtype(dtype).requires_grad_(_flag(requires_grad))


def randn(*size: Any, dtype: Any = None, device: Device = None, requires_grad: bool = False, backend: Device = None) -> Tensor:
    """Standard normal numbers (Box-Muller over two uniform draws), on the tensor's own device."""
    shape = _sizes(size, "randn")
    u = rand(2, *shape, device=device, backend=backend)
    radius = ((1.0 - u[0]).log() * -2.0).sqrt()
    out = radius * (u[1] * (2.0 * math.pi)).cos()
    return out.to(float32 if dtype is None else as_dtype(dtype)).requires_grad_(_flag(requires_grad))


def arange(
    start: float, end: Optional[float] = None, step: float = 1, *, dtype: Any = None, device: Device = None,
    requires_grad: bool = False, backend: Device = None,
) -> Tensor:  # fmt: skip
    """start, start + step, ... up to but not including end (arange(n): 0 .. n - 1), as torch.arange:
    int64 when start, end and step are all ints, else float32."""
    if end is None:
        start, end = 0, start
    for name, value in (("start", start), ("end", end), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"arange() {name} must be a number, got {type(value).__name__} {value!r}")
    if step == 0:
        raise ValueError("arange step must not be zero")
    integral = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    n = max(0, -((start - end) // step) if integral else int(np.ceil((end - start) / step)))
    backend = _backend(backend, device)
    out = _empty((int(n),), backend, int64)
    backend.ops.arange(out._tensor)
    if not integral:
        out = out.float()
    if start != 0 or step != 1:
        out = out * step + start
    return out.to(out.dtype if dtype is None else as_dtype(dtype)).requires_grad_(_flag(requires_grad))


def linspace(
    start: float, end: float, steps: int, *, dtype: Any = None, device: Device = None, requires_grad: bool = False,
    backend: Device = None,
) -> Tensor:  # fmt: skip
    """steps values evenly spaced from start to end (both included), as torch.linspace: the first
    half counted from start, the second from end, so both ends are exact."""
    (steps,) = _sizes((steps,), "linspace")
    backend = _backend(backend, device)
    if steps <= 1:
        return full((steps,), float(start), dtype=dtype, backend=backend, requires_grad=requires_grad)
    i = arange(steps, backend=backend).float()
    delta = (float(end) - float(start)) / (steps - 1)
    half = steps // 2
    out = (i * delta + float(start)).where(i < half, (i - (steps - 1)) * delta + float(end))
    return out.to(float32 if dtype is None else as_dtype(dtype)).requires_grad_(_flag(requires_grad))


def from_torch(t: Any, backend: Device = None) -> Tensor:
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
        backend = as_backend("cuda") if t.is_cuda else default_backend()
    backend = as_backend(backend)
    if t.is_cuda != bool(backend.ops.is_cuda):
        raise TypeError(f"a {'CUDA' if t.is_cuda else 'CPU'} torch tensor cannot back a {backend.ops.__name__} tensor")
    flat = t.detach().contiguous().reshape(-1)
    if t.is_cuda:
        storage = flat
    else:
        storage = flat.numpy() if dtype is float32 else dtype.decode(flat.view(torch.int16).numpy().view(np.uint16))
    return Tensor(TensorData(storage, tuple(t.shape), dtype=dtype), backend=backend)
