"""Training pieces of the GPT-2 program (project/train_gpt2.py): llm.c's learning-rate schedule,
one optimization step, validation loss, the resumable training state (the model in llm.c's format
beside a project/run_checkpoint.py archive) and the loss plot.

Per step the host sends one batch (two [B, T] arrays) and reads back the loss (and the gradient
norm when clipping); everything else stays on the backend, and on CUDA a step can be one graph replay.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

import minitorch
from minitorch.cuda.graphs import StepGraphs
from project.gpt2.model import GPT2
from project.gpt2.llmc import ShardLoader
from project.common.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

STATE_MODEL = "model.bin"
STATE_NAME = "state.npz"
CHECKPOINT_KIND = "gpt2"


def learning_rate(step: int, peak: float, warmup_steps: int, total_steps: int, final_frac: float) -> float:
    """llm.c's schedule for update ``step`` (from 0): linear warm-up to ``peak`` over warmup_steps,
    then cosine decay from peak to ``peak * final_frac`` at total_steps (final_frac 1: constant)."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    floor = peak * final_frac
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - floor)


class TrainStep:
    """One update per call on a [B, T] batch: loss, backward, gradient_sync (data parallel: the
    gradients combined over the processes), AdamW at the call's lr (which clips the gradients' global
    norm when it has a max_grad_norm). Returns (this process's loss, gradient norm before clipping, or
    None when the optimizer does not clip).

    use_graphs (CUDA only): the first step of a batch shape runs eagerly and is then captured in a CUDA
    graph (minitorch.cuda.graphs.StepGraphs) that later steps of that shape replay, one launch instead
    of a Python dispatch per kernel. The batch goes through device buffers the graph reads, the learning
    rate through the optimizer's device state, and the loss through a device value the step writes."""

    def __init__(
        self, model: GPT2, optimizer: minitorch.AdamW, loss_kind: str,
        gradient_sync: Optional[Callable[[], None]] = None, use_graphs: bool = False,
    ):  # fmt: skip
        if use_graphs and not model.backend.cuda:
            raise ValueError("CUDA graphs need the CUDA backend")
        self.model, self.optimizer, self.loss_kind, self.gradient_sync = model, optimizer, loss_kind, gradient_sync
        self.loss = minitorch.zeros((1,), backend=model.backend)
        self._batches: dict = {}  # batch shape -> the device buffers of its ids and targets
        self._graphs = StepGraphs(use_graphs)

    def __call__(self, inputs: np.ndarray, targets: np.ndarray, lr: float) -> tuple[float, Optional[float]]:
        shape = np.shape(inputs)
        batch = self._batches.get(shape)
        if batch is None:
            batch = self._batches[shape] = (self.model.token_ids(inputs), self.model.token_ids(targets))
        else:
            self.model.token_ids(inputs, out=batch[0])
            self.model.token_ids(targets, out=batch[1])
        self.optimizer.lr = lr
        self.optimizer.begin_step()
        self._graphs.run(shape, lambda: self._run(*batch))
        norm = self.optimizer.grad_norm().item() if self.optimizer.max_grad_norm else None
        return self.loss.item(), norm

    def release_graphs(self) -> None:
        """Free the captured graphs (call before leaving a process group whose all-reduces they hold)."""
        self._graphs.release()

    def _run(self, ids: minitorch.Tensor, targets: minitorch.Tensor) -> None:
        loss = self.model.loss(ids, targets, self.loss_kind)
        self.optimizer.zero_grad()
        loss.backward()
        if self.gradient_sync is not None:
            self.gradient_sync()
        self.optimizer.update()
        with minitorch.no_grad():
            self.loss.copy_(loss.detach().view(1))


def validation_loss(model: GPT2, loader: ShardLoader, batches: int, loss_kind: str) -> float:
    """Mean loss over the first ``batches`` batches of ``loader`` (from its start, as llm.c does;
    under data parallelism this process's part of them, to be averaged over the processes)."""
    if batches < 1:
        raise ValueError(f"validation needs at least one batch, got {batches}")
    loader.reset()
    total: Optional[minitorch.Tensor] = None
    with minitorch.no_grad():
        for _ in range(batches):
            inputs, targets = loader.next_batch()
            loss = model.loss(model.token_ids(inputs), model.token_ids(targets), loss_kind)
            total = loss if total is None else total + loss
    assert total is not None
    return total.item() / batches


def save_training_state(
    directory: str | os.PathLike, model: GPT2, optimizer: minitorch.AdamW, step: int, loader: ShardLoader,
    config: Mapping[str, Any],
) -> Path:  # fmt: skip
    """Write ``directory/model.bin`` (llm.c's checkpoint format), then ``directory/state.npz``
    (project/run_checkpoint.py: the run's ``config``, steps done, AdamW's step count and moments, the
    training loader's position); each atomically, state.npz last, so a directory with one is complete."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_checkpoint(directory / STATE_MODEL)
    state = {"step": step, "optimizer": optimizer.state_dict(), "train_loader": loader.state()}
    save_checkpoint(directory / STATE_NAME, CHECKPOINT_KIND, config, state)
    return directory


def load_training_state(directory: str | os.PathLike, optimizer: minitorch.AdamW, loader: ShardLoader) -> dict[str, Any]:
    """Restore the optimizer and the loader position that ``save_training_state`` wrote (the model
    comes from ``directory/model.bin``); returns the saved state (``step`` among it)."""
    path = Path(directory) / STATE_NAME
    state = load_checkpoint(path, CHECKPOINT_KIND).state
    saved = state["optimizer"]
    n = len(optimizer.parameters)
    for key, moments in (("m", saved["m"]), ("v", saved["v"])):
        for i, value in moments.items():
            if int(i) >= n or value.shape != optimizer.parameters[int(i)].value.shape:
                raise CheckpointError(
                    f"{path}: AdamW moment {key} {i} of shape {value.shape} does not fit parameter {i} of the "
                    f"model's {n}"
                )
    optimizer.load_state_dict(saved)
    loader.load_state(state["train_loader"])
    return state


def plot_losses(records: Sequence[Mapping[str, Any]], path: str | os.PathLike, title: str) -> None:
    """PNG of the training loss per step and the validation losses of the metric records."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train", linewidth=1)
    if val:
        ax.plot(*zip(*val), "o-", label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
