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

from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Sequence, Tuple

import numpy as np

import minitorch
from project.translation.batches import Batch, Batcher, make_batch
from project.translation.tokenizer import EOS_DE_ID
from project.common.parallel import DataParallel


@dataclass(frozen=True)
class ShardStep:
    """One process's part of a training step."""

    batch: Batch
    n_targets: int  # target tokens this process's loss counts (0 for a stand-in batch)
    share: float  # n_targets / the step's target tokens: the factor of this process's loss
    first_batch: int  # position in the epoch of the step's first batch (the schedule's clock)
    step_tokens: int  # input tokens of the whole step, all processes together (for tokens/s)


class TranslationParallel(DataParallel):
    """DataParallel with the translation program's steps: a Batcher's epochs cut into groups."""

    def __init__(self, backend: str):
        super().__init__(backend)
        self._counts: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}

    def wrap(self, model: minitorch.Module, gradient_weight: Optional[float] = 1.0) -> None:
        """DataParallel.wrap with weight 1: each process's loss already carries its share."""
        super().wrap(model, gradient_weight)

    def steps_per_epoch(self, batcher: Batcher) -> int:
        return -(-len(batcher) // self.world_size)

    def steps(self, batcher: Batcher) -> Iterator[ShardStep]:
        """This process's part of each step of the batcher's next epoch (shard_steps); the
        per-sequence counts are computed once per batcher, not every epoch."""
        if id(batcher) not in self._counts:
            self._counts = {id(batcher): sequence_counts(batcher.sequences)}
        return shard_steps(batcher, self.rank, self.world_size, self._counts[id(batcher)])


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
