"""KVCache: the keys and values of every attention layer of a DecoderLM, for incremental decoding.

Decoding one token at a time with a causal model recomputes nothing about the prefix if each layer
keeps the keys and values it has already made: a new position costs one row of every projection
and one [1, L] row of attention scores, instead of a re-run over all L positions.

Layout: per layer a keys and a values buffer [rows, capacity * C] (row r's slot s at columns
s*C .. s*C + C), batch-major so that reordering the rows (beam search keeps the best hypotheses,
whose parents may be any beam of the same sentence) is one row gather per buffer.  Rows may hold
prompts of different lengths: they are left-padded, so every row writes the same slot at each
step, and the padded slots are removed from attention by an additive key mask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .fused.embedding import embedding
from .fused.masks import NEG_BIG
from .tensor_create import tensor_from_numpy
from .tensor_data import IndexingError, TensorData

if TYPE_CHECKING:
    from .tensor import Tensor


def _slots(buffer: "Tensor", capacity: int, n_embd: int, start: int, stop: int, heads: int = 0) -> "Tensor":
    """Slots [start, stop) of every row of a [rows, capacity * n_embd] buffer as a view (no copy):
    [rows, stop - start, n_embd], or with heads > 0 [rows, stop - start, heads, n_embd / heads]."""
    storage = buffer._tensor._storage[start * n_embd :]
    rows, T = buffer.shape[0], stop - start
    if heads:
        shape, strides = (rows, T, heads, n_embd // heads), (capacity * n_embd, n_embd, n_embd // heads, 1)
    else:
        shape, strides = (rows, T, n_embd), (capacity * n_embd, n_embd, 1)
    return buffer._new(TensorData(storage, shape, strides))


class LayerCache:
    """Keys and values of one attention layer; slots [0, cache.length) are filled."""

    def __init__(self, cache: "KVCache", like: "Tensor"):
        self.cache = cache
        self.keys = like.zeros((cache.rows, cache.capacity * cache.n_embd))
        self.values = like.zeros((cache.rows, cache.capacity * cache.n_embd))

    def append(self, keys: "Tensor", values: "Tensor", heads: int) -> Tuple["Tensor", "Tensor"]:
        """Write keys and values [rows, T, C] of the next T positions at slot cache.length; returns
        the keys and values of every filled slot including these, as [rows, length + T, heads,
        C / heads] views."""
        c = self.cache
        T = keys.shape[1]
        if keys.shape != (c.rows, T, c.n_embd) or values.shape != keys.shape:
            raise IndexingError(
                f"KVCache.append expects keys and values [{c.rows}, T, {c.n_embd}], got {keys.shape} and {values.shape}"
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


class KVCache:
    """Keys and values of every layer of a DecoderLM for `rows` sequences of up to `capacity` slots.

    pads[r] (default 0) is the number of left-padding slots of row r: DecoderLM gives them position
    0 and key_mask removes them from attention.  DecoderLM.hidden_states(ids, cache=...) appends the
    positions it is given and advances `length`; `reorder` makes row r a copy of a chosen row.
    """

    def __init__(
        self, like: "Tensor", n_layers: int, rows: int, capacity: int, n_embd: int, pads: Optional[Sequence[int]] = None
    ):
        if rows < 1 or capacity < 1:
            raise ValueError(f"KVCache needs at least one row and one slot, got rows={rows}, capacity={capacity}")
        self.rows = rows
        self.capacity = capacity
        self.n_embd = n_embd
        self.length = 0
        self._backend = like.backend
        self._set_pads(np.zeros(rows, dtype=np.int64) if pads is None else np.asarray(pads, dtype=np.int64))
        self.layers: List[LayerCache] = [LayerCache(self, like) for _ in range(n_layers)]

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
        """Additive [rows, length] mask of slots [0, length) (NEG_BIG on padding), None without padding."""
        if self._mask is None:
            return None
        mask = self._masks.get(length)
        if mask is None:
            view = TensorData(self._mask._tensor._storage, (self.rows, length), (self.capacity, 1))
            mask = self._mask._new(view).contiguous()
            self._masks = {length: mask}
        return mask

    def positions(self, count: int) -> np.ndarray:
        """Position ids [rows, count] of the next `count` slots: slot s of row r has position
        s - pads[r], and padding slots position 0."""
        slots = np.arange(self.length, self.length + count)[None, :]
        return np.maximum(slots - self.pads[:, None], 0)

    def advance(self, count: int) -> None:
        """Mark `count` more slots filled (after every layer has appended them)."""
        self.length += count

    def reorder(self, sources: np.ndarray) -> None:
        """Row r becomes a copy of row sources[r] (keys, values and padding); len(sources) is the new
        number of rows, so this also repeats rows (one prompt's cache for each of its beams)."""
        sources = np.asarray(sources, dtype=np.int64)
        if sources.ndim != 1 or sources.size == 0 or sources.min() < 0 or sources.max() >= self.rows:
            raise IndexingError(f"KVCache.reorder needs row ids in [0, {self.rows}), got {sources}")
        ids = tensor_from_numpy(sources, backend=self._backend)
        for layer in self.layers:
            layer.keys = embedding(layer.keys, ids)
            layer.values = embedding(layer.values, ids)
        pads = self.pads[sources]
        self.rows = sources.size
        if pads.shape != self.pads.shape or not np.array_equal(pads, self.pads):
            self._set_pads(pads)
