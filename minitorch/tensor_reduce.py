"""Reductions of a Tensor (a mixin of Tensor): sum, mean, var, max, all, and clamp.

A reduced dim is kept with size 1 unless keepdim=False; reducing everything (no dim) gives shape (1,).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from . import tensor_functions as F
from .tensor_data import IndexingError

if TYPE_CHECKING:
    from .tensor import Tensor


class Reductions:
    """Reductions over one dim or over everything; mixed into Tensor."""

    def _dim(self: "Tensor", dim: int) -> int:
        d = dim + self.dims if dim < 0 else dim
        if not 0 <= d < self.dims:
            raise IndexingError(f"dim {dim} is out of range for shape {self.shape}")
        return d

    def _flat(self: "Tensor") -> "Tensor":
        return self.contiguous().view(self.size)

    def _drop(self: "Tensor", out: "Tensor", dim: Optional[int], keepdim: bool) -> "Tensor":
        """A reduction's result with the reduced dim removed unless keepdim (no dim: shape (1,))."""
        if keepdim or dim is None:
            return out
        d = self._dim(dim)
        return out.view(*(self.shape[:d] + self.shape[d + 1 :] or (1,)))

    def sum(self: "Tensor", dim: Optional[int] = None, keepdim: bool = True) -> "Tensor":
        """Sum over dim (kept with size 1 unless keepdim=False), or over everything (shape (1,))."""
        if dim is None:
            return F.Sum.apply(self._flat(), 0)
        return self._drop(F.Sum.apply(self, self._dim(dim)), dim, keepdim)

    def mean(self: "Tensor", dim: Optional[int] = None, keepdim: bool = True) -> "Tensor":
        """Mean over dim (kept with size 1 unless keepdim=False), or over everything."""
        n = self.size if dim is None else self.shape[self._dim(dim)]
        return self.sum(dim, keepdim) * (1.0 / n)

    def var(self: "Tensor", dim: Optional[int] = None, correction: int = 0, keepdim: bool = True) -> "Tensor":
        """Variance over dim (kept with size 1 unless keepdim=False) or everything: sum of squared
        deviations / (n - correction).  correction=0 (default) is the population variance, as in the
        original minitorch and NumPy; correction=1 the unbiased one (torch.var's default)."""
        n = self.size if dim is None else self.shape[self._dim(dim)]
        if isinstance(correction, bool) or not isinstance(correction, int) or correction < 0:
            raise ValueError(f"var correction must be a non-negative int, got {correction!r}")
        if n - correction < 1:
            raise ValueError(
                f"var with correction={correction} over {n} element(s) (shape {self.shape}, dim {dim}) is undefined"
            )
        centered = (self._flat() if dim is None else self) - self.mean(dim)
        out = (centered * centered).sum(0 if dim is None else dim) * (1.0 / (n - correction))
        return self._drop(out, dim, keepdim)

    def max(self: "Tensor", dim: Optional[int] = None, keepdim: bool = True) -> "Tensor":
        """Max over dim (kept with size 1 unless keepdim=False), or over everything (shape (1,))."""
        if dim is None:
            return F.Max.apply(self._flat(), 0)
        return self._drop(F.Max.apply(self, self._dim(dim)), dim, keepdim)

    def clamp(self: "Tensor", min: Optional[float] = None, max: Optional[float] = None) -> "Tensor":
        """Values limited to [min, max] (either bound may be None); the gradient passes inside."""
        out = self
        if min is not None:
            out = F.ClampMin.apply(out, float(min))
        if max is not None:
            out = -F.ClampMin.apply(-out, -float(max))
        return out

    def all(self: "Tensor", dim: Optional[int] = None) -> "Tensor":
        """1.0 where every element (over dim, or overall) is non-zero."""
        nonzero = 1.0 - (self == 0.0)
        flat = nonzero._flat() if dim is None else nonzero
        return flat._new(flat.backend.mul_reduce(flat._tensor, 0 if dim is None else self._dim(dim)))

