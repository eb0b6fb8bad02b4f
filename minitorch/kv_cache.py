"""KVCache: the keys and values of every attention layer of a DecoderLM, for incremental decoding.

Decoding one token at a time with a causal model recomputes nothing about the prefix if each layer
keeps the keys and values it has already made: a new position costs one row of every projection
and one [1, L] row of attention scores, instead of a re-run over all L positions.

Layout: per layer a keys and a values buffer [rows, capacity * C] (row r's slot s at columns
s*C .. s*C + C), batch-major so that reordering the rows (beam search keeps the best hypotheses,
whose parents may be any beam of the same sentence) is one row gather per buffer.  Rows may hold
prompts of different lengths: they are left-padded, so every row writes the same slot at each
step, and the padded slots are removed from attention by an additive key mask.

Device-slot mode (`begin_device_steps`), for decoding steps replayed from a CUDA graph: after the
prompts, each step appends one position per row at a slot held in device memory (`slot`), attends
over a fixed number of slots (`width`, set by the caller per step) with the slots past the current
one masked, and advances the slot with a kernel.  Every value that changes from step to step is
then read by the kernels from device memory, so one captured graph serves every step of a width.
`reorder_rows` reorders rows by ids held in a tensor, into a second set of buffers (`parity`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .fused.device_indexed import gather_rows, write_slot
from .fused.embedding import embedding
from .fused.masks import NEG_BIG
from .fused.slot_attention import slot_attention, slot_mask
from .dtypes import DType, float32
from .tensor_create import tensor_from_numpy
from .tensor_data import IndexingError

if TYPE_CHECKING:
    from .tensor import Tensor


def _slots(buffer: "Tensor", capacity: int, n_embd: int, start: int, stop: int, heads: int = 0) -> "Tensor":
    """Slots [start, stop) of every row of a [rows, capacity * n_embd] buffer as a view (no copy):
    [rows, stop - start, n_embd], or with heads > 0 [rows, stop - start, heads, n_embd / heads]."""
    inner = (heads, n_embd // heads) if heads else (n_embd,)
    return buffer.view(buffer.shape[0], capacity, *inner).narrow(1, start, stop - start)


class LayerCache:
    """Keys and values of one attention layer; slots [0, cache.length) are filled (in device-slot
    mode, up to the device slot).  `spare` is the second set of buffers of reorder_rows."""

    def __init__(self, cache: "KVCache", like: "Tensor"):
        self.cache = cache
        self.keys, self.values = (cache._zeros(like) for _ in range(2))
        self.spare: Optional[Tuple["Tensor", "Tensor"]] = None

    def append(self, keys: "Tensor", values: "Tensor", heads: int) -> Tuple["Tensor", "Tensor"]:
        """Write keys and values [rows, T, C] of the next T positions at slot cache.length; returns
        the keys and values of every filled slot including these, as [rows, length + T, heads,
        C / heads] views.  In device-slot mode: T = 1, written at the device slot; the views cover
        the first cache.width slots."""
        c = self.cache
        T = keys.shape[1]
        if keys.shape != (c.rows, T, c.n_embd) or values.shape != keys.shape:
            raise IndexingError(
                f"KVCache.append expects keys and values [{c.rows}, T, {c.n_embd}], got {keys.shape} and {values.shape}"
            )
        if c.slot is not None:
            if T != 1:
                raise IndexingError(f"KVCache in device-slot mode appends one position per step, got {T}")
            for buffer, new in ((self.keys, keys), (self.values, values)):
                write_slot(buffer.view(c.rows, c.capacity, c.n_embd), new[:, 0], c.slot)
            return (
                _slots(self.keys, c.capacity, c.n_embd, 0, c.width, heads),
                _slots(self.values, c.capacity, c.n_embd, 0, c.width, heads),
            )
        if c.length + T > c.capacity:
            raise IndexingError(f"KVCache holds {c.capacity} positions: {c.length} filled, {T} more do not fit")
        stop = c.length + T
        _slots(self.keys, c.capacity, c.n_embd, c.length, stop).copy_(keys)
        _slots(self.values, c.capacity, c.n_embd, c.length, stop).copy_(values)
        return (
            _slots(self.keys, c.capacity, c.n_embd, 0, stop, heads),
            _slots(self.values, c.capacity, c.n_embd, 0, stop, heads),
        )

    def attend(self, q: "Tensor", heads: int, scale: float) -> "Tensor":
        """Device-slot mode, after append: the attention [rows, C] of queries q [rows, C] (one per row)
        over this layer's filled slots up to the device slot, within the first cache.width slots
        (fused.slot_attention)."""
        c = self.cache
        if c.slot is None:
            raise RuntimeError("LayerCache.attend needs device-slot mode (KVCache.begin_device_steps)")
        keys, values = (b.view(c.rows, c.capacity, c.n_embd) for b in (self.keys, self.values))
        return slot_attention(q, keys, values, c.slot, c._device_buffers()[1], c.width, heads, scale)


class KVCache:
    """Keys and values of every layer of a DecoderLM for `rows` sequences of up to `capacity` slots.

    pads[r] (default 0) is the number of left-padding slots of row r: DecoderLM gives them position
    0 and key_mask removes them from attention.  DecoderLM.hidden_states(ids, cache=...) appends the
    positions it is given and advances `length`; `reorder` makes row r a copy of a chosen row.
    dtype: of the buffers (default float32; bfloat16 halves the cache and what each step reads), whatever
    the dtype of the keys and values written.
    """

    def __init__(
        self, like: "Tensor", n_layers: int, rows: int, capacity: int, n_embd: int, pads: Optional[Sequence[int]] = None,
        dtype: DType = float32,
    ):  # fmt: skip
        if rows < 1 or capacity < 1:
            raise ValueError(f"KVCache needs at least one row and one slot, got rows={rows}, capacity={capacity}")
        self.rows = rows
        self.capacity = capacity
        self.n_embd = n_embd
        self.dtype = dtype
        self.length = 0
        self._backend = like.backend
        self._like = like
        self._set_pads(np.zeros(rows, dtype=np.int64) if pads is None else np.asarray(pads, dtype=np.int64))
        self.layers: List[LayerCache] = [LayerCache(self, like) for _ in range(n_layers)]
        self.slot: Optional["Tensor"] = None  # device-slot mode: the slot the next step writes
        self.width = capacity
        self.parity = 0
        self._device_state: Optional[Tuple["Tensor", "Tensor"]] = None  # (slot, pads [rows, 1]) buffers
        self._step_mask: Optional["Tensor"] = None

    def _zeros(self, like: "Tensor") -> "Tensor":
        """A zero [rows, capacity * n_embd] buffer of self.dtype (made in float32 and cast: the fill
        kernels are float32)."""
        zeros = like.zeros((self.rows, self.capacity * self.n_embd))
        return zeros if self.dtype == float32 else zeros.to(dtype=self.dtype)

    def reset(self, pads: Optional[Sequence[int]] = None) -> None:
        """Empty the cache for new prompts (pads as in the constructor), keeping its buffers: slot 0,
        host mode, the first set of buffers current."""
        self.length = 0
        self.slot = None
        self.set_parity(0)
        self._set_pads(np.zeros(self.rows, dtype=np.int64) if pads is None else np.asarray(pads, dtype=np.int64))

    def _set_pads(self, pads: np.ndarray) -> None:
        if pads.shape != (self.rows,) or (pads < 0).any() or (pads > self.capacity).any():
            raise ValueError(f"KVCache pads must be {self.rows} counts in [0, {self.capacity}], got {pads}")
        self.pads = pads
        self._masks: Dict[int, "Tensor"] = {}
        self._mask: Optional["Tensor"] = None
        if pads.any():
            padded = np.arange(self.capacity)[None, :] < pads[:, None]
            self._mask = tensor_from_numpy(np.where(padded, NEG_BIG, 0.0), backend=self._backend)

    def key_mask(self, length: int) -> Optional["Tensor"]:
        """Additive [rows, length] mask of slots [0, length) (NEG_BIG on padding), None without padding.
        In device-slot mode length is the width, and the slots past the device slot are masked too."""
        if self.slot is not None:
            if length != self.width:
                raise IndexingError(f"KVCache in device-slot mode attends over width {self.width}, not {length}")
            if self._step_mask is None:
                self._step_mask = slot_mask(self.slot, self._device_buffers()[1], length)
            return self._step_mask
        if self._mask is None:
            return None
        mask = self._masks.get(length)
        if mask is None:
            mask = self._mask.narrow(1, 0, length).contiguous()
            self._masks = {length: mask}
        return mask

    def positions(self, count: int) -> np.ndarray:
        """Position ids [rows, count] of the next `count` slots: slot s of row r has position
        s - pads[r], and padding slots position 0."""
        slots = np.arange(self.length, self.length + count)[None, :]
        return np.maximum(slots - self.pads[:, None], 0)

    def advance(self, count: int) -> None:
        """Mark `count` more slots filled (after every layer has appended them): the host count, or
        in device-slot mode the device slot (by a kernel; the host count stays)."""
        if self.slot is None:
            self.length += count
            return
        self.slot.copy_(self.slot + float(count))
        self._step_mask = None

    def begin_device_steps(self) -> None:
        """Enter device-slot mode (see the module docstring) after the prompts: the device slot starts
        at `length`.  The mode's buffers are made once and reused after reset()."""
        slot, pad_column = self._device_buffers()
        slot.copy_(np.array([self.length], dtype=np.float32))
        pad_column.copy_(self.pads.astype(np.float32).reshape(self.rows, 1))
        self.slot = slot
        self.width = self.capacity
        self._step_mask = None

    def slot_positions(self) -> "Tensor":
        """Device-slot mode: position ids [rows, 1] of the current slot (slot - pads[r]), on the backend."""
        if self.slot is None:
            raise RuntimeError("KVCache.slot_positions needs device-slot mode (begin_device_steps)")
        _, pad_column = self._device_buffers()
        return self.slot.view(1, 1) - pad_column

    def _device_buffers(self) -> Tuple["Tensor", "Tensor"]:
        if self._device_state is None:
            self._device_state = (self._like.zeros((1,)), self._like.zeros((self.rows, 1)))
        return self._device_state

    def reorder_rows(self, sources: "Tensor", width: int) -> None:
        """Row r becomes row sources[r] over the first `width` slots (those filled), sources [rows] row
        ids on the cache's backend, read where the gather runs (no host copy).  Rows and padding stay:
        the caller keeps each row's source at the same padding (beam search's rows of one sentence).
        The gather goes into the second set of buffers, which become the current ones (parity flips)."""
        if not 1 <= width <= self.capacity or sources.shape != (self.rows,):
            raise IndexingError(
                f"KVCache.reorder_rows needs sources [{self.rows}] and width in [1, {self.capacity}], got "
                f"{sources.shape} and {width}"
            )
        n = width * self.n_embd
        for layer in self.layers:
            if layer.spare is None:
                layer.spare = (self._zeros(self._like), self._zeros(self._like))
            for current, spare in zip((layer.keys, layer.values), layer.spare):
                gather_rows(spare.narrow(1, 0, n), current.narrow(1, 0, n), sources)
            (layer.keys, layer.values), layer.spare = layer.spare, (layer.keys, layer.values)
        self.parity ^= 1

    def set_parity(self, parity: int) -> None:
        """Make buffer set `parity` (0 or 1) current, without copying: a caller replaying captured
        reorders tells the cache where their data went."""
        if parity not in (0, 1):
            raise ValueError(f"KVCache parity is 0 or 1, got {parity}")
        if parity != self.parity:
            for layer in self.layers:
                if layer.spare is None:
                    raise RuntimeError("KVCache.set_parity: the second set of buffers is made by reorder_rows")
                (layer.keys, layer.values), layer.spare = layer.spare, (layer.keys, layer.values)
            self.parity = parity

    def reorder(self, sources: np.ndarray) -> None:
        """Row r becomes a copy of row sources[r] (keys, values and padding); len(sources) is the new
        number of rows, so this also repeats rows (one prompt's cache for each of its beams)."""
        sources = np.asarray(sources, dtype=np.int64)
        if sources.ndim != 1 or sources.size == 0 or sources.min() < 0 or sources.max() >= self.rows:
            raise IndexingError(f"KVCache.reorder needs row ids in [0, {self.rows}), got {sources}")
        if self.slot is not None:
            raise RuntimeError("KVCache.reorder works in host mode; in device-slot mode use reorder_rows")
        ids = tensor_from_numpy(sources, backend=self._backend)
        for layer in self.layers:
            layer.keys = embedding(layer.keys, ids, layer.keys.dtype)
            layer.values = embedding(layer.values, ids, layer.values.dtype)
            layer.spare = None
        self.parity = 0
        pads = self.pads[sources]
        if sources.size != self.rows:
            self._device_state = None
        self.rows = sources.size
        if pads.shape != self.pads.shape or not np.array_equal(pads, self.pads):
            self._set_pads(pads)
