"""Elementwise autodiff Functions: the maps of minitorch.operators with their derivatives (as one
backward zip, or composed from other maps), the binary arithmetic and its Python-scalar forms,
comparisons (no gradient), the elementwise max/min, clamp and where.  See tensor_functions.py for
the Function contract."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Tuple, Type

from .autodiff import Context
from .dtypes import arithmetic, result_type
from .tensor_data import TensorData
from .tensor_functions import Function, Product

if TYPE_CHECKING:
    from .tensor import Tensor


class Neg(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor") -> "Tensor":
        return t1._new(t1.backend.neg_map(t1._tensor))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        return grad_output._new(grad_output.backend.neg_map(grad_output._tensor))


class _Pointwise(Function):
    """y = f(x) elementwise; backward is one zip kernel of the saved x (or y, where the derivative is
    cheaper from the output) and the incoming gradient."""

    map_name: str  # the backend's forward map, e.g. "sigmoid_map"
    back_name: str  # the backend's zip (saved, grad_output) -> grad_input
    saves_output = False

    @classmethod
    def forward(cls, ctx: Context, t1: "Tensor") -> "Tensor":
        out = t1._new(getattr(t1.backend, cls.map_name)(t1._tensor))
        ctx.save_for_backward(out if cls.saves_output else t1)
        return out

    @classmethod
    def backward(cls, ctx: Context, grad_output: "Tensor") -> "Tensor":
        (saved,) = ctx.saved_values
        back = getattr(grad_output.backend, cls.back_name)
        return grad_output._new(back(saved._tensor, grad_output._tensor))


def _pointwise(name: str, back_name: str, saves_output: bool = False) -> Type[_Pointwise]:
    """The _Pointwise Function `name` of the backend's map `<name in lower case>_map`."""
    attributes = {"map_name": f"{name.lower()}_map", "back_name": back_name, "saves_output": saves_output}
    return type(name, (_Pointwise,), {**attributes, "__module__": __name__})


Inv = _pointwise("Inv", "inv_back_zip")
Sigmoid = _pointwise("Sigmoid", "sigmoid_back_zip", saves_output=True)
ReLU = _pointwise("ReLU", "relu_back_zip")
GELU = _pointwise("GELU", "gelu_back_zip")
GELUErf = _pointwise("GELU_Erf", "gelu_erf_back_zip")
Tanh = _pointwise("Tanh", "tanh_back_zip", saves_output=True)
Log = _pointwise("Log", "log_back_zip")
Exp = _pointwise("Exp", "mul_zip", saves_output=True)  # d/dx exp(x) = exp(x): the saved output times the gradient


class _Composed(Function):
    """y = f(x) elementwise by the backend's map `map_name`, whose backward `slope(backend, x, y)`
    (the derivative, as a TensorData) is composed from other maps; multiplied by the gradient."""

    map_name: str

    @classmethod
    def forward(cls, ctx: Context, t1: "Tensor") -> "Tensor":
        out = t1._new(getattr(t1.backend, cls.map_name)(t1._tensor))
        ctx.save_for_backward(t1, out)
        return out

    @classmethod
    def backward(cls, ctx: Context, grad_output: "Tensor") -> "Tensor":
        x, y = ctx.saved_values
        b = grad_output.backend
        return grad_output._new(b.mul_zip(cls.slope(b, x._tensor, y._tensor), grad_output._tensor))  # type: ignore[attr-defined]


class Abs(_Composed):
    """|x|; the gradient is sign(x) (0 at 0, as torch's)."""

    map_name = "abs_map"

    @staticmethod
    def slope(b: Any, x: TensorData, y: TensorData) -> TensorData:
        return b.add_zip(b.lt_scalar(b.neg_map(x), 0.0), b.neg_map(b.lt_scalar(x, 0.0)))


class Sqrt(_Composed):
    """sqrt(x); the gradient is 1 / (2 sqrt(x))."""

    map_name = "sqrt_map"

    @staticmethod
    def slope(b: Any, x: TensorData, y: TensorData) -> TensorData:
        return b.inv_map(b.mul_scalar(y, 2.0))


class Sin(_Composed):
    """sin(x); the gradient is cos(x)."""

    map_name = "sin_map"

    @staticmethod
    def slope(b: Any, x: TensorData, y: TensorData) -> TensorData:
        return b.cos_map(x)


