"""Indexing and slicing of a Tensor (a mixin of Tensor), as in torch.

`x[key]`, where key is one entry or a tuple of entries:

  int (negative counts from the end)   picks one position and removes the dim
  slice start:stop:step                step > 0 keeps a strided view; step < 0 (which NumPy allows
                                       and torch does not) gives the reversed elements as a copy
  None                                 a new dim of size 1
  ...                                  as many full slices as the other entries leave
  integers (list, numpy array, Tensor) positions gathered along the dim (a copy); several such
                                       entries broadcast together, and the result's dims from them
                                       stand where the first of them stood when they are adjacent,
                                       in front otherwise (ints are applied first, as torch does)
  booleans (list, numpy array, Tensor  the positions where it is True, over as many dims as it
  of bool dtype, e.g. `x > 0`)         has; its shape must equal those dims' sizes

A key of ints, slices with step > 0, None and ... gives a view of the same storage, which starts
mid-storage when it skips elements (the storage is sliced: numpy and torch 1-D storages slice as
views); any other key gives a copy.  Both carry autodiff.  Index entries given as Tensors (int64, or
floats holding integers) are read on the host to check them (on CUDA: one small device-to-host
copy), since an index that is out of range must be an error that names it, not a silently wrong value.

`gather(dim, index)` picks along dim by an int64 index tensor without leaving the device: on the CPU
backends an index out of range raises; on CUDA, where checking would need a device-to-host copy, it
gives 0 (and no gradient), as embedding does.

`x[key] = value` writes a number or a tensor that broadcasts to x[key]'s shape into x's storage, in
place.  Like torch it refuses tensors that have autodiff history, and leaves that require grad
outside `no_grad()`.  Through repeated positions the last value written wins.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Tuple

import numpy as np

from .autodiff import Context, is_grad_enabled, no_grad
from .dtypes import bool_, int64
from .fused.embedding import Embedding, scatter_rows
from .tensor_data import IndexingError, TensorData, prod, strides_from_shape
from .tensor_functions import Function

if TYPE_CHECKING:
    from .tensor import Tensor


def _show(key: Any) -> str:
    """The key for an error message, long lists and arrays abbreviated."""
    return reprlib.repr(key)


@dataclass(frozen=True)
class ViewPlan:
    """The strided view that a key's basic entries describe, for any strides of the input.

    starts[d]: first position taken in input dim d; dims: per output dim, (input dim, step) or
    (-1, 0) for a new dim of size 1."""

    shape: Tuple[int, ...]
    starts: Tuple[int, ...]
    dims: Tuple[Tuple[int, int], ...]

    def apply(self, td: TensorData) -> TensorData:
        offset = sum(s * st for s, st in zip(self.starts, td.strides))
        strides = tuple(0 if d < 0 else td.strides[d] * step for d, step in self.dims)
        return td.as_strided(self.shape, strides, offset)


@dataclass
class IndexPlan:
    """A parsed key: the view of its basic entries, the view dims its negative-step slices reverse,
    and its advanced entries as (view dim, int64 positions) with their broadcast shape."""

    view: ViewPlan
    flips: List[int]
    advanced: List[Tuple[int, np.ndarray]]
    broadcast: Tuple[int, ...] = ()


class StridedView(Function):
    """A view given by a ViewPlan; the gradient is zeros with the view's part set to the incoming one."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", plan: ViewPlan) -> "Tensor":
        ctx.save_for_backward(a.shape, plan)
        return a._new(plan.apply(a._tensor))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        shape, plan = ctx.saved_values
        out = grad_output.zeros(shape, grad_output.dtype)
        grad_output.backend.id_map(grad_output._tensor, out=plan.apply(out._tensor))
        return out


def _index_array(entry: Any, key: Any) -> np.ndarray:
    """An index entry (list, numpy array, Tensor) as an int64 or bool numpy array."""
    if hasattr(entry, "_tensor"):
        values = entry.to_numpy()
        if entry.dtype is bool_:
            return values != 0
        if not np.all(values == np.floor(values)):
            raise IndexingError(f"index tensor of shape {entry.shape} holds non-integer values (key {_show(key)})")
        return values.astype(np.int64)
    arr = np.asarray(entry)
    if arr.size == 0 and arr.dtype.kind == "f":
        return arr.astype(np.int64)
    if arr.dtype.kind == "b":
        return arr
    if arr.dtype.kind not in "iu":
        raise IndexingError(f"index arrays must hold integers or booleans, got dtype {arr.dtype} (key {_show(key)})")
    return arr.astype(np.int64)


