"""Shape and layout of a Tensor (a mixin of Tensor): view, reshape, permute, transpose, t(), .T,
expand, contiguous, clone, unsqueeze, squeeze, flatten, chunk and split.  All but clone(),
contiguous() copies and reshape() of a non-contiguous tensor are views of the same storage; all keep
the dtype."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple, Union

from . import tensor_functions as F
from .tensor_data import IndexingError, UserShape, resolve_shape, shape_args, shape_broadcast

if TYPE_CHECKING:
    from .tensor import Tensor

Sizes = Union[int, Sequence[int]]


class Views:
    """Views and layout changes; mixed into Tensor."""

    def view(self: "Tensor", *shape: Sizes) -> "Tensor":
        """Same data with another shape (one size may be -1); the tensor must be contiguous. Its own
        shape gives this tensor itself, as contiguous() does when there is nothing to copy: an op that
        changes nothing puts no node between a value and its uses (backward's LayerNorm then meets the
        gradient a pre-LN block's residual gives its input: Context.take_pending)."""
        sizes = shape_args(shape)
        if self.is_contiguous() and resolve_shape(tuple(int(s) for s in sizes), self.numel(), self.shape) == self.shape:
            return self
        return F.View.apply(self, sizes)

    def reshape(self: "Tensor", *shape: Sizes) -> "Tensor":
        """view() after a contiguous copy when one is needed."""
        return self.contiguous().view(*shape)

    def flatten(self: "Tensor", start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        """Dims start_dim .. end_dim merged into one (a view when the tensor is contiguous)."""
        if self.dims == 0:
            return self.reshape(1)
        a, b = self._dim(start_dim), self._dim(end_dim)
        if a > b:
            raise IndexingError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {self.shape}")
        return self.reshape(*self.shape[:a], -1, *self.shape[b + 1 :])

    def unsqueeze(self: "Tensor", dim: int) -> "Tensor":
        """A new dim of size 1 at position dim (negative dims count from dims + 1), as a view."""
        d = dim + self.dims + 1 if dim < 0 else dim
        if not 0 <= d <= self.dims:
            raise IndexingError(f"unsqueeze dim {dim} is out of range for shape {self.shape}")
        return self[(slice(None),) * d + (None,)]

    def squeeze(self: "Tensor", dim: Optional[int] = None) -> "Tensor":
        """dim removed if its size is 1 (every size-1 dim without dim), as a view."""
        if dim is None:
            drop = [d for d, s in enumerate(self.shape) if s == 1]
        else:
            d = self._dim(dim)
            drop = [d] if self.shape[d] == 1 else []
        return self[tuple(0 if d in drop else slice(None) for d in range(self.dims))]

    def permute(self: "Tensor", *order: Sizes) -> "Tensor":
        """Dims reordered (a view)."""
        dims = tuple(self._dim(d) for d in shape_args(order))
        return F.Permute.apply(self, dims)

    def transpose(self: "Tensor", dim0: int = -2, dim1: int = -1) -> "Tensor":
        """Two dims swapped (a view)."""
        order = list(range(self.dims))
        a, b = self._dim(dim0), self._dim(dim1)
        order[a], order[b] = order[b], order[a]
        return self.permute(*order)

    @property
    def T(self: "Tensor") -> "Tensor":
        """All dims reversed (the transpose of a matrix), as a view."""
        return self.permute(*reversed(range(self.dims)))

    def t(self: "Tensor") -> "Tensor":
        """The transpose of a matrix (a view); a tensor of 0 or 1 dims as it is, as torch's t()."""
        if self.dims > 2:
            raise IndexingError(f"t() expects a tensor of at most 2 dims, got shape {self.shape}; use transpose(dim0, dim1)")
        return self.transpose(0, 1) if self.dims == 2 else self

    def clone(self: "Tensor") -> "Tensor":
        """A contiguous copy with its own storage (the gradient passes through, as torch's clone)."""
        return F.Copy.apply(self)

    def split(self: "Tensor", split_size_or_sections: Union[int, Sequence[int]], dim: int = 0) -> Tuple["Tensor", ...]:
        """Views along dim: pieces of split_size_or_sections elements (the last may be shorter), or of
        the listed sizes (which must add up to the dim's size), as torch.split."""
        d = self._dim(dim)
        n = self.shape[d]
        if isinstance(split_size_or_sections, int) and not isinstance(split_size_or_sections, bool):
            step = split_size_or_sections
            if step <= 0:
                raise ValueError(f"split size must be positive, got {step}")
            sizes: List[int] = [min(step, n - start) for start in range(0, n, step)] or [0]
        else:
            sizes = [int(s) for s in split_size_or_sections]
            if sum(sizes) != n or any(s < 0 for s in sizes):
                raise ValueError(f"split sizes {sizes} do not add up to size {n} of dim {dim} (shape {self.shape})")
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return tuple(self.narrow(d, start, size) for start, size in zip(starts, sizes))

    def chunk(self: "Tensor", chunks: int, dim: int = 0) -> Tuple["Tensor", ...]:
        """At most `chunks` views along dim of equal size (the last may be shorter), as torch.chunk."""
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks <= 0:
            raise ValueError(f"chunk expects a positive number of chunks, got {chunks!r}")
        n = self.shape[self._dim(dim)]
        return self.split(max(-(-n // chunks), 1), dim)

    def contiguous(self: "Tensor") -> "Tensor":
        """This tensor if its layout is row-major, else a row-major copy."""
        if self.is_contiguous():
            return self
        return F.Copy.apply(self)

    def expand(self: "Tensor", *shape: Sizes) -> "Tensor":
        """A broadcast view of this tensor with a larger shape (stride 0 on broadcast dims); -1 keeps a size."""
        sizes = shape_args(shape)
        pad = len(sizes) - self.dims
        sizes = tuple(self.shape[i - pad] if s == -1 and i >= pad else s for i, s in enumerate(sizes))
        if pad < 0 or shape_broadcast(self.shape, sizes) != sizes:
            raise IndexingError(f"cannot expand shape {self.shape} to {sizes}")
        return F.Expand.apply(self, sizes)

    def _view(self: "Tensor", shape: Sequence[int]) -> "Tensor":
        shape = resolve_shape(tuple(int(s) for s in shape), self.numel(), self.shape)
        if not self._tensor.is_contiguous():
            raise IndexingError(
                f"view of a non-contiguous tensor (shape {self.shape}, strides {self._tensor.strides}) "
                f"to {shape}: call .contiguous() first, or use .reshape()"
            )
        return self._new(self._tensor.as_strided(shape))

    def _expand_view(self: "Tensor", shape: UserShape) -> "Tensor":
        offset = len(shape) - self.dims
        strides = [0] * offset
        for size, own, stride in zip(shape[offset:], self.shape, self._tensor.strides):
            strides.append(stride if own == size else 0)
        return self._new(self._tensor.as_strided(shape, tuple(strides)))
