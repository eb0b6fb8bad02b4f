"""Backends: the TensorOps protocol, SimpleOps (pure Python) and TensorBackend (a table of ops).

A backend is a class of static methods over `TensorData` (storage + shape + strides); it never sees a
`Tensor`.  `map`, `map_scalar`, `zip` and `reduce` take a scalar function from `operators` and return
a storage-level op; the CPU backends compile that function, the CUDA backend maps it to an opcode of
its kernels.  A backend may also offer kernel hooks for fused ops (see `TensorOps`); each fused
`Function` calls the hook where the backend has it and its composed reference (built from Tensor
operations, kept beside the Function) where it does not.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import numpy as np

from . import operators
from .tensor_data import (
    TensorData,
    broadcast_index,
    index_to_position,
    prod,
    shape_broadcast,
    to_index,
)


ATTENTION_ACTIVATIONS = ("softmax", "relu")  # what attention applies to the scores (kernel codes by position)


class TensorOps:
    """What a backend provides, all on TensorData:

    storage_empty(size), storage_from_numpy(arr), storage_to_numpy(storage),
    storage_upload(storage, arr) (storage[:arr.size] = arr, without waiting on a device); fill(out, value),
    arange(out), uniform(out, seed) writing into `out`; map(fn) -> op(a, out=None),
    map_scalar(fn) -> op(a, s, out=None), zip(fn) -> op(a, b), reduce(fn, start) -> op(a, dim) (dim kept with
    size 1), matrix_multiply(a, b).

    Optional kernel hooks, looked up by name with `hook(ops, name)` (absent: the Function runs its
    composed reference): linear_fw, attn_softmax_fw/bw, layernorm_fw/bw, attention_fw/bw, embedding_fw/bw,
    linear_cross_entropy_fw, adamw_step, adamw_multi (multi-tensor AdamW state, see optim.AdamW), slot_write and
    gather_rows (fused.device_indexed), slot_attention (fused.slot_attention), top_k (fused.topk),
    beam_search_step (beam_search).  Their contracts are documented where the Function that calls them lives.
    Inputs reach a hook already checked (shapes, values) by the public entry; a hook only rejects what its
    kernels cannot do (sizes beyond their limits), or returns None where its contract says the caller composes.
    """

    is_cuda = False


def hook(ops: Any, name: str) -> Optional[Callable[..., Any]]:
    """The backend's kernel hook `name`, or None when the backend has none."""
    return getattr(ops, name, None)


def empty(ops: Any, shape: Tuple[int, ...]) -> TensorData:
    """An uninitialized contiguous TensorData of `shape` on backend class `ops`."""
    return TensorData(ops.storage_empty(prod(shape)), shape)


# ---- pure-Python backend ----------------------------------------------------------------------
class SimpleOps(TensorOps):
    """Reference CPU backend in plain Python loops: slow, obviously correct."""

    @staticmethod
    def storage_empty(size: int) -> np.ndarray:
        return np.empty(size, dtype=np.float32)

    @staticmethod
    def storage_from_numpy(arr: np.ndarray) -> np.ndarray:
        return np.array(arr, dtype=np.float32, copy=True).reshape(-1)

    @staticmethod
    def storage_to_numpy(storage: np.ndarray) -> np.ndarray:
        return storage

    @staticmethod
    def storage_upload(storage: np.ndarray, arr: np.ndarray) -> None:
        flat = np.asarray(arr, dtype=np.float32).reshape(-1)
        storage[: flat.size] = flat

    @staticmethod
    def fill(out: TensorData, value: float) -> None:
        """Set every element of out (any layout, e.g. a view into a larger storage) to value."""
        if out.size:
            item = out._storage.itemsize
            np.lib.stride_tricks.as_strided(
                out._storage, out.shape, tuple(s * item for s in out.strides), writeable=True
            )[...] = value

    @staticmethod
    def arange(out: TensorData) -> None:
        out._storage[:] = np.arange(out.size, dtype=np.float32)

    @staticmethod
    def uniform(out: TensorData, seed: int) -> None:
        out._storage[:] = np.random.default_rng(seed).random(out.size, dtype=np.float32)

    @staticmethod
    def map(fn: Callable[[float], float]) -> Callable[..., TensorData]:
        def ret(a: TensorData, out: Optional[TensorData] = None) -> TensorData:
            out = empty(SimpleOps, a.shape) if out is None else out
            _simple_map(fn, out, a)
            return out

        return ret

    @staticmethod
    def map_scalar(fn: Callable[[float, float], float]) -> Callable[..., TensorData]:
        def ret(a: TensorData, s: float, out: Optional[TensorData] = None) -> TensorData:
            out = empty(SimpleOps, a.shape) if out is None else out
            _simple_map(lambda x: fn(x, s), out, a)
            return out

        return ret

    @staticmethod
    def zip(fn: Callable[[float, float], float]) -> Callable[[TensorData, TensorData], TensorData]:
        def ret(x: TensorData, y: TensorData) -> TensorData:
            o = empty(SimpleOps, shape_broadcast(x.shape, y.shape))
            for oi, ai, bi in _broadcast_indices(o, x, y):
                o._storage[index_to_position(oi, o.np_strides)] = fn(
                    float(x._storage[index_to_position(ai, x.np_strides)]),
                    float(y._storage[index_to_position(bi, y.np_strides)]),
                )
            return o

        return ret

    @staticmethod
    def reduce(fn: Callable[[float, float], float], start: float = 0.0) -> Callable[[TensorData, int], TensorData]:
        def ret(x: TensorData, dim: int) -> TensorData:
            shape = list(x.shape)
            shape[dim] = 1
            o = empty(SimpleOps, tuple(shape))
            oi = np.zeros(o.dims, np.int64)
            for i in range(o.size):
                to_index(i, o.np_shape, oi)
                acc = start
                pos = index_to_position(oi, x.np_strides)
                for j in range(x.shape[dim]):
                    acc = fn(acc, float(x._storage[pos + j * x.strides[dim]]))
                o._storage[index_to_position(oi, o.np_strides)] = acc
            return o

        return ret

    @staticmethod
    def matrix_multiply(x: TensorData, y: TensorData) -> TensorData:
        batch = shape_broadcast(x.shape[:-2], y.shape[:-2])
        n, k, m = x.shape[-2], x.shape[-1], y.shape[-1]
        o = empty(SimpleOps, batch + (n, m))
        for oi, ai, bi in _broadcast_indices(o, x, y):
            acc = 0.0
            for j in range(k):
                ai[-1] = j
                bi[-2] = j
                acc += float(x._storage[index_to_position(ai, x.np_strides)]) * float(
                    y._storage[index_to_position(bi, y.np_strides)]
                )
            o._storage[index_to_position(oi, o.np_strides)] = acc
        return o


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


