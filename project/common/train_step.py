"""The training step of the programs, run so that the host never waits on the GPU, and its timer.

`TrainStep.run(values, lr)` queues one update: forward and loss (the program's `loss` function of
the step's inputs), backward, the gradients' synchronization (data parallel), global-norm clip and
AdamW, with the step's tally (e.g. the loss times its target tokens) summed into a device
accumulator (`loss_sum`, read every N steps by the caller). A program supplies only its loss
function and the values of its inputs: numpy arrays by name (token ids, targets, weights, scalars as
shape-(1,) arrays), whose shapes are the step's key. The inputs go to the device as one queued copy
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
from collections.abc import Callable, Mapping
from typing import Any, Dict, Hashable, List, Optional, Tuple

import numpy as np

import minitorch
from minitorch import Tensor, TensorBackend
from minitorch.graphs import StepGraphs, StepInputs, StepSeed
from project.common.precision import compute_precision

# The program's loss of one step's inputs: (what backward starts from, what the loss sum adds up).
LossFunction = Callable[[StepInputs], Tuple[Tensor, Tensor]]


class TrainStep:
    """One training update per run() (see the module docstring).

    loss: the program's LossFunction; use_graphs: capture and replay CUDA graphs (CUDA only);
    gradient_sync: called between backward and the optimizer (data parallel: combines the gradients
    over the processes); dtype: the --dtype the loss function runs in ("fp32" or "bf16")."""

    def __init__(
        self, optimizer: minitorch.AdamW, backend: TensorBackend, loss: LossFunction, use_graphs: bool = False,
        gradient_sync: Optional[Callable[[], None]] = None, dtype: str = "fp32",
    ):  # fmt: skip
        if use_graphs and not backend.cuda:
            raise ValueError("CUDA graphs need the CUDA backend (--backend cuda)")
        self.optimizer, self.backend, self.loss, self.gradient_sync = optimizer, backend, loss, gradient_sync
        self.use_graphs, self.dtype = use_graphs, dtype
        self.loss_sum = minitorch.zeros((1,), backend=backend)
        self._inputs: Dict[Hashable, StepInputs] = {}
        self._graphs = StepGraphs(use_graphs)
        self._seed = StepSeed(backend)

    def run(self, values: Mapping[str, np.ndarray], lr: float, capture: bool = True) -> bool:
        """Queue one update on the inputs `values` at learning rate lr; True when it ran as a graph
        replay. capture=False: a key not seen before runs eagerly and stays uncaptured (a shape that
        comes once, such as an epoch's short last batch)."""
        parts = {name: tuple(np.shape(value)) for name, value in values.items()}
        key = tuple(parts.items())
        inputs = self._inputs.get(key)
        if inputs is None:
            inputs = self._inputs[key] = StepInputs(parts, self.backend)
        inputs.upload(**values)
        self.optimizer.lr = lr
        self.optimizer.begin_step()
        self._seed.advance()
        return self._graphs.run(key, lambda: self._body(inputs), capture)

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

    def _body(self, inputs: StepInputs) -> None:
        """The step's kernels: forward, backward, synchronization, clip + AdamW, loss accumulation."""
        with self._seed.scope():
            with compute_precision(self.dtype):
                objective, tally = self.loss(inputs)
            self.optimizer.zero_grad()
            objective.backward()
            if self.gradient_sync is not None:
                self.gradient_sync()
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