def _entries(key: Any, shape: Tuple[int, ...]) -> List[Any]:
    """The key as a list of entries (ellipsis expanded, index arrays as numpy), checked for types."""
    items = list(key) if isinstance(key, tuple) else [key]
    out: List[Any] = []
    consumed = 0
    for e in items:
        if e is None or e is Ellipsis:
            out.append(e)
        elif isinstance(e, (bool, np.bool_)):
            raise IndexingError(f"a bare boolean index is not supported (key {_show(key)}); index with a mask tensor")
        elif isinstance(e, (int, np.integer)):
            out.append(int(e))
            consumed += 1
        elif isinstance(e, slice):
            for part in (e.start, e.stop, e.step):
                if part is not None and not isinstance(part, (int, np.integer)):
                    raise IndexingError(f"slice bounds must be ints or None, got {e} (key {_show(key)})")
            if e.step == 0:
                raise IndexingError(f"slice step cannot be zero (key {_show(key)})")
            out.append(e)
            consumed += 1
        elif isinstance(e, (list, np.ndarray)) or hasattr(e, "_tensor"):
            arr = _index_array(e, key)
            if arr.dtype == np.bool_ and arr.ndim == 0:
                raise IndexingError(f"a 0-d boolean index is not supported (key {_show(key)})")
            out.append(arr)
            consumed += arr.ndim if arr.dtype == np.bool_ else 1
        else:
            raise IndexingError(
                f"tensor indices must be ints, slices, None, ..., or lists/arrays/tensors of ints or bools; "
                f"got {type(e).__name__} (key {_show(key)})"
            )
    ellipses = [i for i, e in enumerate(out) if e is Ellipsis]
    if len(ellipses) > 1:
        raise IndexingError(f"an index can have only one ellipsis (...), got key {_show(key)}")
    if consumed > len(shape):
        raise IndexingError(f"too many indices for a tensor of shape {shape}: key {_show(key)} indexes {consumed} dims")
    fill = [slice(None)] * (len(shape) - consumed)
    if ellipses:
        at = ellipses[0]
        return out[:at] + fill + out[at + 1 :]
    return out + fill


def parse_key(key: Any, shape: Tuple[int, ...]) -> IndexPlan:
    """The IndexPlan of `key` for a tensor of `shape`; IndexingError naming the key and the shape."""
    starts = [0] * len(shape)
    out_shape: List[int] = []
    dims: List[Tuple[int, int]] = []
    flips: List[int] = []
    advanced: List[Tuple[int, np.ndarray]] = []
    d = 0
    for e in _entries(key, shape):
        if e is None:
            out_shape.append(1)
            dims.append((-1, 0))
            continue
        size = shape[d]
        if isinstance(e, int):
            i = e + size if e < 0 else e
            if not 0 <= i < size:
                raise IndexingError(f"index {e} is out of range for dim {d} of size {size} (key {_show(key)}, shape {shape})")
            starts[d] = i
            d += 1
        elif isinstance(e, slice):
            start, stop, step = e.indices(size)
            n = len(range(start, stop, step))
            if step < 0:  # the same elements in increasing order, reversed afterwards
                start, step = start + (n - 1) * step, -step
                flips.append(len(out_shape))
            starts[d] = start if n else 0
            out_shape.append(n)
            dims.append((d, step))
            d += 1
        elif e.dtype == np.bool_:
            if e.shape != shape[d : d + e.ndim]:
                raise IndexingError(
                    f"boolean index of shape {e.shape} does not match the indexed dims {shape[d : d + e.ndim]} "
                    f"(key {_show(key)}, shape {shape})"
                )
            for positions in np.nonzero(e):
                advanced.append((len(out_shape), positions.astype(np.int64)))
                out_shape.append(shape[d])
                dims.append((d, 1))
                d += 1
        else:
            bad = (e < -size) | (e >= size)
            if bad.any():
                raise IndexingError(
                    f"index {int(e[bad].flat[0])} is out of range for dim {d} of size {size} (key {_show(key)}, shape {shape})"
                )
            advanced.append((len(out_shape), np.where(e < 0, e + size, e)))
            out_shape.append(size)
            dims.append((d, 1))
            d += 1
    plan = IndexPlan(ViewPlan(tuple(out_shape), tuple(starts), tuple(dims)), flips, advanced)
    if advanced:
        try:
            plan.broadcast = tuple(np.broadcast_shapes(*(a.shape for _, a in advanced)))
        except ValueError:
            shapes = ", ".join(str(a.shape) for _, a in advanced)
            raise IndexingError(f"index arrays of shapes {shapes} cannot be broadcast together (key {_show(key)})") from None
    return plan


