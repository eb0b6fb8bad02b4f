"""minitorch.nn.functional: the functional ops in one namespace, with torch.nn.functional's names and
signatures: softmax, log_softmax, logsumexp, relu, gelu, dropout, one_hot, linear, embedding,
layer_norm, and the losses cross_entropy and mse_loss (plus softmax_loss, cross_entropy per token).

cross_entropy checks its targets as torch does: each one that counts (not ignore_index, and with a
non-zero weight when per-token weights are given) must be an integer in [0, C).  On the CPU backends
a bad target raises ValueError naming it; on CUDA, where checking would need a device-to-host copy,
it makes the loss NaN (as the fused classifier does), never a finite wrong value.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

from ..autocast import autocast_inputs
from ..fused.embedding import embedding as _embedding
from ..fused.linear import linear
from ..fused.linear_cross_entropy import check_label_smoothing, check_targets, invalid_targets
from ..fused.softmax_loss import softmax_loss_rows
from ..tensor import Tensor
from ..tensor_create import rand
from ..tensor_data import IndexingError
from ..pointwise_functions import GELUErf

GELU_APPROXIMATIONS = ("none", "tanh")
REDUCTIONS = ("mean", "sum", "none")

__all__ = [
    "softmax", "log_softmax", "logsoftmax", "logsumexp", "relu", "gelu", "dropout", "one_hot", "linear", "embedding",
    "layer_norm", "softmax_loss", "cross_entropy", "mse_loss",
]  # fmt: skip


def softmax(input: Tensor, dim: int) -> Tensor:
    """exp(x) / sum(exp(x)) along dim (Tensor.softmax)."""
    return input.softmax(dim)


def log_softmax(input: Tensor, dim: int) -> Tensor:
    """log(softmax(x)) computed as x - logsumexp(x) (Tensor.log_softmax)."""
    return input.log_softmax(dim)


logsoftmax = log_softmax


def logsumexp(input: Tensor, dim: int, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) along dim with the max trick (Tensor.logsumexp); keepdim=True keeps the dim."""
    return input.logsumexp(dim, keepdim)


def relu(input: Tensor) -> Tensor:
    """max(x, 0), elementwise."""
    return input.relu()


def check_gelu_approximation(approximate: str) -> None:
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"gelu approximate must be one of {GELU_APPROXIMATIONS}, got {approximate!r}")


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """GELU: exact, 0.5 x (1 + erf(x / sqrt(2))) (approximate="none", torch's default), or the tanh
    approximation (approximate="tanh", what Tensor.gelu and the fused Linear epilogue compute)."""
    check_gelu_approximation(approximate)
    return input.gelu() if approximate == "tanh" else GELUErf.apply(input)


def dropout(input: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Inverted dropout: zero each element with probability p and scale the rest by 1 / (1 - p).

    The mask is drawn on the tensor's own device; identity when not training or p == 0; the
    result keeps input's dtype (the mask is bool, the scale a Python number).
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p!r}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input * 0.0
    keep = rand(input.shape, backend=input.backend) < (1.0 - p)
    return (input * keep) * (1.0 / (1.0 - p))


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """[..., num_classes] int64 rows of 0/1 with a 1 at each id (num_classes -1: the largest id + 1,
    read back to the host), as torch's one_hot."""
    if num_classes < 0:
        num_classes = int(tensor.amax().item()) + 1 if tensor.numel() else 0
    return _hot(tensor, num_classes).long()


def _hot(ids: Tensor, num_classes: int) -> Tensor:
    """The bool [..., num_classes] rows that one_hot gives as int64."""
    return ids.contiguous().view(*ids.shape, 1) == ids._arange(num_classes).view(*([1] * ids.dims), num_classes)


def embedding(input: Tensor, weight: Tensor) -> Tensor:
    """weight[input]: the rows of weight [num, dim] at the integer ids of input (torch's argument order)."""
    return _embedding(weight, input)


