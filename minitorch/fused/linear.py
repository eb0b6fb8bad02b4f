"""Linear layer with a fused epilogue: act(x @ weight.T + bias) for x [rows, in] and weight
[out, in], torch's layout (torch.nn.functional.linear).

On CUDA the bias and the activation (GELU, tanh approximation, or ReLU) run in the matmul's
epilogue, which also keeps x @ weight.T + bias for the backward; elsewhere the composed reference
below.  weight.T is read in place (the matmul kernels take any strides, at the speed of a
contiguous operand).  The backward turns the incoming gradient into the pre-activation gradient d
with the activation's derivative, then dx = d @ weight, dweight = d^T @ x (made in weight's
[out, in] layout), dbias = column sums of d.

16-bit inputs (bfloat16 under minitorch.autocast) compute as the kernels do: products of the 16-bit
values summed in float32, the bias and the activation in float32, the output and the kept
pre-activation rounded once to the 16-bit dtype; dx is 16-bit, while dweight and dbias are float32
(weight gradients accumulate in float32: a float32 master weight read through its 16-bit copy gets
them as they are).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

from ..autocast import autocast, autocast_inputs
from ..autodiff import Context
from ..dtypes import arithmetic, result_type
from ..tensor_data import IndexingError
from ..tensor_functions import Function
from ..tensor_ops import hook

if TYPE_CHECKING:
    from ..tensor import Tensor

ACTIVATIONS = (None, "gelu", "relu")


def linear(x: "Tensor", weight: "Tensor", bias: Optional["Tensor"] = None, activation: Optional[str] = None) -> "Tensor":
    """act(x @ weight.T + bias) over the last dim of x [..., in] with weight [out, in], bias [out]
    (torch.nn.functional.linear, plus a fused activation None, "gelu" (tanh approximation) or
    "relu"); in the autocast dtype inside minitorch.autocast, otherwise in the inputs' promoted dtype."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {ACTIVATIONS}, got {activation!r}")
    weight = x._ensure(weight)
    if weight.dims != 2 or x.dims < 1 or x.shape[-1] != weight.shape[1]:
        raise IndexingError(f"linear: input {x.shape} and weight {weight.shape} (expected [..., in] and [out, in])")
    if bias is not None:
        bias = x._ensure(bias)
        if bias.shape != (weight.shape[0],):
            raise IndexingError(f"linear: bias of shape {bias.shape} for weight {weight.shape}")
    x, weight, bias = autocast_inputs("linear", x, weight, bias)
    operands = [t for t in (x, weight, bias) if t is not None]
    dtype = arithmetic(result_type(*operands))
    x, weight, bias = (t if t is None or t.dtype is dtype else t.to(dtype) for t in (x, weight, bias))
    lead = x.shape[:-1]
    rows = x.contiguous().view(-1, weight.shape[1])
    out = Linear.apply(rows, weight, bias, activation)
    return out.view(*lead, weight.shape[0])


def linear_reference(
    x: "Tensor", weight: "Tensor", bias: Optional["Tensor"], activation: Optional[str]
) -> Tuple["Tensor", Optional["Tensor"]]:
    """(act(x @ weight.T + bias), x @ weight.T + bias when there is an activation) composed from
    Tensor operations; for 16-bit inputs in float32, each output rounded once (see the module notes)."""
    low = x.dtype
    with autocast(enabled=False):
        if low.rounds:
            x, weight, bias = (None if t is None else t.float() for t in (x, weight, bias))
        pre = x @ weight.transpose(0, 1)
        if bias is not None:
            pre = pre + bias
        if activation is None:
            return (pre.to(low) if low.rounds else pre), None
        out = pre.gelu() if activation == "gelu" else pre.relu()
        return (out.to(low), pre.to(low)) if low.rounds else (out, pre)


def linear_backward_reference(
    d: "Tensor", x: "Tensor", weight: "Tensor", has_bias: bool
) -> Tuple["Tensor", "Tensor", Optional["Tensor"]]:
    """(dx, dweight, dbias or None) from d [rows, out], the pre-activation gradient, composed:
    dx = d @ weight in d's dtype; dweight = d^T @ x [out, in] and dbias = column sums of d in float32."""
    dx = d @ weight
    d32 = d.float()
    dweight = d32.transpose(0, 1) @ x.float()
    return dx, dweight, (d32.sum(0).view(weight.shape[0]) if has_bias else None)


def _activation_backward(grad: "Tensor", pre: "Tensor", activation: Optional[str]) -> "Tensor":
    if activation is None:
        return grad
    b = grad.backend
    back = b.gelu_back_zip if activation == "gelu" else b.relu_back_zip
    return grad._new(back(pre._tensor, grad._tensor))


class Linear(Function):
    """Saves x, weight [out, in] and the pre-activation (when there is an activation).

    Kernel hooks: linear_fw(x, weight, bias, activation) -> (out, pre or None) as linear_reference;
    linear_bw(d, x, weight, has_bias) -> (dx, dweight, dbias or None) as linear_backward_reference,
    or None where the backend composes them (e.g. float32 on CUDA)."""

    @staticmethod
    def forward(
        ctx: Context, x: "Tensor", weight: "Tensor", bias: Optional["Tensor"], activation: Optional[str]
    ) -> "Tensor":
        kernel = hook(x.backend.ops, "linear_fw")
        if kernel is None:
            out, pre = linear_reference(x, weight, bias, activation)
        else:
            out_td, pre_td = kernel(x._tensor, weight._tensor, None if bias is None else bias._tensor, activation)
            out = x._new(out_td)
            pre = None if pre_td is None else x._new(pre_td)
        ctx.save_for_backward(x, weight, pre, activation, bias is not None)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        x, weight, pre, activation, has_bias = ctx.saved_values
        d = _activation_backward(grad_output.contiguous(), pre, activation)
        kernel = hook(x.backend.ops, "linear_bw")
        tds = None if kernel is None else kernel(d._tensor, x._tensor, weight._tensor, has_bias)
        if tds is None:
            dx, dweight, dbias = linear_backward_reference(d, x, weight, has_bias)
        else:
            dx, dweight, dbias = (None if t is None else x._new(t) for t in tds)
        return (dx, dweight, dbias) if has_bias else (dx, dweight)
