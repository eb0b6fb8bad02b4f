"""Autodiff Functions over Python floats: the small teaching layer beneath tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Tuple

from . import operators
from .autodiff import Context

if TYPE_CHECKING:
    from .scalar import Scalar, ScalarLike


class ScalarFunction:
    """A differentiable function of floats.

    Subclasses define static `forward(ctx, *floats) -> float` and `backward(ctx, d_out)` returning
    one derivative per input.
    """

    @classmethod
    def _backward(cls, ctx: Context, d_out: float) -> Tuple[float, ...]:
        grads = cls.backward(ctx, d_out)
        return grads if isinstance(grads, tuple) else (grads,)

    @classmethod
    def apply(cls, *vals: "ScalarLike") -> "Scalar":
        """Run forward on the floats of vals and record history for backward."""
        from .scalar import Scalar, ScalarHistory

        scalars = [v if isinstance(v, Scalar) else Scalar(float(v)) for v in vals]
        ctx = Context(False)
        out = cls.forward(ctx, *(s.data for s in scalars))
        return Scalar(float(out), ScalarHistory(cls, ctx, scalars))


class Add(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float, b: float) -> float:
        return operators.add(a, b)

    @staticmethod
    def backward(ctx: Context, d_out: float) -> Tuple[float, ...]:
        return d_out, d_out


class _Pointwise(ScalarFunction):
    """y = f(x); the derivative is back(x, d_out), or back(y, d_out) where it is cheaper from y."""

    fn: Callable[[float], float]
    back: Callable[[float, float], float]
    saves_output = False

    @classmethod
    def forward(cls, ctx: Context, a: float) -> float:
        out = cls.fn(a)
        ctx.save_for_backward(out if cls.saves_output else a)
        return out

    @classmethod
    def backward(cls, ctx: Context, d_out: float) -> float:
        (saved,) = ctx.saved_values
        return cls.back(saved, d_out)


class Log(_Pointwise):
    fn, back = staticmethod(operators.log), staticmethod(operators.log_back)


class Inv(_Pointwise):
    fn, back = staticmethod(operators.inv), staticmethod(operators.inv_back)


class Sigmoid(_Pointwise):
    fn, back = staticmethod(operators.sigmoid), staticmethod(operators.sigmoid_back)
    saves_output = True


class ReLU(_Pointwise):
    fn, back = staticmethod(operators.relu), staticmethod(operators.relu_back)


class Exp(_Pointwise):
    fn, back = staticmethod(operators.exp), staticmethod(operators.mul)
    saves_output = True


class Tanh(_Pointwise):
    fn, back = staticmethod(operators.tanh), staticmethod(operators.tanh_back)
    saves_output = True


class Mul(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float, b: float) -> float:
        ctx.save_for_backward(a, b)
        return operators.mul(a, b)

    @staticmethod
    def backward(ctx: Context, d_out: float) -> Tuple[float, ...]:
        a, b = ctx.saved_values
        return b * d_out, a * d_out


class Neg(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float) -> float:
        return operators.neg(a)

    @staticmethod
    def backward(ctx: Context, d_out: float) -> float:
        return -d_out


class Pow(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float, b: float) -> float:
        out = operators.pow(a, b)
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx: Context, d_out: float) -> Tuple[float, ...]:
        a, b, out = ctx.saved_values
        da = b * operators.pow(a, b - 1.0) * d_out
        db = out * operators.log(a) * d_out if a > 0.0 else 0.0
        return da, db


class LT(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float, b: float) -> float:
        return operators.lt(a, b)

    @staticmethod
    def backward(ctx: Context, d_out: float) -> Tuple[float, ...]:
        return 0.0, 0.0


class EQ(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float, b: float) -> float:
        return operators.eq(a, b)

    @staticmethod
    def backward(ctx: Context, d_out: float) -> Tuple[float, ...]:
        return 0.0, 0.0
