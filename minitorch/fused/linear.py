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

feed_forward is two Linears with an activation between them as one Function, so that the second
product's input gradient comes out of its kernel already multiplied by the activation's derivative
(the matmul's backward epilogue reads it, kept by the first product's epilogue; bf16 on CUDA keeps the
derivative itself, rounded once, elsewhere the pre-activation): the [rows, middle] gradient of the
activation's output is never written, and no pass of its own turns it into the pre-activation's.

Both take a `residual`, added to the (last) product's output: a transformer's residual stream, x +
proj(h), which on CUDA in bfloat16 the product's epilogue adds as it writes (the sum rounded once),
so the stream costs no pass of its own; its gradient is the output's, handed on as it is.  A residual
of another dtype than the product's is added after it, promoted as `residual + linear(...)` is.
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


def linear(
    x: "Tensor", weight: "Tensor", bias: Optional["Tensor"] = None, activation: Optional[str] = None,
    residual: Optional["Tensor"] = None,
) -> "Tensor":  # fmt: skip
    """act(x @ weight.T + bias) over the last dim of x [..., in] with weight [out, in], bias [out]
    (torch.nn.functional.linear, plus a fused activation None, "gelu" (tanh approximation) or
    "relu"), plus residual [..., out] when given (activation None; see the module notes); in the
    autocast dtype inside minitorch.autocast, otherwise in the inputs' promoted dtype."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {ACTIVATIONS}, got {activation!r}")
    weight, bias = _checked(x, x.shape, weight, bias, "linear", "input", "weight", "bias")
    residual = _checked_residual(x, weight, residual, activation, "linear")
    x, weight, bias = _promoted(x, weight, bias)
    if residual is not None and residual.dtype is not x.dtype:
        return residual + linear(x, weight, bias)  # promoted as the sum would be
    lead = x.shape[:-1]
    rows = x.contiguous().view(-1, weight.shape[1])
    out = Linear.apply(rows, weight, bias, activation, _whole(residual))
    return out.view(*lead, weight.shape[0])


def feed_forward(
    x: "Tensor", weight_in: "Tensor", bias_in: Optional["Tensor"], weight_out: "Tensor",
    bias_out: Optional["Tensor"], activation: str = "gelu", residual: Optional["Tensor"] = None,
) -> "Tensor":  # fmt: skip
    """linear(linear(x, weight_in, bias_in, activation), weight_out, bias_out, residual=residual) as
    one Function (a transformer's feed-forward block): x [..., in], weight_in [middle, in], weight_out
    [out, middle], biases [middle] / [out] or None, activation "gelu" (tanh approximation) or "relu",
    residual [..., out] or None.  Same values as the two linear calls; on CUDA in bfloat16 the
    backward multiplies by the activation's derivative inside the second product's input-gradient
    kernel (see the module notes)."""
    if activation not in ("gelu", "relu"):
        raise ValueError(f"feed_forward: activation must be 'gelu' or 'relu', got {activation!r}")
    weight_in, bias_in = _checked(x, x.shape, weight_in, bias_in, "feed_forward", "input", "weight_in", "bias_in")
    middle = (*x.shape[:-1], weight_in.shape[0])
    weight_out, bias_out = _checked(
        x, middle, weight_out, bias_out, "feed_forward", "weight_in's output", "weight_out", "bias_out"
    )
    residual = _checked_residual(x, weight_out, residual, None, "feed_forward")
    x, weight_in, bias_in, weight_out, bias_out = _promoted(x, weight_in, bias_in, weight_out, bias_out)
    if residual is not None and residual.dtype is not x.dtype:
        return residual + feed_forward(x, weight_in, bias_in, weight_out, bias_out, activation)
    lead = x.shape[:-1]
    rows = x.contiguous().view(-1, weight_in.shape[1])
    out = FeedForward.apply(rows, weight_in, bias_in, weight_out, bias_out, activation, _whole(residual))
    return out.view(*lead, weight_out.shape[0])


def _checked(
    x: "Tensor", shape: Tuple[int, ...], weight: "Tensor", bias: Optional["Tensor"], op: str, input_name: str,
    weight_name: str, bias_name: str,
) -> Tuple["Tensor", Optional["Tensor"]]:  # fmt: skip
    """weight and bias as tensors of x's backend for a product of an input of `shape`, with
    IndexingError for shapes that do not fit."""
    weight = x._ensure(weight)
    if weight.dims != 2 or len(shape) < 1 or shape[-1] != weight.shape[1]:
        raise IndexingError(
            f"{op}: {input_name} {tuple(shape)} and {weight_name} {weight.shape} (expected [..., in] and [out, in])"
        )
    if bias is not None:
        bias = x._ensure(bias)
        if bias.shape != (weight.shape[0],):
            raise IndexingError(f"{op}: {bias_name} of shape {bias.shape} for {weight_name} {weight.shape}")
    return weight, bias


def _checked_residual(
    x: "Tensor", weight: "Tensor", residual: Optional["Tensor"], activation: Optional[str], op: str
) -> Optional["Tensor"]:
    """residual as a tensor of x's backend with the product's output shape [..., out], or None;
    IndexingError for another shape, ValueError beside an activation."""
    if residual is None:
        return None
    if activation is not None:
        raise ValueError(f"{op}: residual is added after the product, so it takes no activation (got {activation!r})")
    residual = x._ensure(residual)
    shape = (*x.shape[:-1], weight.shape[0])
    if residual.shape != shape:
        raise IndexingError(f"{op}: residual of shape {residual.shape} for an output of shape {shape}")
    return residual


def _whole(residual: Optional["Tensor"]) -> Optional["Tensor"]:
    """residual [..., out] as the Function takes it: contiguous (itself where it is), in its own shape,
    not a [rows, out] view. So the Function itself uses the residual stream, as the next block's
    LayerNorm does, and backward reaches it first, by the graph's order: the LayerNorm is then handed
    the residual's gradient to add in its kernel (Context.take_pending)."""
    return None if residual is None else residual.contiguous()


def _rows(residual: Optional["Tensor"]) -> Optional["Tensor"]:
    """A Function's residual [..., out] as [rows, out] (inside forward: no history), or None."""
    return None if residual is None else residual.view(-1, residual.shape[-1])


def _residual_gradient(grad_output: "Tensor", residual_shape: Optional[Tuple[int, ...]]) -> Tuple["Tensor", ...]:
    """The residual's gradient, the output's [rows, out] in the residual's shape; () without one."""
    return () if residual_shape is None else (grad_output.contiguous().view(*residual_shape),)


def _promoted(*tensors: Optional["Tensor"]) -> Tuple[Optional["Tensor"], ...]:
    """tensors under autocast's rule for linear (its dtype inside minitorch.autocast), then all in their
    promoted arithmetic dtype."""
    tensors = autocast_inputs("linear", *tensors)
    dtype = arithmetic(result_type(*(t for t in tensors if t is not None)))
    return tuple(t if t is None or t.dtype is dtype else t.to(dtype) for t in tensors)


def linear_reference(
    x: "Tensor", weight: "Tensor", bias: Optional["Tensor"], activation: Optional[str],
    residual: Optional["Tensor"] = None,
) -> Tuple["Tensor", Optional["Tensor"]]:  # fmt: skip
    """(act(x @ weight.T + bias) (+ residual), x @ weight.T + bias when there is an activation)
    composed from Tensor operations; for 16-bit inputs in float32, each output rounded once (see the
    module notes)."""
    low = x.dtype
    with autocast(enabled=False):
        if low.rounds:
            x, weight, bias, residual = (None if t is None else t.float() for t in (x, weight, bias, residual))
        pre = x @ weight.transpose(0, 1)
        if bias is not None:
            pre = pre + bias
        if activation is None:
            if residual is not None:
                pre = pre + residual
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
    """grad through the activation at pre; activation "derivative": pre holds the derivative itself."""
    if activation is None:
        return grad
    if activation == "derivative":
        return grad * pre
    b = grad.backend
    back = b.gelu_back_zip if activation == "gelu" else b.relu_back_zip
    return grad._new(back(pre._tensor, grad._tensor))


def _forward(
    x: "Tensor", weight: "Tensor", bias: Optional["Tensor"], activation: Optional[str],
    residual: Optional["Tensor"] = None, derivative: bool = False,
) -> Tuple["Tensor", Optional["Tensor"], Optional[str]]:  # fmt: skip
    """(out, kept or None, what backward takes it as) of one Linear: the backend's linear_fw kernel,
    else linear_reference. kept is the pre-activation (taken as `activation`), or with derivative,
    where the kernel can, the activation's derivative there (taken as "derivative")."""
    kernel = hook(x.backend.ops, "linear_fw")
    if kernel is None:
        out, pre = linear_reference(x, weight, bias, activation, residual)
        return out, pre, activation
    bias_td, residual_td = (None if t is None else t._tensor for t in (bias, residual))
    out_td, kept_td, kind = kernel(x._tensor, weight._tensor, bias_td, activation, residual_td, derivative)
    return x._new(out_td), None if kept_td is None else x._new(kept_td), "derivative" if kind == "derivative" else activation


def _backward(
    d: "Tensor", x: "Tensor", weight: "Tensor", has_bias: bool, x_pre: Optional["Tensor"] = None,
    x_activation: Optional[str] = None,
) -> Tuple["Tensor", "Tensor", Optional["Tensor"]]:  # fmt: skip
    """(dx, dweight, dbias or None) of one Linear from its pre-activation gradient d; with x_pre and
    x_activation (x = x_activation(x_pre)), dx is the gradient of x_pre instead.  The backend's
    linear_bw kernel where it has one for these dtypes, else composed."""
    kernel = hook(x.backend.ops, "linear_bw")
    x_pre_td = None if x_pre is None else x_pre._tensor
    tds = None if kernel is None else kernel(d._tensor, x._tensor, weight._tensor, has_bias, x_pre_td, x_activation)
    if tds is None:
        dx, dweight, dbias = linear_backward_reference(d, x, weight, has_bias)
        return (dx if x_pre is None else _activation_backward(dx, x_pre, x_activation)), dweight, dbias
    dx, dweight, dbias = (None if t is None else x._new(t) for t in tds)
    return dx, dweight, dbias


class Linear(Function):
    """Saves x, weight [out, in] and the pre-activation (when there is an activation); a residual's
    gradient is the output's.

    Kernel hooks: linear_fw(x, weight, bias, activation, residual, derivative) -> (out, kept or None,
    kind): as linear_reference, the kept pre-activation kind "pre", or with derivative (where the kernel
    can) the activation's derivative there, kind "derivative";
    linear_bw(d, x, weight, has_bias, x_pre, x_activation) -> (dx, dweight, dbias or None) as
    linear_backward_reference (dx through x_activation's derivative at x_pre when given), or None where
    the backend composes them (e.g. float32 on CUDA)."""

    @staticmethod
    def forward(
        ctx: Context, x: "Tensor", weight: "Tensor", bias: Optional["Tensor"], activation: Optional[str],
        residual: Optional["Tensor"],
    ) -> "Tensor":  # fmt: skip
        out, pre, _ = _forward(x, weight, bias, activation, _rows(residual))
        ctx.save_for_backward(x, weight, pre, activation, bias is not None, None if residual is None else residual.shape)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        x, weight, pre, activation, has_bias, residual_shape = ctx.saved_values
        d = _activation_backward(grad_output.contiguous(), pre, activation)
        dx, dweight, dbias = _backward(d, x, weight, has_bias)
        return (dx, dweight) + ((dbias,) if has_bias else ()) + _residual_gradient(grad_output, residual_shape)


class FeedForward(Function):
    """feed_forward's two products; saves x, both weights, the middle output and what backward needs of
    the activation: its pre-activation, or (bf16 on CUDA) its derivative there, which the first
    product's epilogue computes beside the activation, so that the second product's input-gradient
    epilogue only multiplies by it."""

    @staticmethod
    def forward(
        ctx: Context, x: "Tensor", weight_in: "Tensor", bias_in: Optional["Tensor"], weight_out: "Tensor",
        bias_out: Optional["Tensor"], activation: str, residual: Optional["Tensor"],
    ) -> "Tensor":  # fmt: skip
        middle, kept, kept_as = _forward(x, weight_in, bias_in, activation, derivative=True)
        out, _, _ = _forward(middle, weight_out, bias_out, None, _rows(residual))
        residual_shape = None if residual is None else residual.shape
        ctx.save_for_backward(
            x, weight_in, bias_in is not None, middle, kept, weight_out, bias_out is not None, kept_as, residual_shape
        )  # fmt: skip
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        x, weight_in, has_bias_in, middle, pre, weight_out, has_bias_out, activation, residual_shape = ctx.saved_values
        d_pre, dweight_out, dbias_out = _backward(grad_output.contiguous(), middle, weight_out, has_bias_out, pre, activation)
        dx, dweight_in, dbias_in = _backward(d_pre, x, weight_in, has_bias_in)
        grads = (dx, dweight_in) + ((dbias_in,) if has_bias_in else ())
        return grads + (dweight_out,) + ((dbias_out,) if has_bias_out else ()) + _residual_gradient(grad_output, residual_shape)
