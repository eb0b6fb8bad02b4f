"""One AdamW update, in place: the fused kernel where the backend has one (28 bytes per element on
CUDA), else the composed reference from Tensor operations."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..tensor_data import IndexingError
from ..tensor_ops import hook

if TYPE_CHECKING:
    from ..tensor import Tensor


def adamw_step(
    param: "Tensor", grad: "Tensor", exp_avg: "Tensor", exp_avg_sq: "Tensor",
    lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
) -> None:  # fmt: skip
    """One AdamW update as torch.optim.AdamW computes it, written IN PLACE into param, exp_avg and
    exp_avg_sq (their storage is kept; they must be contiguous); step counts updates from 1, this one
    included.  No autodiff: call it on tensors whose history does not matter (parameters' data)."""
    for name, t in (("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if t.shape != param.shape:
            raise IndexingError(f"adamw_step: {name} of shape {t.shape} for a parameter of shape {param.shape}")
        if t.backend.ops is not param.backend.ops:
            raise TypeError(f"adamw_step: {name} is on {t.backend.ops.__name__}, the parameter on {param.backend.ops.__name__}")
    for name, t in (("param", param), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if not t.is_contiguous():
            raise IndexingError(f"adamw_step updates {name} in place and needs it contiguous, got shape {t.shape}")
    if step < 1:
        raise ValueError(f"adamw_step: step counts updates from 1, got {step}")
    kernel = hook(param.backend.ops, "adamw_step")
    if kernel is not None:
        kernel(param._tensor, grad._tensor, exp_avg._tensor, exp_avg_sq._tensor, lr, beta1, beta2, eps, weight_decay, step)
        param._version += 1  # written in place: autocast's cached copies of it are stale
        return
    m = exp_avg * beta1 + grad * (1.0 - beta1)
    v = exp_avg_sq * beta2 + grad * grad * (1.0 - beta2)
    denom = v**0.5 * (1.0 / math.sqrt(1.0 - beta2**step)) + eps
    new = param * (1.0 - lr * weight_decay) - m * (lr / (1.0 - beta1**step)) / denom
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    param.copy_(new)
