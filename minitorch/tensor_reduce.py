"""Reductions of a Tensor (a mixin of Tensor), as in torch: sum, mean, var, std, amax/amin,
max/min, argmax/argmin, all, any, logsumexp, softmax, log_softmax, cumsum, topk, sort, argsort and
clamp.

`dim` is one dim, a tuple of dims, or None for all of them, and a reduced dim is removed unless
keepdim=True (which keeps it with size 1); reducing everything gives a 0-dim tensor.  max(dim) and
min(dim) give a named pair (values, indices), as torch's do, the indices int64; max() gives the
value; max(other) the elementwise maximum.  NaN propagates: a max, min, argmax or argmin over a slice
holding NaN gives NaN (and its first position).  mean, var and std need a floating dtype (as in
torch); the sum of a bool tensor is int64.  var() defaults to the population variance (correction=0,
minitorch's original API), std() to torch's unbiased one (correction=1).  Under minitorch.autocast, sum (so mean and var),
logsumexp, softmax and log_softmax run in float32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence, Tuple, Union

from . import pointwise_functions as P
from . import tensor_functions as F
from .autocast import autocast_inputs
from .autodiff import Context
from .dtypes import int64
from .tensor_data import IndexingError, prod
from .tensor_functions import Function

if TYPE_CHECKING:
    from .tensor import Tensor

Dims = Union[None, int, Sequence[int]]


class CumSum(Function):
    """Running sums along a dim; the gradient is the incoming one summed from the end."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", dim: int) -> "Tensor":
        ctx.save_for_backward(dim)
        return a._new(a.backend.cumsum(a._tensor, dim))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (dim,) = ctx.saved_values
        flip = (slice(None),) * dim + (slice(None, None, -1),)
        return grad_output[flip].cumsum(dim)[flip]


class ValuesIndices(NamedTuple):
    """What max(dim), min(dim), topk and sort return, as torch's return types: the values (with
    autodiff) and their int64 positions along the dim."""

    values: "Tensor"
    indices: "Tensor"


