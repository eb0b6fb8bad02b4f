"""Data parallelism for the translation program: this process's part of every step's batch, cut into
micro-batches, and the loss shares that make the step one update of the whole batch.

By default --batch-size is the step's global batch: every process draws the same epoch from the
same seed (Batcher), and process r of N takes rows r, r + N, r + 2N, ... of each batch (a batch's
rows come sorted by length, so the processes get rows of about the same lengths and wait little
for one another).  A process whose rows exceed --micro-batch-size runs them as consecutive
micro-batches.  Each micro-batch's token-mean loss is scaled by its share of the step's target
tokens and the gradients are summed (over micro-batches, then processes: DistributedDataParallel
with gradient_weight 1), so a step equals one process training on the whole batch, whatever N and
the micro-batch size; the share is a device value of the step (TrainStep), so captured CUDA graphs
replay it.  With --scale-batch-with-world a step takes N consecutive batches of the epoch
(Batcher.epoch_groups) instead, process r the r-th.  A process left without rows (a short last
batch, or a last group of fewer than N batches) runs a stand-in (the step's first sequence) with
share 0.  Batches are counted as handed out a whole step at a time, so a checkpoint taken by rank 0
resumes with any N, in the same order where the global batch is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from project.common.parallel import DataParallel
from project.translation.batches import Batch, Batcher, make_batch
from project.translation.tokenizer import EOS_DE_ID


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward pass of a step."""

    batch: Batch
    n_targets: int  # target tokens its loss counts (0 for a stand-in)
    share: float  # n_targets / the step's target tokens: the factor of its loss


@dataclass(frozen=True)
class ShardStep:
    """One process's part of a training step."""

    sequences: Tuple[np.ndarray, ...]  # its sequences of the step (a stand-in: the step's first)
    targets: np.ndarray  # target tokens of each of them (zeros for a stand-in)
    step_targets: int  # target tokens of the whole step, all processes together
    first_batch: int  # position in the epoch of the step's first batch (the schedule's clock)
    step_tokens: int  # input tokens of the whole step, all processes together (for tokens/s)
    full: bool  # a step of whole batches (an epoch's last batch may be short: not worth a CUDA graph)

    @property
    def n_targets(self) -> int:
        """Target tokens this process's loss counts (0 for a stand-in)."""
        return int(self.targets.sum())

    @property
    def share(self) -> float:
        """n_targets / the step's target tokens: the factor of this process's loss."""
        return self.n_targets / self.step_targets

    @property
    def batch(self) -> Batch:
        """All its sequences as one batch."""
        return make_batch(self.sequences)

    def micro_batches(self, slices: Sequence[slice]) -> List[MicroBatch]:
        """Its sequences cut at `slices` (DataParallel.micro_slices), each with its share of the step."""
        out = []
        for part in slices:
            n_targets = int(self.targets[part].sum())
            out.append(MicroBatch(make_batch(self.sequences[part]), n_targets, n_targets / self.step_targets))
        return out


class TranslationParallel(DataParallel):
    """DataParallel with the translation program's steps: a Batcher's epochs cut into processes'
    shares (and groups of batches under --scale-batch-with-world)."""

    def __init__(self, backend: str, options: Optional[Mapping[str, Any]] = None, resume_hint: str = ""):
        super().__init__(backend, options, resume_hint)
        self._counts: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}

    @property
    def batches_per_step(self) -> int:
        """Batches of the epoch one step takes (the schedule's clock counts batches)."""
        return self.world_size if self.scale_batch else 1

    def steps_per_epoch(self, batcher: Batcher) -> int:
        return -(-len(batcher) // self.batches_per_step)

    def steps(self, batcher: Batcher) -> Iterator[ShardStep]:
        """This process's part of each step of the batcher's next epoch (shard_steps); the
        per-sequence counts are computed once per batcher, not every epoch."""
        if id(batcher) not in self._counts:
            self._counts = {id(batcher): sequence_counts(batcher.sequences)}
        return shard_steps(batcher, self.rank, self.world_size, self._counts[id(batcher)], split_batches=not self.scale_batch)


def sequence_counts(sequences: Sequence[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """Per sequence de <eos_de> en <eos_en>: its target tokens (from the <eos_de> input to the end)
    and its input tokens (all but the last)."""
    lengths = np.array([len(s) for s in sequences])
    return lengths - 1 - np.array([int(np.argmax(s == EOS_DE_ID)) for s in sequences]), lengths - 1


def shard_steps(
    batcher: Batcher, rank: int, world_size: int, counts: Optional[Tuple[np.ndarray, np.ndarray]] = None,
    split_batches: bool = False,
) -> Iterator[ShardStep]:  # fmt: skip
    """Process `rank`'s part of each step of the batcher's next epoch.  split_batches: a step is one
    batch, whose rows rank, rank + world_size, ... are this process's; else a step is a group of
    world_size consecutive batches (Batcher.epoch_groups), whose rank-th is this process's.  Where
    that leaves no rows, a stand-in with no targets.  counts: sequence_counts of the batcher's sequences."""
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")
    targets, tokens = sequence_counts(batcher.sequences) if counts is None else counts
    groups = batcher.epoch_groups(1 if split_batches else world_size)
    first_batch = batcher.state_dict()["batches_done"]  # > 0 when resuming inside an epoch
    for group in groups:
        if split_batches:
            mine = group[0][rank::world_size]
        else:
            mine = group[rank] if rank < len(group) else group[0][:0]
        step = np.concatenate(group)
        mine_targets = targets[mine] if len(mine) else np.zeros(1, dtype=targets.dtype)
        rows = mine if len(mine) else step[:1]
        full = len(step) == batcher.batch_size * (1 if split_batches else world_size)
        yield ShardStep(tuple(batcher.sequences[i] for i in rows), mine_targets, int(targets[step].sum()),
                        first_batch, int(tokens[step].sum()), full)  # fmt: skip
        first_batch += len(group)
