"""fused_linear_cross_entropy: an LM head and its cross-entropy without the [tokens, vocab] logits.

The loss of a language model is usually `cross_entropy(hidden @ W + b, targets)`, whose logits (and
the softmax and gradient tensors of the same size) dominate training memory: 16384 tokens of a
50257-word vocabulary take 3.3 GB per copy in float32.  Here the logits are made `chunk_size` rows
at a time and the gradients of hidden, W (and b) are computed right away in the forward pass (on
CUDA the softmax, the loss and the gradient of each row of logits come from one fused kernel that
writes the gradient over the logits), so only one chunk of logits exists at any moment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

import numpy as np

from ..autocast import autocast_inputs
from ..autodiff import Context
from ..tensor_combine import cat
from ..tensor_data import IndexingError
from ..tensor_functions import Function
from ..tensor_ops import hook

if TYPE_CHECKING:
    from ..tensor import Tensor

# Bytes of logits per chunk when chunk_size is not given (512 MiB: 2^27 float32 or 2^28 bfloat16 logits;
# GPT-2 at 4 x 1024 bf16 tokens then takes one chunk, whose head products run as whole products: 10.6 ->
# 10.5 ms a step on an H100 against two chunks of 2,048 rows, 37.7 -> 37.3 ms at 16 x 1024 tokens).
DEFAULT_CHUNK_BYTES = 1 << 29
# Default chunks are a multiple of this many rows (the tile height of the CUDA matmul).
CHUNK_ROW_MULTIPLE = 128


def default_chunk_size(n_tokens: int, vocab: int, itemsize: int = 4) -> int:
    """Rows per chunk when none is given, for logits of `itemsize` bytes: the fewest chunks whose
    logits stay within DEFAULT_CHUNK_BYTES each, made as even as multiples of CHUNK_ROW_MULTIPLE
    allow (8,192 rows of 50,304 float32 logits: four chunks of 2,048, not three of 2,560 and a
    512-row tail), at most n_tokens."""
    rows = max(1, DEFAULT_CHUNK_BYTES // max(vocab * itemsize, 1))
    if rows <= CHUNK_ROW_MULTIPLE:
        return max(1, min(rows, n_tokens))
    rows -= rows % CHUNK_ROW_MULTIPLE
    chunks = -(-n_tokens // rows)
    even = -(-n_tokens // chunks)
    return min(-(-even // CHUNK_ROW_MULTIPLE) * CHUNK_ROW_MULTIPLE, n_tokens)


def check_label_smoothing(op: str, label_smoothing: float) -> float:
    """label_smoothing as a float in [0, 1]; ValueError naming op otherwise."""
    value = float(label_smoothing)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    return value


def fused_linear_cross_entropy(
    hidden: "Tensor",
    weight: "Tensor",
    targets: "Tensor",
    token_weights: "Tensor",
    chunk_size: Optional[int] = None,
    bias: Optional["Tensor"] = None,
    label_smoothing: float = 0.0,
    classes: Optional[int] = None,
) -> "Tensor":
    """sum(loss * w) / sum(w), a 0-dim tensor (as nn.cross_entropy's), where loss[r] is the cross-entropy of the logits
    hidden[r] @ weight (+ bias) against targets[r], and w = token_weights.

    hidden [N, C]; weight [C, V] (Linear(C, V).weight.T, a transposed view read in place); targets [N]
    of class ids (int64, or floats holding integers); token_weights [N] (0 leaves a token out: its target may then be any
    value, e.g. padding); bias [V] or None; chunk_size: rows of logits made at a time (any positive
    int, need not divide N; default: default_chunk_size(N, V, itemsize of the logits)); label_smoothing = e in [0, 1] trains
    against (1 - e) * onehot(target) + e / V (torch's definition).  It equals
    nn.cross_entropy(hidden @ weight + bias, targets, token_weights, label_smoothing) up to float rounding.
    classes: only the first `classes` columns of weight (and bias) are classes (default all V); the
    others are padding, as in llm.c's padded vocabulary (GPT-2's 50257 words in a 50304-row table):
    their logits are left out of the softmax, and their weight columns get a zero gradient.  The
    whole padded weight is then the operand (a tied head needs no narrowed view, whose gradient would
    be a zero-filled table plus a copy).

    Gradients flow to hidden, weight and bias; they are computed during this call (when any of them
    requires grad), so backward is a cheap scaling; a backward that starts at this loss takes them
    over as they are, so a second backward through the same loss raises RuntimeError (compute the
    loss again).  All-zero weights (sum(w) == 0) give a loss of 0
    and zero gradients, rather than 0/0.  A target outside [0, V) (or not an integer) on a token with
    a non-zero weight raises ValueError on the CPU backends; on CUDA, where checking would need a
    device-to-host copy, it makes the loss NaN.  Inside minitorch.autocast hidden, weight and bias
    are taken in the autocast dtype (the logits are of that dtype; the loss is float32).
    """
    for name, t in (("weight", weight), ("targets", targets), ("token_weights", token_weights)) + (
        (("bias", bias),) if bias is not None else ()
    ):
        if not hasattr(t, "backend") or t.backend.ops is not hidden.backend.ops:
            raise TypeError(
                f"fused_linear_cross_entropy: {name} must be a tensor on {hidden.backend.ops.__name__} like hidden"
            )
    if hidden.dims != 2 or weight.dims != 2 or hidden.shape[1] != weight.shape[0] or hidden.numel() == 0:
        raise IndexingError(
            f"fused_linear_cross_entropy: hidden [N, C] and weight [C, V] with N, C >= 1, got {hidden.shape} "
            f"and {weight.shape}"
        )
    N, C = hidden.shape
    V = weight.shape[1]
    if V < 1:
        raise IndexingError(f"fused_linear_cross_entropy: weight {weight.shape} has no classes")
    if targets.shape != (N,) or token_weights.shape != (N,):
        raise IndexingError(
            f"fused_linear_cross_entropy: hidden {hidden.shape} needs targets and token_weights of shape ({N},), "
            f"got {targets.shape} and {token_weights.shape}"
        )
    if bias is not None and bias.shape != (V,):
        raise IndexingError(f"fused_linear_cross_entropy: bias must have shape ({V},), got {bias.shape}")
    if classes is None:
        classes = V
    elif isinstance(classes, bool) or not isinstance(classes, (int, np.integer)) or not 1 <= classes <= V:
        raise ValueError(f"fused_linear_cross_entropy: classes must be an int in [1, {V}] (weight {weight.shape}), "
                         f"got {classes!r}")  # fmt: skip
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1
    ):
        raise ValueError(f"fused_linear_cross_entropy: chunk_size must be a positive int, got {chunk_size!r}")
    smoothing = check_label_smoothing("fused_linear_cross_entropy", label_smoothing)
    hidden, weight, bias = autocast_inputs("linear_cross_entropy", hidden, weight, bias)
    if chunk_size is None:
        chunk_size = default_chunk_size(N, V, hidden.dtype.itemsize)
    if not hidden.backend.cuda:
        check_targets(
            "fused_linear_cross_entropy", targets, invalid_targets(targets, classes, token_weights != 0), classes
        )
    return FusedLinearCrossEntropy.apply(
        hidden.contiguous(), _dense(weight), None if bias is None else bias.contiguous(),
        targets, token_weights, int(chunk_size), smoothing, int(classes),
    ).view(())  # fmt: skip


def _dense(weight: "Tensor") -> "Tensor":
    """weight itself when contiguous or transposed (a tied head, read in place), else a contiguous copy."""
    return weight if weight.is_contiguous() or weight._tensor.is_transposed() else weight.contiguous()


def _scaled(grad: "Tensor", by: "Tensor") -> "Tensor":
    """grad * by, kept in grad's layout when transposed (a tied head's gradient), so that the scaling
    is a contiguous pass, not a transposing one."""
    return (grad.permute(1, 0) * by).permute(1, 0) if grad._tensor.is_transposed() else grad * by


def invalid_targets(targets: "Tensor", vocab: int, counted: Optional["Tensor"] = None) -> "Tensor":
    """The bool mask of targets that count (where counted is true; everywhere for None) and are not
    integers in [0, vocab): int64 ids, or floats holding integers."""
    valid = (targets >= 0) & (targets < vocab)
    if targets.dtype.is_floating:
        valid = valid & (targets == targets.floor())
    return ~valid if counted is None else counted & ~valid


def check_targets(name: str, targets: "Tensor", bad: "Tensor", vocab: int) -> None:
    """ValueError naming the first target that the mask bad marks (a host check, for the CPU backends)."""
    if not bool(bad.any()):
        return
    i = int(np.flatnonzero(bad.numpy().reshape(-1))[0])
    where = np.unravel_index(i, targets.shape) if targets.dims > 1 else (i,)
    token = where[0] if len(where) == 1 else tuple(int(w) for w in where)
    raise ValueError(
        f"{name}: targets must be integers in [0, {vocab}) where they count; token {token} has target "
        f"{targets.numpy().reshape(-1)[i]} (targets of shape {targets.shape})"
    )


def linear_cross_entropy_reference(
    hidden: "Tensor", weight: "Tensor", bias: Optional["Tensor"], targets: "Tensor", token_weights: "Tensor",
    chunk_size: int, need_grad: bool, label_smoothing: float = 0.0,
) -> Tuple["Tensor", Optional["Tensor"], Optional["Tensor"], Optional["Tensor"]]:  # fmt: skip
    """(loss (1,), dhidden [N, C], dweight [C, V], dbias [V]) of sum_r ce_r * w_r / sum(w) of logits =
    hidden @ weight (+ bias), composed chunk by chunk; ce_r is smoothed by label_smoothing = e:
    logsumexp - (1 - e) * logit[target] - e * mean(logits).  The gradients (None unless need_grad;
    dbias None without a bias) are those of the loss itself; sum(w) == 0 gives zero loss and gradients.
    A chunk's dweight is laid out as weight when that is a transposed view (a tied table's gradient in
    the table's layout, as the CUDA kernels write it)."""
    N, C = hidden.shape
    V = weight.shape[1]
    h, ids, w = hidden.contiguous(), targets.contiguous(), token_weights.contiguous()
    total = w.sum()
    empty = total == 0.0
    scale = (1.0 - empty) / (total + empty)  # 1 / sum(w), or 0 when sum(w) == 0
    classes = hidden._arange(V).view(1, V)
    weight_t = weight.transpose(0, 1)
    loss: Optional["Tensor"] = None
    dhidden = hidden.zeros((N, C)) if need_grad else None
    dweight: Optional["Tensor"] = None
    dbias: Optional["Tensor"] = None
    for n0 in range(0, N, chunk_size):
        rows = min(chunk_size, N - n0)
        h_rows = h.narrow(0, n0, rows)
        logits = h_rows @ weight
        if bias is not None:
            logits = logits + bias.view(1, V)
        m = logits.amax(1, keepdim=True)
        e = (logits - m).exp()
        s = e.sum(1, keepdim=True)
        one_hot = ids.narrow(0, n0, rows).view(rows, 1) == classes
        row_scale = w.narrow(0, n0, rows).view(rows, 1) * scale
        target_weights = one_hot * (1.0 - label_smoothing) + label_smoothing / V
        part = ((s.log() + m - (logits * target_weights).sum(1, keepdim=True)) * row_scale).sum()
        loss = part if loss is None else loss + part
        if dhidden is not None:
            dlogits = (e / s - target_weights) * row_scale
            dhidden.narrow(0, n0, rows).copy_(dlogits @ weight_t)
            if weight._tensor.is_transposed():
                part_w = (dlogits.transpose(0, 1) @ h_rows).transpose(0, 1)
            else:
                part_w = h_rows.transpose(0, 1) @ dlogits
            dweight = part_w if dweight is None else dweight + part_w
            if bias is not None:
                part_b = dlogits.sum(0).view(V)
                dbias = part_b if dbias is None else dbias + part_b
    assert loss is not None, "linear_cross_entropy_reference needs at least one row"
    return loss.view(1), dhidden, dweight, dbias


