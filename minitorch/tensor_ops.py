"""Backends: the TensorOps protocol and TensorBackend (a table of ops); SimpleOps, the pure-Python
backend, lives in simple_ops.py, FastOps in fast_ops.py, CudaKernelOps in cuda_kernel_ops.py.

A backend is a class of static methods over `TensorData` (storage + shape + strides); it never sees a
`Tensor`.  `map`, `map_scalar`, `zip` and `reduce` take a scalar function from `operators` and return
a storage-level op; the CPU backends compile that function, the CUDA backend maps it to an opcode of
its kernels.  A backend may also offer kernel hooks for fused ops (see `TensorOps`); each fused
`Function` calls the hook where the backend has it and its composed reference (built from Tensor
operations, kept beside the Function) where it does not.

Dtypes: `TensorBackend` decides every op's output dtype (`dtypes.result_type`, comparisons give
bool) and the dtype it computes in: an op between int64 and a float, or an op of `operators` outside
INTEGER_OPS on int64 (exp, sigmoid, ...), computes in the float, the int64 operand cast first, as
PyTorch does.  On the CPU backends, whose float32 storage holds every float dtype, it rounds each
output to its dtype; the CUDA backend's ops read and write each dtype's own storage and raise
`dtypes.NoKernelError` where they have no kernel for it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from . import operators
from .dtypes import DType, arithmetic, bool_, float32, int64, result_type
from .tensor_data import TensorData, prod

ATTENTION_ACTIVATIONS = ("softmax", "relu")  # what attention applies to the scores (kernel codes by position)


class TensorOps:
    """What a backend provides, all on TensorData:

    storage_empty(size, dtype=float32), storage_from_numpy(arr) (int64 for an integer array, float32
    otherwise), storage_to_numpy(storage) (its values: float32, or int64), storage_upload(storage,
    arr) (storage[:arr.size] = arr, values already of the storage's dtype, without waiting on a
    device); fill(out, value), arange(out), uniform(out, seed) writing into `out`; map(fn) ->
    op(a, out=None), map_scalar(fn) -> op(a, s, out=None), zip(fn) -> op(a, b), reduce(fn, start) ->
    op(a, dim) (dim kept with size 1), matrix_multiply(a, b); the index ops arg_reduce(a, dim,
    largest) (int64 position of the first max or min along dim, kept with size 1; NaN counts as the
    extreme), sort_indices(a, dim, descending) (int64 positions of a stable sort along dim, NaN
    largest) and cumsum(a, dim).  An op's new output has its inputs' storage type (they share one:
    TensorBackend casts mixed operands first), float32 for a comparison; `new_output` makes it.

    Dtypes: a backend with `emulates_dtypes` keeps every float dtype in float32 storage and computes
    in float32 (int64 in int64); TensorBackend labels and rounds its outputs.  A backend without it
    stores each dtype in its own format, labels its outputs itself and has cast(a, dtype, out=None):
    a's values converted into out (any layout, a broadcasting to it) or into a new contiguous TensorData.

    Optional kernel hooks, looked up by name with `hook(ops, name)` (absent: the Function runs its
    composed reference): linear_fw/bw, attn_softmax_fw/bw, layernorm_fw/bw, attention_fw/bw, attention_qkv_fw/bw
    (fused.attention.PackedAttention), embedding_fw/bw, linear_cross_entropy_fw, softmax_loss_fw/bw
    (fused.softmax_loss), adamw_step, adamw_multi (multi-tensor AdamW state, see optim.AdamW), slot_write and
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


COMPARISONS = (operators.lt, operators.eq, operators.is_close)  # their results are bool


def new_output(ops: Any, shape: Tuple[int, ...], fn: Optional[Callable[..., Any]], like: TensorData) -> TensorData:
    """A new contiguous output of op fn on operands like `like`: float32 storage for a comparison,
    else like's storage type (int64 or float32)."""
    integer = like.dtype.is_integer and fn not in COMPARISONS
    return empty(ops, shape, int64 if integer else float32)


def typed_start(start: float, like: TensorData) -> Any:
    """A reduction's start value in like's storage type: for int64, an int (-inf and inf as the
    int64 extremes)."""
    if not like.dtype.is_integer:
        return float(start)
    if math.isinf(start):
        info = np.iinfo(np.int64)
        return int(info.max if start > 0 else info.min)
    return int(start)


