"""Training pieces of the translation program: backend and model, learning-rate schedule, the
loss of a batch, validation loss, memory readings and the run state that a checkpoint holds (the
step itself: mt_steps.py).

Everything numeric runs as minitorch tensor ops on the chosen backend.
"""

from __future__ import annotations

import math
import resource
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
from tqdm import tqdm

import minitorch
from minitorch import DecoderLM, Tensor, TensorBackend, nn
from project.translation.checks import InputError
from project.translation.batches import Batch, Batcher, eval_batches
from project.translation.tokenizer import PAD_ID
from project.common.checkpoint import Checkpoint, CheckpointError


def cuda_unavailable_reason() -> Optional[str]:
    """Why the CUDA backend cannot run here: no GPU (or torch) or kernels not built; None if it can."""
    from minitorch import cuda_kernel_ops
    from minitorch.cuda.libraries import LIBRARIES, kernel_library

    reason = cuda_kernel_ops.unavailable_reason()
    if reason is not None:
        return reason
    try:
        for name in LIBRARIES:
            kernel_library(name)
    except RuntimeError as err:
        return str(err)
    return None


def make_backend(name: str) -> Tuple[TensorBackend, str]:
    """(backend, a line saying which and why). 'cuda': the hand-written CUDA kernels; 'cpu': numba
    FastOps; 'auto': CUDA where it can run, else the CPU. Raises InputError when 'cuda' cannot run."""
    if name == "cpu":
        return TensorBackend(minitorch.FastOps), "backend cpu (numba FastOps)"
    if name not in ("cuda", "auto"):
        raise ValueError(f"unknown backend {name!r}: expected 'auto', 'cuda' or 'cpu'")
    reason = cuda_unavailable_reason()
    if reason is None:
        return TensorBackend(minitorch.CudaKernelOps), f"backend cuda{' (auto)' if name == 'auto' else ''}"
    if name == "cuda":
        raise InputError(f"--backend cuda cannot run here: {reason}; use --backend cpu or --backend auto")
    return TensorBackend(minitorch.FastOps), f"backend cpu (auto: CUDA unavailable: {reason})"


def build_model(config: Dict[str, Any], n_vocab: int, backend: TensorBackend) -> DecoderLM:
    """The DecoderLM a run's configuration describes (positions for sequences up to max_len)."""
    return DecoderLM(
        n_vocab=n_vocab,
        n_embd=config["n_embd"],
        n_head=config["n_head"],
        n_positions=config["max_len"],
        n_layers=config["n_layers"],
        p_dropout=config["dropout"],
        backend=backend,
        use_fused_kernel=config["use_fused_kernel"],
        recompute_layers=config.get("recompute_layers", False),
        attention=config.get("attention", "naive"),
        activation=config.get("activation", "softmax"),
    )