def _gather(view: "Tensor", advanced: List[Tuple[int, np.ndarray]], broadcast: Tuple[int, ...]) -> "Tensor":
    """The advanced-index result of a view: the indexed dims gathered as rows of a [N, C] matrix."""
    dims = [d for d, _ in advanced]
    rest = [d for d in range(view.dims) if d not in dims]
    sizes = [view.shape[d] for d in dims]
    rest_shape = tuple(view.shape[d] for d in rest)
    flat = np.zeros(broadcast, dtype=np.int64)
    for (d, positions), size in zip(advanced, sizes):
        flat = flat * size + positions
    n_rows, n_cols = prod(sizes), prod(rest_shape)
    first = dims[0]
    adjacent = dims == list(range(first, first + len(dims)))
    shape = rest_shape[:first] + broadcast + rest_shape[first:] if adjacent else broadcast + rest_shape
    if flat.size == 0 or n_cols == 0:  # nothing to gather; an empty view keeps the autodiff graph
        return view.flatten()[:0].view(*shape)
    rows = view.permute(*dims, *rest).contiguous().view(n_rows, n_cols)
    ids = view._new(TensorData(view.backend.ops.storage_from_numpy(flat), broadcast, dtype=int64))
    out = Embedding.apply(rows, ids).view(*broadcast, *rest_shape)
    if not adjacent or first == 0:
        return out
    b = len(broadcast)
    order = list(range(b, b + first)) + list(range(b)) + list(range(b + first, out.dims))
    return out.permute(*order)


def _reverse(t: "Tensor", dim: int) -> "Tensor":
    n = t.shape[dim]
    return _gather(t, [(dim, np.arange(n - 1, -1, -1, dtype=np.int64))], (n,)) if n > 1 else t


