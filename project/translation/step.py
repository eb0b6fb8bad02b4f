"""The training step of the translation program, run so that the host never waits on the GPU.

`TrainStep(batch, lr)` queues one update: forward, backward, global-norm clip and AdamW, with the
batch's loss summed into a device accumulator (`loss_sum`, read every N steps by the caller).  On
CUDA with graphs on, the first batch of each shape runs eagerly and the step is then captured in a
CUDA graph (one per batch shape, all in one memory pool: minitorch.cuda.graphs.StepGraphs) and
replayed for every later batch of that shape: a replay is one launch instead of ~1,000
Python-dispatched kernels.  The host work of a step is then copying the batch into pinned staging
memory and queueing its upload, the learning rate and a fresh dropout key
(`minitorch.rng.seeds_from_device`), and the replay.

Batch widths are padded up to a multiple of `WIDTH_MULTIPLE` on CUDA, so a few graphs cover every
batch (padding positions have weight 0 and, with right padding and causal attention, change
nothing for the real ones).  On CUDA every step (eager or replayed) draws its dropout masks from
the device key, so an eager run and a graph run from the same seed compute the same updates.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

import minitorch
from minitorch import DecoderLM, TensorBackend
from minitorch.cuda.graphs import StepGraphs
from minitorch.cuda.runtime import runtime
from minitorch.tensor_data import TensorData
from project.translation.batches import Batch
from project.translation.tokenizer import PAD_ID
from project.translation.model import batch_loss_from_tensors

WIDTH_MULTIPLE = 8


def pad_width(batch: Batch, multiple: int) -> Batch:
    """The batch with its width padded up to a multiple of `multiple` (pad tokens, weight 0)."""
    B, T = batch.tokens.shape
    extra = -T % multiple
    if extra == 0:
        return batch
    pad = ((0, 0), (0, extra))
    return Batch(
        tokens=np.pad(batch.tokens, pad, constant_values=PAD_ID),
        targets=np.pad(batch.targets, pad, constant_values=PAD_ID),
        weights=np.pad(batch.weights, pad),
    )


class _Inputs:
    """Device buffers of one batch shape and the step's share and counted targets (see
    TrainStep.__call__): views of one flat buffer, so a step's inputs are one queued upload."""

    def __init__(self, shape: Tuple[int, int], backend: TensorBackend):
        B, T = shape
        self._host = np.zeros(3 * B * T + 2, dtype=np.float32)
        self._flat = minitorch.zeros((self._host.size,), backend=backend)
        storage, n = self._flat._tensor._storage, B * T

        def part(start: int, shape: Tuple[int, ...]) -> minitorch.Tensor:
            size = int(np.prod(shape))
            return minitorch.Tensor(TensorData(storage[start : start + size], shape), backend=backend)

        self.tokens, self.targets, self.weights = part(0, (B, T)), part(n, (n,)), part(2 * n, (n,))
        self.share, self.n_targets = part(3 * n, (1,)), part(3 * n + 1, (1,))

    def upload(self, batch: Batch, share: float, n_targets: int) -> None:
        n = batch.tokens.size
        host = self._host
        host[:n] = batch.tokens.reshape(-1)
        host[n : 2 * n] = batch.targets.reshape(-1)
        host[2 * n : 3 * n] = batch.weights.reshape(-1)
        host[3 * n :] = (share, n_targets)
        self._flat.copy_(host)


