"""Functional layer: softmax family, dropout, GELU, one-hot and losses, built from tensor ops."""

from __future__ import annotations

from typing import Optional

from .autocast import autocast_inputs
from .fused.linear_cross_entropy import check_label_smoothing
from .tensor import Tensor
from .tensor_create import rand
from .tensor_data import IndexingError


def max(input: Tensor, dim: int) -> Tensor:
    """Max over dim (kept with size 1); its gradient goes to the max elements."""
    return input.max(dim, keepdim=True)


def argmax(input: Tensor, dim: int) -> Tensor:
    """A 1/0 tensor of input's shape marking the max of each slice along dim."""
    return input == input.max(dim, keepdim=True).detach()


def softmax(input: Tensor, dim: int) -> Tensor:
    """exp(x) / sum(exp(x)) along dim (Tensor.softmax)."""
    return input.softmax(dim)


def logsumexp(input: Tensor, dim: int, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) along dim with the max trick (Tensor.logsumexp); keepdim=True keeps the dim."""
    return input.logsumexp(dim, keepdim)


def logsoftmax(input: Tensor, dim: int) -> Tensor:
    """log(softmax(x)) computed as x - logsumexp(x) (Tensor.log_softmax)."""
    return input.log_softmax(dim)


log_softmax = logsoftmax


def dropout(input: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout: zero each element with probability p and scale the rest by 1 / (1 - p).

    The mask is drawn on the tensor's own device; identity when not training or p == 0; the
    result keeps input's dtype (the mask is bool, the scale a Python number).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input * 0.0
    keep = rand(input.shape, backend=input.backend) < (1.0 - p)
    return (input * keep) * (1.0 / (1.0 - p))


def gelu(input: Tensor) -> Tensor:
    """GELU, tanh approximation."""
    return input.gelu()


def one_hot(ids: Tensor, num_classes: int) -> Tensor:
    """[..., num_classes] rows of 0/1 with a 1 at each integral id."""
    flat = ids.contiguous().view(*ids.shape, 1)
    return flat == ids._arange(num_classes).view(*([1] * ids.dims), num_classes)


def softmax_loss(logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy of each row: logsumexp(logits) - logits[target]; shape target.shape.

    logits [..., V]; target [...] holding integral class ids.  label_smoothing = e trains against
    (1 - e) * onehot(target) + e / V instead of the one-hot (torch's definition):
    logsumexp(logits) - (1 - e) * logits[target] - e * mean(logits).  In float32 inside minitorch.autocast.
    """
    (logits,) = autocast_inputs("cross_entropy", logits)
    if logits.shape[:-1] != target.shape:
        raise IndexingError(f"softmax_loss: logits {logits.shape} need targets of shape {logits.shape[:-1]}, got {target.shape}")
    smoothing = check_label_smoothing("softmax_loss", label_smoothing)
    V = logits.shape[-1]
    picked = (logits * one_hot(target, V)).sum(-1)
    if smoothing:
        picked = picked * (1.0 - smoothing) + logits.mean(-1) * smoothing
    return logits.logsumexp(-1) - picked


def cross_entropy(
    logits: Tensor, target: Tensor, weights: Optional[Tensor] = None, label_smoothing: float = 0.0
) -> Tensor:
    """Mean cross-entropy, or with per-token weights sum(loss * w) / sum(w) (0 dims).

    Weights of 0 leave a token out (padding, source tokens); label_smoothing: see softmax_loss.
    In float32 inside minitorch.autocast.
    """
    (logits,) = autocast_inputs("cross_entropy", logits)
    loss = softmax_loss(logits, target, label_smoothing)
    if weights is None:
        return loss.mean()
    if weights.shape != target.shape:
        raise IndexingError(f"cross_entropy: weights {weights.shape} must match targets {target.shape}")
    return (loss * weights).sum() / weights.sum()
