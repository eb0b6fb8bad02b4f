"""The training step of the translation program: the common TrainStep (project/common/train_step.py:
no host waits, CUDA-graph replay, device dropout seed) with the translation loss of a padded batch.

Batch widths are padded up to a multiple of `WIDTH_MULTIPLE` on CUDA, so a few graphs cover every
batch (padding positions have weight 0 and, with right padding and causal attention, change
nothing for the real ones). A micro-batch's inputs are its tokens, targets and weights, and two
scalars of data parallelism and accumulation (project/translation/parallel.py): its share of the
step's target tokens and the targets its loss counts. Both are device values, so a replayed graph
takes each step's own.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

import minitorch
from minitorch import DecoderLM, Tensor, TensorBackend
from minitorch.distributed import GradientAccumulator
from minitorch.graphs import StepInputs
from project.common.train_step import TrainStep
from project.translation.batches import Batch
from project.translation.model import batch_loss_from_tensors
from project.translation.parallel import MicroBatch
from project.translation.tokenizer import PAD_ID

WIDTH_MULTIPLE = 8


def pad_width(batch: Batch, multiple: int) -> Batch:
    """The batch with its width padded up to a multiple of `multiple` (pad tokens, weight 0)."""
    extra = -batch.tokens.shape[1] % multiple
    if extra == 0:
        return batch
    pad = ((0, 0), (0, extra))
    return Batch(
        tokens=np.pad(batch.tokens, pad, constant_values=PAD_ID),
        targets=np.pad(batch.targets, pad, constant_values=PAD_ID),
        weights=np.pad(batch.weights, pad),
    )


class TranslationStep(TrainStep):
    """One training update per call, of a Batch or of a step's micro-batches.

    loss_kind and label_smoothing: see model.batch_loss; use_graphs: capture and replay CUDA graphs
    (CUDA only); graph_batch_size: a call with one batch is captured only with this many rows (the
    short last batch of an epoch runs eagerly); gradient_sync: what backward runs through (TrainStep);
    dtype: --dtype ("fp32" or "bf16")."""

    def __init__(
        self, model: DecoderLM, optimizer: minitorch.AdamW, backend: TensorBackend, loss_kind: str,
        use_graphs: bool, graph_batch_size: Optional[int] = None, label_smoothing: float = 0.0,
        gradient_sync: Optional[GradientAccumulator] = None, dtype: str = "fp32",
    ):  # fmt: skip
        super().__init__(optimizer, backend, self._loss, use_graphs, gradient_sync, dtype)
        self.model, self.loss_kind, self.label_smoothing = model, loss_kind, label_smoothing
        self.graph_batch_size = graph_batch_size

    def __call__(self, batch: Batch, lr: float, share: float = 1.0, n_targets: Optional[int] = None) -> bool:
        """Queue one update of `batch` at learning rate `lr`; True when it ran as a graph replay.

        Data parallel: backward starts from loss x share, this process's part of the step's target
        tokens (1 alone; 0 for a stand-in batch), and the loss sum counts n_targets tokens (default:
        the batch's; 0 for a stand-in)."""
        counted = batch.n_targets if n_targets is None else n_targets
        whole = self.graph_batch_size is None or batch.tokens.shape[0] == self.graph_batch_size
        return self.accumulate([MicroBatch(batch, counted, share)], lr, capture=whole)

    def accumulate(self, micro: Sequence[MicroBatch], lr: float, capture: bool = True) -> bool:
        """Queue one update whose gradient sums the micro-batches' (each loss x its share); True when
        every micro-batch ran as a graph replay.  capture=False: shapes not seen before run eagerly
        and stay uncaptured (the short last step of an epoch)."""
        values = []
        for part in micro:
            batch = pad_width(part.batch, WIDTH_MULTIPLE) if self.backend.cuda else part.batch
            values.append({
                "tokens": batch.tokens, "targets": batch.targets.reshape(-1), "weights": batch.weights.reshape(-1),
                "share": np.array([part.share]), "n_targets": np.array([part.n_targets]),
            })  # fmt: skip
        return self.run(values, lr, capture)

    def _loss(self, inputs: StepInputs) -> Tuple[Tensor, Tensor]:
        loss = batch_loss_from_tensors(
            self.model, inputs["tokens"], inputs["targets"], inputs["weights"], self.loss_kind, self.label_smoothing
        )
        return loss * inputs["share"], loss * inputs["n_targets"]
