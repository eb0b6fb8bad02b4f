"""The training step of the programs, run so that the host never waits on the GPU, and its timer.

`TrainStep.run(micro, lr)` queues one update over the step's micro-batches (usually one): for each,
forward and loss (the program's `loss` function of the micro-batch's inputs, weighted by its part
of the step) and backward, whose gradients the synchronizer sums over the micro-batches and
combines over the processes (data parallel: minitorch.distributed); then global-norm clip and
AdamW, with the step's tally (e.g. the loss times its target tokens) summed into a device
accumulator (`loss_sum`, read every N steps by the caller). A program supplies only its loss
function and the values of its inputs: numpy arrays by name (token ids, targets, weights, scalars as
shape-(1,) arrays), whose shapes, with the micro-batch's place in the step, are the graph's key. The inputs go to the device as one queued copy
(minitorch.graphs.StepInputs); on CUDA with graphs on, the first step of each key runs eagerly and
is then captured in a CUDA graph (minitorch.graphs.StepGraphs, all keys in one memory pool) that
later steps of that key replay: one launch instead of a Python dispatch per kernel. The step's
random kernels (dropout) draw from a device seed advanced every step (minitorch.graphs.StepSeed), so
an eager run and a graph run from the same seed compute the same updates. The forward pass and loss
run in the step's dtype (--dtype, project/common/precision.py): in bf16 the graph captures the
products on the weights' bfloat16 working copies, and AdamW's update, which rewrites those copies,
is part of the same graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import minitorch
from minitorch import Tensor, TensorBackend
from minitorch.distributed import GradientAccumulator
from minitorch.graphs import StepGraphs, StepInputs, StepSeed
from project.common.precision import compute_precision

# The program's loss of one step's inputs: (what backward starts from, what the loss sum adds up).
LossFunction = Callable[[StepInputs], Tuple[Tensor, Tensor]]


class TrainStep:
    """One training update per run() (see the module docstring).

    loss: the program's LossFunction; use_graphs: capture and replay CUDA graphs (CUDA only);
    gradient_sync: what backward runs through (minitorch.distributed's GradientAccumulator, or its
    DistributedDataParallel: sums the micro-batches' gradients, combines them over the processes);
    None runs one plain backward per step; dtype: the --dtype the loss function runs in ("fp32" or
    "bf16")."""

    def __init__(
        self, optimizer: minitorch.AdamW, backend: TensorBackend, loss: LossFunction, use_graphs: bool = False,
        gradient_sync: Optional[GradientAccumulator] = None, dtype: str = "fp32",
    ):  # fmt: skip
        if use_graphs and not backend.cuda:
            raise ValueError("CUDA graphs need the CUDA backend (--backend cuda)")
        self.optimizer, self.backend, self.loss, self.gradient_sync = optimizer, backend, loss, gradient_sync
        self.use_graphs, self.dtype = use_graphs, dtype
        self.loss_sum = minitorch.zeros((1,), backend=backend)
        self._inputs: Dict[Tuple[Any, ...], StepInputs] = {}
        self._graphs = StepGraphs(use_graphs)
        self._seed = StepSeed(backend)

    def run(self, micro: Sequence[Mapping[str, np.ndarray]], lr: float, capture: bool = True) -> bool:
        """Queue one update over the micro-batches' inputs at learning rate lr; True when every
        micro-batch ran as a graph replay. capture=False: keys not seen before run eagerly and stay
        uncaptured (shapes that come once, such as an epoch's short last batch)."""
        if not micro:
            raise ValueError("a training step needs at least one micro-batch")
        if len(micro) > 1 and self.gradient_sync is None:
            raise ValueError(f"{len(micro)} micro-batches in a step need a gradient accumulator (gradient_sync)")
        self.optimizer.lr = lr
        self.optimizer.begin_step()
        replayed = True
        for i, values in enumerate(micro):
            parts = {name: tuple(np.shape(value)) for name, value in values.items()}
            shapes = tuple(parts.items())
            inputs = self._inputs.get(shapes)
            if inputs is None:
                inputs = self._inputs[shapes] = StepInputs(parts, self.backend)
            inputs.upload(**values)
            self._seed.advance()
            first, last = i == 0, i == len(micro) - 1
            body = lambda: self._body(inputs, first, last)  # noqa: E731 (run now, inside graphs.run)
            replayed = self._graphs.run((shapes, first, last), body, capture) and replayed
        return replayed

    @property
    def captured(self) -> int:
        """CUDA graphs captured so far (one per key)."""
        return self._graphs.captured

    def release_graphs(self) -> None:
        """Free the captured graphs (a new step captures again). Call it before leaving a process
        group whose all-reduces a graph captured: NCCL's communicator cannot be destroyed while such
        a graph lives (destroy_process_group would hang; pytorch/pytorch#115388)."""
        self._graphs.release()

    def loss_total(self) -> float:
        """The accumulated sum of the steps' tallies (a device read: it waits for queued steps)."""
        return self.loss_sum.item()

    def reset_loss(self, value: float = 0.0) -> None:
        """Set the accumulated sum (a new epoch starts from 0, a resumed one from its saved sum)."""
        self.loss_sum.copy_(value)

    def _body(self, inputs: StepInputs, first: bool, last: bool) -> None:
        """A micro-batch's kernels: forward, backward (its gradients summed into the earlier
        micro-batches' and, for the last, combined over the processes), clip + AdamW after the last,
        loss accumulation."""
        with self._seed.scope():
            with compute_precision(self.dtype):
                objective, tally = self.loss(inputs)
            self.optimizer.zero_grad()
            if self.gradient_sync is None:
                objective.backward()
            else:
                with self.gradient_sync.backward_round(accumulate=not first, reduce=last):
                    objective.backward()
            if last:
                self.optimizer.update()
            with minitorch.no_grad():
                self.loss_sum.copy_(self.loss_sum + tally.detach())


class StepTimer:
    """Per-step times without host waits: CUDA events recorded after each step (read at the end),
    or the host clock on the CPU. Steps marked not steady (eager first runs and captures of a new
    shape) are left out of the median."""

    def __init__(self, backend: TensorBackend):
        self.cuda = backend.cuda
        self._marks: List[Tuple[Any, int, bool]] = []

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
        import torch  # minitorch queues its kernels on torch's current stream, where the event goes

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _seconds(self, t0: Any, t1: Any) -> float:
        if not self.cuda:
            return t1 - t0
        t1.synchronize()
        return t0.elapsed_time(t1) / 1000.0
