"""Autodiff Functions over tensors: the Function base, and the Functions of reductions (sum, max/min),
views and layouts (permute, view, expand, copy), casts and the matrix product; the elementwise ones
are in pointwise_functions.py.

Each Function runs backend ops (TensorData in, TensorData out) in `forward` and `backward` and
wraps their results as Tensors; nothing here knows where storage lives.  Inputs arrive detached (no
history); non-tensor arguments (dims, scalars, flags) pass through as plain Python values and get no
gradient.  `backward` returns gradients for the tensor arguments in order; trailing tensor arguments
that take no gradient (masks, ids) may be left out, and None may stand for the gradient of an input
that `ctx.needs_input_grad` says needs none (a constant operand: its gradient would be discarded).
The fused ops' Functions live in `minitorch.fused`, one module each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from .autodiff import Context, is_grad_enabled
from .dtypes import DType
from .tensor_data import TensorData

if TYPE_CHECKING:
    from .tensor import Tensor


_TYPES: List[Any] = []


def _tensor_types() -> Tuple[Any, Any]:
    """(Tensor, History): tensor.py imports this module, so the classes are fetched once, late."""
    if not _TYPES:
        from .tensor import History, Tensor

        _TYPES.extend((Tensor, History))
    return _TYPES[0], _TYPES[1]


def _wrap(result: Any) -> Tuple[Any, ...]:
    return result if isinstance(result, tuple) else (result,)


class Function:
    """Base class: `apply` records history so `backward` can be chained.

    folds_pending: whether backward may fold its inputs' gathered gradients into its own
    (Context.take_pending); only such Functions are offered them.
    passes_gradient_on: whether backward returns its output's gradient itself or a view of it, and
    nothing else: a gradient that was backward's alone stays so (Context.may_write_pending).
    settles_own_gradient: whether backward settles its output's gradient itself (Tensor.settle) where
    it reads it on the device; otherwise backward settles it before the call."""

    folds_pending = False
    passes_gradient_on = False
    settles_own_gradient = False

    @classmethod
    def _backward(cls, ctx: Context, grad_out: "Tensor") -> Tuple["Tensor", ...]:
        return _wrap(cls.backward(ctx, grad_out))  # type: ignore[attr-defined]

    @classmethod
    def apply(cls, *vals: Any) -> "Tensor":
        """Run forward on detached inputs; record (cls, ctx, inputs) when any input needs grad."""
        Tensor, History = _tensor_types()
        need_grad = False
        raw: List[Any] = []
        for v in vals:
            if isinstance(v, Tensor):
                if v.requires_grad:
                    need_grad = True
                raw.append(v.detach())
            else:
                raw.append(v)
        need_grad = need_grad and is_grad_enabled()
        ctx = Context(not need_grad)
        if need_grad:
            ctx.needs_input_grad = tuple(v.requires_grad for v in vals if isinstance(v, Tensor))
        out = cls.forward(ctx, *raw)  # type: ignore[attr-defined]
        if not need_grad or not out.dtype.is_floating:  # integer and bool results carry no gradient, as in torch
            return out
        inputs = tuple(v for v in vals if isinstance(v, Tensor))
        return Tensor(out._tensor, History(cls, ctx, inputs), backend=out.backend)


class Product(Function):
    """A product bilinear in a and b (the backend's op `op_name`): the gradients are op(g, b') and
    op(a', g), where ' is `adjoint` (the values themselves for Mul, the transpose for MatMul)."""

    op_name: str

    @staticmethod
    def adjoint(t: "Tensor") -> TensorData:
        return t._tensor

    @classmethod
    def forward(cls, ctx: Context, a: "Tensor", b: "Tensor") -> "Tensor":
        ctx.save_for_backward(a, b)
        return a._new(getattr(a.backend, cls.op_name)(a._tensor, b._tensor))

    @classmethod
    def backward(cls, ctx: Context, grad_output: "Tensor") -> Tuple[Optional["Tensor"], Optional["Tensor"]]:
        a, b = ctx.saved_values
        op = getattr(grad_output.backend, cls.op_name)
        g = grad_output._tensor
        need_a, need_b = ctx.needs_input_grad
        return (
            grad_output._new(op(g, cls.adjoint(b))) if need_a else None,
            grad_output._new(op(cls.adjoint(a), g)) if need_b else None,
        )


class Sum(Function):
    @staticmethod
    def forward(ctx: Context, a: "Tensor", dim: int) -> "Tensor":
        ctx.save_for_backward(a.shape)
        return a._new(a.backend.add_reduce(a._tensor, dim))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (shape,) = ctx.saved_values
        return grad_output.expand(shape)


class Extreme(Function):
    """The max (largest=True) or min over one dim, kept with size 1, NaN when the slice holds one;
    as torch's amax/amin, the gradient is split evenly among the elements equal to the result."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", dim: int, largest: bool) -> "Tensor":
        out = a._new((a.backend.max_reduce if largest else a.backend.min_reduce)(a._tensor, dim))
        ctx.save_for_backward(a, out, dim)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        a, out, dim = ctx.saved_values
        b = grad_output.backend
        nan = b.eq_scalar(b.eq_zip(a._tensor, a._tensor), 0.0)  # only a slice whose result is NaN has one
        hit = b.add_zip(b.eq_zip(a._tensor, out._tensor), nan)
        share = b.div_zip(grad_output._tensor, b.add_reduce(hit, dim))
        return grad_output._new(b.mul_zip(hit, share))


class Permute(Function):
    passes_gradient_on = True

    @staticmethod
    def forward(ctx: Context, a: "Tensor", order: Tuple[int, ...]) -> "Tensor":
        ctx.save_for_backward(order)
        return a._new(a._tensor.permute(*order))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (order,) = ctx.saved_values
        inverse = [0] * len(order)
        for i, o in enumerate(order):
            inverse[o] = i
        return grad_output._new(grad_output._tensor.permute(*inverse))


class View(Function):
    passes_gradient_on = True  # the gradient's view, or a contiguous copy (a new tensor) of it

    @staticmethod
    def forward(ctx: Context, a: "Tensor", shape: Tuple[int, ...]) -> "Tensor":
        ctx.save_for_backward(a.shape)
        return a._view(shape)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (shape,) = ctx.saved_values
        grad = grad_output.contiguous()._view(shape)
        grad.is_unit_seed = grad_output.is_unit_seed  # backward's own 1, reshaped, is still it
        return grad


class Expand(Function):
    """A broadcast view; the chain rule sums the gradient back to the input's shape."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", shape: Tuple[int, ...]) -> "Tensor":
        return a._expand_view(shape)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        return grad_output


class Cast(Function):
    """The values in another dtype (Tensor.to); the gradient is cast back to the input's dtype."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", dtype: DType) -> "Tensor":
        ctx.save_for_backward(a.dtype)
        return a._new(a.backend.cast(a._tensor, dtype))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (dtype,) = ctx.saved_values
        return grad_output._new(grad_output.backend.cast(grad_output._tensor, dtype))


class Copy(Function):
    """A contiguous copy (what `contiguous()` runs when the layout is not already contiguous)."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor") -> "Tensor":
        return a._new(a.backend.id_map(a._tensor))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        return grad_output


def _transpose(t: "Tensor") -> TensorData:
    order = list(range(t.dims))
    order[-2], order[-1] = order[-1], order[-2]
    return t._tensor.permute(*order)


class MatMul(Product):
    op_name = "matrix_multiply"
    adjoint = staticmethod(_transpose)