class Reductions:
    """Reductions over one dim, several, or everything; mixed into Tensor."""

    def _dim(self: "Tensor", dim: int) -> int:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"dim must be an int, got {type(dim).__name__} {dim!r}")
        d = dim + self.dims if dim < 0 else dim
        if not 0 <= d < self.dims:
            raise IndexingError(f"dim {dim} is out of range for shape {self.shape}")
        return d

    def _dims(self: "Tensor", dim: Dims) -> Tuple[int, ...]:
        """The reduced dims, sorted (all of them for None); a 0-dim tensor takes dim 0 or -1 (none)."""
        listed = () if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)
        if self.dims == 0:
            if any(d not in (0, -1) for d in listed):
                raise IndexingError(f"dim {dim} is out of range for a 0-dim tensor")
            return ()
        if dim is None:
            return tuple(range(self.dims))
        return tuple(sorted({self._dim(d) for d in listed}))

    def _flat(self: "Tensor") -> "Tensor":
        return self.contiguous().view(self.numel())

    def _reduce(self: "Tensor", fn: Any, dim: Dims, keepdim: bool, *args: Any) -> "Tensor":
        """fn.apply(x, d, *args) over the dims: one dim directly, several as one (moved last and merged)."""
        dims = self._dims(dim)
        if self.dims == 0:
            return fn.apply(self.view(1), 0, *args).view()
        if len(dims) == 1:
            out = fn.apply(self, dims[0], *args)
        else:
            kept = [d for d in range(self.dims) if d not in dims]
            merged = self.permute(*kept, *dims).contiguous().view(*(self.shape[d] for d in kept), -1)
            out = fn.apply(merged, len(kept), *args)
        shape = tuple(1 if d in dims else s for d, s in enumerate(self.shape))
        return out.view(*(shape if keepdim else tuple(s for d, s in enumerate(self.shape) if d not in dims)))

    def _floating(self: "Tensor", what: str) -> None:
        if not self.dtype.is_floating:
            raise TypeError(f"{what} needs a floating-point tensor, got {self.dtype.name} (cast with .float() first, as in torch)")

    def sum(self: "Tensor", dim: Dims = None, keepdim: bool = False) -> "Tensor":
        """Sum over dim (one, several, or all with None); int64 for int64 and bool tensors."""
        (x,) = autocast_inputs("sum", self)
        return x._reduce(F.Sum, dim, keepdim)

    def mean(self: "Tensor", dim: Dims = None, keepdim: bool = False) -> "Tensor":
        """Mean over dim (one, several, or all with None)."""
        self._floating("mean")
        n = prod(self.shape[d] for d in self._dims(dim))
        return self.sum(dim, keepdim) * (1.0 / n)

    def var(self: "Tensor", dim: Dims = None, correction: int = 0, keepdim: bool = False) -> "Tensor":
        """Variance over dim: sum of squared deviations / (n - correction).  correction=0 (default) is the
        population variance, as in the original minitorch and NumPy (torch.var defaults to 1, the
        unbiased estimate: pass correction=1 for torch's value); std() defaults to torch's 1."""
        self._floating("var")
        n = prod(self.shape[d] for d in self._dims(dim))
        if isinstance(correction, bool) or not isinstance(correction, int) or correction < 0:
            raise ValueError(f"var correction must be a non-negative int, got {correction!r}")
        if n - correction < 1:
            raise ValueError(
                f"var with correction={correction} over {n} element(s) (shape {self.shape}, dim {dim}) is undefined"
            )
        centered = self - self.mean(dim, keepdim=True)
        return (centered * centered).sum(dim, keepdim) * (1.0 / (n - correction))

    def std(self: "Tensor", dim: Dims = None, correction: int = 1, keepdim: bool = False) -> "Tensor":
        """Standard deviation over dim: var(dim, correction, keepdim).sqrt(), with torch's default
        correction=1 (the unbiased estimate)."""
        return self.var(dim, correction, keepdim).sqrt()

    def amax(self: "Tensor", dim: Dims = None, keepdim: bool = False) -> "Tensor":
        """Max over dim (one, several, or all with None), NaN where a slice holds one; the gradient
        is split evenly among the elements equal to it (as torch.amax)."""
        return self._reduce(F.Extreme, dim, keepdim, True)

    def amin(self: "Tensor", dim: Dims = None, keepdim: bool = False) -> "Tensor":
        """Min over dim, as amax."""
        return self._reduce(F.Extreme, dim, keepdim, False)

    def max(self: "Tensor", dim: Any = None, keepdim: bool = False) -> Any:
        """max(): the largest value (0 dims); max(dim, keepdim=False): (values, indices) of the first
        largest along dim, the gradient going to that position; max(other): the elementwise
        maximum.  NaN counts as the largest."""
        return self._extreme("max", dim, keepdim, True)

    def min(self: "Tensor", dim: Any = None, keepdim: bool = False) -> Any:
        """min(), min(dim, keepdim=False) -> (values, indices), min(other): as max."""
        return self._extreme("min", dim, keepdim, False)

    def _extreme(self: "Tensor", name: str, dim: Any, keepdim: bool, largest: bool) -> Any:
        if dim is None:
            return self.amax() if largest else self.amin()
        if hasattr(dim, "_tensor"):
            return self.maximum(dim) if largest else self.minimum(dim)
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"{name}(dim) takes one int dim, got {dim!r}; a{name}(dims) reduces several")
        indices = self._arg_extreme(dim, True, largest)
        if not self.dims:
            return ValuesIndices(self, indices)
        values = self.gather(self._dim(dim), indices)
        if not keepdim:
            return ValuesIndices(values.squeeze(dim), indices.squeeze(dim))
        return ValuesIndices(values, indices)

    def argmax(self: "Tensor", dim: Optional[int] = None, keepdim: bool = False) -> "Tensor":
        """The int64 position of the first max along dim (of the flattened tensor with None); a NaN
        is the max."""
        return self._arg_extreme(dim, keepdim, True)

    def argmin(self: "Tensor", dim: Optional[int] = None, keepdim: bool = False) -> "Tensor":
        """The int64 position of the first min along dim, as argmax."""
        return self._arg_extreme(dim, keepdim, False)

    def _arg_extreme(self: "Tensor", dim: Optional[int], keepdim: bool, largest: bool) -> "Tensor":
        name = "argmax" if largest else "argmin"
        if self.dims == 0:
            self._dims(dim)
            return self.zeros((), int64)
        if dim is None:
            flat = self._flat()._arg_extreme(0, False, largest)
            return flat.view(*((1,) * self.dims)) if keepdim else flat
        d = self._dim(dim)
        if self.shape[d] == 0:
            raise IndexingError(f"{name}(dim={dim}) of a tensor of shape {self.shape}: the dim is empty")
        out = self._new(self.backend.arg_reduce(self.detach()._tensor, d, largest))
        return out if keepdim else out.squeeze(d)

    def all(self: "Tensor", dim: Dims = None, keepdim: bool = False) -> "Tensor":
        """True where every element (over dim, or overall) is non-zero (a bool tensor)."""
        return (self == 0).sum(dim, keepdim) == 0

    def any(self: "Tensor", dim: Dims = None, keepdim: bool = False) -> "Tensor":
        """True where some element (over dim, or overall) is non-zero (a bool tensor)."""
        return (self == 0).sum(dim, keepdim) < prod(self.shape[d] for d in self._dims(dim))

    def logsumexp(self: "Tensor", dim: Dims, keepdim: bool = False) -> "Tensor":
        """log(sum(exp(x))) over dim, shifted by the max for stability (a row of -inf gives -inf)."""
        (x,) = autocast_inputs("logsumexp", self)
        m = x.amax(dim, keepdim=True).detach().clamp(min=-3.0e38)
        out = m + (x - m).exp().sum(dim, keepdim=True).log()
        return out if keepdim else out.view(*(s for d, s in enumerate(self.shape) if d not in self._dims(dim)))

    def softmax(self: "Tensor", dim: int) -> "Tensor":
        """exp(x) / sum(exp(x)) along dim, shifted by the (constant) max for stability."""
        (x,) = autocast_inputs("softmax", self)
        e = (x - x.amax(dim, keepdim=True).detach()).exp()
        return e / e.sum(dim, keepdim=True)

    def log_softmax(self: "Tensor", dim: int) -> "Tensor":
        """log(softmax(x)) along dim, computed as x - logsumexp(x)."""
        (x,) = autocast_inputs("log_softmax", self)
        return x - x.logsumexp(dim, keepdim=True)

    def cumsum(self: "Tensor", dim: int) -> "Tensor":
        """Running sums along dim (in order, in float32 for the float dtypes; int64 for int64 and
        bool); the gradient is the reversed running sum of the incoming one."""
        return CumSum.apply(self, self._dim(dim)) if self.dims else self.view(1).cumsum(0).view()

    def sort(self: "Tensor", dim: int = -1, descending: bool = False, stable: bool = True) -> ValuesIndices:
        """(values, indices) sorted along dim; always stable (equal values keep their order, the
        guarantee torch gives with stable=True); NaN sorts as the largest value."""
        if self.dims == 0:
            return ValuesIndices(self, self.zeros((), int64))
        indices = self.argsort(dim, descending)
        return ValuesIndices(self.gather(self._dim(dim), indices), indices)

    def argsort(self: "Tensor", dim: int = -1, descending: bool = False) -> "Tensor":
        """The int64 positions that sort along dim (stable; NaN largest)."""
        return self._new(self.backend.sort_indices(self.detach()._tensor, self._dim(dim), bool(descending)))

    def topk(self: "Tensor", k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
        """(values, indices) of the k largest (largest=False: smallest) along dim, best first; among
        equal values the first position comes first, NaN counts as the largest."""
        d = self._dim(dim)
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= self.shape[d]:
            raise ValueError(f"topk: k must be an int in [0, {self.shape[d]}] for dim {dim} of shape {self.shape}, got {k!r}")
        indices = self.argsort(d, descending=largest).narrow(d, 0, k)
        return ValuesIndices(self.gather(d, indices), indices)

    def clamp(self: "Tensor", min: Optional[float] = None, max: Optional[float] = None) -> "Tensor":
        """Values limited to [min, max] (either bound may be None); the gradient passes inside."""
        out = self
        if min is not None:
            out = P.ClampMin.apply(out, float(min))
        if max is not None:
            out = -P.ClampMin.apply(-out, -float(max))
        return out