class Cos(_Composed):
    """cos(x); the gradient is -sin(x)."""

    map_name = "cos_map"

    @staticmethod
    def slope(b: Any, x: TensorData, y: TensorData) -> TensorData:
        return b.neg_map(b.sin_map(x))


class Floor(Function):
    """floor(x); no gradient flows (its derivative is 0 almost everywhere), as in torch."""

    @staticmethod
    def forward(ctx: Context, t1: "Tensor") -> "Tensor":
        return t1._new(t1.backend.floor_map(t1._tensor))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        return grad_output._new(grad_output.backend.mul_scalar(grad_output._tensor, 0.0))


class Add(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor", t2: "Tensor") -> "Tensor":
        return t1._new(t1.backend.add_zip(t1._tensor, t2._tensor))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", "Tensor"]:
        return grad_output, grad_output


class Mul(Product):
    op_name = "mul_zip"


class Div(Function):
    """a / b, IEEE division (int64 operands divide as float32, as torch's true division)."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", b: "Tensor") -> "Tensor":
        out = a._new(a.backend.div_zip(a._tensor, b._tensor))
        ctx.save_for_backward(b, out)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple[Optional["Tensor"], Optional["Tensor"]]:
        b, out = ctx.saved_values
        backend = grad_output.backend
        da = backend.div_zip(grad_output._tensor, b._tensor)
        need_a, need_b = ctx.needs_input_grad
        return (
            grad_output._new(da) if need_a else None,
            grad_output._new(backend.neg_map(backend.mul_zip(da, out._tensor))) if need_b else None,
        )


class Pow(Function):
    """a ** b elementwise; the gradients are b * a ** (b - 1) and a ** b * log(a)."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", b: "Tensor") -> "Tensor":
        out = a._new(a.backend.pow_zip(a._tensor, b._tensor))
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple[Optional["Tensor"], Optional["Tensor"]]:
        a, b, out = ctx.saved_values
        k = grad_output.backend
        g = grad_output._tensor
        need_a, need_b = ctx.needs_input_grad
        da = db = None
        if need_a:
            slope = k.mul_zip(b._tensor, k.pow_zip(a._tensor, k.add_scalar(b._tensor, -1.0)))
            da = grad_output._new(k.mul_zip(slope, g))
        if need_b:
            db = grad_output._new(k.mul_zip(k.mul_zip(out._tensor, k.log_map(a._tensor)), g))
        return da, db


class AddScalar(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor", s: float) -> "Tensor":
        return t1._new(t1.backend.add_scalar(t1._tensor, s))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        return grad_output


class _ScaledByScalar(Function):
    """x op s for a Python number s, op (the backend's `op_name`) linear in x: its gradient is op(g, s)."""

    op_name: str

    @classmethod
    def forward(cls, ctx: Context, t1: "Tensor", s: float) -> "Tensor":
        ctx.save_for_backward(s)
        return t1._new(getattr(t1.backend, cls.op_name)(t1._tensor, s))

    @classmethod
    def backward(cls, ctx: Context, grad_output: "Tensor") -> "Tensor":
        (s,) = ctx.saved_values
        return grad_output._new(getattr(grad_output.backend, cls.op_name)(grad_output._tensor, s))


class MulScalar(_ScaledByScalar):
    """x * s for a Python number s."""

    op_name = "mul_scalar"


class DivScalar(_ScaledByScalar):
    """x / s for a Python number s (true division: an int64 x gives float32)."""

    op_name = "div_scalar"


class PowerScalar(Function):
    """x ** p for a Python float p."""

    @staticmethod
    def forward(ctx: Context, t1: "Tensor", p: float) -> "Tensor":
        ctx.save_for_backward(t1, p)
        return t1._new(t1.backend.pow_scalar(t1._tensor, p))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        t1, p = ctx.saved_values
        backend = grad_output.backend
        if p == 0.0:
            return grad_output._new(backend.mul_scalar(grad_output._tensor, 0.0))
        slope = backend.mul_scalar(backend.pow_scalar(t1._tensor, p - 1.0), p)
        return grad_output._new(backend.mul_zip(slope, grad_output._tensor))


def _no_grad_backward(n_tensors: int) -> Any:
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        zero = grad_output._new(grad_output.backend.mul_scalar(grad_output._tensor, 0.0))
        return (zero,) * n_tensors

    return staticmethod(backward)


class LT(Function):
    @staticmethod
    def forward(ctx: Context, a: "Tensor", b: "Tensor") -> "Tensor":
        return a._new(a.backend.lt_zip(a._tensor, b._tensor))

    backward = _no_grad_backward(2)


class EQ(Function):
    @staticmethod
    def forward(ctx: Context, a: "Tensor", b: "Tensor") -> "Tensor":
        return a._new(a.backend.eq_zip(a._tensor, b._tensor))

    backward = _no_grad_backward(2)


class IsClose(Function):
    @staticmethod
    def forward(ctx: Context, a: "Tensor", b: "Tensor") -> "Tensor":
        return a._new(a.backend.is_close_zip(a._tensor, b._tensor))

    backward = _no_grad_backward(2)


class LTScalar(Function):
    """x < s for a Python float s."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", s: float) -> "Tensor":
        return a._new(a.backend.lt_scalar(a._tensor, s))

    backward = _no_grad_backward(1)


class EQScalar(Function):
    """x == s for a Python float s."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", s: float) -> "Tensor":
        return a._new(a.backend.eq_scalar(a._tensor, s))

    backward = _no_grad_backward(1)


