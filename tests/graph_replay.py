"""CUDA-graph capture and replay emulated on the CPU, to test code that CUDA graphs replay (the
decoders' steps) on machines without a GPU.

`EMULATED` is the FastOps backend with its storage ops recorded while a capture is open.  As in a
CUDA graph capture, which launches nothing: a write into an existing buffer is recorded, not done;
an op that makes a new buffer runs (on whatever the buffers hold) so that the Python of the step can
go on, and its buffer is recorded; every host<->device transfer raises CaptureError (a capture
cannot hold one, or would replay it with the host values of the capture).  Buffers made in a
capture start as zeros, elsewhere as NaN (uninitialized memory).  A replay re-runs the recorded ops
on the recorded buffers with the recorded host values (sizes, scalars), each result written into
the buffer the capture returned.  `EmulatedGraphs` stands in for minitorch.graphs.StepGraphs.
BeamState's step gets a hook, the NumPy reference on the same buffers, as CUDA has a kernel for it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import numpy as np

import minitorch
from minitorch.beam_search import _reference_step
from minitorch.fast_ops import FastOps
from minitorch.tensor_data import TensorData

Record = Tuple[Callable[..., Any], tuple, dict, Any]
FAST = minitorch.TensorBackend(FastOps)
_capture: List[Optional[List[Record]]] = [None]  # the records of the capture in progress


class CaptureError(RuntimeError):
    """A host<->device transfer inside an emulated capture."""


def _recorded(fn: Callable[..., Any], out_at: Optional[int] = None, in_place: bool = False) -> Callable[..., Any]:
    """fn, recorded during a capture; in_place (or an `out` argument, keyword or at position out_at)
    marks a write into an existing buffer."""

    def call(*args: Any, **kwargs: Any) -> Any:
        records = _capture[0]
        if records is None:
            return fn(*args, **kwargs)
        out = kwargs.get("out", args[out_at] if out_at is not None and len(args) > out_at else None)
        if in_place or out is not None:
            records.append((fn, args, kwargs, None))
            return out
        result = fn(*args, **kwargs)
        records.append((fn, args, kwargs, result))
        return result

    return call


def _host(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if _capture[0] is not None:
            raise CaptureError(f"{fn.__name__} inside a CUDA graph capture")
        return fn(*args, **kwargs)

    return staticmethod(call)


def _empty(size: int, dtype: minitorch.DType = minitorch.float32) -> np.ndarray:
    return np.full(size, 0.0 if _capture[0] is not None else np.nan, dtype=np.float32)


def _beam_search_step(values: TensorData, indices: TensorData, *state: Any) -> None:
    """The beam_search_step hook (minitorch.cuda.beam_search's arguments) by the NumPy reference."""
    step, room, scores, tokens, sources, done, history, finished, count = state[:9]
    beam, vocab, eos, _, penalty = state[9:]
    on_fast = lambda t: minitorch.Tensor(t, backend=FAST)  # noqa: E731
    rows = scores.shape[0]
    s = SimpleNamespace(
        sentences=rows // beam, beam=beam, vocab=vocab, max_steps=history.shape[0], rows=rows, eos=eos,
        length_penalty=penalty, step_counter=on_fast(step), room=on_fast(room), scores=on_fast(scores),
        tokens=on_fast(tokens), sources=on_fast(sources), done=on_fast(done), history=on_fast(history),
        finished=on_fast(finished), finished_count=on_fast(count),
    )  # fmt: skip
    _reference_step(s, on_fast(values).to_numpy().copy(), on_fast(indices).to_numpy().copy())


class EmulatedOps(FastOps):
    """FastOps with the recording above (the storage ops; the op tables are FAST's, see EMULATED)."""

    storage_empty = staticmethod(_empty)
    storage_from_numpy = _host(FastOps.storage_from_numpy)
    storage_to_numpy = _host(FastOps.storage_to_numpy)
    storage_upload = _host(FastOps.storage_upload)
    fill = staticmethod(_recorded(FastOps.fill, in_place=True))
    arange = staticmethod(_recorded(FastOps.arange, in_place=True))
    uniform = staticmethod(_recorded(FastOps.uniform, in_place=True))
    matrix_multiply = staticmethod(_recorded(FastOps.matrix_multiply))
    embedding_fw = staticmethod(_recorded(FastOps.embedding_fw))
    embedding_bw = staticmethod(_recorded(FastOps.embedding_bw))
    beam_search_step = staticmethod(_recorded(_beam_search_step, in_place=True))


def _emulated_backend() -> minitorch.TensorBackend:
    """FAST's op tables (compiled once) wrapped by _recorded, registered as TensorBackend(EmulatedOps)."""
    backend = object.__new__(minitorch.TensorBackend)
    for name, value in vars(FAST).items():
        out_at = 1 if name.endswith("_map") else 2 if name.endswith(("_zip", "_scalar")) else None
        setattr(backend, name, _recorded(value, out_at) if callable(value) and name != "ops" else value)
    backend.ops = EmulatedOps
    minitorch.TensorBackend._cache[EmulatedOps] = backend
    return backend


EMULATED = _emulated_backend()


class EmulatedGraphs:
    """minitorch.graphs.StepGraphs on EMULATED: the first step of a key runs, then is captured
    (recorded); later steps of that key replay the records."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.captured = 0
        self.replayed = 0
        self._graphs: Dict[Hashable, List[Record]] = {}

    def run(self, key: Hashable, step: Callable[[], None], capture: bool = True) -> bool:
        records = self._graphs.get(key)
        if records is not None:
            for fn, args, kwargs, result in records:
                fresh = fn(*args, **kwargs)
                pairs = zip(result, fresh) if isinstance(result, tuple) else [(result, fresh)]
                for old, new in pairs if result is not None else []:
                    old._storage[:] = new._storage
            self.replayed += 1
            return True
        step()
        if self.enabled and capture:
            _capture[0] = records = []
            try:
                step()
            finally:
                _capture[0] = None
            self._graphs[key] = records
            self.captured += 1
        return False

    def release(self) -> None:
        self._graphs.clear()
