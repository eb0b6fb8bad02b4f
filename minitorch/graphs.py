"""A repeated step (a training update, a decoding step) run as a CUDA graph replay, with its inputs
in device memory; the same code runs eagerly where graphs are off or the backend is the CPU's.

    inputs = StepInputs({"tokens": (B, T), "share": (1,)}, backend)
    seed, graphs = StepSeed(backend), StepGraphs(enabled=backend.cuda)

    def step() -> None:                      # reads only inputs[...] and persistent state
        with seed.scope():                   # dropout draws from the device key
            loss = model.loss(inputs["tokens"]) * inputs["share"]
            ...

    for batch in batches:                    # per step the host only queues work:
        inputs.upload(tokens=batch, share=1.0)   # one host->device copy
        seed.advance()                           # a fresh dropout key
        graphs.run(batch.shape, step)            # eager + capture the first time, then a replay

StepGraphs: the first time a key comes, the step runs eagerly (the real step, which also builds
every lazily made constant and layout plan, so nothing in the capture copies from the host) and is
then captured; later steps of that key replay the graph: one launch instead of one Python dispatch
per kernel.  A replay runs the captured kernels on the captured buffers, so everything a step reads
or writes must be made before (persistent buffers whose addresses stay: StepInputs' parts,
parameters, optimizer state) or inside it, and everything that changes from step to step must live
in device memory.  A capture runs the step's Python again without executing its kernels: the step
must set its host-side state (widths, which buffers are current) itself rather than carry it over
from the previous call.  Graphs in one StepGraphs share one memory pool, so they must not run
concurrently (they replay one at a time on the current stream).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, ContextManager, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .cuda.runtime import runtime
from .cuda.staging import reader, uploader
from .dtypes import FLOAT32_EXACT_INTEGERS
from .rng import next_seed, seeds_from_device
from .tensor import Tensor
from .tensor_create import zeros
from .tensor_data import prod
from .tensor_ops import TensorBackend


class StepGraphs:
    """run(key, step) replays key's graph, or runs step() and captures it (see the module docstring);
    with enabled False every step runs eagerly.  captured / replayed count graphs made and replays."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.captured = 0
        self.replayed = 0
        self._graphs: Dict[Hashable, Any] = {}
        self._pool: Any = None

    def run(self, key: Hashable, step: Callable[[], None], capture: bool = True) -> bool:
        """One step of `key`; True when it ran as a replay.  capture=False runs a step without a graph
        eagerly and leaves it uncaptured (a shape seen once)."""
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            self.replayed += 1
            return True
        step()
        if self.enabled and capture:
            torch = runtime().torch
            graph = torch.cuda.CUDAGraph()
            with _no_garbage_collection(), torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                step()
            self._pool = graph.pool()
            self._graphs[key] = graph
            self.captured += 1
        return False

    def release(self) -> None:
        """Free the captured graphs and their pool (a later step of any key captures again).  Call it
        before leaving a process group whose collectives a graph captured: NCCL's communicator cannot
        be destroyed while such a graph lives."""
        for graph in self._graphs.values():
            graph.reset()
        self._graphs.clear()
        self._pool = None