class Extremum(Function):
    """The elementwise max (largest=True) or min of a and b, NaN where either is; the gradient goes
    to the side chosen, half to each on ties (as torch.maximum / minimum)."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", b: "Tensor", largest: bool) -> "Tensor":
        ctx.save_for_backward(a, b, largest)
        return a._new((a.backend.max_zip if largest else a.backend.min_zip)(a._tensor, b._tensor))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", "Tensor"]:
        a, b, largest = ctx.saved_values
        k = grad_output.backend
        g = grad_output._tensor
        wins = k.lt_zip(b._tensor, a._tensor) if largest else k.lt_zip(a._tensor, b._tensor)
        loses = k.lt_zip(a._tensor, b._tensor) if largest else k.lt_zip(b._tensor, a._tensor)
        tie = k.mul_scalar(k.eq_zip(a._tensor, b._tensor), 0.5)
        return grad_output._new(k.mul_zip(k.add_zip(wins, tie), g)), grad_output._new(k.mul_zip(k.add_zip(loses, tie), g))


class ClampMin(Function):
    """max(x, s) for a Python float s; the gradient passes where x >= s (as torch.clamp's does)."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", s: float) -> "Tensor":
        ctx.save_for_backward(a, s)
        return a._new(a.backend.max_scalar(a._tensor, s))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        a, s = ctx.saved_values
        b = grad_output.backend
        keep = b.add_scalar(b.mul_scalar(b.lt_scalar(a._tensor, s), -1.0), 1.0)
        return grad_output._new(b.mul_zip(keep, grad_output._tensor))


class Where(Function):
    """condition ? a : b with broadcasting (condition: non-zero is true), as two selects
    (relu_back(m, v) is v where m > 0, else 0), so a NaN or inf in the branch not taken never reaches
    the result; no gradient for condition.  The result has a's and b's promoted dtype (a 0-dim
    branch, e.g. masked_fill's value, does not promote the other), the selects' masks being bool."""

    @staticmethod
    def forward(ctx: Context, condition: "Tensor", a: "Tensor", b: "Tensor") -> "Tensor":
        backend = condition.backend
        false = backend.eq_scalar(condition._tensor, 0.0)
        true = backend.eq_scalar(false, 0.0)
        ctx.save_for_backward(true, false)
        dtype = arithmetic(result_type(a, b))
        a_td, b_td = (backend.cast(t._tensor, dtype) if t.dtype is not dtype else t._tensor for t in (a, b))
        if dtype.is_integer:  # integers hold no NaN or inf: an exact select by 0/1 products
            return a._new(backend.add_zip(backend.mul_zip(a_td, true), backend.mul_zip(b_td, false)))
        return a._new(backend.add_zip(backend.relu_back_zip(true, a_td), backend.relu_back_zip(false, b_td)))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", "Tensor", "Tensor"]:
        true, false = ctx.saved_values
        backend = grad_output.backend
        g = grad_output._tensor
        no_grad = grad_output._new(backend.mul_scalar(true, 0.0))
        return no_grad, grad_output._new(backend.relu_back_zip(true, g)), grad_output._new(backend.relu_back_zip(false, g))