def _simple_map(fn: Callable[[float], float], o: TensorData, x: TensorData) -> None:
    for oi, ai in _broadcast_indices(o, x):
        o._storage[index_to_position(oi, o.np_strides)] = fn(float(x._storage[index_to_position(ai, x.np_strides)]))


# ---- the table of ops a Tensor uses -----------------------------------------------------------
class TensorBackend:
    """The storage-level ops of one backend (TensorData in, TensorData out), built once per backend
    class (TensorBackend(FastOps) is cached)."""

    _cache: Dict[type, "TensorBackend"] = {}

    def __new__(cls, ops: Any) -> "TensorBackend":
        cached = cls._cache.get(ops)
        if cached is not None:
            return cached
        self = super().__new__(cls)
        self._build(ops)
        cls._cache[ops] = self
        return self

    def _build(self, ops: Any) -> None:
        self.ops = ops
        self.cuda = bool(ops.is_cuda)
        o = operators
        self.id_map = ops.map(o.id)
        self.neg_map = ops.map(o.neg)
        self.sigmoid_map = ops.map(o.sigmoid)
        self.relu_map = ops.map(o.relu)
        self.log_map = ops.map(o.log)
        self.exp_map = ops.map(o.exp)
        self.inv_map = ops.map(o.inv)
        self.tanh_map = ops.map(o.tanh)
        self.gelu_map = ops.map(o.gelu)

        self.add_zip = ops.zip(o.add)
        self.mul_zip = ops.zip(o.mul)
        self.lt_zip = ops.zip(o.lt)
        self.eq_zip = ops.zip(o.eq)
        self.is_close_zip = ops.zip(o.is_close)
        self.max_zip = ops.zip(o.max)
        self.pow_zip = ops.zip(o.pow)
        self.relu_back_zip = ops.zip(o.relu_back)
        self.log_back_zip = ops.zip(o.log_back)
        self.inv_back_zip = ops.zip(o.inv_back)
        self.sigmoid_back_zip = ops.zip(o.sigmoid_back)
        self.tanh_back_zip = ops.zip(o.tanh_back)
        self.gelu_back_zip = ops.zip(o.gelu_back)

        self.add_scalar = ops.map_scalar(o.add)
        self.mul_scalar = ops.map_scalar(o.mul)
        self.pow_scalar = ops.map_scalar(o.pow)
        self.lt_scalar = ops.map_scalar(o.lt)
        self.eq_scalar = ops.map_scalar(o.eq)
        self.max_scalar = ops.map_scalar(o.max)

        self.add_reduce = ops.reduce(o.add, 0.0)
        self.mul_reduce = ops.reduce(o.mul, 1.0)
        self.max_reduce = ops.reduce(o.max, -math.inf)
        self.matrix_multiply = ops.matrix_multiply

    def __repr__(self) -> str:
        return f"TensorBackend({self.ops.__name__})"


SimpleBackend = TensorBackend(SimpleOps)
