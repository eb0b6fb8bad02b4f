"""Embedding: rows of a weight [V, C] picked by integral ids; the gradient scatters back.

The CPU backends and CUDA have gather/scatter kernels (hooks); the composed reference is a one-hot
matrix product, which any backend can run.  Mixed precision: `embedding(weight, ids, dtype=bfloat16)`
gathers bfloat16 rows of a float32 master weight (rounded once), and its gradient scatter-adds the
bfloat16 row gradients in float32 into a float32 weight gradient."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

from ..autocast import activation_dtype
from ..autodiff import Context
from ..dtypes import DType, float32
from ..tensor_data import IndexingError
from ..tensor_functions import Function
from ..tensor_ops import hook

if TYPE_CHECKING:
    from ..tensor import Tensor


def embedding(weight: "Tensor", ids: "Tensor", dtype: Optional[DType] = None) -> "Tensor":
    """weight[ids] -> [*ids.shape, C] for weight [V, C] and ids holding integers in [0, V), in dtype
    (default weight's, or the autocast dtype under minitorch.autocast(low_activations=True); the
    gradient is weight's dtype either way).

    The CPU backends raise IndexError for an id outside [0, V); on CUDA, where checking would need a
    device-to-host copy, such an id gives a row of zeros (and no gradient)."""
    ids = weight._ensure(ids)
    if weight.dims != 2:
        raise IndexingError(f"embedding weight must be [num_embeddings, dim], got shape {weight.shape}")
    return Embedding.apply(weight, ids.detach(), dtype or activation_dtype(weight.dtype))


def _one_hot(ids: "Tensor", classes: int) -> "Tensor":
    flat = ids.contiguous().view(ids.numel(), 1)
    return flat == ids._arange(classes).view(1, classes)


class Embedding(Function):
    """Saves the ids, the vocabulary size and the weight's dtype. Folds the table's gathered gradient
    into the scatter (its start; the scatter adds into it in place where it is backward's alone)."""

    folds_pending = True

    @staticmethod
    def forward(ctx: Context, weight: "Tensor", ids: "Tensor", dtype: Optional[DType] = None) -> "Tensor":
        dtype = dtype or weight.dtype
        ctx.save_for_backward(ids, weight.shape[0], weight.dtype)
        kernel = hook(weight.backend.ops, "embedding_fw")
        if kernel is None:
            V, C = weight.shape
            return (_one_hot(ids, V) @ weight).view(*ids.shape, C).to(dtype)
        return weight._new(kernel(weight._tensor, ids._tensor, dtype))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        ids, num_embeddings, dtype = ctx.saved_values
        # the table's gradient from its other uses (a tied LM head's) is where the rows are added
        initial = ctx.take_pending(0, dtype)
        in_place = initial is not None and ctx.may_write_pending(0)
        ctx.hand_over(0)  # a new table, or the gathered one that was backward's alone
        return (scatter_rows(grad_output, ids, num_embeddings, dtype, initial, in_place),)


def scatter_rows(
    rows: "Tensor", ids: "Tensor", num_embeddings: int, dtype: Optional[DType] = None, initial: Optional["Tensor"] = None,
    in_place: bool = False,
) -> "Tensor":  # fmt: skip
    """[num_embeddings, C] zeros (or a copy of initial, of that shape; initial itself with in_place,
    when it is a contiguous float32 table the sums can go into) with each row r of rows [..., C] added
    at row ids[r] (no autodiff), in dtype (default rows'); the sums are float32 where a kernel runs."""
    kernel = hook(rows.backend.ops, "embedding_bw")
    if kernel is None:
        C = rows.shape[-1]
        rows = rows.contiguous().view(ids.numel(), C)
        scattered = (_one_hot(ids, num_embeddings).transpose(0, 1) @ rows).to(dtype or rows.dtype)
        return scattered if initial is None else initial + scattered
    writable = in_place and initial is not None and initial.is_contiguous() and initial.dtype is float32
    start = {} if initial is None else {"initial": initial._tensor, "in_place": writable}
    return rows._new(kernel(rows._tensor, ids._tensor, num_embeddings, dtype or rows.dtype, **start))