def _padded_reference(
    hidden: "Tensor", weight: "Tensor", bias: Optional["Tensor"], targets: "Tensor", token_weights: "Tensor",
    chunk_size: int, need_grad: bool, label_smoothing: float, classes: int,
) -> Tuple["Tensor", Optional["Tensor"], Optional["Tensor"], Optional["Tensor"]]:  # fmt: skip
    """linear_cross_entropy_reference over the first `classes` columns of weight (and bias), the
    gradients of the padding columns zeros."""
    V = weight.shape[1]
    if classes == V:
        return linear_cross_entropy_reference(
            hidden, weight, bias, targets, token_weights, chunk_size, need_grad, label_smoothing
        )
    narrow_bias = None if bias is None else bias.narrow(0, 0, classes)
    loss, dhidden, dweight, dbias = linear_cross_entropy_reference(
        hidden, weight.narrow(1, 0, classes), narrow_bias, targets, token_weights, chunk_size, need_grad,
        label_smoothing,
    )  # fmt: skip
    if dweight is not None:
        dweight = cat([dweight, dweight.zeros((weight.shape[0], V - classes))], 1)
    if dbias is not None:
        dbias = cat([dbias, dbias.zeros((V - classes,))], 0)
    return loss, dhidden, dweight, dbias


class FusedLinearCrossEntropy(Function):
    """Token-weighted cross-entropy of hidden @ weight (+ bias), of shape (1,), with its gradients
    computed in the forward pass (chunk by chunk, so the [tokens, vocab] logits never exist).  The
    saved dhidden, dweight (and dbias) are the gradients for an incoming gradient of 1; backward scales
    them, or hands them over as they are when backward() started at this loss (Tensor.is_unit_seed):
    a tied head's [V, C] gradient then costs no pass of its own, and since this op keeps no reference
    to them (a second backward through the loss is an error) a later op may add into them in place
    (Context.hand_over): the tied embedding scatters its rows into the head's gradient itself."""

    @staticmethod
    def forward(
        ctx: Context, hidden: "Tensor", weight: "Tensor", bias: Optional["Tensor"], targets: "Tensor",
        token_weights: "Tensor", chunk_size: int, label_smoothing: float, classes: int,
    ) -> "Tensor":  # fmt: skip
        need_grad = not ctx.no_grad
        kernel = hook(hidden.backend.ops, "linear_cross_entropy_fw")
        if kernel is None:
            loss, dhidden, dweight, dbias = _padded_reference(
                hidden, weight, bias, targets, token_weights, chunk_size, need_grad, label_smoothing, classes
            )
        else:
            tds = kernel(
                hidden._tensor, weight._tensor, None if bias is None else bias._tensor, targets._tensor,
                token_weights._tensor, chunk_size, need_grad, label_smoothing, classes,
            )  # fmt: skip
            loss, dhidden, dweight, dbias = (None if t is None else hidden._new(t) for t in tds)
        ctx.save_for_backward(dhidden, dweight, dbias)
        return loss

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        if not ctx.saved_values:
            raise RuntimeError(
                "fused_linear_cross_entropy: backward through this loss ran already, and its gradients "
                "(made in forward) went to that backward; compute the loss again for another one"
            )
        dhidden, dweight, dbias = ctx.saved_values
        ctx.hand_over(0, 1, 2)  # new tensors, or the saved ones, which this op then drops
        if grad_output.is_unit_seed:
            ctx.saved_values = ()
            grads = (dhidden, dweight)
        else:
            grads = (dhidden * grad_output, _scaled(dweight, grad_output))
        if dbias is None:
            return grads
        return grads + (dbias if grad_output.is_unit_seed else dbias * grad_output,)