class TrainStep:
    """One training update per call; see the module docstring.

    use_graphs: capture and replay CUDA graphs (CUDA only); graph_batch_size: only batches of this
    many rows are captured (the short last batch of an epoch runs eagerly); loss_kind and
    label_smoothing: see mt_train.batch_loss; gradient_sync: called between backward and the
    optimizer update (DistributedDataParallel.sync_gradients)."""

    def __init__(
        self, model: DecoderLM, optimizer: minitorch.AdamW, backend: TensorBackend, loss_kind: str,
        use_graphs: bool, graph_batch_size: Optional[int] = None, label_smoothing: float = 0.0,
        gradient_sync: Optional[Callable[[], None]] = None,
    ):  # fmt: skip
        if use_graphs and not backend.cuda:
            raise ValueError("CUDA graphs need the CUDA backend (--backend cuda)")
        self.model, self.optimizer, self.backend, self.loss_kind = model, optimizer, backend, loss_kind
        self.label_smoothing = label_smoothing
        self.use_graphs = use_graphs
        self.graph_batch_size = graph_batch_size
        self.gradient_sync = gradient_sync
        self.loss_sum = minitorch.zeros((1,), backend=backend)
        self._inputs: Dict[Tuple[int, int], _Inputs] = {}
        self._graphs = StepGraphs(use_graphs)
        self._seed: Any = None
        if backend.cuda:
            from minitorch.cuda.staging import DeviceSeed

            self._seed = DeviceSeed()

    def __call__(self, batch: Batch, lr: float, share: float = 1.0, n_targets: Optional[int] = None) -> bool:
        """Queue one update of `batch` at learning rate `lr`; True when it ran as a graph replay.

        Data parallel (project/mt_parallel.py): backward starts from loss x share, this process's
        part of the step's target tokens (1 alone; 0 for a stand-in batch), and the loss sum counts
        n_targets tokens (default: the batch's; 0 for a stand-in).  Both are device values, so a
        replayed graph takes each step's own."""
        if self.backend.cuda:
            batch = pad_width(batch, WIDTH_MULTIPLE)
        shape = batch.tokens.shape
        inputs = self._inputs.get(shape)
        if inputs is None:
            inputs = self._inputs[shape] = _Inputs(shape, self.backend)
        inputs.upload(batch, share, batch.n_targets if n_targets is None else n_targets)
        self.optimizer.lr = lr
        self.optimizer.begin_step()
        if self._seed is not None:
            self._seed.advance(minitorch.rng.next_seed())
        capture = self.graph_batch_size is None or shape[0] == self.graph_batch_size
        return self._graphs.run(shape, lambda: self._run(inputs), capture)

    @property
    def captured(self) -> int:
        """CUDA graphs captured so far (one per batch shape)."""
        return self._graphs.captured

    def release_graphs(self) -> None:
        """Free the captured graphs (a new call captures again).  Call it before leaving a process
        group whose all-reduces a graph captured: NCCL's communicator cannot be destroyed while
        such a graph lives (destroy_process_group would hang; pytorch/pytorch#115388)."""
        self._graphs.release()

    def loss_total(self) -> float:
        """The accumulated sum of loss x targets (a device read: it waits for queued steps)."""
        return self.loss_sum.item()

    def _run(self, inputs: _Inputs) -> None:
        """The step's kernels: forward, backward, clip + AdamW, loss accumulation."""
        if self._seed is None:
            self._body(inputs)
            return
        with minitorch.rng.seeds_from_device(self._seed.buffer):
            self._body(inputs)

    def _body(self, inputs: _Inputs) -> None:
        loss = batch_loss_from_tensors(
            self.model, inputs.tokens, inputs.targets, inputs.weights, self.loss_kind, self.label_smoothing
        )
        self.optimizer.zero_grad()
        (loss * inputs.share).backward()
        if self.gradient_sync is not None:
            self.gradient_sync()
        self.optimizer.update()
        with minitorch.no_grad():
            self.loss_sum.copy_(self.loss_sum + loss.detach() * inputs.n_targets)


class StepTimer:
    """Per-step times without host waits: CUDA events recorded after each step (read at the end),
    or the host clock on the CPU.  Steps marked not steady (eager first runs and captures of a new
    shape) are left out of the median."""

    def __init__(self, backend: TensorBackend):
        self.cuda = backend.cuda
        self._marks: list = []

    def start(self) -> None:
        """Begin an epoch: the reference point of its first step."""
        self._marks = [(self._now(), 0, False)]

    def mark(self, tokens: int, steady: bool) -> None:
        """A step of `tokens` real tokens has been queued."""
        self._marks.append((self._now(), tokens, steady))

    def median_tokens_per_s(self) -> Optional[float]:
        """Median over steady steps of tokens / step time (None without steady steps)."""
        rates = []
        for (t0, _, _), (t1, tokens, steady) in zip(self._marks, self._marks[1:]):
            seconds = self._seconds(t0, t1)
            if steady and seconds > 0:
                rates.append(tokens / seconds)
        return float(np.median(rates)) if rates else None

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = runtime().torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _seconds(self, t0: Any, t1: Any) -> float:
        if not self.cuda:
            return t1 - t0
        t1.synchronize()
        return t0.elapsed_time(t1) / 1000.0
