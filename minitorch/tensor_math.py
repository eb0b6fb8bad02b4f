"""Elementwise math of a Tensor (a mixin of Tensor): arithmetic operators (+ - * / // % ** @),
comparisons and logic, the pointwise functions (abs, sqrt, sin, cos, exp, ...), selection (where,
masked_fill, maximum, minimum) and the in-place updates (add_, sub_, mul_, fill_, zero_).

Python numbers never promote a tensor of their category (see minitorch.dtypes): int64 * 2 stays
int64, int64 * 2.5 is float32, bfloat16 * 2.5 stays bfloat16.  `/` is true division (int64 / int64
is float32), `//` floors and `%` takes the sign of the divisor, as in PyTorch and Python; on the CPU
backends an int64 `//` or `%` by zero raises ZeroDivisionError (on CUDA, where checking would read
the divisor back to the host, it gives 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Type, Union

from . import pointwise_functions as P
from . import tensor_functions as F
from .autocast import autocast_inputs
from .autodiff import is_grad_enabled, no_grad
from .dtypes import bool_, result_type
from .tensor_data import IndexingError, shape_broadcast

if TYPE_CHECKING:
    from .tensor import Tensor

Number = (int, float)
TensorLike = Union[float, int, "Tensor"]


def _elementwise(fn: Type[F.Function], doc: str) -> Callable[["Tensor"], "Tensor"]:
    """A Tensor method applying the one-input Function fn."""

    def method(self: "Tensor") -> "Tensor":
        return fn.apply(self)

    method.__name__ = fn.__name__.lower()
    method.__qualname__ = f"Tensor.{method.__name__}"
    method.__doc__ = doc
    return method


class Arithmetic:
    """Operators and pointwise functions; mixed into Tensor."""

    # ---- + - * / // % ----------------------------------------------------------------------
    def __add__(self: "Tensor", b: TensorLike) -> "Tensor":
        if isinstance(b, Number):
            return P.AddScalar.apply(self, b)
        return P.Add.apply(self, self._ensure(b))

    def __radd__(self: "Tensor", b: TensorLike) -> "Tensor":
        return self + b

    def __sub__(self: "Tensor", b: TensorLike) -> "Tensor":
        if isinstance(b, Number):
            return P.AddScalar.apply(self, -b)
        return P.Add.apply(self, -self._ensure(b))

    def __rsub__(self: "Tensor", b: TensorLike) -> "Tensor":
        return P.AddScalar.apply(-self, b) if isinstance(b, Number) else self._ensure(b) - self

    def __mul__(self: "Tensor", b: TensorLike) -> "Tensor":
        if isinstance(b, Number):
            return P.MulScalar.apply(self, b)
        return P.Mul.apply(self, self._ensure(b))

    def __rmul__(self: "Tensor", b: TensorLike) -> "Tensor":
        return self * b

    def __truediv__(self: "Tensor", b: TensorLike) -> "Tensor":
        if isinstance(b, Number):
            return P.DivScalar.apply(self, b)
        return P.Div.apply(self, self._ensure(b))

    def __rtruediv__(self: "Tensor", b: TensorLike) -> "Tensor":
        if isinstance(b, Number):
            return P.MulScalar.apply(P.Inv.apply(self), b)
        return self._ensure(b) / self

    def __floordiv__(self: "Tensor", b: TensorLike) -> "Tensor":
        """Division rounded toward negative infinity (no gradient flows through it, as in torch)."""
        if self._integer_operands(b):
            return self._integer_division("floordiv", b)
        return (self / b).detach().floor()

    def __rfloordiv__(self: "Tensor", b: TensorLike) -> "Tensor":
        return self._ensure(b) // self

    def __mod__(self: "Tensor", b: TensorLike) -> "Tensor":
        """The remainder with the sign of b: self - b * floor(self / b) (torch.remainder)."""
        if self._integer_operands(b):
            return self._integer_division("remainder", b)
        return self - (self / b).floor() * b

    def __rmod__(self: "Tensor", b: TensorLike) -> "Tensor":
        return self._ensure(b) % self

    def _integer_operands(self: "Tensor", b: TensorLike) -> bool:
        other = b if isinstance(b, Number) else self._ensure(b)
        return result_type(self, other).is_integer

    def _integer_division(self: "Tensor", name: str, b: TensorLike) -> "Tensor":
        backend = self.backend
        if isinstance(b, Number):
            if b == 0 and not backend.cuda:
                raise ZeroDivisionError(f"integer {name} of a tensor of shape {self.shape} by zero")
            return self._new(getattr(backend, f"{name}_scalar")(self._tensor, b))
        b = self._ensure(b)
        if not backend.cuda and bool((b == 0).any()):
            raise ZeroDivisionError(f"integer {name} of a tensor of shape {self.shape} by a tensor {b.shape} holding 0")
        return self._new(getattr(backend, f"{name}_zip")(self._tensor, b._tensor))

    # ---- powers --------------------------------------------------------------------------
    def __pow__(self: "Tensor", p: TensorLike) -> "Tensor":
        """self ** p: an int64 tensor to a non-negative int stays int64 (exact products); a tensor
        exponent broadcasts, with gradients for both sides."""
        if not isinstance(p, Number):
            return P.Pow.apply(self, self._ensure(p))
        if self.dtype.is_integer and isinstance(p, int):
            if p < 0:
                raise ValueError(f"int64 tensor ** {p}: integers to negative integer powers are not allowed (as in torch)")
            out, base = self.zeros(dtype=self.dtype) + 1, self
            while p:
                out, base, p = (out * base if p & 1 else out), base * base, p >> 1
            return out
        return P.PowerScalar.apply(self, float(p))

    def __rpow__(self: "Tensor", b: TensorLike) -> "Tensor":
        """b ** self for a number b (2 ** x), with the gradient b ** x * log(b)."""
        return P.Pow.apply(self._ensure(float(b) if isinstance(b, Number) else b), self)

    # ---- matrix products -------------------------------------------------------------------
    def __matmul__(self: "Tensor", b: "Tensor") -> "Tensor":
        """The matrix product, as torch.matmul: 1-D operands are a row (left) or a column (right)
        vector whose dim is removed from the result; other leading dims broadcast."""
        b = self._ensure(b)
        if self.dims == 0 or b.dims == 0:
            raise IndexingError(f"matmul needs tensors of at least 1 dim, got {self.shape} @ {b.shape}")
        a2 = self.unsqueeze(0) if self.dims == 1 else self
        b2 = b.unsqueeze(1) if b.dims == 1 else b
        if a2.shape[-1] != b2.shape[-2]:
            raise IndexingError(f"matmul shapes {self.shape} @ {b.shape}: inner sizes {a2.shape[-1]} and {b2.shape[-2]} differ")
        try:
            shape_broadcast(a2.shape[:-2], b2.shape[:-2])
        except IndexingError as err:
            raise IndexingError(f"matmul shapes {self.shape} @ {b.shape}: batch dims: {err}") from None
        out = F.MatMul.apply(*autocast_inputs("matmul", a2, b2))
        if self.dims == 1:
            out = out.squeeze(-2)
        return out.squeeze(-1) if b.dims == 1 else out

    def matmul(self: "Tensor", b: "Tensor") -> "Tensor":
        """self @ b (see __matmul__)."""
        return self @ b

    # ---- comparisons and logic -------------------------------------------------------------
    def __lt__(self: "Tensor", b: TensorLike) -> "Tensor":
        if isinstance(b, Number):
            return P.LTScalar.apply(self, b)
        return P.LT.apply(self, self._ensure(b))

    def __gt__(self: "Tensor", b: TensorLike) -> "Tensor":
        if isinstance(b, Number):
            return P.LTScalar.apply(-self, -b)
        return P.LT.apply(self._ensure(b), self)

    def __eq__(self: "Tensor", b: TensorLike) -> "Tensor":  # type: ignore[override]
        if isinstance(b, Number):
            return P.EQScalar.apply(self, b)
        return P.EQ.apply(self, self._ensure(b))

    def __le__(self: "Tensor", b: TensorLike) -> "Tensor":
        return (self < b) | (self == b)

    def __ge__(self: "Tensor", b: TensorLike) -> "Tensor":
        return (self > b) | (self == b)

    def __ne__(self: "Tensor", b: TensorLike) -> "Tensor":  # type: ignore[override]
        return ~(self == b)

    __hash__ = object.__hash__

    def __invert__(self: "Tensor") -> "Tensor":
        """Logical not of a bool tensor."""
        self._need_bool("~")
        return self == 0.0

    def __and__(self: "Tensor", b: "Tensor") -> "Tensor":
        """Logical and of bool tensors."""
        self._need_bool("&", b)
        out = self * b
        out._tensor = out._tensor.with_dtype(bool_)
        return out

    def __or__(self: "Tensor", b: "Tensor") -> "Tensor":
        """Logical or of bool tensors."""
        self._need_bool("|", b)
        return (self + b) > 0.0

    def _need_bool(self: "Tensor", op: str, other: Any = None) -> None:
        for t in (self, other) if other is not None else (self,):
            if getattr(t, "dtype", None) is not bool_:
                raise TypeError(f"{op} needs bool tensors (results of comparisons), got {getattr(t, 'dtype', type(t).__name__)}")

    def is_close(self: "Tensor", b: "Tensor") -> "Tensor":
        return P.IsClose.apply(self, self._ensure(b))

    def isnan(self: "Tensor") -> "Tensor":
        """True where the value is NaN."""
        return self != self

    # ---- pointwise functions ---------------------------------------------------------------
    def __neg__(self: "Tensor") -> "Tensor":
        return P.Neg.apply(self)

    def __abs__(self: "Tensor") -> "Tensor":
        return P.Abs.apply(self)

    abs = _elementwise(P.Abs, "|x|, elementwise (the gradient is sign(x), 0 at 0).")
    sqrt = _elementwise(P.Sqrt, "The square root, elementwise (nan below 0).")
    sin = _elementwise(P.Sin, "The sine, elementwise.")
    cos = _elementwise(P.Cos, "The cosine, elementwise.")
    floor = _elementwise(P.Floor, "The largest integer <= x, elementwise (no gradient flows through it).")
    sigmoid = _elementwise(P.Sigmoid, "1 / (1 + exp(-x)), elementwise.")
    relu = _elementwise(P.ReLU, "max(x, 0), elementwise.")
    gelu = _elementwise(P.GELU, "GELU with the tanh approximation, elementwise.")
    log = _elementwise(P.Log, "The natural logarithm, elementwise.")
    exp = _elementwise(P.Exp, "e ** x, elementwise.")
    tanh = _elementwise(P.Tanh, "The hyperbolic tangent, elementwise.")

    # ---- selection -------------------------------------------------------------------------
    def where(self: "Tensor", condition: "Tensor", other: TensorLike) -> "Tensor":
        """This tensor where condition is non-zero, other elsewhere (broadcast; a NaN or inf in the
        branch not taken never leaks); the gradient goes to the branch taken."""
        return P.Where.apply(self._ensure(condition).float(), self, self._ensure(other))

    def masked_fill(self: "Tensor", mask: "Tensor", value: float) -> "Tensor":
        """value where mask is non-zero, this tensor elsewhere."""
        return self._ensure(value).where(mask, self)

    def maximum(self: "Tensor", other: "Tensor") -> "Tensor":
        """The elementwise larger of self and other, NaN where either is NaN; the gradient goes to
        the larger, split in half on ties (as torch.maximum)."""
        return P.Extremum.apply(self, self._ensure(other), True)

    def minimum(self: "Tensor", other: "Tensor") -> "Tensor":
        """The elementwise smaller of self and other, as maximum."""
        return P.Extremum.apply(self, self._ensure(other), False)

    # ---- in place --------------------------------------------------------------------------
    def add_(self: "Tensor", other: TensorLike, alpha: float = 1) -> "Tensor":
        """self += alpha * other, in place (as torch.Tensor.add_)."""
        return self._in_place("add_", other, lambda: self + (other * alpha if alpha != 1 else other))

    def sub_(self: "Tensor", other: TensorLike, alpha: float = 1) -> "Tensor":
        """self -= alpha * other, in place."""
        return self._in_place("sub_", other, lambda: self - (other * alpha if alpha != 1 else other))

    def mul_(self: "Tensor", other: TensorLike) -> "Tensor":
        """self *= other, in place."""
        return self._in_place("mul_", other, lambda: self * other)

    def fill_(self: "Tensor", value: float) -> "Tensor":
        """Every element set to value, in place."""
        return self._in_place("fill_", None, lambda: value)

    def zero_(self: "Tensor") -> "Tensor":
        """Every element set to 0, in place."""
        return self.fill_(0)

    def _in_place(self: "Tensor", name: str, other: Any, result: Callable[[], TensorLike]) -> "Tensor":
        """self.copy_(result()) after torch's checks: no autodiff history, no leaf that requires grad
        outside no_grad(), and (for an operand other) no result dtype of a higher category than self's
        (a float added into an int64 tensor)."""
        if self.history is not None and (not self.is_leaf or is_grad_enabled()):
            what = "has autodiff history" if not self.is_leaf else "requires grad (write inside minitorch.no_grad())"
            raise RuntimeError(f"{name} writes in place into a tensor of shape {self.shape} that {what}")
        if other is not None:
            wanted = result_type(self, other if isinstance(other, Number) else self._ensure(other))
            if "bif".index(wanted.kind) > "bif".index(self.dtype.kind):
                raise RuntimeError(f"{name}: result type {wanted.name} can't be cast to the {self.dtype.name} of the tensor written")
        with no_grad():
            return self.copy_(result())
