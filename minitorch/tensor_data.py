"""Shape, strides and index arithmetic, and TensorData: a storage viewed with a shape and strides.

Storage is backend-specific: a 1-D float32 numpy array for the CPU backends (whatever the dtype: its
values are the dtype's, see minitorch.dtypes), a 1-D torch buffer of the dtype's storage format on
the GPU for the CUDA backend.  Nothing here reads a GPU storage element by element.
"""

from __future__ import annotations

import functools
import random
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .dtypes import DType, float32

MAX_DIMS = 8

Index = np.ndarray
Shape = np.ndarray
Strides = np.ndarray
UserShape = Tuple[int, ...]
UserIndex = Sequence[int]
UserStrides = Tuple[int, ...]


class IndexingError(RuntimeError, IndexError):
    """An index, shape or stride that does not fit the tensor (an IndexError too, as torch's indexing
    errors are, so iteration by indexing stops at the end)."""


def index_to_position(index: Index, strides: Strides) -> int:
    """Storage position of a multidimensional index."""
    position = 0
    for i in range(len(index)):
        position += index[i] * strides[i]
    return position


def to_index(ordinal: int, shape: Shape, out_index: Index) -> None:
    """Write into out_index the index of the ordinal-th element in row-major order of shape."""
    rest = ordinal
    for i in range(len(shape) - 1, -1, -1):
        out_index[i] = rest % shape[i]
        rest = rest // shape[i]


def broadcast_index(big_index: Index, big_shape: Shape, shape: Shape, out_index: Index) -> None:
    """Map an index of the broadcast shape big_shape to the index of a smaller shape.

    Dimensions of size 1 in `shape` take index 0; leading dimensions `shape` lacks are dropped.
    """
    offset = len(big_shape) - len(shape)
    for i in range(len(shape)):
        out_index[i] = big_index[i + offset] if shape[i] > 1 else 0


def shape_broadcast(shape1: UserShape, shape2: UserShape) -> UserShape:
    """The numpy-style broadcast of two shapes; IndexingError naming both when they clash."""
    n = max(len(shape1), len(shape2))
    a = (1,) * (n - len(shape1)) + tuple(shape1)
    b = (1,) * (n - len(shape2)) + tuple(shape2)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise IndexingError(f"shapes {tuple(shape1)} and {tuple(shape2)} cannot be broadcast together")
    return tuple(out)


def broadcast_strides(shape: Tuple[int, ...], strides: Tuple[int, ...], out_shape: Tuple[int, ...]) -> List[int]:
    """Strides of a tensor viewed with the broadcast shape out_shape (0 on broadcast dims)."""
    pad = len(out_shape) - len(shape)
    return [0 if d < pad or shape[d - pad] != out_shape[d] else strides[d - pad] for d in range(len(out_shape))]


