"""slot_attention: a decoding step's attention over a KV cache whose current slot lives in a tensor.

In a decoding step every row of the batch feeds one token: its query attends over the keys and
values its row has cached, at slots [pads[r], s], where s is the slot the step has just written and
pads[r] the row's left padding.  s is held in a one-element tensor and read where the op runs, so a
CUDA graph captured once replays the step at every slot (KVCache's device-slot mode).

The CUDA backend has a kernel (hook `slot_attention`, src/kv_cache_kernel.cu) that reads each filled
slot once for all heads and skips the padding and the slots past s.  The composed reference below
runs on any backend: it attends over the first `width` slots with the others masked by slot_mask.
Softmax attention; no autodiff history (decoding runs without gradients).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

from ..tensor_data import IndexingError
from ..tensor_ops import hook
from .masks import NEG_BIG

if TYPE_CHECKING:
    from ..tensor import Tensor


def slot_mask(slot: "Tensor", pads: "Tensor", width: int) -> "Tensor":
    """Additive [rows, width] mask: 0 at slots [pads[r], s] of row r and NEG_BIG at the others, for
    slot a one-element tensor holding s and pads [rows, 1]."""
    cols = slot._arange(width).view(1, width)
    hidden = (cols < pads) | (cols > slot.contiguous().view(1, 1))
    return hidden * NEG_BIG


def slot_attention(
    q: "Tensor", keys: "Tensor", values: "Tensor", slot: "Tensor", pads: "Tensor", width: int, heads: int,
    scale: Optional[float] = None,
) -> "Tensor":  # fmt: skip
    """[rows, C]: each row's query attending, head by head, over its cached keys and values at slots
    [pads[r], s] (s = slot's value), softmax(scale q_h k_h^T) v_h for every head h.

    q [rows, C] holds one query per row with the heads side by side (head h: columns h*D .. (h+1)*D,
    D = C / heads); keys and values [rows, slots, C] are cache buffers with a unit stride in their
    last dim and slot stride C; slot is a one-element tensor and pads [rows, 1]; width (1 .. slots)
    bounds the slots the step may reach: slots from width on are never read, whatever s is.  scale
    defaults to 1 / sqrt(D).  A row with no slot in [pads[r], min(s, width - 1)] gets zeros.
    q is taken in the caches' dtype, which the output has (a bfloat16 cache: bf16 reads, float32 math).
    """
    if q.dims != 2 or heads < 1 or q.shape[1] % heads:
        raise IndexingError(f"slot_attention needs queries [rows, C] with C a multiple of heads {heads}, got {q.shape}")
    rows, C = q.shape
    if keys.dims != 3 or keys.shape[::2] != (rows, C) or values.shape != keys.shape:
        raise IndexingError(
            f"slot_attention needs keys and values [{rows}, slots, {C}] for queries {q.shape}, got {keys.shape} and "
            f"{values.shape}"
        )
    if not 1 <= width <= keys.shape[1] or slot.numel() != 1 or pads.shape != (rows, 1):
        raise IndexingError(
            f"slot_attention needs 1 <= width <= {keys.shape[1]}, a one-element slot and pads [{rows}, 1], got width "
            f"{width}, slot {slot.shape} and pads {pads.shape}"
        )
    D = C // heads
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    q, keys, values, slot, pads = (t.detach() for t in (q, keys, values, slot, pads))
    if q.dtype != keys.dtype:
        q = q.to(dtype=keys.dtype)
    kernel = hook(q.backend.ops, "slot_attention")
    if kernel is not None:
        out = kernel(q._tensor, keys._tensor, values._tensor, slot._tensor, pads._tensor, width, heads, scale)
        if out is not None:
            return q._new(out)
    k, v = (t.contiguous().view(rows, keys.shape[1], heads, D).narrow(1, 0, width) for t in (keys, values))
    mask = slot_mask(slot, pads, width).view(rows, 1, 1, width)
    scores = (q.contiguous().view(rows, heads, 1, D) * scale) @ k.permute(0, 2, 3, 1) + mask
    e = (scores - scores.amax(3, keepdim=True)).exp() * (mask == 0.0)  # a row with no slot: e = 0, out 0
    s = e.sum(3, keepdim=True)
    return ((e / (s + (s == 0.0))) @ v.permute(0, 2, 1, 3)).contiguous().view(rows, C)
