"""The cross-entropy rows of nn.cross_entropy and nn.softmax_loss in one kernel, where the backend
has one (CUDA: the fused classifier of `classifier_kernel.cu`, the same kernel as the fused linear
cross-entropy's).

Composed from tensor ops, each row's loss logsumexp(x) - x[target] (smoothed: see nn.softmax_loss)
takes a one-hot [N, V] tensor, a product and sum with it, a max, a shift, an exponential, a sum and
a log, and the backward as many passes again, each over all N x V logits in float32.  The kernel reads
the logits once for the losses; the backward reads them once more (a row from L2 for its second
pass) and writes (softmax - q) * grad, in the logits' dtype.  bfloat16 logits under
minitorch.autocast, whose rule for the losses is float32, are read as they are: converting a bf16
value to float32 is exact, so this is the float32 loss of the cast logits without the cast's pass
(and the gradient is rounded to bf16 once, as the cast's backward would).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

from ..autocast import raised_to_float32
from ..autodiff import Context
from ..dtypes import FLOAT32_EXACT_INTEGERS, bfloat16, float32
from ..tensor_functions import Function
from ..tensor_ops import hook

if TYPE_CHECKING:
    from ..tensor import Tensor


def softmax_loss_rows(logits: "Tensor", target: "Tensor", label_smoothing: float) -> Optional["Tensor"]:
    """The float32 cross-entropy of each row of logits [..., V] against target [...] (checked by the
    caller) from the backend's kernel, shaped as target; None where the backend has no kernel, the
    logits' dtype is not one the loss runs in there (float32, or bfloat16 raised by autocast), or V
    is beyond the ids a float32 holds exactly (the kernel reads them as float32)."""
    V = logits.shape[-1]
    if hook(logits.backend.ops, "softmax_loss_fw") is None or not 0 < V <= FLOAT32_EXACT_INTEGERS:
        return None
    if not (logits.dtype is float32 or (logits.dtype is bfloat16 and raised_to_float32("cross_entropy"))):
        return None
    ids = target.contiguous().view(-1)
    if not ids.dtype.is_floating:  # the kernel reads float32 ids: converted once for both passes (exact up to V)
        ids = ids.float()
    rows = SoftmaxLoss.apply(logits.contiguous().view(-1, V), ids, float(label_smoothing))
    return rows.view(*target.shape)


class SoftmaxLoss(Function):
    """Cross-entropy rows of logits [N, V] against float32 ids target [N] (no gradient); saves the logits."""

    @staticmethod
    def forward(ctx: Context, logits: "Tensor", target: "Tensor", label_smoothing: float) -> "Tensor":
        ctx.save_for_backward(logits, target, label_smoothing)
        kernel = hook(logits.backend.ops, "softmax_loss_fw")
        return logits._new(kernel(logits._tensor, target._tensor, label_smoothing))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        logits, target, label_smoothing = ctx.saved_values
        kernel = hook(logits.backend.ops, "softmax_loss_bw")
        grad = grad_output.to(float32).contiguous()
        return (logits._new(kernel(logits._tensor, target._tensor, grad._tensor, label_smoothing)),)
