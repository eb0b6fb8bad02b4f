"""Data parallelism shared by the training programs: this process's place in a torchrun launch, how
a step's global batch is split over the processes and into micro-batches, the gradient
synchronizer and optimizer (plain or ZeRO-1), the watchdog, and the collectives a program needs
(sums, agreed flags, rank-0 output).

The recipe does not depend on the number of processes: --batch-size is the global batch of a step,
split over the N processes, and a process whose share is larger than --micro-batch-size runs it as
several forward/backward passes whose gradients are summed (each pass's loss weighted by its part
of the step), so the same command trains the same way on 1, 2 or 4 GPUs, up to floating-point
order (and dropout, whose masks are drawn per process).  --scale-batch-with-world true keeps the
batch per process instead (a global batch of N x --batch-size) and scales the peak learning rate
by --lr-scaling.  Under torchrun every process builds the same model; DistributedDataParallel
broadcasts rank 0's values and combines the gradients during backward (--zero 1: reduce-scattered,
each process updating its shard of the weights and AdamW moments).  A plain `python` run is the same
code with N = 1 and no process group.

A lost process (killed, crashed) ends the others within --lost-rank-timeout seconds with a message
naming it and how to resume (the watchdog of minitorch.distributed); collectives time out after
--dist-timeout seconds; where processes wait on rank 0's long work (evaluation, writing files) they
wait through the store, without a time limit, guarded by the watchdog.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from datetime import timedelta
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

import minitorch
from minitorch import distributed
from project.common.options import POSITIVE, POSITIVE_INT, InputError, str2bool

# The peak learning rate for N processes under --scale-batch-with-world (a global batch N times
# --batch-size), from --lr.
LR_SCALING: Dict[str, Callable[[int], float]] = {"none": lambda n: 1.0, "sqrt": math.sqrt, "linear": float}
DEFAULTS = {"micro_batch_size": None, "zero": 0, "scale_batch_with_world": False, "lr_scaling": "linear",
            "dist_timeout": 120.0, "lost_rank_timeout": 30.0}  # fmt: skip


def add_parallel_options(parser: argparse.ArgumentParser, rows: str) -> Any:
    """The data-parallel options as a group of parser; rows: what a batch counts (e.g. "pairs")."""
    group = parser.add_argument_group("data parallel (torchrun --nproc_per_node N [--nnodes M])")
    group.add_argument("--micro-batch-size", type=POSITIVE_INT, default=DEFAULTS["micro_batch_size"],
                       help=f"most {rows} per forward/backward pass: a process's share of the step larger than this "
                       "is run as several passes whose gradients are summed (None: the whole share in one)")
    group.add_argument("--zero", type=int, choices=(0, 1), default=DEFAULTS["zero"],
                       help="1: ZeRO stage 1, gradients reduce-scattered and each process updating its 1/N shard of "
                       "the float32 weights and AdamW moments (optimizer memory / N); the same training")
    group.add_argument("--scale-batch-with-world", type=str2bool, default=DEFAULTS["scale_batch_with_world"],
                       metavar="true|false",
                       help="true: --batch-size is per process, the global batch N x --batch-size, and the peak "
                       "learning rate --lr x the --lr-scaling factor of N (false: --batch-size is the global batch, "
                       "the same training on any N)")
    group.add_argument("--lr-scaling", choices=tuple(LR_SCALING), default=DEFAULTS["lr_scaling"],
                       help="with --scale-batch-with-world true and N processes, the peak lr is --lr x 1, sqrt(N) "
                       "or N (linear: the rule of Goyal et al. for a batch N times larger)")
    group.add_argument("--dist-timeout", type=POSITIVE, default=DEFAULTS["dist_timeout"],
                       help="seconds a collective (gradient reduction, sums) may wait for the other processes before "
                       "the job fails")
    group.add_argument("--lost-rank-timeout", type=POSITIVE, default=DEFAULTS["lost_rank_timeout"],
                       help="seconds without a heartbeat after which a process counts as lost: the others exit "
                       f"(status {distributed.LOST_PEER_EXIT}) naming it, the last checkpoint intact")
    return group


class DataParallel:
    """This process's rank and world size, the split of a step's batch, the gradient synchronizer,
    the optimizer and the collectives a training program needs under torchrun; without torchrun
    N = 1 and they change nothing.

    backend: the program's --backend: "cuda" (NCCL; GPU LOCAL_RANK is made current, so build this
    before anything touches CUDA), "cpu" (gloo) or "auto" (NCCL where torch sees a GPU).  options:
    the values of add_parallel_options (missing ones take their defaults); resume_hint: how to go on
    from the last checkpoint, said when a lost process ends the job.
    """

    def __init__(self, backend: str, options: Optional[Mapping[str, Any]] = None, resume_hint: str = ""):
        self.options = {**DEFAULTS, **{k: v for k, v in (options or {}).items() if k in DEFAULTS}}
        timeout = timedelta(seconds=self.options["dist_timeout"])
        self.info = distributed.init_from_torchrun(_device(backend), timeout)
        if self.world_size > 1:
            distributed.start_watchdog(self.options["lost_rank_timeout"], resume_hint)
        self.sync: Optional[distributed.GradientAccumulator] = None
        self._before_close: List[Callable[[], None]] = []

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

    # ---- the batch of a step ------------------------------------------------------------------
    @property
    def scale_batch(self) -> bool:
        """--scale-batch-with-world: --batch-size per process instead of per step."""
        return bool(self.options["scale_batch_with_world"])

    def global_batch(self, batch_size: int) -> int:
        """Rows of a step over all processes."""
        return batch_size * self.world_size if self.scale_batch else batch_size

    def peak_lr(self, lr: float) -> float:
        """--lr, scaled by --lr-scaling where the global batch grows with the processes."""
        return lr * LR_SCALING[self.options["lr_scaling"]](self.world_size) if self.scale_batch else lr

    def process_rows(self, batch_size: int) -> int:
        """Rows of a whole step this process trains: its share of the global batch (rows r, r + N,
        ... of it), or --batch-size itself under --scale-batch-with-world.  InputError where a
        process would get none."""
        if not self.scale_batch and batch_size < self.world_size:
            raise InputError(f"--batch-size {batch_size} (the global batch) leaves some of the {self.world_size} "
                             f"processes without rows: give at least {self.world_size}, or --scale-batch-with-world true")
        return batch_size if self.scale_batch else len(range(self.rank, batch_size, self.world_size))

    def micro_slices(self, rows: int) -> List[slice]:
        """A process's rows of a step cut into consecutive micro-batches of at most --micro-batch-size."""
        size = self.options["micro_batch_size"] or max(rows, 1)
        return [slice(start, min(start + size, rows)) for start in range(0, rows, size)]

    # ---- gradients and optimizer --------------------------------------------------------------
    def wrap(self, model: minitorch.Module, micro_batches: bool, gradient_weight: float = 1.0) -> None:
        """Combine the model's gradients over the processes when there is a process group (rank 0's
        initial values are broadcast; --zero 1 shards them), or sum them over micro-batches when one
        process runs several per step (micro_batches); else training is untouched.  The reduced
        gradient is the sum of each process's gradient x gradient_weight (the programs' losses carry
        their part of the step, so 1)."""
        if distributed.is_initialized():
            self.sync = distributed.DistributedDataParallel(model, shard=self.options["zero"] == 1)
            self.sync.gradient_weight = gradient_weight
        elif micro_batches:
            self.sync = distributed.GradientAccumulator(model)

    def optimizer(self, model: minitorch.Module, **hyper: Any) -> minitorch.AdamW:
        """AdamW(**hyper) over the model's parameters, or ShardedAdamW under --zero 1 in a group
        (call wrap first)."""
        if isinstance(self.sync, distributed.DistributedDataParallel) and self.sync.sharded:
            return distributed.ShardedAdamW(self.sync, **hyper)
        return minitorch.AdamW(model.parameters(), **hyper)

    def optimizer_state(self, optimizer: minitorch.AdamW) -> Optional[Dict[str, Any]]:
        """The optimizer's state_dict on rank 0, for its checkpoint (None elsewhere); under --zero 1
        every process calls this (the moments are gathered from all)."""
        if self.is_main or isinstance(optimizer, distributed.ShardedAdamW):
            state = optimizer.state_dict()
            return state if self.is_main else None
        return None

    @property
    def gradient_sync(self) -> Optional[distributed.GradientAccumulator]:
        """What the step runs its backward passes through (None: one pass, nothing to combine)."""
        return self.sync

    def decorrelate_rng(self) -> None:
        """Give each rank its own dropout stream, derived from the current (seeded or resumed)
        state and the rank; rank 0 keeps the state as it is, so one process runs as without torchrun."""
        if self.rank:
            state = minitorch.get_rng_state()["state"]["state"]
            minitorch.manual_seed(int(np.random.default_rng([state, self.rank]).integers(2**63 - 1)))

    # ---- collectives --------------------------------------------------------------------------
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

    def barrier(self, name: str = "barrier") -> None:
        """Every process waits here for the others, without a time limit (rank 0 may be evaluating
        or writing files; a lost process still ends the wait, through the watchdog)."""
        distributed.barrier(name)

    def before_close(self, release: Callable[[], None]) -> None:
        """Run release() when the program leaves the group (e.g. free CUDA graphs that captured
        collectives: NCCL cannot be shut down under them)."""
        self._before_close.append(release)

    def close(self) -> None:
        """Leave the process group (after every process got here)."""
        for release in self._before_close:
            release()
        if self.sync is not None:
            self.sync.close()
        distributed.destroy_process_group()

    def __enter__(self) -> "DataParallel":
        return self

    def __exit__(self, kind: Any, error: Optional[BaseException], trace: Any) -> None:
        """close(), also when the program fails.  A failure that a lost process caused (a collective
        whose peer vanished) ends up here, and while close() waits for the others the watchdog names
        the lost process and ends this one; the failure is said first, in one line."""
        if error is not None and self.world_size > 1:
            first = str(error).splitlines()[0] if str(error) else ""
            print(f"rank {self.rank}: {type(error).__name__}: {first}; waiting for the other processes",
                  file=sys.stderr, flush=True)  # fmt: skip
        self.close()


def _device(backend: str) -> str:
    if backend != "auto":
        return backend
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_divisible(batch_size: int, world_size: int) -> None:
    """InputError unless a global batch of batch_size rows splits evenly over the processes (each
    process reads its own equal slice of every sample of the data)."""
    if batch_size % world_size:
        raise InputError(f"--batch-size {batch_size} (the global batch) does not split evenly over {world_size} "
                         f"processes: choose a multiple of {world_size}, or --scale-batch-with-world true")
