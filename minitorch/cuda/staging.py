"""Host<->device copies that never wait on the GPU.  Uploads: values are copied into a ring of pinned
host buffers and sent with non-blocking copies on the current stream, so a training loop can queue
the next step's inputs (a batch, a learning rate, a dropout seed: minitorch.graphs) while earlier
steps still run.  Readbacks: device scalars are copied into a ring of pinned buffers behind the work
queued so far, read when the host asks for them (a step's loss, printed while the next step runs).

An upload slot is reused only after the copy that last read it has run (an event per slot), so the
host can run at most `SLOTS` uploads ahead of the GPU; a readback slot is reused after its values
have been taken out of it (read then, if nobody has asked for them yet).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from .runtime import count_transfer, runtime, storage_dtype

SLOTS = 64


class Uploader:
    """A ring of pinned staging buffers; `upload(dst, values)` queues dst[:] = values."""

    def __init__(self) -> None:
        self._buffers: List[Optional[Any]] = [None] * SLOTS
        self._events: List[Optional[Any]] = [None] * SLOTS
        self._next = 0

    def upload(self, dst: Any, values: np.ndarray) -> None:
        """Queue a copy of `values` into the device tensor `dst` (a torch tensor of the same number
        of elements and dtype) on the current stream; returns without waiting for the GPU."""
        torch = runtime().torch
        host = np.ascontiguousarray(values).reshape(-1)
        if host.size != dst.numel():
            raise ValueError(f"upload of {host.size} values into a device buffer of {dst.numel()}")
        slot = self._next
        self._next = (slot + 1) % SLOTS
        event = self._events[slot]
        if event is not None:
            event.synchronize()
        nbytes = host.nbytes
        buffer = self._buffers[slot]
        if buffer is None or buffer.numel() < nbytes:
            buffer = self._buffers[slot] = torch.empty(max(nbytes, 256), dtype=torch.uint8, pin_memory=True)
        staged = buffer[:nbytes]
        staged.numpy()[:] = host.view(np.uint8)
        dst.view(-1).view(torch.uint8).copy_(staged, non_blocking=True)
        if event is None:
            event = self._events[slot] = torch.cuda.Event()
        event.record()
        count_transfer("h2d", nbytes)


class PendingRead:
    """Values a Reader queued: values() waits for their copy (the work queued before it) once."""

    def __init__(self, buffer: Any, event: Any, n: int):
        self._buffer, self._event, self._n = buffer, event, n
        self._values: Optional[List[float]] = None

    def values(self) -> List[float]:
        """The copied values (the first call waits for the copy)."""
        if self._values is None:
            self._event.synchronize()
            self._values = self._buffer[: self._n].tolist()
        return self._values


class Reader:
    """A ring of pinned float32 buffers; `read_later(sources)` queues their copies, returns a PendingRead."""

    def __init__(self) -> None:
        self._buffers: List[Optional[Any]] = [None] * SLOTS
        self._events: List[Optional[Any]] = [None] * SLOTS
        self._reads: List[Optional[PendingRead]] = [None] * SLOTS
        self._next = 0

    def read_later(self, sources: Sequence[Any]) -> PendingRead:
        """Queue copies of the one-element device tensors `sources` (torch, float32) to the host on the
        current stream, behind the work queued so far; returns without waiting for the GPU."""
        torch = runtime().torch
        slot = self._next
        self._next = (slot + 1) % SLOTS
        previous = self._reads[slot]
        if previous is not None:
            previous.values()  # taken out before the slot is written again
        buffer = self._buffers[slot]
        if buffer is None or buffer.numel() < len(sources):
            buffer = self._buffers[slot] = torch.empty(max(len(sources), 16), dtype=torch.float32, pin_memory=True)
        for i, source in enumerate(sources):
            buffer[i : i + 1].copy_(source.reshape(1), non_blocking=True)
        event = self._events[slot]
        if event is None:
            event = self._events[slot] = torch.cuda.Event()
        event.record()
        count_transfer("d2h", 4 * len(sources))
        read = self._reads[slot] = PendingRead(buffer, event, len(sources))
        return read


_uploader: List[Uploader] = []
_reader: List[Reader] = []


def uploader() -> Uploader:
    """The process's uploader (made on first use)."""
    if not _uploader:
        _uploader.append(Uploader())
    return _uploader[0]


def upload_storage(storage: Any, values: np.ndarray) -> None:
    """Queue storage[:values.size] = values (int64 values for an int64 storage, else float32 values
    written in the storage's format: the 16-bit words of values already rounded to its dtype)
    without waiting for the GPU."""
    dtype = storage_dtype(storage)
    flat = np.ascontiguousarray(values, dtype=np.int64 if dtype.is_integer else np.float32).reshape(-1)
    uploader().upload(storage[: flat.size], dtype.encode(flat) if dtype.rounds else flat)


def reader() -> Reader:
    """The process's readback ring (made on first use)."""
    if not _reader:
        _reader.append(Reader())
    return _reader[0]
