"""Fused attention: one autodiff op for softmax(q k^T * scale + mask) v (or its ReLU variant).

On the CUDA backend it runs src/attention_kernel.cu (float32) or src/attention_bf16_kernel.cu
(bfloat16), which never store the [Tq, Tk] matrix (the forward keeps the per-row log-sum-exp, the
backward recomputes the scores tile by tile); in bfloat16 fused_attention_qkv reads and writes the
packed [B, T, 3C] layout in place (PackedAttention). The other backends run the composed reference
below, which materializes the weights.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional, Tuple

from ..autocast import autocast_inputs
from ..autodiff import Context
from ..tensor_data import IndexingError
from ..tensor_functions import Function
from ..tensor_ops import ATTENTION_ACTIVATIONS, hook
from .masks import key_mask, masked_scores
from .softmax import softmax_backward_reference

if TYPE_CHECKING:
    from ..tensor import Tensor


def check_activation(op: str, activation: str) -> str:
    """activation itself when it is one of ATTENTION_ACTIVATIONS; ValueError naming them otherwise."""
    if activation not in ATTENTION_ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {ATTENTION_ACTIVATIONS}, got {activation!r}")
    return activation


def fused_attention(
    q: "Tensor",
    k: "Tensor",
    v: "Tensor",
    mask: Optional["Tensor"] = None,
    causal: bool = False,
    activation: str = "softmax",
    scale: Optional[float] = None,
) -> "Tensor":
    """Attention of queries q [B, H, Tq, D] over keys k and values v [B, H, Tk, D] -> [B, H, Tq, D].

    x = scale * q k^T + mask, scale defaulting to 1 / sqrt(D); mask is additive, [B, Tk] or any shape
    broadcasting to [B, 1, 1, Tk] (0 keeps a key, -inf removes it; finite values are plain additions)
    and takes no gradient. causal=True keeps key j for query i only when j <= i + (Tk - Tq).
    activation "softmax": softmax over the kept keys, then @ v; a query with no key kept gives zeros
    (and zero gradients). "relu": relu(x) over the kept keys @ v, without normalization.
    Inside minitorch.autocast q, k and v are taken in the autocast dtype (the mask as it is).
    """
    check_activation("fused_attention", activation)
    q, k, v = autocast_inputs("attention", q, q._ensure(k), q._ensure(v))
    if q.dims != 4 or k.dims != 4 or v.dims != 4:
        raise IndexingError(
            f"fused_attention expects q [B, H, Tq, D] and k, v [B, H, Tk, D], got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if k.shape != v.shape or k.shape[:2] != (B, H) or k.shape[3] != D:
        raise IndexingError(
            f"fused_attention: k and v must both be [B, H, Tk, D] = [{B}, {H}, Tk, {D}] for q {q.shape}, "
            f"got k {k.shape} and v {v.shape}"
        )
    if Tk == 0 or D == 0:
        raise IndexingError(f"fused_attention needs at least one key and D >= 1, got q {q.shape} and k {k.shape}")
    flat_mask = key_mask("fused_attention", f"q {q.shape} and k {k.shape}", q, mask, B, Tk)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    return FusedAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), flat_mask, bool(causal), activation, float(scale))


def fused_attention_qkv(
    qkv: "Tensor",
    n_head: int,
    mask: Optional["Tensor"] = None,
    causal: bool = False,
    activation: str = "softmax",
    scale: Optional[float] = None,
) -> "Tensor":
    """fused_attention of the packed projections qkv [B, T, 3C] (q, then k, then v, each of n_head
    heads of D = C / n_head channels) -> [B, n_head, T, D]; mask, causal, activation and scale as
    fused_attention. Its gradient is one [B, T, 3C] tensor, so a packed q/k/v projection gets it
    without the three slices' gradients being padded to [B, T, 3C] and summed. In bfloat16 on CUDA
    the result is a view of a [B, T, n_head, D] tensor: out.permute(0, 2, 1, 3) is contiguous."""
    check_activation("fused_attention_qkv", activation)
    if qkv.dims != 3 or n_head < 1 or qkv.shape[2] % (3 * n_head):
        raise IndexingError(f"fused_attention_qkv expects qkv [B, T, 3C] with C a multiple of n_head {n_head}, got {qkv.shape}")
    B, T, C3 = qkv.shape
    D = C3 // (3 * n_head)
    if T == 0 or D == 0:
        raise IndexingError(f"fused_attention_qkv needs at least one position and D >= 1, got qkv {qkv.shape}")
    flat_mask = key_mask("fused_attention_qkv", f"qkv {qkv.shape}", qkv, mask, B, T)
    (qkv,) = autocast_inputs("attention", qkv)
    return PackedAttention.apply(qkv, n_head, flat_mask, bool(causal), activation, 1.0 / math.sqrt(D) if scale is None else float(scale))


def attention_weights(
    q: "Tensor", k: "Tensor", mask: Optional["Tensor"], causal: bool, activation: str, scale: float
) -> Tuple["Tensor", "Tensor"]:
    """(weights [B, H, Tq, Tk], lse [B, H, Tq]) composed, with x = scale * q k^T + mask: softmax over
    the kept keys (lse its log-sum-exp, -inf for a row without keys) or relu(x) (lse 0); causally
    removed keys get weight 0."""
    B, H, Tq, _ = q.shape
    x, allowed = masked_scores((q @ k.transpose(2, 3)) * scale, mask, causal)
    if activation == "relu":
        weights = x.relu() if allowed is None else x.relu() * allowed
        return weights, q.zeros((B, H, Tq))
    m = x.amax(3, keepdim=True).clamp(min=-3.0e38)  # a row of -inf keeps a finite shift, so x - m is never nan
    e = (x - m).exp()
    if allowed is not None:
        e = e * allowed
    s = e.sum(3, keepdim=True)
    # A row without keys has e = 0 and s = 0: weights 0, and log(0) = -inf makes its lse -inf.
    return e / (s + (s == 0.0)), (m + s.log()).view(B, H, Tq)


class FusedAttention(Function):
    """Saves q, k, v, the output and the per-row log-sum-exp, never the [Tq, Tk] weights."""

    @staticmethod
    def forward(
        ctx: Context, q: "Tensor", k: "Tensor", v: "Tensor", mask: Optional["Tensor"], causal: bool,
        activation: str, scale: float,
    ) -> "Tensor":  # fmt: skip
        kernel = hook(q.backend.ops, "attention_fw")
        if kernel is None:
            weights, lse = attention_weights(q, k, mask, causal, activation, scale)
            out = (weights @ v).contiguous()
        else:
            m = None if mask is None else mask._tensor
            out, lse = (q._new(t) for t in kernel(q._tensor, k._tensor, v._tensor, m, causal, activation, scale))
        ctx.save_for_backward(q, k, v, out, lse, mask, causal, activation, scale)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", "Tensor", "Tensor"]:
        q, k, v, out, lse, mask, causal, activation, scale = ctx.saved_values
        kernel = hook(q.backend.ops, "attention_bw")
        if kernel is not None:
            m = None if mask is None else mask._tensor
            tds = kernel(grad_output._tensor, q._tensor, k._tensor, v._tensor, out._tensor, lse._tensor, m, causal, activation, scale)
            return tuple(q._new(t) for t in tds)  # type: ignore[return-value]
        weights, _ = attention_weights(q, k, mask, causal, activation, scale)
        dweights = grad_output @ v.transpose(2, 3)
        if activation == "relu":
            dscores = dweights * (weights > 0.0)
        else:
            dscores = softmax_backward_reference(dweights, weights)
        dscores = dscores * scale
        return (dscores @ k).contiguous(), (dscores.transpose(2, 3) @ q).contiguous(), (weights.transpose(2, 3) @ grad_output).contiguous()


class PackedAttention(Function):
    """FusedAttention of q, k, v cut from a packed [B, T, 3C] tensor.

    Kernel hooks: attention_qkv_fw(qkv, heads, mask, causal, activation, scale) -> (out [B, H, T, D],
    lse) reading qkv in place, out a view of a [B, T, H, D] tensor (so that the module's permute back
    to [B, T, H, D] is contiguous, no copy); attention_qkv_bw(grad_output, qkv, out, lse, heads, mask,
    causal, activation, scale) -> the [B, T, 3C] gradient, dq, dk, dv written into its thirds.  Where a
    backend has no such hook or it returns None (e.g. float32 on CUDA), one copy makes q, k, v
    contiguous [B, H, T, D] heads for FusedAttention, and backward copies dq, dk, dv into the thirds
    of one gradient."""

    @staticmethod
    def forward(
        ctx: Context, qkv: "Tensor", heads: int, mask: Optional["Tensor"], causal: bool, activation: str, scale: float
    ) -> "Tensor":  # fmt: skip
        kernel = hook(qkv.backend.ops, "attention_qkv_fw")
        m = None if mask is None else mask._tensor
        tds = None if kernel is None else kernel(qkv._tensor, heads, m, causal, activation, scale)
        if tds is not None:
            out, lse = (qkv._new(t) for t in tds)
            ctx.save_for_backward(None, (qkv, out, lse, heads, mask, causal, activation, scale))
            return out
        B, T, C3 = qkv.shape
        split = qkv.view(B, T, 3, heads, C3 // (3 * heads)).permute(2, 0, 3, 1, 4).contiguous()
        inner = Context(ctx.no_grad)
        out = FusedAttention.forward(inner, split[0], split[1], split[2], mask, causal, activation, scale)
        ctx.save_for_backward(inner, qkv.shape)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        inner, saved = ctx.saved_values
        if inner is None:  # the packed kernels ran forward
            qkv, out, lse, heads, mask, causal, activation, scale = saved
            kernel = hook(qkv.backend.ops, "attention_qkv_bw")
            m = None if mask is None else mask._tensor
            tds = (grad_output._tensor, qkv._tensor, out._tensor, lse._tensor)
            return qkv._new(kernel(*tds, heads, m, causal, activation, scale))
        B, T, C3 = saved
        grads = FusedAttention.backward(inner, grad_output)
        dqkv = grad_output._new_empty((B, T, 3, grads[0].shape[1], grads[0].shape[3]), grad_output.dtype)
        for i, g in enumerate(grads):
            dqkv[:, :, i].copy_(g.permute(0, 2, 1, 3))
        return dqkv.view(B, T, C3)
