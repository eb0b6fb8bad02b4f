"""Backends: the TensorOps protocol, SimpleOps (pure Python) and TensorBackend (a table of ops).

A backend is a class of static methods over `TensorData` (storage + shape + strides); it never sees a
`Tensor`.  `map`, `map_scalar`, `zip` and `reduce` take a scalar function from `operators` and return
a storage-level op; the CPU backends compile that function, the CUDA backend maps it to an opcode of
its kernels.  A backend may also offer kernel hooks for fused ops (see `TensorOps`); each fused
`Function` calls the hook where the backend has it and its composed reference (built from Tensor
operations, kept beside the Function) where it does not.

Dtypes: `TensorBackend` decides every op's output dtype (`dtypes.result_type`, comparisons give
bool) and, on the CPU backends, whose float32 storage holds every dtype, rounds each output to it;
the CUDA backend's ops read and write each dtype's own storage and raise `dtypes.NoKernelError`
where they have no kernel for it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import numpy as np

from . import operators
from .dtypes import DType, arithmetic, bool_, float32, result_type
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

    storage_empty(size, dtype=float32), storage_from_numpy(arr) (float32), storage_to_numpy(storage)
    (float32 values), storage_upload(storage, arr) (storage[:arr.size] = arr, values already of the
    storage's dtype, without waiting on a device); fill(out, value), arange(out), uniform(out, seed) writing
    into `out`; map(fn) -> op(a, out=None), map_scalar(fn) -> op(a, s, out=None), zip(fn) -> op(a, b),
    reduce(fn, start) -> op(a, dim) (dim kept with size 1), matrix_multiply(a, b).

    Dtypes: a backend with `emulates_dtypes` keeps every dtype in float32 storage and computes in
    float32; TensorBackend labels and rounds its outputs.  A backend without it stores each dtype in
    its own format, labels its outputs itself and has cast(a, dtype, out=None): a's values converted
    into out (any layout, a broadcasting to it) or into a new contiguous TensorData.

    Optional kernel hooks, looked up by name with `hook(ops, name)` (absent: the Function runs its
    composed reference): linear_fw/bw, attn_softmax_fw/bw, layernorm_fw/bw, attention_fw/bw, embedding_fw/bw,
    linear_cross_entropy_fw, adamw_step, adamw_multi (multi-tensor AdamW state, see optim.AdamW), slot_write and
    gather_rows (fused.device_indexed), slot_attention (fused.slot_attention), top_k (fused.topk),
    beam_search_step (beam_search).  Their contracts are documented where the Function that calls them lives.
    Inputs reach a hook already checked (shapes, values) by the public entry; a hook only rejects what its
    kernels cannot do (sizes beyond their limits), or returns None where its contract says the caller composes.
    """

    is_cuda = False
    emulates_dtypes = True


def hook(ops: Any, name: str) -> Optional[Callable[..., Any]]:
    """The backend's kernel hook `name`, or None when the backend has none."""
    return getattr(ops, name, None)


def empty(ops: Any, shape: Tuple[int, ...], dtype: DType = float32) -> TensorData:
    """An uninitialized contiguous TensorData of `shape` and `dtype` on backend class `ops`."""
    return TensorData(ops.storage_empty(prod(shape), dtype), shape, dtype=dtype)


def as_array(t: TensorData) -> np.ndarray:
    """A NumPy view (no copy, writeable) of a CPU TensorData: its storage with its shape and strides."""
    item = t._storage.itemsize
    return np.lib.stride_tricks.as_strided(t._storage, t.shape, tuple(s * item for s in t.strides))


def emulated(t: TensorData, dtype: DType) -> TensorData:
    """t (float32 storage of a CPU backend, just written by an op) as a tensor of dtype: labelled,
    and its values rounded to dtype's in place when dtype is a 16-bit float."""
    if t.dtype is not dtype:
        t = t.with_dtype(dtype)
    if dtype.rounds and t.size:
        view = as_array(t)
        view[...] = dtype.round(view)
    return t


# ---- pure-Python backend ----------------------------------------------------------------------
class SimpleOps(TensorOps):
    """Reference CPU backend in plain Python loops: slow, obviously correct."""

    @staticmethod
    def storage_empty(size: int, dtype: DType = float32) -> np.ndarray:
        """float32 storage for every dtype (see TensorOps)."""
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
            as_array(out)[...] = value

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
COMPARISONS = (operators.lt, operators.eq, operators.is_close)  # their results are bool


