"""Linear layer with a fused epilogue: act(x @ weight.T + bias) for x [rows, in] and weight
[out, in], torch's layout (torch.nn.functional.linear).

On CUDA the bias and the activation (GELU, tanh approximation, or ReLU) run in the matmul's
epilogue, which also keeps x @ weight.T + bias for the backward; elsewhere the composed reference
below.  weight.T is a transposed view, which the matmul kernels read in place at the speed of a
contiguous operand.  The backward turns the incoming gradient into the pre-activation gradient with
the activation's derivative, then dx = d @ weight, dweight = d^T @ x (made in weight's [out, in]
layout), dbias = column sums of d.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

from ..autocast import autocast_inputs
from ..autodiff import Context
from ..tensor_data import IndexingError
from ..tensor_functions import Function
from ..tensor_ops import hook

if TYPE_CHECKING:
    from ..tensor import Tensor

ACTIVATIONS = (None, "gelu", "relu")


def linear(x: "Tensor", weight: "Tensor", bias: Optional["Tensor"] = None, activation: Optional[str] = None) -> "Tensor":
    """act(x @ weight.T + bias) over the last dim of x [..., in] with weight [out, in], bias [out]
    (torch.nn.functional.linear, plus a fused activation None, "gelu" (tanh approximation) or
    "relu"); in the autocast dtype inside minitorch.autocast."""
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
    lead = x.shape[:-1]
    rows = x.contiguous().view(-1, weight.shape[1])
    out = Linear.apply(rows, weight, bias, activation)
    return out.view(*lead, weight.shape[0])


def _activation_backward(grad: "Tensor", pre: "Tensor", activation: Optional[str]) -> "Tensor":
    if activation is None:
        return grad
    b = grad.backend
    back = b.gelu_back_zip if activation == "gelu" else b.relu_back_zip
    return grad._new(back(pre._tensor, grad._tensor))


class Linear(Function):
    """Saves x, weight [out, in] and the pre-activation (when there is an activation)."""

    @staticmethod
    def forward(
        ctx: Context, x: "Tensor", weight: "Tensor", bias: Optional["Tensor"], activation: Optional[str]
    ) -> "Tensor":
        kernel = hook(x.backend.ops, "linear_fw")
        if kernel is None:
            pre = x @ weight.transpose(0, 1)
            if bias is not None:
                pre = pre + bias
            out = pre if activation is None else (pre.gelu() if activation == "gelu" else pre.relu())
        else:
            w_t = weight._tensor.permute(1, 0)  # [in, out], read in place
            out_td, pre_td = kernel(x._tensor, w_t, None if bias is None else bias._tensor, activation)
            out = x._new(out_td)
            pre = None if pre_td is None else x._new(pre_td)
        ctx.save_for_backward(x, weight, pre, activation, bias is not None)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        x, weight, pre, activation, has_bias = ctx.saved_values
        d = _activation_backward(grad_output.contiguous(), pre, activation)
        dx = d @ weight
        dweight = d.transpose(0, 1) @ x
        if not has_bias:
            return dx, dweight
        return dx, dweight, d.sum(0).view(weight.shape[0])
