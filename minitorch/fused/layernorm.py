"""LayerNorm over the last dim with learned gamma and beta (LightSeq2's fused kernels on CUDA,
`layernorm_kernel.cu`; the composed reference elsewhere).

Dtypes: the output (and the input's gradient) has the input's dtype, float32 or bfloat16; gamma and
beta are read as float32 (a 16-bit one is cast up), the saved mean and rstd, gamma's and beta's
gradients and all the arithmetic are float32, on every backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

from ..autocast import autocast_inputs
from ..autodiff import Context
from ..dtypes import float32
from ..tensor_data import IndexingError
from ..tensor_functions import Function
from ..tensor_ops import hook

if TYPE_CHECKING:
    from ..tensor import Tensor


def layernorm(x: "Tensor", gamma: "Tensor", beta: "Tensor", eps: float = 1e-5) -> "Tensor":
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last dim (population variance); in float32
    inside minitorch.autocast.  The result has x's dtype; statistics and math are float32."""
    x, gamma, beta = autocast_inputs("layernorm", x, x._ensure(gamma), x._ensure(beta))
    gamma, beta = (p if p.dtype is float32 else p.to(float32) for p in (gamma, beta))
    C = x.shape[-1] if x.dims else 0
    if C == 0:
        raise IndexingError(f"layernorm of input {x.shape} needs a non-empty last dim")
    if gamma.shape != (C,) or beta.shape != (C,):
        raise IndexingError(
            f"layernorm of input {x.shape} needs gamma and beta of shape ({C},), got {gamma.shape} and {beta.shape}"
        )
    if not eps > 0.0:
        raise ValueError(f"layernorm eps must be positive, got {eps}")
    return LayerNorm.apply(x.contiguous(), gamma.contiguous(), beta.contiguous(), float(eps))


def layernorm_reference(inp: "Tensor", gamma: "Tensor", beta: "Tensor", eps: float) -> Tuple["Tensor", "Tensor", "Tensor"]:
    """(out [inp's dtype], mean [rows], rstd [rows]) composed from Tensor operations in float32."""
    C = inp.shape[-1]
    rows = inp.numel() // C
    x = inp.contiguous().view(rows, C).to(float32)
    mean = x.mean(1, keepdim=True)
    xc = x - mean
    rstd = ((xc * xc).mean(1, keepdim=True) + eps) ** -0.5
    out = xc * rstd * gamma.view(1, C) + beta.view(1, C)
    return out.view(*inp.shape).to(inp.dtype), mean.view(rows), rstd.view(rows)


def layernorm_backward_reference(
    grad_out: "Tensor", inp: "Tensor", gamma: "Tensor", mean: "Tensor", rstd: "Tensor"
) -> Tuple["Tensor", "Tensor", "Tensor"]:
    """(dinp [inp's dtype], dgamma, dbeta [float32]) composed from Tensor operations in float32."""
    C = inp.shape[-1]
    rows = inp.numel() // C
    x = inp.contiguous().view(rows, C).to(float32)
    dy = grad_out.contiguous().view(rows, C).to(float32)
    r = rstd.view(rows, 1)
    xhat = (x - mean.view(rows, 1)) * r
    dbeta = dy.sum(0).view(C)
    dgamma = (dy * xhat).sum(0).view(C)
    g = dy * gamma.view(1, C)
    dx = (g - g.mean(1, keepdim=True) - xhat * (g * xhat).mean(1, keepdim=True)) * r
    return dx.view(*inp.shape).to(inp.dtype), dgamma, dbeta


class LayerNorm(Function):
    """LayerNorm; saves the input, gamma and the per-row mean and rstd. Folds the input's gathered
    gradient into dinp."""

    folds_pending = True

    @staticmethod
    def forward(ctx: Context, inp: "Tensor", gamma: "Tensor", beta: "Tensor", eps: float) -> "Tensor":
        kernel = hook(inp.backend.ops, "layernorm_fw")
        if kernel is None:
            out, mean, rstd = layernorm_reference(inp, gamma, beta, eps)
        else:
            out, mean, rstd = (inp._new(t) for t in kernel(inp._tensor, gamma._tensor, beta._tensor, eps))
        ctx.save_for_backward(inp, gamma, mean, rstd)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", "Tensor", "Tensor"]:
        inp, gamma, mean, rstd = ctx.saved_values
        kernel = hook(inp.backend.ops, "layernorm_bw")
        # the input's gradient from its other uses (a pre-LN block's residual stream) joins dinp: in
        # the kernel, or by one sum (the engine's) in the composed reference
        pending = ctx.take_pending(0, inp.dtype)
        if kernel is None:
            dinp, dgamma, dbeta = layernorm_backward_reference(grad_output, inp, gamma, mean, rstd)
            return (dinp if pending is None else pending + dinp), dgamma, dbeta
        addend = {} if pending is None else {"addend": pending._tensor}
        tds = kernel(grad_output._tensor, inp._tensor, gamma._tensor, mean._tensor, rstd._tensor, **addend)
        return tuple(inp._new(t) for t in tds)  # type: ignore[return-value]
