"""Shape and layout of a Tensor (a mixin of Tensor): view, reshape, permute, transpose, .T, expand,
contiguous, unsqueeze, squeeze and flatten.  All but contiguous() copies and reshape() of a
non-contiguous tensor are views of the same storage; all keep the dtype."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence, Union

from . import tensor_functions as F
from .tensor_data import IndexingError, UserShape, resolve_shape, shape_args, shape_broadcast

if TYPE_CHECKING:
    from .tensor import Tensor

Sizes = Union[int, Sequence[int]]


class Views:
    """Views and layout changes; mixed into Tensor."""

    def view(self: "Tensor", *shape: Sizes) -> "Tensor":
        """Same data with another shape (one size may be -1); the tensor must be contiguous."""
        return F.View.apply(self, shape_args(shape))

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
        shape = resolve_shape(tuple(int(s) for s in shape), self.size, self.shape)
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