def coalesce(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> Tuple[Tuple[int, ...], List[List[int]]]:
    """Drop size-1 dims and merge neighbours that are contiguous in every operand."""
    out_shape: List[int] = []
    out_strides: List[List[int]] = [[] for _ in strides]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        if out_shape and all(o[-1] == s[d] * size for o, s in zip(out_strides, strides)):
            out_shape[-1] *= size
            for o, s in zip(out_strides, strides):
                o[-1] = s[d]
        else:
            out_shape.append(size)
            for o, s in zip(out_strides, strides):
                o.append(s[d])
    if not out_shape:
        return (1,), [[1] for _ in strides]
    return tuple(out_shape), out_strides


def prod(shape: Iterable[int]) -> int:
    """Number of elements of a shape."""
    n = 1
    for s in shape:
        n *= int(s)
    return n


def strides_from_shape(shape: UserShape) -> UserStrides:
    """Row-major (contiguous) strides of a shape."""
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


@functools.lru_cache(maxsize=4096)
def _contiguous_layout(shape: UserShape) -> Tuple[UserStrides, int]:
    """Row-major strides and size of a valid shape (cached: ops make the same shapes over and over)."""
    if len(shape) > MAX_DIMS:
        raise IndexingError(f"shape {shape} has {len(shape)} dims; at most {MAX_DIMS} are supported")
    if any(s < 0 for s in shape):
        raise IndexingError(f"shape {shape} has a negative size")
    return strides_from_shape(shape), prod(shape)


def _checked_layout(shape: Any, strides: Optional[Any]) -> Tuple[UserShape, Optional[UserStrides]]:
    shape = tuple(int(s) for s in shape)
    _contiguous_layout(shape)
    if strides is None:
        return shape, None
    strides = tuple(int(s) for s in strides)
    if len(strides) != len(shape):
        raise IndexingError(f"strides {strides} do not match shape {shape}")
    return shape, strides


class TensorData:
    """A storage with a shape, strides (in elements) and a dtype; several TensorData may share a storage.

    in_flight: None, or work still writing the storage on another device stream (an object with
    settle(): the current stream waits for it); read_beside: None, or such work that only reads it.
    Both are shared by the views made from this one; settle() before anything but handing the tensor
    on reads it, settle(write=True) before anything writes into it (see Tensor.settle)."""

    in_flight: Optional[Any] = None
    read_beside: Optional[Any] = None

    def __init__(self, storage: Any, shape: UserShape, strides: Optional[UserStrides] = None, dtype: DType = float32):
        if type(shape) is not tuple or strides is not None:
            shape, strides = _checked_layout(shape, strides)
        self._storage = storage
        self.dtype = dtype
        self._shape = shape
        if strides is None:
            self._strides, self.size = _contiguous_layout(shape)
        else:
            self._strides, self.size = strides, prod(shape)
        self.dims = len(shape)
        self._np_shape: Optional[np.ndarray] = None
        self._np_strides: Optional[np.ndarray] = None

    @property
    def shape(self) -> UserShape:
        return self._shape

    @property
    def strides(self) -> UserStrides:
        return self._strides

    @property
    def np_shape(self) -> np.ndarray:
        """Shape as an int64 array (what the compiled CPU kernels take); cached."""
        if self._np_shape is None:
            self._np_shape = np.array(self._shape, dtype=np.int64)
        return self._np_shape

    @property
    def np_strides(self) -> np.ndarray:
        """Strides as an int64 array; cached."""
        if self._np_strides is None:
            self._np_strides = np.array(self._strides, dtype=np.int64)
        return self._np_strides

    def is_contiguous(self) -> bool:
        """True when the strides are the row-major strides of the shape (size-1 dims ignored; an empty
        tensor is contiguous)."""
        if self.size == 0:
            return True
        expected = 1
        for size, stride in zip(reversed(self._shape), reversed(self._strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def is_transposed(self) -> bool:
        """True for a 2-D view that is the transpose of a contiguous matrix and not contiguous itself
        (e.g. a tied LM head, embedding.permute(1, 0))."""
        return self.dims == 2 and not self.is_contiguous() and self.permute(1, 0).is_contiguous()

    def index(self, index: UserIndex) -> int:
        """Storage position of a full index, checked against the shape."""
        idx = tuple(int(i) for i in index)
        if len(idx) != self.dims:
            raise IndexingError(f"index {idx} has {len(idx)} dims but the shape {self._shape} has {self.dims}")
        for i, s in zip(idx, self._shape):
            if i < 0 or i >= s:
                raise IndexingError(f"index {idx} is out of range for shape {self._shape}")
        return sum(i * st for i, st in zip(idx, self._strides))

    def indices(self) -> Iterable[UserIndex]:
        """Every index of the shape in row-major order."""
        idx = np.zeros(self.dims, dtype=np.int64)
        shape = np.array(self._shape, dtype=np.int64)
        for ordinal in range(self.size):
            to_index(ordinal, shape, idx)
            yield tuple(int(i) for i in idx)

    def sample(self) -> UserIndex:
        """A random valid index."""
        return tuple(random.randint(0, s - 1) for s in self._shape)

    def _host(self) -> np.ndarray:
        if not isinstance(self._storage, np.ndarray):
            raise TypeError("element access works on CPU storage only; read GPU tensors with to_numpy()")
        return self._storage

    def get(self, key: UserIndex) -> float:
        """The element at an index (CPU storage)."""
        return float(self._host()[self.index(key)])

    def set(self, key: UserIndex, val: float) -> None:
        """Set the element at an index (CPU storage), rounded to the dtype."""
        self._host()[self.index(key)] = self.dtype.round(np.float32(val))

    def as_strided(self, shape: UserShape, strides: Optional[UserStrides] = None, offset: int = 0) -> "TensorData":
        """Another view of this storage, of the same dtype: shape and strides (default row-major) from
        element `offset` on (1-D numpy and torch storages slice as views)."""
        view = TensorData(self._storage[offset:] if offset else self._storage, shape, strides, self.dtype)
        view.in_flight, view.read_beside = self.in_flight, self.read_beside
        return view

    def with_dtype(self, dtype: DType) -> "TensorData":
        """This view labelled with another dtype, the storage as it is: for a storage that already
        holds values of dtype in its format (a bool's 1.0/0.0 read as float32, a CPU backend's
        float32 results once rounded to bfloat16)."""
        view = TensorData(self._storage, self._shape, self._strides, dtype)
        view.in_flight, view.read_beside = self.in_flight, self.read_beside
        return view

    def settle(self, write: bool = False) -> None:
        """Make the current stream wait for the work writing this storage beside it, if any, and with
        write for the work reading it beside it too (each a no-op after)."""
        if self.in_flight is not None:
            self.in_flight.settle()
            self.in_flight = None
        if write and self.read_beside is not None:
            self.read_beside.settle()
            self.read_beside = None

    def permute(self, *order: int) -> "TensorData":
        """A view with dims reordered; order must be a permutation of range(dims)."""
        if sorted(order) != list(range(self.dims)):
            raise IndexingError(f"permute order {order} is not a permutation of the {self.dims} dims of {self._shape}")
        return self.as_strided(tuple(self._shape[i] for i in order), tuple(self._strides[i] for i in order))


def shape_args(shape: Sequence[Any]) -> Tuple[int, ...]:
    """Sizes given as f(2, 3) or f((2, 3)), as a tuple of ints."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(int(s) for s in shape[0])
    return tuple(int(s) for s in shape)


def resolve_shape(shape: Tuple[int, ...], size: int, old: UserShape) -> Tuple[int, ...]:
    """A view shape with its -1 (if any) filled in; IndexingError when it does not hold `size` elements."""
    if shape.count(-1) > 1:
        raise IndexingError(f"view shape {shape} has more than one -1")
    if -1 in shape:
        known = prod(s for s in shape if s != -1)
        if known == 0 or size % known:
            raise IndexingError(f"cannot view shape {old} ({size} elements) as {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if prod(shape) != size:
        raise IndexingError(f"cannot view shape {old} ({size} elements) as {shape} ({prod(shape)} elements)")
    return shape
