"""SimpleOps: the reference CPU backend in plain Python loops (slow, obviously correct).

Storage is a 1-D NumPy array: int64 for int64 tensors, float32 for every other dtype (see
minitorch.dtypes).  Elements are read as Python numbers (`.item()`: ints stay exact), the scalar
function of `operators` is applied, and the result is stored in the output's storage.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Tuple

import numpy as np

from .dtypes import DType, float32, int64
from .tensor_data import TensorData, broadcast_index, index_to_position, shape_broadcast, to_index
from .tensor_ops import TensorBackend, TensorOps, as_array, emulated, empty, host_argsort, host_ids, new_output, typed_start


def _get(t: TensorData, index: np.ndarray) -> Any:
    return t._storage[index_to_position(index, t.np_strides)].item()


def _store(storage: np.ndarray, position: int, value: Any) -> None:
    """storage[position] = value; a Python int wraps around into int64, as int64 arithmetic does."""
    if storage.dtype == np.int64:
        value = (int(value) + 2**63) % 2**64 - 2**63
    storage[position] = value


def _set(t: TensorData, index: np.ndarray, value: Any) -> None:
    _store(t._storage, index_to_position(index, t.np_strides), value)


def _broadcast_indices(o: TensorData, *inputs: TensorData) -> Iterator[Tuple[np.ndarray, ...]]:
    """For each element of o in row-major order: its index, then the index of each input that
    broadcasts to it (index arrays reused from one element to the next)."""
    oi = np.zeros(o.dims, np.int64)
    indices = [np.zeros(t.dims, np.int64) for t in inputs]
    for i in range(o.size):
        to_index(i, o.np_shape, oi)
        for t, ti in zip(inputs, indices):
            broadcast_index(oi, o.np_shape, t.np_shape, ti)
        yield (oi, *indices)


def _rows(x: TensorData, dim: int) -> Iterator[Tuple[np.ndarray, list]]:
    """For each index of x with dim at 0: that index and the storage positions along dim."""
    for index in np.ndindex(*x.shape[:dim], 1, *x.shape[dim + 1 :]):
        oi = np.array(index, dtype=np.int64)
        base = index_to_position(oi, x.np_strides)
        yield oi, [base + j * x.strides[dim] for j in range(x.shape[dim])]


class SimpleOps(TensorOps):
    """Reference CPU backend in plain Python loops."""

    @staticmethod
    def storage_empty(size: int, dtype: DType = float32) -> np.ndarray:
        """int64 storage for int64, float32 storage for every other dtype (see TensorOps)."""
        return np.empty(size, dtype=np.int64 if dtype.is_integer else np.float32)

    @staticmethod
    def storage_from_numpy(arr: np.ndarray) -> np.ndarray:
        kind = np.asarray(arr).dtype.kind
        return np.array(arr, dtype=np.int64 if kind in "iu" else np.float32, copy=True).reshape(-1)

    @staticmethod
    def storage_to_numpy(storage: np.ndarray) -> np.ndarray:
        return storage

    @staticmethod
    def storage_upload(storage: np.ndarray, arr: np.ndarray) -> None:
        flat = np.asarray(arr).astype(storage.dtype, copy=False).reshape(-1)
        storage[: flat.size] = flat

    @staticmethod
    def fill(out: TensorData, value: Any) -> None:
        """Set every element of out (any layout, e.g. a view into a larger storage) to value."""
        if out.size:
            as_array(out)[...] = value

    @staticmethod
    def arange(out: TensorData) -> None:
        out._storage[:] = np.arange(out.size)

    @staticmethod
    def uniform(out: TensorData, seed: int) -> None:
        out._storage[:] = np.random.default_rng(seed).random(out.size, dtype=np.float32)

    @staticmethod
    def map(fn: Callable[[float], float]) -> Callable[..., TensorData]:
        def ret(a: TensorData, out: Optional[TensorData] = None) -> TensorData:
            out = new_output(SimpleOps, a.shape, fn, a) if out is None else out
            for oi, ai in _broadcast_indices(out, a):
                _set(out, oi, fn(_get(a, ai)))
            return out

        return ret

    @staticmethod
    def map_scalar(fn: Callable[[float, float], float]) -> Callable[..., TensorData]:
        def ret(a: TensorData, s: float, out: Optional[TensorData] = None) -> TensorData:
            out = new_output(SimpleOps, a.shape, fn, a) if out is None else out
            return SimpleOps.map(lambda x: fn(x, s))(a, out=out)

        return ret

    @staticmethod
    def zip(fn: Callable[[float, float], float]) -> Callable[..., TensorData]:
        def ret(x: TensorData, y: TensorData, out: Optional[TensorData] = None) -> TensorData:
            o = new_output(SimpleOps, shape_broadcast(x.shape, y.shape), fn, x) if out is None else out
            for oi, ai, bi in _broadcast_indices(o, x, y):
                _set(o, oi, fn(_get(x, ai), _get(y, bi)))
            return o

        return ret

    @staticmethod
    def reduce(fn: Callable[[float, float], float], start: float = 0.0) -> Callable[[TensorData, int], TensorData]:
        def ret(x: TensorData, dim: int) -> TensorData:
            o = new_output(SimpleOps, x.shape[:dim] + (1,) + x.shape[dim + 1 :], fn, x)
            first = typed_start(start, x)
            for oi, positions in _rows(x, dim):
                acc = first
                for p in positions:
                    acc = fn(acc, x._storage[p].item())
                _set(o, oi, acc)
            return o

        return ret

    @staticmethod
    def arg_reduce(x: TensorData, dim: int, largest: bool) -> TensorData:
        """The int64 position along dim (kept with size 1) of the first largest (or smallest) element;
        a NaN counts as the extreme, so the first NaN wins."""
        o = empty(SimpleOps, x.shape[:dim] + (1,) + x.shape[dim + 1 :], int64)
        for oi, positions in _rows(x, dim):
            best, at = None, 0
            for j, p in enumerate(positions):
                v = x._storage[p].item()
                if best is None or (v != v and best == best) or (v > best if largest else v < best):
                    best, at = v, j
                if best != best:
                    break
            _set(o, oi, at)
        return o

    @staticmethod
    def cumsum(x: TensorData, dim: int) -> TensorData:
        """Running sums along dim, in x's storage type."""
        o = empty(SimpleOps, x.shape, int64 if x.dtype.is_integer else float32)
        for oi, positions in _rows(x, dim):
            acc = typed_start(0.0, x)
            for j, p in enumerate(positions):
                acc = acc + x._storage[p].item()
                _store(o._storage, index_to_position(oi, o.np_strides) + j * o.strides[dim], acc)
        return o

    sort_indices = staticmethod(host_argsort)

    @staticmethod
    def embedding_fw(weight: TensorData, ids: TensorData, dtype: Optional[DType] = None) -> TensorData:
        """Rows of weight [V, C] at the integer ids [...] -> [..., C] of dtype (default weight's;
        IndexError outside [0, V)), copied row by row (a one-hot product would spread a NaN or inf of
        one row to every row)."""
        rows = host_ids(ids, weight.shape[0])
        out = TensorData(as_array(weight)[rows].reshape(-1), ids.shape + weight.shape[1:], dtype=weight.dtype)
        return emulated(out, dtype or weight.dtype)

    @staticmethod
    def embedding_bw(
        grad_out: TensorData, ids: TensorData, num_embeddings: int, dtype: Optional[DType] = None,
        initial: Optional[TensorData] = None, in_place: bool = False,
    ) -> TensorData:  # fmt: skip
        """Each row of grad_out [..., C] added into row ids[r] of a zeroed [num_embeddings, C] of dtype
        (default grad_out's), or of a copy of initial (initial itself with in_place: the caller's
        contiguous float32 table), summed in float32."""
        C = grad_out.shape[-1]
        if initial is None:
            out = np.zeros((num_embeddings, C), np.float32)
        elif in_place:
            out = as_array(initial)
        else:
            out = as_array(initial).astype(np.float32).reshape(num_embeddings, C)
        np.add.at(out, host_ids(ids, num_embeddings), np.ascontiguousarray(as_array(grad_out)).reshape(-1, C))
        return emulated(TensorData(out.reshape(-1), (num_embeddings, C)), dtype or grad_out.dtype)

    @staticmethod
    def matrix_multiply(x: TensorData, y: TensorData) -> TensorData:
        batch = shape_broadcast(x.shape[:-2], y.shape[:-2])
        n, k, m = x.shape[-2], x.shape[-1], y.shape[-1]
        o = new_output(SimpleOps, batch + (n, m), None, x)
        for oi, ai, bi in _broadcast_indices(o, x, y):
            acc = typed_start(0.0, x)
            for j in range(k):
                ai[-1] = j
                bi[-2] = j
                acc += _get(x, ai) * _get(y, bi)
            _set(o, oi, acc)
        return o


SimpleBackend = TensorBackend(SimpleOps)
