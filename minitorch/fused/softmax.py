"""Attention softmax: softmax over the last dim of scores [B, H, Tq, Tk] with a padding mask and an
optional causal mask (LightSeq2's fused kernel on CUDA, `softmax_kernel.cu`).

Dtypes: the probabilities (and the scores' gradient) have the scores' dtype, float32 or bfloat16;
the row max and sum and all the arithmetic are float32, on every backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

from ..autocast import autocast_inputs
from ..autodiff import Context
from ..dtypes import float32
from ..tensor_data import IndexingError
from ..tensor_functions import Function
from ..tensor_ops import hook
from .masks import key_mask, masked_scores

if TYPE_CHECKING:
    from ..tensor import Tensor


def attn_softmax(scores: "Tensor", mask: Optional["Tensor"] = None, causal: bool = False) -> "Tensor":
    """Softmax over the last dim of attention scores [B, H, Tq, Tk] (out of place).

    mask: additive, [B, Tk] or broadcastable to [B, 1, 1, Tk]; -inf removes a key, finite values
    (-1e8) are added as they are; it takes no gradient.  causal: key j of query i is kept only when
    j <= i + (Tk - Tq).  A row with every key removed gives zeros.  Inside minitorch.autocast it
    runs in float32.
    """
    if scores.dims != 4:
        raise IndexingError(f"attn_softmax expects scores [B, H, Tq, Tk], got shape {scores.shape}")
    B, _, _, Tk = scores.shape
    (scores,) = autocast_inputs("attn_softmax", scores)
    return Attn_Softmax.apply(scores.contiguous(), key_mask("attn_softmax", f"scores {scores.shape}", scores, mask, B, Tk), bool(causal))


def softmax_reference(x: "Tensor", mask: Optional["Tensor"], causal: bool) -> "Tensor":
    """The composed softmax in float32, in x's dtype: shifted by the row max; a row without keys
    gives zeros, never NaN."""
    dtype = x.dtype
    x, allowed = masked_scores(x.to(float32), mask, causal)
    m = x.amax(3, keepdim=True)
    m = m.clamp(min=-3.0e38)  # a row of -inf keeps a finite shift, so x - m is never nan
    e = (x - m).exp()
    if allowed is not None:
        e = e * allowed
    s = e.sum(3, keepdim=True)
    # A live row sums to >= 1 (its max contributes exp(0)); a dead row sums to 0 and must give 0.
    s = s.clamp(min=1.0) * (s > 0.0) + (s == 0.0)
    return (e / s).to(dtype).contiguous()


def softmax_backward_reference(grad_out: "Tensor", y: "Tensor") -> "Tensor":
    """y * (g - sum(g * y)) over the last dim, in float32, in y's dtype."""
    g, y32 = grad_out.to(float32), y.to(float32)
    return (y32 * (g - (g * y32).sum(-1, keepdim=True))).to(y.dtype).contiguous()


class Attn_Softmax(Function):
    """Softmax of attention scores; saves only its output."""

    @staticmethod
    def forward(ctx: Context, inp: "Tensor", mask: Optional["Tensor"], causal: bool) -> "Tensor":
        kernel = hook(inp.backend.ops, "attn_softmax_fw")
        if kernel is None:
            out = softmax_reference(inp, mask, causal)
        else:
            out = inp._new(kernel(inp._tensor, None if mask is None else mask._tensor, causal))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        (out,) = ctx.saved_values
        kernel = hook(out.backend.ops, "attn_softmax_bw")
        if kernel is None:
            return (softmax_backward_reference(grad_output, out),)
        return (out._new(kernel(grad_output._tensor, out._tensor)),)