@contextlib.contextmanager
def _no_garbage_collection() -> Any:
    """Python's cyclic garbage collector paused for a capture.  A collection inside it can free a
    dead cycle that holds an earlier CUDA graph (a dropped trainer's), whose destruction is a CUDA
    call the capturing stream forbids: the capture fails with "operation failed due to a previous
    error during capture".  (PyTorch's torch.cuda.graph no longer collects before a capture unless
    torch.compiler.config.force_cudagraph_gc is set.)"""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class StepInputs:
    """A step's named inputs as views of one flat float32 buffer on the backend, so that sending a
    step's inputs is one host->device copy.  parts: name -> shape, in buffer order.

    inputs[name] is the part's Tensor (the same view every time: a captured graph reads it).
    upload(name=value, ...) writes values into a host staging array and queues one copy of the whole
    buffer: on CUDA a non-blocking copy through pinned staging memory (the host never waits on the
    GPU), on the CPU a plain copy.  Parts not named keep the values they were last given (zeros at
    first)."""

    def __init__(self, parts: Mapping[str, Tuple[int, ...]], backend: TensorBackend):
        self.shapes: Dict[str, Tuple[int, ...]] = {}
        self._ranges: Dict[str, slice] = {}
        offset = 0
        for name, shape in parts.items():
            dims = tuple(int(s) for s in shape)
            if any(s < 0 for s in dims):
                raise ValueError(f"StepInputs: part {name!r} has a negative size in shape {tuple(shape)}")
            self.shapes[name] = dims
            self._ranges[name] = slice(offset, offset + prod(dims))
            offset += prod(dims)
        if offset == 0:
            raise ValueError(f"StepInputs needs parts holding at least one value, got {dict(parts)}")
        self._host = np.zeros(offset, dtype=np.float32)
        self._flat = zeros((offset,), backend=backend)
        self._parts = {
            name: self._flat.narrow(0, r.start, r.stop - r.start).view(*self.shapes[name])
            for name, r in self._ranges.items()
        }

    def __getitem__(self, name: str) -> Tensor:
        part = self._parts.get(name)
        if part is None:
            raise KeyError(f"StepInputs has no part {name!r}; its parts are {list(self.shapes)}")
        return part

    def upload(self, **values: Any) -> None:
        """Queue the step's values: arrays of their part's shape, or Python numbers for (1,) parts.
        Integers must be exact in float32 (|value| <= 2**24)."""
        for name, value in values.items():
            if name not in self.shapes:
                raise KeyError(f"StepInputs.upload: no part {name!r}; the parts are {list(self.shapes)}")
            shape = self.shapes[name]
            array = np.asarray(value)
            if array.ndim == 0 and shape == (1,):
                array = array.reshape(1)
            if array.shape != shape or array.dtype.kind not in "biuf":
                raise ValueError(
                    f"StepInputs.upload: part {name!r} takes numbers of shape {shape}, got {array.dtype} {array.shape}"
                )
            if array.dtype.kind in "iu" and array.size and np.abs(array).max() > FLOAT32_EXACT_INTEGERS:
                raise ValueError(
                    f"StepInputs.upload: part {name!r} holds the integer {np.abs(array).max()}, beyond "
                    f"{FLOAT32_EXACT_INTEGERS} (float32 would round it)"
                )
            self._host[self._ranges[name]] = array.reshape(-1)
        self._flat.copy_(self._host)


class StepReadout:
    """One-element tensors (a step's loss sum, its gradient norm) as they are once the work queued so
    far has run, read later: on CUDA copied into pinned host memory behind that work
    (minitorch.cuda.staging.Reader), so the host goes on queueing the next step and waits only when it
    asks for values(); on the CPU read at once."""

    def __init__(self, tensors: Sequence[Tensor]):
        self._values: Optional[List[float]] = None
        self._pending: Any = None
        if tensors[0].backend.cuda:
            self._pending = reader().read_later([t.to_torch() for t in tensors])
        else:
            self._values = [float(t.item()) for t in tensors]

    def values(self) -> List[float]:
        """The values (on CUDA: waits for the work queued before this readout)."""
        return self._values if self._pending is None else self._pending.values()


class StepSeed:
    """The random key of a step's dropout (and rand) in device memory, so that a replayed graph draws
    new numbers each step: advance() before a step queues a fresh key (drawn from minitorch's
    generator, minitorch.rng.next_seed); scope() around the step's body makes the random kernels read
    it (minitorch.rng.seeds_from_device), eager steps and replays alike.

    On the CPU both are no-ops: the step's random ops draw from minitorch's generator themselves, as
    an eager loop without StepSeed does, so a CPU run gives the same numbers with or without it."""

    def __init__(self, backend: TensorBackend):
        self._buffer: Any = None
        if backend.cuda:
            rt = runtime()
            self._buffer = rt.torch.zeros(1, dtype=rt.torch.int64, device=rt.device)

    def advance(self) -> None:
        """Queue a fresh key for the next step (call it outside scope())."""
        if self._buffer is not None:
            uploader().upload(self._buffer, np.array([next_seed()], dtype=np.int64))

    def scope(self) -> ContextManager[Any]:
        """The context the step's body runs in (see the class docstring)."""
        return contextlib.nullcontext() if self._buffer is None else seeds_from_device(self._buffer)
