"""Training pieces of the GPT-2 program (main.py): its step over the common TrainStep, the validation
loss, the resumable training state (the model in llm.c's format beside a run checkpoint) and the
loss plot.

A run's llm.c model files are in its --dtype, as llm.c's trainers write them: float32 (version 3)
or, for bf16, bfloat16 (version 5). Beside a bfloat16 model.bin the run checkpoint keeps the float32
master weights (as llm.c keeps them in its state file), so a bf16 run resumes exactly, in either
dtype.

Per step the host sends one batch (two [B, T] arrays, one queued copy) and reads back the loss (and
the gradient norm when clipping); everything else stays on the backend, and on CUDA a step can be
one graph replay.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Tuple

import numpy as np

import minitorch
from minitorch import Tensor
from minitorch.distributed import GradientAccumulator
from minitorch.graphs import StepInputs, StepReadout
from project.common.checkpoint import CheckpointError, load_checkpoint, restore_optimizer, save_checkpoint
from project.common import evaluation
from project.common.metrics import Panel, Series, plot_records
from project.common.train_step import TrainStep
from project.gpt2.model import GPT2
from project.gpt2.shards import ShardLoader

STATE_MODEL = "model.bin"
STATE_NAME = "state.npz"
CHECKPOINT_KIND = "gpt2"
CHECKPOINT_PREFIX = "checkpoint_"
LLMC_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # --dtype -> the dtype of the run's llm.c model files
LOSS_PANEL = Panel("loss", "cross-entropy loss", (Series("loss", "train", "-"), Series("val_loss", "val")))


class GPT2Step(TrainStep):
    """One update per call on a [B, T] batch (this process's rows of the step): loss, backward through
    gradient_sync (data parallel: the gradients combined over the processes), AdamW at the call's lr
    (which clips the gradients' global norm when it has a max_grad_norm). Returns (this process's
    part of the step's loss, gradient norm before clipping, or None when the optimizer does not
    clip). use_graphs (CUDA only): capture the step in a CUDA graph per batch shape and replay it
    (project/common/train_step.py); dtype: --dtype ("fp32" or "bf16").

    micro_slices: the rows of each forward/backward pass (several: their gradients are summed through
    gradient_sync; default: all rows at once); weight: this process's part of the step (its rows /
    the global batch's), by which its loss is scaled, so that the sum over the processes of their
    gradients and of their returned losses is the step's."""

    def __init__(
        self, model: GPT2, optimizer: minitorch.AdamW, loss_kind: str,
        gradient_sync: Optional[GradientAccumulator] = None, use_graphs: bool = False, dtype: str = "fp32",
        micro_slices: Optional[Sequence[slice]] = None, weight: float = 1.0,
    ):  # fmt: skip
        super().__init__(optimizer, model.backend, self._loss, use_graphs, gradient_sync, dtype)
        self.model, self.loss_kind = model, loss_kind
        self.micro_slices, self.weight = micro_slices, weight
        # One pass with weight 1 (one process): backward starts at the loss itself, whose gradients the
        # fused head hands over as it made them (no scaling pass over the [V, C] head gradient).
        self._scaled = weight != 1.0 or (micro_slices is not None and len(micro_slices) > 1)

    def __call__(self, inputs: np.ndarray, targets: np.ndarray, lr: float) -> Tuple[float, Optional[float]]:
        """Run one step and wait for it: (loss, gradient norm or None)."""
        return self.queue(inputs, targets, lr).result()

    def queue(self, inputs: np.ndarray, targets: np.ndarray, lr: float) -> "QueuedStep":
        """Queue one step without waiting for the GPU; its result() waits for it (so a caller that
        prepares and queues the next step first keeps the GPU busy through its own host work)."""
        rows = inputs.shape[0]
        micro = []
        for part in self.micro_slices or [slice(0, rows)]:
            share = self.weight * (part.stop - part.start) / rows
            micro.append({"ids": self.model.check_ids(inputs[part]), "targets": self.model.check_ids(targets[part]),
                          "weight": np.array([share])})  # fmt: skip
        self.run(micro, lr)
        clipping = bool(self.optimizer.max_grad_norm)
        readout = StepReadout([self.loss_sum, self.optimizer.grad_norm()] if clipping else [self.loss_sum])
        self.reset_loss()
        return QueuedStep(readout, clipping)

    def _loss(self, inputs: StepInputs) -> Tuple[Tensor, Tensor]:
        loss = self.model.loss(inputs["ids"], inputs["targets"], self.loss_kind)
        if self._scaled:
            loss = loss * inputs["weight"]
        return loss, loss


class QueuedStep:
    """A queued GPT2Step: result() waits for it and gives (its loss, gradient norm before clipping or
    None when the optimizer does not clip)."""

    def __init__(self, readout: StepReadout, clipping: bool):
        self._readout, self._clipping = readout, clipping

    def result(self) -> Tuple[float, Optional[float]]:
        values = self._readout.values()
        return values[0], values[1] if self._clipping else None


def validation_loss(model: GPT2, loader: ShardLoader, batches: int, loss_kind: str) -> float:
    """Mean loss over the first ``batches`` batches of ``loader`` (from its start, as llm.c does;
    under data parallelism this process's part of them, to be averaged over the processes)."""
    if batches < 1:
        raise ValueError(f"validation needs at least one batch, got {batches}")
    loader.reset()

    def loss_of(batch: Tuple[np.ndarray, np.ndarray]) -> Tuple[Tensor, float]:
        return model.loss(model.token_ids(batch[0]), model.token_ids(batch[1]), loss_kind), 1.0

    return evaluation.validation_loss(model, (loader.next_batch() for _ in range(batches)), loss_of, batches, show=False)


def save_training_state(
    directory: str | os.PathLike, model: GPT2, optimizer_state: Mapping[str, Any], step: int, loader: ShardLoader,
    config: Mapping[str, Any],
) -> Path:  # fmt: skip
    """Write ``directory/model.bin`` (llm.c's checkpoint format, in ``config["dtype"]``), then
    ``directory/state.npz`` (a run checkpoint: the run's ``config``, steps done, AdamW's step count
    and moments as its state_dict gives them, the training loader's position and, beside a bfloat16
    model.bin, the float32 master weights in llm.c's layout); each atomically, state.npz last, so a
    directory with one is complete."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    dtype = LLMC_DTYPES[config.get("dtype", "fp32")]
    model.save_checkpoint(directory / STATE_MODEL, dtype)
    state = {"step": step, "optimizer": dict(optimizer_state), "train_loader": loader.state()}
    if dtype != "float32":
        state["master_weights"] = model.llmc_params()
    save_checkpoint(directory / STATE_NAME, CHECKPOINT_KIND, config, state)
    return directory


def load_training_state(
    directory: str | os.PathLike, model: GPT2, optimizer: minitorch.AdamW, loader: ShardLoader
) -> dict[str, Any]:
    """Restore what ``save_training_state`` wrote beside ``directory/model.bin``, which the model
    was built from: the float32 master weights where it keeps them, the optimizer and the loader
    position; returns the saved state (``step`` among it)."""
    checkpoint = load_checkpoint(Path(directory) / STATE_NAME, CHECKPOINT_KIND)
    if "master_weights" in checkpoint.state:
        model.load_llmc_params(checkpoint.state["master_weights"])
    restore_optimizer(checkpoint.path, optimizer, checkpoint.state["optimizer"])
    try:
        loader.load_state(checkpoint.state["train_loader"])
    except (KeyError, ValueError) as err:
        raise CheckpointError(f"{checkpoint.path} does not fit these training shards: {err}") from None
    return checkpoint.state


def checkpoint_directory(out_dir: str | os.PathLike, step: int) -> Path:
    """Where a run saves its checkpoint of a step: ``<out_dir>/checkpoint_NNNNNN``."""
    return Path(out_dir) / f"{CHECKPOINT_PREFIX}{step:06d}"


def prune_checkpoints(out_dir: str | os.PathLike, keep: int) -> list[Path]:
    """Remove all but the newest `keep` checkpoint directories of out_dir (keep 0: remove none);
    returns those removed."""
    found = sorted(p for p in Path(out_dir).glob(f"{CHECKPOINT_PREFIX}[0-9]*") if p.is_dir())
    removed = found[:-keep] if keep else []
    for directory in removed:
        shutil.rmtree(directory)
    return removed


def plot_losses(records: Sequence[Mapping[str, Any]], path: str | os.PathLike, title: str) -> Path:
    """PNG of the training loss per step and the validation losses of the metric records."""
    return plot_records(records, path, "step", [LOSS_PANEL], title)
