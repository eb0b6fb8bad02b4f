"""In-place copies addressed by indices that stay where the tensors are: write_slot (a KV cache append
at a slot held in a tensor) and gather_rows (a reorder of cache rows by row ids held in a tensor).

Reading the index where the op runs (on CUDA: inside the kernel, from device memory) is what lets a
CUDA graph captured once replay a decoding step at every slot: the graph's pointers are fixed, the
values behind them change.  The CUDA backend has kernels (hooks `slot_write`, `gather_rows`); the
composed references, a one-hot select and an embedding gather, run on any backend.  Neither records
autodiff history: they write into buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tensor_data import IndexingError
from ..tensor_ops import hook
from .embedding import embedding

if TYPE_CHECKING:
    from ..tensor import Tensor


def write_slot(buffer: "Tensor", values: "Tensor", slot: "Tensor") -> None:
    """buffer[:, s, :] = values, in place, for buffer [rows, slots, n] (unit stride in its last dim),
    values [rows, n] and slot a one-element tensor holding s.  A slot that is not an integer in
    [0, slots) writes nothing (on CUDA the value is not seen by the host, so it cannot raise).  values
    are written in the buffer's dtype (e.g. float32 activations into a bfloat16 cache)."""
    if buffer.dims != 3 or values.shape != (buffer.shape[0], buffer.shape[2]) or slot.numel() != 1:
        raise IndexingError(
            f"write_slot needs buffer [rows, slots, n], values [rows, n] and a one-element slot, got {buffer.shape}, "
            f"{values.shape} and {slot.shape}"
        )
    values = values.detach()
    if values.dtype != buffer.dtype:
        values = values.to(dtype=buffer.dtype)
    kernel = hook(buffer.backend.ops, "slot_write")
    if kernel is not None:
        kernel(buffer._tensor, values._tensor, slot.detach()._tensor)
        return
    rows, slots, n = buffer.shape
    hit = buffer._arange(slots).view(1, slots, 1) == slot.detach().contiguous().view(1, 1, 1)
    buffer.copy_(values.contiguous().view(rows, 1, n).where(hit, buffer).detach())


def gather_rows(out: "Tensor", source: "Tensor", ids: "Tensor") -> None:
    """out[r, :] = source[ids[r], :], in place, for out [rows, n], source [m, n] (each with a unit
    stride in its last dim; rows may have any stride, e.g. the first n floats of longer rows) and ids
    [rows] holding row numbers; out must not overlap source.  An id that is not an integer in [0, m)
    gives a row of zeros on CUDA and raises on the CPU backends."""
    if out.dims != 2 or source.dims != 2 or out.shape[1] != source.shape[1] or ids.shape != (out.shape[0],):
        raise IndexingError(
            f"gather_rows needs out [rows, n], source [m, n] and ids [rows], got {out.shape}, {source.shape} and {ids.shape}"
        )
    kernel = hook(out.backend.ops, "gather_rows")
    if kernel is not None:
        kernel(out._tensor, source._tensor, ids.detach()._tensor)
        return
    out.copy_(embedding(source.detach().contiguous(), ids.detach()).detach())