def learning_rate(step: int, peak: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup to `peak` over warmup_steps updates, then cosine decay to 0 at total_steps.
    step counts updates from 0."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


def batch_tensors(batch: Batch, backend: TensorBackend) -> Tuple[Tensor, Tensor, Tensor]:
    """(tokens [B, T], targets [B*T], weights [B*T]) on the backend."""
    tokens = minitorch.tensor_from_numpy(batch.tokens, backend=backend)
    targets = minitorch.tensor_from_numpy(batch.targets.reshape(-1), backend=backend)
    weights = minitorch.tensor_from_numpy(batch.weights.reshape(-1), backend=backend)
    return tokens, targets, weights


def batch_loss(
    model: DecoderLM, batch: Batch, backend: TensorBackend, loss: str = "naive", label_smoothing: float = 0.0
) -> Tensor:
    """Token-weighted mean cross-entropy of the batch's targets (English side and <eos_en>), against
    targets smoothed by label_smoothing (see nn.softmax_loss)."""
    return batch_loss_from_tensors(model, *batch_tensors(batch, backend), loss, label_smoothing)


def batch_loss_from_tensors(
    model: DecoderLM, tokens: Tensor, targets: Tensor, weights: Tensor, loss: str = "naive",
    label_smoothing: float = 0.0,
) -> Tensor:  # fmt: skip
    """batch_loss of tokens [B, T], targets [B*T] and weights [B*T] already on the backend.

    loss "naive": the LM head's [B*T, V] logits, then nn.cross_entropy; "fused":
    minitorch.fused_linear_cross_entropy on the LM head's input, which never makes the logits."""
    if loss == "fused":
        hidden = model.hidden_states(tokens)
        B, T, C = hidden.shape
        head = model.lm_head
        bias = None if head.bias is None else head.bias.value
        return minitorch.fused_linear_cross_entropy(
            hidden.view(B * T, C), head.weights.value, targets, weights, bias=bias, label_smoothing=label_smoothing
        )
    if loss != "naive":
        raise ValueError(f"unknown loss {loss!r}: expected 'naive' or 'fused'")
    logits = model(tokens)
    B, T, V = logits.shape
    return nn.cross_entropy(logits.view(B * T, V), targets, weights, label_smoothing=label_smoothing)


def count_tokens(batch: Batch) -> int:
    """Real (non-padding) input tokens of a batch, the unit of tokens/s."""
    return int(np.count_nonzero(batch.tokens != PAD_ID))


def validation_loss(model: DecoderLM, sequences: Sequence[np.ndarray], batch_size: int, backend: TensorBackend) -> float:
    """Per-target-token cross-entropy over all sequences (eval mode, summed on the backend), with a
    progress bar."""
    was_training = model.training
    model.eval()
    total: Optional[Tensor] = None
    n_targets = 0
    bar = tqdm(total=len(sequences), desc="validation loss", unit="pair", leave=False)
    with minitorch.no_grad(), bar:
        for batch in eval_batches(sequences, batch_size):
            tokens, targets, weights = batch_tensors(batch, backend)
            logits = model(tokens)
            B, T, V = logits.shape
            summed = (nn.softmax_loss(logits.view(B * T, V), targets) * weights).sum()
            total = summed if total is None else total + summed
            n_targets += batch.n_targets
            bar.update(B)
    if was_training:
        model.train()
    if total is None or n_targets == 0:
        raise ValueError("validation set has no target tokens")
    return total.item() / n_targets


def peak_memory_mb(backend: TensorBackend) -> Dict[str, Any]:
    """Peak memory: on CUDA, the most device memory tensors held since the previous call
    (minitorch.cuda_memory_stats, whose peak window this call restarts); on the CPU, the process's
    peak resident size so far."""
    if backend.ops.is_cuda:
        peak = minitorch.cuda_memory_stats(reset=True)["peak"]
        return {"peak_memory_mb": peak / 2**20, "memory_kind": "cuda_allocated"}
    return {"peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "memory_kind": "host_rss"}


def run_state(model: DecoderLM, optimizer: minitorch.Adam, batcher: Batcher, progress: Dict[str, Any]) -> Dict[str, Any]:
    """Everything a checkpoint needs to continue a run exactly: parameters, optimizer moments, the
    batch order (mid-epoch included), the generators behind dropout and numpy's global one, and the
    caller's progress record (epoch, step, the running sums of an unfinished epoch)."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "batcher": batcher.state_dict(),
        "rng": {"minitorch": minitorch.get_rng_state(), "numpy": np.random.get_state(legacy=False)},
        "progress": progress,
    }


def upgrade_moments(model: DecoderLM, saved_names: Sequence[str], optimizer_state: Dict[str, Any]) -> Dict[str, Any]:
    """Adam's state (moments keyed by parameter position) saved with a model whose parameters were
    saved_names, re-keyed for model: a checkpoint of an older parameter layout (separate q, k, v
    projections) gets its moments packed as its parameters are (Module.upgrade_state)."""
    names = [name for name, _ in model.named_parameters()]
    if list(saved_names) == names:
        return optimizer_state
    position = {name: i for i, name in enumerate(names)}
    out = dict(optimizer_state)
    for key in ("m", "v"):
        by_name = model.upgrade_state({saved_names[int(i)]: value for i, value in optimizer_state[key].items()})
        out[key] = {str(position[name]): value for name, value in by_name.items()}
    return out


def restore_run_state(
    checkpoint: Checkpoint, model: DecoderLM, optimizer: minitorch.Adam, batcher: Batcher
) -> Dict[str, Any]:
    """Load what run_state saved into a freshly built model, optimizer and batcher; returns the
    progress record. A state that does not fit them raises CheckpointError naming the file."""
    state = checkpoint.state
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(upgrade_moments(model, list(state["model"]), state["optimizer"]))
        batcher.load_state_dict(state["batcher"])
        minitorch.set_rng_state(state["rng"]["minitorch"])
        np.random.set_state(state["rng"]["numpy"])
        return dict(state["progress"])
    except (KeyError, IndexError, ValueError, TypeError) as err:
        raise CheckpointError(f"{checkpoint.path} does not fit this run: {type(err).__name__}: {err}") from None