class TensorBackend:
    """The storage-level ops of one backend (TensorData in, TensorData out), built once per backend
    class (TensorBackend(FastOps) is cached).

    Every op's output dtype is decided here: a copy keeps its input's dtype (or takes its `out`'s),
    a comparison gives bool, other ops `dtypes.result_type` of their operands with bool arithmetic
    giving float32 (a Python scalar of map_scalar never promotes).  On a backend that emulates dtypes
    (the CPU ones) each output is then rounded to its dtype here, the one place where those backends'
    results are written."""

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
        self._copy = ops.map(o.id)
        self.id_map = lambda a, out=None: self.cast(a, a.dtype if out is None else out.dtype, out)
        self.neg_map = self._map(o.neg)
        self.sigmoid_map = self._map(o.sigmoid)
        self.relu_map = self._map(o.relu)
        self.log_map = self._map(o.log)
        self.exp_map = self._map(o.exp)
        self.inv_map = self._map(o.inv)
        self.tanh_map = self._map(o.tanh)
        self.gelu_map = self._map(o.gelu)

        self.add_zip = self._zip(o.add)
        self.mul_zip = self._zip(o.mul)
        self.lt_zip = self._zip(o.lt)
        self.eq_zip = self._zip(o.eq)
        self.is_close_zip = self._zip(o.is_close)
        self.max_zip = self._zip(o.max)
        self.pow_zip = self._zip(o.pow)
        self.relu_back_zip = self._zip(o.relu_back)
        self.log_back_zip = self._zip(o.log_back)
        self.inv_back_zip = self._zip(o.inv_back)
        self.sigmoid_back_zip = self._zip(o.sigmoid_back)
        self.tanh_back_zip = self._zip(o.tanh_back)
        self.gelu_back_zip = self._zip(o.gelu_back)

        self.add_scalar = self._scalar(o.add)
        self.mul_scalar = self._scalar(o.mul)
        self.pow_scalar = self._scalar(o.pow)
        self.lt_scalar = self._scalar(o.lt)
        self.eq_scalar = self._scalar(o.eq)
        self.max_scalar = self._scalar(o.max)

        self.add_reduce = self._reduce(o.add, 0.0)
        self.mul_reduce = self._reduce(o.mul, 1.0)
        self.max_reduce = self._reduce(o.max, -math.inf)
        matmul = ops.matrix_multiply
        self.matrix_multiply = lambda a, b: self._finish(matmul(a, b), _binary_dtype(a, b, False))

    def _finish(self, t: TensorData, dtype: DType) -> TensorData:
        if self.ops.emulates_dtypes:
            return emulated(t, dtype)
        return t if t.dtype is dtype else t.with_dtype(dtype)

    def _map(self, fn: Callable[[float], float]) -> Callable[..., TensorData]:
        op = self.ops.map(fn)
        return lambda a, out=None: self._finish(op(a, out=out), arithmetic(a.dtype) if out is None else out.dtype)

    def _scalar(self, fn: Callable[[float, float], float]) -> Callable[..., TensorData]:
        op = self.ops.map_scalar(fn)
        compare = fn in COMPARISONS

        def run(a: TensorData, s: float, out: Optional[TensorData] = None) -> TensorData:
            dtype = out.dtype if out is not None else bool_ if compare else arithmetic(a.dtype)
            return self._finish(op(a, s, out=out), dtype)

        return run

    def _zip(self, fn: Callable[[float, float], float]) -> Callable[[TensorData, TensorData], TensorData]:
        op = self.ops.zip(fn)
        compare = fn in COMPARISONS
        return lambda a, b: self._finish(op(a, b), _binary_dtype(a, b, compare))

    def _reduce(self, fn: Callable[[float, float], float], start: float) -> Callable[[TensorData, int], TensorData]:
        op = self.ops.reduce(fn, start)
        return lambda a, dim: self._finish(op(a, dim), arithmetic(a.dtype))

    def cast(self, a: TensorData, dtype: DType, out: Optional[TensorData] = None) -> TensorData:
        """a's values in dtype, written into out (any layout; a broadcasts to it; its dtype is dtype)
        or into a new contiguous TensorData.  To bool: 1 where a is non-zero.  From bool to float32
        without out: a's own storage, relabelled (a bool's values are float32 1.0/0.0)."""
        if dtype is bool_ and a.dtype is not bool_:
            nonzero = self.eq_scalar(self.eq_scalar(a, 0.0), 0.0)
            return nonzero if out is None else self.id_map(nonzero, out)
        if out is None and a.dtype is bool_ and dtype is float32:
            return a.with_dtype(float32)
        if self.ops.emulates_dtypes:
            return emulated(self._copy(a, out=out), dtype)
        return self.ops.cast(a, dtype, out)

    def fill(self, out: TensorData, value: float) -> None:
        """Set every element of out (any layout) to value, in out's dtype."""
        if self.ops.emulates_dtypes or out.dtype.storage == float32.storage:
            self.ops.fill(out, value)
            self._finish(out, out.dtype)
            return
        full = empty(self.ops, out.shape)
        self.ops.fill(full, value)
        self.ops.cast(full, out.dtype, out)

    def __repr__(self) -> str:
        return f"TensorBackend({self.ops.__name__})"


def _binary_dtype(a: TensorData, b: TensorData, compare: bool) -> DType:
    """The output dtype of a zip or a matmul of a and b."""
    if compare:
        return bool_
    return arithmetic(a.dtype if a.dtype is b.dtype else result_type(a, b))


SimpleBackend = TensorBackend(SimpleOps)
