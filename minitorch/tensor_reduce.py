"""Reductions of a Tensor (a mixin of Tensor): sum, mean, var, max, argmax, all, any, logsumexp,
softmax, log_softmax, and clamp.

As in torch, `dim` is one dim, a tuple of dims, or None for all of them, and a reduced dim is removed
unless keepdim=True (which keeps it with size 1); reducing everything gives a 0-dim tensor.  Unlike
torch, max(dim) gives the values only (argmax gives the positions).  Under minitorch.autocast, sum
(so mean and var), logsumexp, softmax and log_softmax run in float32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple, Union

from . import tensor_functions as F
from .autocast import autocast_inputs
from .tensor_data import IndexingError, prod

if TYPE_CHECKING:
    from .tensor import Tensor

Dims = Union[None, int, Sequence[int]]


class Reductions:
    """Reductions over one dim, several, or everything; mixed into Tensor."""

    def _dim(self: "Tensor", dim: int) -> int:
        d = dim + self.dims if dim < 0 else dim
        if not 0 <= d < self.dims:
            raise IndexingError(f"dim {dim} is out of range for shape {self.shape}")
        return d

    def _dims(self: "Tensor", dim: Dims) -> Tuple[int, ...]:
        """The reduced dims, sorted (all of them for None)."""
        if dim is None:
            return tuple(range(self.dims))
        return tuple(sorted({self._dim(d) for d in ((dim,) if isinstance(dim, int) else dim)}))

    def _flat(self: "Tensor") -> "Tensor":
        return self.contiguous().view(self.size)

    def _reduce(self: "Tensor", fn: Any, dim: Dims, keepdim: bool) -> "Tensor":
        dims = self._dims(dim)
        if dim is None and self.dims != 1:
            out = fn.apply(self._flat(), 0)
        else:
            out = self
            for d in dims:
                out = fn.apply(out, d)
        kept = tuple(1 if d in dims else s for d, s in enumerate(self.shape))
        return out.view(*(kept if keepdim else tuple(s for d, s in enumerate(self.shape) if d not in dims)))

    def sum(self: "Tensor", dim: Dims = None, keepdim: bool = False) -> "Tensor":
        """Sum over dim (one, several, or all with None)."""
        (x,) = autocast_inputs("sum", self)
        return x._reduce(F.Sum, dim, keepdim)

    def mean(self: "Tensor", dim: Dims = None, keepdim: bool = False) -> "Tensor":
        """Mean over dim (one, several, or all with None)."""
        n = prod(self.shape[d] for d in self._dims(dim))
        return self.sum(dim, keepdim) * (1.0 / n)

    def var(self: "Tensor", dim: Dims = None, correction: int = 0, keepdim: bool = False) -> "Tensor":
        """Variance over dim: sum of squared deviations / (n - correction).  correction=0 (default) is the
        population variance, as in the original minitorch and NumPy; correction=1 the unbiased one
        (torch.var's default)."""
        n = prod(self.shape[d] for d in self._dims(dim))
        if isinstance(correction, bool) or not isinstance(correction, int) or correction < 0:
            raise ValueError(f"var correction must be a non-negative int, got {correction!r}")
        if n - correction < 1:
            raise ValueError(
                f"var with correction={correction} over {n} element(s) (shape {self.shape}, dim {dim}) is undefined"
            )
        centered = self - self.mean(dim, keepdim=True)
        return (centered * centered).sum(dim, keepdim) * (1.0 / (n - correction))

    def max(self: "Tensor", dim: Dims = None, keepdim: bool = False) -> "Tensor":
        """Max over dim (one, several, or all with None); the gradient goes to every element tied for it."""
        return self._reduce(F.Max, dim, keepdim)

    def argmax(self: "Tensor", dim: Optional[int] = None, keepdim: bool = False) -> "Tensor":
        """The position of the first max along dim (of the flattened tensor with None), as float32 integers."""
        x = self.detach()
        if dim is None:
            return x._flat().argmax(0, keepdim=False).view(*((1,) * self.dims if keepdim else ()))
        d = self._dim(dim)
        n = self.shape[d]
        positions = x._arange(n).view(*(n if i == d else 1 for i in range(self.dims)))
        candidates = positions.where(x == x.max(d, keepdim=True), float(n))
        return -((-candidates).max(d, keepdim))

    def all(self: "Tensor", dim: Dims = None, keepdim: bool = False) -> "Tensor":
        """True where every element (over dim, or overall) is non-zero (a bool tensor)."""
        return (self == 0.0).float().sum(dim, keepdim) == 0.0

    def any(self: "Tensor", dim: Dims = None, keepdim: bool = False) -> "Tensor":
        """True where some element (over dim, or overall) is non-zero (a bool tensor)."""
        return (self == 0.0).float().sum(dim, keepdim) < float(prod(self.shape[d] for d in self._dims(dim)))

    def logsumexp(self: "Tensor", dim: Dims, keepdim: bool = False) -> "Tensor":
        """log(sum(exp(x))) over dim, shifted by the max for stability (a row of -inf gives -inf)."""
        (x,) = autocast_inputs("logsumexp", self)
        m = x.max(dim, keepdim=True).detach().clamp(min=-3.0e38)
        out = m + (x - m).exp().sum(dim, keepdim=True).log()
        return out if keepdim else out.view(*(s for d, s in enumerate(self.shape) if d not in self._dims(dim)))

    def softmax(self: "Tensor", dim: int) -> "Tensor":
        """exp(x) / sum(exp(x)) along dim, shifted by the (constant) max for stability."""
        (x,) = autocast_inputs("softmax", self)
        e = (x - x.max(dim, keepdim=True).detach()).exp()
        return e / e.sum(dim, keepdim=True)

    def log_softmax(self: "Tensor", dim: int) -> "Tensor":
        """log(softmax(x)) along dim, computed as x - logsumexp(x)."""
        (x,) = autocast_inputs("log_softmax", self)
        return x - x.logsumexp(dim, keepdim=True)

    def clamp(self: "Tensor", min: Optional[float] = None, max: Optional[float] = None) -> "Tensor":
        """Values limited to [min, max] (either bound may be None); the gradient passes inside."""
        out = self
        if min is not None:
            out = F.ClampMin.apply(out, float(min))
        if max is not None:
            out = -F.ClampMin.apply(-out, -float(max))
        return out