def layer_norm(
    input: Tensor, normalized_shape: Union[int, Sequence[int]], weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None, eps: float = 1e-5,
) -> Tensor:  # fmt: skip
    """LayerNorm over the trailing dims normalized_shape, then * weight + bias when given."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(shape)
    if input.shape[input.dims - k :] != shape:
        raise IndexingError(f"layer_norm: normalized_shape {shape} does not end input's shape {input.shape}")
    dims = tuple(range(input.dims - k, input.dims))
    centered = input - input.mean(dims, keepdim=True)
    out = centered * ((centered * centered).mean(dims, keepdim=True) + eps) ** -0.5
    out = out if weight is None else out * weight
    return out if bias is None else out + bias


def softmax_loss(logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy of each row: logsumexp(logits) - logits[target]; shape target.shape.

    logits [..., V]; target [...] of class ids (int64, or floats holding integers) in [0, V), checked
    as cross_entropy's.  label_smoothing = e trains against (1 - e) * onehot(target) + e / V instead of
    the one-hot (torch's definition): logsumexp(logits) - (1 - e) * logits[target] - e * mean(logits).
    In float32 inside minitorch.autocast.
    """
    return _per_token(logits, target, label_smoothing, None, "softmax_loss")


def _per_token(logits: Tensor, target: Tensor, label_smoothing: float, counted: Optional[Tensor], name: str) -> Tensor:
    """softmax_loss's rows, with the targets checked where counted (everywhere for None): an error
    on the CPU backends, NaN rows on CUDA (there from one kernel, fused.softmax_loss, for float32
    logits and bfloat16 ones under autocast)."""
    target = logits._ensure(target)
    if logits.shape[:-1] != target.shape:
        raise IndexingError(f"{name}: logits {logits.shape} need targets of shape {logits.shape[:-1]}, got {target.shape}")
    smoothing = check_label_smoothing(name, label_smoothing)
    fused = softmax_loss_rows(logits, target, smoothing)
    if fused is not None:
        return fused
    (logits,) = autocast_inputs("cross_entropy", logits)
    V = logits.shape[-1]
    bad = invalid_targets(target, V, counted)
    if not logits.backend.cuda:
        check_targets(name, target, bad, V)
    picked = (logits * _hot(target, V)).sum(-1)
    if smoothing:
        picked = picked * (1.0 - smoothing) + logits.mean(-1) * smoothing
    loss = logits.logsumexp(-1) - picked
    return loss.masked_fill(bad, float("nan")) if logits.backend.cuda else loss


def cross_entropy(
    logits: Tensor, target: Tensor, weights: Optional[Tensor] = None, label_smoothing: float = 0.0, *,
    ignore_index: int = -100, reduction: str = "mean",
) -> Tensor:  # fmt: skip
    """Cross-entropy of logits [..., C] against class ids target [...] (torch's
    cross_entropy(input, target, ignore_index=, reduction=, label_smoothing=) for logits with the
    classes last), with minitorch's per-token weights: reduction "mean" gives
    sum(loss * w) / sum(w) over the counted tokens (w = 1 without weights; 0 dims), "sum" the
    weighted sum, "none" the weighted loss of each token (0 where ignored).

    Tokens whose target is ignore_index, or whose weight is 0, count for nothing (padding, source
    tokens); every other target must be an integer in [0, C) (see the module notes).  label_smoothing:
    see softmax_loss.  In float32 inside minitorch.autocast.  (torch's third argument is a per-class
    weight; here it is per token: a shape that is not target's raises.)
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"cross_entropy reduction must be one of {REDUCTIONS}, got {reduction!r}")
    target = logits._ensure(target)
    counted = target != ignore_index
    if weights is not None:
        weights = logits._ensure(weights)
        if weights.shape != target.shape:
            raise IndexingError(f"cross_entropy: weights {weights.shape} must match targets {target.shape}")
        counted = counted & (weights != 0)
    loss = _per_token(logits, target, label_smoothing, counted, "cross_entropy")
    w = counted.float() if weights is None else weights * counted
    loss = (loss * w).masked_fill(~counted, 0.0)
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / w.sum()


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """(input - target) ** 2, averaged ("mean"), summed ("sum") or per element ("none"), as torch's;
    the shapes must be equal (torch would broadcast them with a warning)."""
    target = input._ensure(target)
    if input.shape != target.shape:
        raise IndexingError(f"mse_loss: input {input.shape} and target {target.shape} must have the same shape")
    if reduction not in REDUCTIONS:
        raise ValueError(f"mse_loss reduction must be one of {REDUCTIONS}, got {reduction!r}")
    diff = input - target
    squared = diff * diff
    return squared if reduction == "none" else squared.sum() if reduction == "sum" else squared.mean()
