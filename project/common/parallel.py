"""Data parallelism shared by the training programs: this process's place in a torchrun launch,
the gradient synchronizer, and the collectives a program needs (sums, agreed flags, rank-0 output).

Under `torchrun --nproc_per_node N` every process builds the same model; DistributedDataParallel
broadcasts rank 0's values and combines the gradients during backward.  A plain `python` run is
the same code with N = 1, no process group and no communication.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

import minitorch
from minitorch import distributed


class DataParallel:
    """This process's rank and world size, the gradient synchronizer and the collectives a
    training program needs under torchrun; without torchrun N = 1 and they change nothing.

    backend: the program's --backend: "cuda" (NCCL; GPU LOCAL_RANK is made current, so build this
    before anything touches CUDA), "cpu" (gloo) or "auto" (NCCL where torch sees a GPU).
    """

    def __init__(self, backend: str):
        self.info = distributed.init_from_torchrun(_device(backend))
        self.ddp: Optional[distributed.DistributedDataParallel] = None

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that prints, evaluates and writes files."""
        return self.info.is_main

    def wrap(self, model: minitorch.Module, gradient_weight: Optional[float] = None) -> None:
        """Combine the model's gradients over the processes when there is a process group (rank 0's
        initial values are broadcast): the sum of each process's gradient x gradient_weight (default
        1 / N: the mean); with no group, training is untouched."""
        if distributed.is_initialized():
            self.ddp = distributed.DistributedDataParallel(model)
            if gradient_weight is not None:
                self.ddp.gradient_weight = gradient_weight

    @property
    def gradient_sync(self) -> Optional[Callable[[], None]]:
        """What the step calls between backward and the optimizer (None without a group)."""
        return None if self.ddp is None else self.ddp.sync_gradients

    def decorrelate_rng(self) -> None:
        """Give each rank its own dropout stream, derived from the current (seeded or resumed)
        state and the rank; rank 0 keeps the state as it is, so one process runs as without torchrun."""
        if self.rank:
            state = minitorch.get_rng_state()["state"]["state"]
            minitorch.manual_seed(int(np.random.default_rng([state, self.rank]).integers(2**63 - 1)))

    def agree(self, now: bool, *flags: Any) -> Tuple[bool, ...]:
        """Flags (a stop signal, a save that is due) that every process acts on at the same step:
        alone, each as it is; in a group, whether any process raised it, compared only when `now`
        (every --log-every steps: the comparison waits for the GPU) and False in between."""
        if self.world_size == 1:
            return tuple(bool(f) for f in flags)
        if not now:
            return tuple(False for _ in flags)
        return tuple(total > 0 for total in self.sum(*(float(bool(f)) for f in flags)))

    def sum(self, *values: float) -> List[float]:
        """Each value summed over the processes."""
        return distributed.all_reduce_sum(values)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print on rank 0 only."""
        if self.is_main:
            print(*args, **kwargs)

    def main_first(self) -> contextlib.AbstractContextManager:
        """Rank 0 runs the block first (trains and saves the tokenizer), the others after it."""
        return distributed.main_process_first()

    def barrier(self) -> None:
        distributed.barrier()

    def close(self) -> None:
        """Leave the process group (after every process got here)."""
        if self.ddp is not None:
            self.ddp.close()
        distributed.destroy_process_group()


def _device(backend: str) -> str:
    if backend != "auto":
        return backend
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
