"""Functions that combine tensors, as in torch: cat, stack, where and matmul."""

from __future__ import annotations

from typing import Sequence, Tuple, Union

from .autodiff import Context
from .dtypes import result_type
from .tensor import Tensor
from .tensor_data import IndexingError
from .tensor_functions import Function
from .tensor_index import ViewPlan


def _part_plans(shapes: Sequence[Tuple[int, ...]], dim: int) -> Tuple[Tuple[int, ...], Tuple[ViewPlan, ...]]:
    """The shape of the concatenation along dim and, per part, the view of it that the part fills."""
    plans, offset = [], 0
    for shape in shapes:
        starts = tuple(offset if d == dim else 0 for d in range(len(shape)))
        plans.append(ViewPlan(shape, starts, tuple((d, 1) for d in range(len(shape)))))
        offset += shape[dim]
    first = shapes[0]
    return first[:dim] + (offset,) + first[dim + 1 :], tuple(plans)


class Cat(Function):
    """Concatenation along a dim: each part copied into its slice; the gradient is the slices again."""

    @staticmethod
    def forward(ctx: Context, dim: int, *parts: Tensor) -> Tensor:
        shape, plans = _part_plans([p.shape for p in parts], dim)
        ctx.save_for_backward(plans)
        out = parts[0]._new_empty(shape, result_type(*parts))
        for part, plan in zip(parts, plans):
            if part.numel():
                out.backend.id_map(part._tensor, out=plan.apply(out._tensor))
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: Tensor) -> Tuple[Tensor, ...]:
        (plans,) = ctx.saved_values
        return tuple(grad_output._new(plan.apply(grad_output._tensor)) for plan in plans)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """The tensors joined along dim; every other size must agree; their dtypes promote (as torch.cat)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat needs at least one tensor")
    first = tensors[0]
    d = first._dim(dim)
    for i, t in enumerate(tensors):
        first._ensure(t)
        if t.dims != first.dims or any(a != b for k, (a, b) in enumerate(zip(t.shape, first.shape)) if k != d):
            raise IndexingError(
                f"cat along dim {dim}: tensor {i} has shape {t.shape}, tensor 0 has {first.shape}; "
                f"all sizes but dim {dim}'s must agree"
            )
    return Cat.apply(d, *tensors)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """The tensors (all of one shape) joined along a new dim (as torch.stack)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack needs at least one tensor")
    shapes = {t.shape for t in tensors}
    if len(shapes) > 1:
        raise IndexingError(f"stack needs tensors of one shape, got {sorted(shapes)}")
    d = dim + tensors[0].dims + 1 if dim < 0 else dim
    return cat([t.unsqueeze(d) for t in tensors], d)


def where(condition: Tensor, x: Union[Tensor, float], y: Union[Tensor, float]) -> Tensor:
    """x where condition is non-zero (true), y elsewhere, broadcast together (as torch.where); a NaN
    or inf in the branch not taken does not leak, and the gradient goes to the branch taken."""
    if not isinstance(x, Tensor):
        x = condition._ensure(float(x))
    return x.where(condition, y)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b, as torch.matmul (1-D operands are vectors; leading dims broadcast)."""
    if not isinstance(a, Tensor):
        raise TypeError(f"matmul expects minitorch tensors, got {type(a).__name__}")
    return a @ b