def host_ids(ids: TensorData, num_embeddings: int) -> np.ndarray:
    """The ids of a CPU storage (int64, or floats holding integers; any layout) as a flat int64 array,
    checked to be integers in [0, num_embeddings): IndexError naming the range of the values otherwise."""
    flat = np.ascontiguousarray(as_array(ids)).reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= num_embeddings or np.any(flat != np.floor(flat))):
        raise IndexError(
            f"embedding ids must be integers in [0, {num_embeddings}), got values in [{flat.min()}, {flat.max()}]"
        )
    return flat.astype(np.int64, copy=False)


def host_argsort(a: TensorData, dim: int, descending: bool) -> TensorData:
    """sort_indices of a CPU storage with NumPy: a stable sort along dim, ties in their order, NaN
    sorting as the largest value (first when descending)."""
    values = as_array(a)
    if not descending:
        order = np.argsort(values, axis=dim, kind="stable")
    elif a.dtype.is_integer:
        order = np.argsort(~values, axis=dim, kind="stable")  # ~x = -x - 1: reverses the order, never overflows
    else:
        keys = np.where(np.isnan(values), -np.inf, -values.astype(np.float64))
        # NaN before +inf (whose key is -inf too): np.lexsort sorts by its last key first.
        order = np.moveaxis(np.lexsort((np.moveaxis(keys, dim, -1), ~np.isnan(np.moveaxis(values, dim, -1)))), -1, dim)
    return TensorData(np.ascontiguousarray(order, dtype=np.int64).reshape(-1), a.shape, dtype=int64)


