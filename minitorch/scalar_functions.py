"""Autodiff Functions over Python floats: the small teaching layer beneath tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

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


class Log(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float) -> float:
        ctx.save_for_backward(a)
        return operators.log(a)

    @staticmethod
    def backward(ctx: Context, d_out: float) -> float:
        (a,) = ctx.saved_values
        return operators.log_back(a, d_out)


class Mul(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float, b: float) -> float:
        ctx.save_for_backward(a, b)
        return operators.mul(a, b)

    @staticmethod
    def backward(ctx: Context, d_out: float) -> Tuple[float, ...]:
        a, b = ctx.saved_values
        return b * d_out, a * d_out


class Inv(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float) -> float:
        ctx.save_for_backward(a)
        return operators.inv(a)

    @staticmethod
    def backward(ctx: Context, d_out: float) -> float:
        (a,) = ctx.saved_values
        return operators.inv_back(a, d_out)


class Neg(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float) -> float:
        return operators.neg(a)

    @staticmethod
    def backward(ctx: Context, d_out: float) -> float:
        return -d_out


class Sigmoid(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float) -> float:
        out = operators.sigmoid(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, d_out: float) -> float:
        (out,) = ctx.saved_values
        return operators.sigmoid_back(out, d_out)


class ReLU(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float) -> float:
        ctx.save_for_backward(a)
        return operators.relu(a)

    @staticmethod
    def backward(ctx: Context, d_out: float) -> float:
        (a,) = ctx.saved_values
        return operators.relu_back(a, d_out)


class Exp(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float) -> float:
        out = operators.exp(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, d_out: float) -> float:
        (out,) = ctx.saved_values
        return out * d_out


class Tanh(ScalarFunction):
    @staticmethod
    def forward(ctx: Context, a: float) -> float:
        out = operators.tanh(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, d_out: float) -> float:
        (out,) = ctx.saved_values
        return operators.tanh_back(out, d_out)


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
