"""Data parallelism for the translation program: this process's place in a torchrun launch, its
batch of every step, and the sums over processes that the metrics need.

Under `torchrun --nproc_per_node N`, a step takes N consecutive batches of the epoch (every process
draws the same epoch from the same seed) and process r trains on the r-th.  Each process scales
its token-mean loss by its share of the step's target tokens and the gradients are summed
(DistributedDataParallel with gradient_weight 1), so a step equals one process training on the N
batches together, whatever their sizes; the share is a device value of the step (TrainStep), so
captured CUDA graphs replay it.  When an epoch's batches do not divide by N, the processes left
without a batch in the last step run a stand-in (the step's first batch) with share 0.  Batches are counted as handed out a whole step at a time, so a
checkpoint taken by rank 0 resumes with any N.  A plain `python` run is the same code with N = 1,
no process group and no communication.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

import minitorch
from minitorch import distributed
from project.mt_data import EOS_DE_ID, Batch, Batcher, make_batch


@dataclass(frozen=True)
class ShardStep:
    """One process's part of a training step."""

    batch: Batch
    n_targets: int  # target tokens this process's loss counts (0 for a stand-in batch)
    share: float  # n_targets / the step's target tokens: the factor of this process's loss
    first_batch: int  # position in the epoch of the step's first batch (the schedule's clock)
    step_tokens: int  # input tokens of the whole step, all processes together (for tokens/s)


class DataParallel:
    """This process's rank and world size, the gradient synchronizer, and the step iterator.

    backend: the program's --backend: "cuda" (NCCL; GPU LOCAL_RANK is made current, so build this
    before anything touches CUDA), "cpu" (gloo) or "auto" (NCCL where torch sees a GPU).
    """

    def __init__(self, backend: str):
        self.info = distributed.init_from_torchrun(_device(backend))
        self.ddp: Optional[distributed.DistributedDataParallel] = None
        self._counts: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}

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

    def wrap(self, model: minitorch.Module) -> None:
        """Sum the model's gradients over the processes when there is a process group (rank 0's
        initial values are broadcast; the losses carry the shares); with none, training is untouched."""
        if distributed.is_initialized():
            self.ddp = distributed.DistributedDataParallel(model)
            self.ddp.gradient_weight = 1.0

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

    def steps_per_epoch(self, batcher: Batcher) -> int:
        return -(-len(batcher) // self.world_size)

    def steps(self, batcher: Batcher) -> Iterator[ShardStep]:
        """This process's part of each step of the batcher's next epoch (shard_steps); the
        per-sequence counts are computed once per batcher, not every epoch."""
        if id(batcher) not in self._counts:
            self._counts = {id(batcher): sequence_counts(batcher.sequences)}
        return shard_steps(batcher, self.rank, self.world_size, self._counts[id(batcher)])

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


def sequence_counts(sequences: Sequence[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """Per sequence de <eos_de> en <eos_en>: its target tokens (from the <eos_de> input to the end)
    and its input tokens (all but the last)."""
    lengths = np.array([len(s) for s in sequences])
    return lengths - 1 - np.array([int(np.argmax(s == EOS_DE_ID)) for s in sequences]), lengths - 1


def shard_steps(
    batcher: Batcher, rank: int, world_size: int, counts: Optional[Tuple[np.ndarray, np.ndarray]] = None
) -> Iterator[ShardStep]:
    """Process `rank`'s part of each step of the batcher's next epoch: the rank-th batch of each
    group of world_size consecutive batches (Batcher.epoch_groups), or, in a last group too small
    to give it one, a stand-in with share 0.  counts: sequence_counts of the batcher's sequences."""
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")
    targets, tokens = sequence_counts(batcher.sequences) if counts is None else counts
    groups = batcher.epoch_groups(world_size)
    first_batch = batcher.state_dict()["batches_done"]  # > 0 when resuming inside an epoch
    for group in groups:
        counts = [int(targets[indices].sum()) for indices in group]
        mine = rank < len(group)
        n_targets = counts[rank] if mine else 0
        batch = make_batch([batcher.sequences[i] for i in group[rank if mine else 0]])
        step_tokens = int(sum(tokens[indices].sum() for indices in group))
        yield ShardStep(batch, n_targets, n_targets / sum(counts), first_batch, step_tokens)
        first_batch += len(group)