# ---- the table of ops a Tensor uses -----------------------------------------------------------
class TensorBackend:
    """The storage-level ops of one backend (TensorData in, TensorData out), built once per backend
    class (TensorBackend(FastOps) is cached).

    Every op's output dtype is decided here: a copy keeps its input's dtype (or takes its `out`'s),
    a comparison gives bool, other ops `dtypes.result_type` of their operands with bool arithmetic
    giving float32 (a Python scalar of map_scalar never promotes; a bool's sum is int64).  The dtype
    an op computes in is decided here too (see the module notes), operands cast to it first.  On a
    backend that emulates dtypes (the CPU ones) each output is then rounded to its dtype here, the one
    place where those backends' results are written."""

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
        for fn in (o.neg, o.abs, o.sigmoid, o.relu, o.log, o.exp, o.inv, o.tanh, o.gelu, o.gelu_erf, o.sqrt, o.sin, o.cos, o.floor):
            setattr(self, f"{fn.__name__}_map", self._map(fn))
        for fn in (o.add, o.mul, o.div, o.lt, o.eq, o.is_close, o.max, o.min, o.pow, o.floordiv, o.remainder, o.relu_back,
                   o.log_back, o.inv_back, o.sigmoid_back, o.tanh_back, o.gelu_back, o.gelu_erf_back):  # fmt: skip
            setattr(self, f"{fn.__name__}_zip", self._zip(fn))
        for fn in (o.add, o.mul, o.div, o.pow, o.lt, o.eq, o.max, o.min, o.floordiv, o.remainder):
            setattr(self, f"{fn.__name__}_scalar", self._scalar(fn))
        self.add_reduce = self._reduce(o.add, 0.0)
        self.mul_reduce = self._reduce(o.mul, 1.0)
        self.max_reduce = self._reduce(o.max, -math.inf)
        self.min_reduce = self._reduce(o.min, math.inf)

    def _finish(self, t: TensorData, dtype: DType) -> TensorData:
        if self.ops.emulates_dtypes:
            return emulated(t, dtype)
        if t.dtype is dtype:
            return t
        # A kernel that computed in a wider storage than the result's (float32 for bfloat16 times a 0-dim
        # float32, whose product is bfloat16 by the 0-dim rule) hands its values over rounded: relabelling
        # float32 storage as bfloat16 read its bytes as other numbers.
        return t.with_dtype(dtype) if t.dtype.storage == dtype.storage else self.cast(t, dtype)

    def _operand(self, t: TensorData, compute: DType) -> TensorData:
        """t ready for an op computing in `compute`: cast where int64 meets another dtype (the other
        dtypes share float32 arithmetic)."""
        if t.dtype is compute or not (t.dtype.is_integer or compute.is_integer):
            return t
        return self.cast(t, compute)

    def _map(self, fn: Callable[[float], float]) -> Callable[..., TensorData]:
        op = self.ops.map(fn)
        exact = fn in operators.INTEGER_OPS

        def run(a: TensorData, out: Optional[TensorData] = None) -> TensorData:
            if out is not None:
                return self._finish(op(a, out=out), out.dtype)
            a = a if exact or not a.dtype.is_integer else self.cast(a, float32)
            return self._finish(op(a), arithmetic(a.dtype))

        return run

    def _scalar(self, fn: Callable[[float, float], float]) -> Callable[..., TensorData]:
        op = self.ops.map_scalar(fn)
        compare = fn in COMPARISONS
        exact = fn in operators.INTEGER_OPS

        def run(a: TensorData, s: Any, out: Optional[TensorData] = None) -> TensorData:
            compute = arithmetic(result_type(a, s)) if not compare else result_type(a, s)
            if compute.is_integer and not exact:
                compute = float32
            a = self._operand(a, compute)
            s = int(s) if compute.is_integer else float(s)
            dtype = out.dtype if out is not None else bool_ if compare else compute
            return self._finish(op(a, s, out=out), dtype)

        return run

    def _zip(self, fn: Callable[[float, float], float]) -> Callable[[TensorData, TensorData], TensorData]:
        op = self.ops.zip(fn)
        compare = fn in COMPARISONS
        exact = fn in operators.INTEGER_OPS

        def run(a: TensorData, b: TensorData) -> TensorData:
            compute = _binary_dtype(a, b)
            if compute.is_integer and not exact:
                compute = float32
            return self._finish(op(self._operand(a, compute), self._operand(b, compute)), bool_ if compare else compute)

        return run

    def _reduce(self, fn: Callable[[float, float], float], start: float) -> Callable[[TensorData, int], TensorData]:
        op = self.ops.reduce(fn, start)

        def run(a: TensorData, dim: int) -> TensorData:
            if a.dtype is bool_ and fn is operators.add:
                a = self.cast(a, int64)  # as in PyTorch, a bool's sum counts in int64
            return self._finish(op(a, dim), arithmetic(a.dtype))

        return run

    def matrix_multiply(self, a: TensorData, b: TensorData) -> TensorData:
        """a @ b (batched, broadcasting), int64 operands with a float one cast to it first."""
        compute = _binary_dtype(a, b)
        return self._finish(self.ops.matrix_multiply(self._operand(a, compute), self._operand(b, compute)), compute)

    def arg_reduce(self, a: TensorData, dim: int, largest: bool) -> TensorData:
        """int64 position of the first max (largest) or min along dim, kept with size 1; NaN is the extreme."""
        return self.ops.arg_reduce(a, dim, largest)

    def sort_indices(self, a: TensorData, dim: int, descending: bool) -> TensorData:
        """int64 positions of a stable sort along dim (NaN largest)."""
        return self.ops.sort_indices(a, dim, descending)

    def cumsum(self, a: TensorData, dim: int) -> TensorData:
        """Running sums along dim: float dtypes in float32 (then rounded to a 16-bit dtype), int64 in int64."""
        if a.dtype is bool_:
            a = self.cast(a, int64)
        return self._finish(self.ops.cumsum(a, dim), arithmetic(a.dtype))

    def cast(self, a: TensorData, dtype: DType, out: Optional[TensorData] = None) -> TensorData:
        """a's values in dtype, written into out (any layout; a broadcasts to it; its dtype is dtype)
        or into a new contiguous TensorData.  To bool: 1 where a is non-zero.  From bool to float32
        without out: a's own storage, relabelled (a bool's values are float32 1.0/0.0).  Floats to
        int64 truncate toward zero, as a cast does in PyTorch."""
        if dtype is bool_ and a.dtype is not bool_:
            nonzero = self.eq_scalar(self.eq_scalar(a, 0), 0.0)
            return nonzero if out is None else self.id_map(nonzero, out)
        if out is None and a.dtype is bool_ and dtype is float32:
            return a.with_dtype(float32)
        if self.ops.emulates_dtypes:
            return emulated(self._copy(a, out=empty(self.ops, a.shape, dtype) if out is None else out), dtype)
        return self.ops.cast(a, dtype, out)

    def fill(self, out: TensorData, value: Any) -> None:
        """Set every element of out (any layout) to value, in out's dtype (an int64's value is an int)."""
        if out.dtype.is_integer:
            self.ops.fill(out, int(value))
            return
        if self.ops.emulates_dtypes or out.dtype.storage == float32.storage:
            self.ops.fill(out, float(value))
            self._finish(out, out.dtype)
            return
        full = empty(self.ops, out.shape)
        self.ops.fill(full, float(value))
        self.ops.cast(full, out.dtype, out)

    def __repr__(self) -> str:
        return f"TensorBackend({self.ops.__name__})"


def _binary_dtype(a: TensorData, b: TensorData) -> DType:
    """The dtype an op of a and b computes in: their result type, bool arithmetic in float32."""
    return arithmetic(a.dtype if a.dtype is b.dtype else result_type(a, b))
