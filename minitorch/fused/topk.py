"""top_k: the k largest entries of every row, best first, selected where the tensor lives.

Ties go to the larger index (among equal values the entry further right comes first), so the order
is total and every backend returns the same indices.  The CUDA backend has a one-pass kernel (hook
`top_k`, for k up to its limit; it returns None beyond it); the composed reference takes k rounds
of: the max of the entries not yet taken, and the largest index holding it (so entries equal to
-inf are taken once each, like any other).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Tuple

from ..tensor_data import IndexingError
from ..tensor_ops import hook

if TYPE_CHECKING:
    from ..tensor import Tensor


def top_k(scores: "Tensor", k: int) -> Tuple["Tensor", "Tensor"]:
    """(values, indices), each [B, k] on scores' backend, of the k largest entries of every row of
    scores [B, M], best first; indices as integral floats.  No autodiff history.  16-bit scores are
    ranked as float32 (an exact widening, so the order and the values are theirs)."""
    if scores.dims != 2:
        raise IndexingError(f"top_k expects scores [B, M], got shape {scores.shape}")
    B, M = scores.shape
    if not 1 <= k <= M:
        raise ValueError(f"top_k: k must be in [1, {M}] for scores of shape {scores.shape}, got {k}")
    if scores.dtype.rounds:
        scores = scores.float()
    kernel = hook(scores.backend.ops, "top_k")
    found = None if kernel is None else kernel(scores.detach()._tensor, k)
    if found is not None:
        return scores._new(found[0]), scores._new(found[1])
    return _composed_top_k(scores.detach(), k)


def _composed_top_k(scores: "Tensor", k: int) -> Tuple["Tensor", "Tensor"]:
    B, M = scores.shape
    positions = scores._arange(M).view(1, M)
    values, indices = scores._new_empty((B, k)), scores._new_empty((B, k))
    taken = scores.zeros((B, M))
    floor = scores.zeros((1, 1)).copy_(-math.inf)  # a fill, not a host copy (graph-safe)
    for j in range(k):
        left = floor.where(taken, scores)
        best = left.amax(1, keepdim=True)
        at = ((left == best) * (1.0 - taken) * positions).amax(1, keepdim=True)
        values.narrow(1, j, 1).copy_(best)
        indices.narrow(1, j, 1).copy_(at)
        taken = taken + (positions == at)
    return values, indices
