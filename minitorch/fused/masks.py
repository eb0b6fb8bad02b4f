"""Masks shared by the attention ops: the additive key mask [B, Tk] and the causal rule."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Tuple

from ..tensor_data import IndexingError, shape_broadcast

if TYPE_CHECKING:
    from ..tensor import Tensor

NEG_BIG = -1e30  # added to causally removed scores in the composed softmax: finite, far below any real score


def key_mask(op: str, subject: str, like: "Tensor", mask: Optional["Tensor"], B: int, Tk: int) -> Optional["Tensor"]:
    """The additive mask as a contiguous [B, Tk] tensor without history (None stays None).

    `mask` may be [B, Tk] or any shape broadcasting to [B, 1, 1, Tk]; anything else raises an
    IndexingError naming `op`, the mask's shape, the shape it must broadcast to and `subject` (the
    inputs it belongs to)."""
    if mask is None:
        return None
    mask = like._ensure(mask)
    if mask.dims > 4:
        raise IndexingError(f"{op} mask of shape {mask.shape} has more than 4 dims")
    if mask.shape == (B, Tk):
        mask4 = mask.reshape(B, 1, 1, Tk)
    else:
        mask4 = mask.reshape(*((1,) * (4 - mask.dims) + mask.shape))
    try:
        ok = shape_broadcast(mask4.shape, (B, 1, 1, Tk)) == (B, 1, 1, Tk)
    except IndexingError:
        ok = False
    if not ok:
        raise IndexingError(
            f"{op} mask of shape {mask.shape} does not broadcast to [B, 1, 1, Tk] = {(B, 1, 1, Tk)} for {subject}"
        )
    return mask4.detach()._expand_view((B, 1, 1, Tk)).contiguous()._view((B, Tk))


def causal_allowed(like: "Tensor", Tq: int, Tk: int) -> "Tensor":
    """[Tq, Tk] 1/0: key j is kept for query i when j <= i + (Tk - Tq)."""
    cols = like._arange(Tk).view(1, Tk)
    rows = like._arange(Tq).view(Tq, 1) + float(Tk - Tq) + 0.5
    return cols < rows


def masked_scores(x: "Tensor", mask: Optional["Tensor"], causal: bool) -> Tuple["Tensor", Optional["Tensor"]]:
    """(x + mask, with causally removed scores pushed to NEG_BIG; the causal 1/0 matrix or None)."""
    B, _, Tq, Tk = x.shape
    if mask is not None:
        x = x + mask.view(B, 1, 1, Tk)
    if not causal:
        return x, None
    allowed = causal_allowed(x, Tq, Tk)
    return x + (allowed - 1.0) * (-NEG_BIG), allowed
