"""Fused attention: one autodiff op for softmax(q k^T * scale + mask) v (or its ReLU variant).

On the CUDA backend it runs src/attention_kernel.cu, which never stores the [Tq, Tk] matrix (the
forward keeps the per-row log-sum-exp, the backward recomputes the scores tile by tile); the CPU
backends run the composed reference in TensorOps.
"""

from __future__ import annotations

import math
from typing import Optional

from .tensor import Tensor
from .tensor_data import IndexingError, shape_broadcast
from .tensor_functions import FusedAttention

ACTIVATIONS = ("softmax", "relu")


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor] = None,
    causal: bool = False,
    activation: str = "softmax",
    scale: Optional[float] = None,
) -> Tensor:
    """Attention of queries q [B, H, Tq, D] over keys k and values v [B, H, Tk, D] -> [B, H, Tq, D].

    x = scale * q k^T + mask, scale defaulting to 1 / sqrt(D); mask is additive, [B, Tk] or any shape
    broadcasting to [B, 1, 1, Tk] (0 keeps a key, -inf removes it; finite values are plain additions)
    and takes no gradient. causal=True keeps key j for query i only when j <= i + (Tk - Tq).
    activation "softmax": softmax over the kept keys, then @ v; a query with no key kept gives zeros
    (and zero gradients). "relu": relu(x) over the kept keys @ v, without normalization.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused_attention: activation must be one of {ACTIVATIONS}, got {activation!r}")
    k, v = q._ensure(k), q._ensure(v)
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
    flat_mask = None
    if mask is not None:
        mask = q._ensure(mask)
        if mask.dims > 4:
            raise IndexingError(f"fused_attention mask of shape {mask.shape} has more than 4 dims")
        mask4 = mask.reshape(B, 1, 1, Tk) if mask.shape == (B, Tk) else mask.reshape(*((1,) * (4 - mask.dims) + mask.shape))
        try:
            ok = shape_broadcast(mask4.shape, (B, 1, 1, Tk)) == (B, 1, 1, Tk)
        except IndexingError:
            ok = False
        if not ok:
            raise IndexingError(
                f"fused_attention mask of shape {mask.shape} does not broadcast to [B, 1, 1, Tk] = {(B, 1, 1, Tk)} "
                f"for q {q.shape} and k {k.shape}"
            )
        flat_mask = mask4.detach()._expand_view((B, 1, 1, Tk)).contiguous()._view((B, Tk))
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    return FusedAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), flat_mask, bool(causal), activation, float(scale))