class Indexing:
    """x[key], x[key] = value, narrow and index_select; mixed into Tensor."""

    def __getitem__(self: "Tensor", key: Any) -> "Tensor":
        plan = parse_key(key, self.shape)
        out = StridedView.apply(self, plan.view)
        for d in plan.flips:
            out = _reverse(out, d)
        if plan.advanced:
            out = _gather(out, plan.advanced, plan.broadcast)
        return self._keep_dtype(out)

    def __setitem__(self: "Tensor", key: Any, value: Any) -> None:
        if self.history is not None and (not self.is_leaf or is_grad_enabled()):
            what = "has autodiff history" if not self.is_leaf else "requires grad (write inside minitorch.no_grad())"
            raise RuntimeError(f"x[{_show(key)}] = ... writes in place into a tensor of shape {self.shape} that {what}")
        plan = parse_key(key, self.shape)
        self._version += 1
        with no_grad():
            if not plan.flips and not plan.advanced:
                self._new(plan.view.apply(self._tensor)).copy_(self._value_like(value))
            else:
                self._scatter(key, value)

    def _scatter(self: "Tensor", key: Any, value: Any) -> None:
        """self[key] = value for keys that copy: written as a select between self and the scattered values."""
        # Which element of self each element of self[key] is: the same key applied to their positions.
        host = type(self)(TensorData(np.arange(self.numel(), dtype=np.int64), self.shape, dtype=int64))
        selected = host[key]
        positions = selected.to_numpy().astype(np.int64).reshape(-1)
        src = self._value_like(value).expand(selected.shape).contiguous().view(positions.size, 1)
        _, last = np.unique(positions[::-1], return_index=True)
        keep = positions.size - 1 - last  # the last write to each position wins
        if not np.array_equal(keep, np.arange(positions.size)):
            src = src[keep]
        ids = self._new(TensorData(self.backend.ops.storage_from_numpy(positions[keep]), (keep.size,), dtype=int64))
        hit = scatter_rows(src * 0.0 + 1.0, ids, self.numel())
        written = scatter_rows(src, ids, self.numel())
        self.copy_(written.where(hit, self.contiguous().view(self.numel(), 1)).view(*self.shape))

    def _value_like(self: "Tensor", value: Any) -> "Tensor":
        """A number, tensor, or (nested) list / numpy array as a tensor on this backend."""
        if isinstance(value, (int, float)) or hasattr(value, "_tensor"):
            return self._ensure(value)
        arr = np.asarray(value, dtype=np.float32)
        return self._new(TensorData(self.backend.ops.storage_from_numpy(arr), arr.shape))

    def narrow(self: "Tensor", dim: int, start: int, length: int) -> "Tensor":
        """Positions start .. start + length - 1 of dim, as torch.narrow: a view sharing this tensor's
        storage (writing into it writes this tensor), start may count from the end (-size <= start
        <= size), and the gradient lands in the narrowed range with zeros elsewhere."""
        call = f"narrow(dim={dim}, start={start}, length={length})"
        for name, value in (("dim", dim), ("start", start), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{call}: {name} must be an int, got {type(value).__name__}")
        if self.dims == 0:
            raise IndexingError(f"{call} cannot be applied to a 0-dim tensor")
        d = self._dim(dim)
        size = self.shape[d]
        if not -size <= start <= size:
            raise IndexingError(
                f"{call}: start must be in [-{size}, {size}] for dim {dim} of size {size} (shape {self.shape})"
            )
        if length < 0:
            raise IndexingError(f"{call}: length must be non-negative")
        s = int(start) + size if start < 0 else int(start)
        if s + length > size:
            raise IndexingError(
                f"{call}: start ({s}) + length ({length}) exceeds size {size} of dim {dim} (shape {self.shape})"
            )
        shape = self.shape[:d] + (int(length),) + self.shape[d + 1 :]
        starts = tuple(s if i == d and length else 0 for i in range(self.dims))
        plan = ViewPlan(shape, starts, tuple((i, 1) for i in range(self.dims)))
        return self._keep_dtype(StridedView.apply(self, plan))

    def index_select(self: "Tensor", dim: int, index: Any) -> "Tensor":
        """The positions of a 1-D integer index along dim (a copy), as torch.index_select."""
        d = self._dim(dim)
        arr = _index_array(index, index)
        if arr.ndim != 1 or arr.dtype == np.bool_:
            raise IndexingError(f"index_select needs a 1-D integer index, got shape {arr.shape} of dtype {arr.dtype}")
        return self[(slice(None),) * d + (arr,)]


    def gather(self: "Tensor", dim: int, index: "Tensor") -> "Tensor":
        """out[i][j][k] = self[index[i][j][k]][j][k] for dim 0 (and so on), as torch.gather: index is
        an int64 tensor with self's number of dims, no larger than self outside dim; the gradient
        adds back into the picked positions."""
        index = self._ensure(index)
        d = self._dim(dim)
        if not index.dtype.is_integer:
            raise TypeError(f"gather(dim={dim}) needs an int64 index, got {index.dtype.name}")
        if index.dims != self.dims or any(i > s for k, (i, s) in enumerate(zip(index.shape, self.shape)) if k != d):
            raise IndexingError(
                f"gather(dim={dim}): index of shape {index.shape} does not fit the input of shape {self.shape} "
                f"(the same number of dims, no larger outside dim {d})"
            )
        size = self.shape[d]
        if not self.backend.cuda and index.numel() and bool(((index < 0) | (index >= size)).any()):
            bad = index.numpy()
            found = bad[(bad < 0) | (bad >= size)].flat[0]
            raise IndexingError(f"gather(dim={dim}): index {found} is out of range for size {size} (shape {self.shape})")
        strides = strides_from_shape(self.shape)
        inside = ((index >= 0) & (index < size)).long()
        position = index * strides[d]
        for k, n in enumerate(index.shape):
            if k != d and n > 1:
                position = position + self._arange(n).view(*(n if j == k else 1 for j in range(self.dims))) * strides[k]
        position = position * inside + (inside - 1)  # outside [0, size): -1, a position that gathers 0
        rows = self.contiguous().view(self.numel(), 1)
        return self._keep_dtype(Embedding.apply(rows, position.detach()).view(*index.shape))
