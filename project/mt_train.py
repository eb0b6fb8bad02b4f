"""Training pieces of the translation program: backend and model, learning-rate schedule, the
loss of a batch, validation loss, memory readings and checkpoints (the step itself: mt_steps.py).

Everything numeric runs as minitorch tensor ops on the chosen backend.
"""

from __future__ import annotations

import math
import os
import pickle
import resource
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

import minitorch
from minitorch import DecoderLM, Tensor, TensorBackend, nn
from project.mt_data import PAD_ID, Batch, eval_batches

CHECKPOINT_NAME = "checkpoint.pkl"
CHECKPOINT_FORMAT = 1


def make_backend(name: str) -> TensorBackend:
    """'cuda': the hand-written CUDA kernels; 'cpu': numba FastOps."""
    if name == "cuda":
        return TensorBackend(minitorch.CudaKernelOps)
    if name == "cpu":
        return TensorBackend(minitorch.FastOps)
    raise ValueError(f"unknown backend {name!r}: expected 'cuda' or 'cpu'")


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


def batch_loss(model: DecoderLM, batch: Batch, backend: TensorBackend, loss: str = "naive") -> Tensor:
    """Token-weighted mean cross-entropy of the batch's targets (English side and <eos_en>)."""
    return batch_loss_from_tensors(model, *batch_tensors(batch, backend), loss)


def batch_loss_from_tensors(model: DecoderLM, tokens: Tensor, targets: Tensor, weights: Tensor, loss: str = "naive") -> Tensor:
    """batch_loss of tokens [B, T], targets [B*T] and weights [B*T] already on the backend.

    loss "naive": the LM head's [B*T, V] logits, then nn.cross_entropy; "fused":
    minitorch.fused_linear_cross_entropy on the LM head's input, which never makes the logits."""
    if loss == "fused":
        hidden = model.hidden_states(tokens)
        B, T, C = hidden.shape
        head = model.lm_head
        bias = None if head.bias is None else head.bias.value
        return minitorch.fused_linear_cross_entropy(
            hidden.view(B * T, C), head.weights.value, targets, weights, bias=bias
        )
    if loss != "naive":
        raise ValueError(f"unknown loss {loss!r}: expected 'naive' or 'fused'")
    logits = model(tokens)
    B, T, V = logits.shape
    return nn.cross_entropy(logits.view(B * T, V), targets, weights)


def count_tokens(batch: Batch) -> int:
    """Real (non-padding) input tokens of a batch, the unit of tokens/s."""
    return int(np.count_nonzero(batch.tokens != PAD_ID))


def validation_loss(model: DecoderLM, sequences: Sequence[np.ndarray], batch_size: int, backend: TensorBackend) -> float:
    """Per-target-token cross-entropy over all sequences (eval mode, summed on the backend)."""
    was_training = model.training
    model.eval()
    total: Optional[Tensor] = None
    n_targets = 0
    with minitorch.no_grad():
        for batch in eval_batches(sequences, batch_size):
            tokens, targets, weights = batch_tensors(batch, backend)
            logits = model(tokens)
            B, T, V = logits.shape
            summed = (nn.softmax_loss(logits.view(B * T, V), targets) * weights).sum()
            total = summed if total is None else total + summed
            n_targets += batch.n_targets
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


def checkpoint_path(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / CHECKPOINT_NAME


def save_checkpoint(path: Path, state: Dict[str, Any]) -> None:
    """Pickle state next to path, flush it to disk, then rename over path: a crash leaves either
    the previous checkpoint or the new one, never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump({"format": CHECKPOINT_FORMAT, **state}, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path) -> Dict[str, Any]:
    """A checkpoint written by save_checkpoint."""
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {path}; train without --resume first")
    with open(path, "rb") as f:
        state = pickle.load(f)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} has checkpoint format {state.get('format')}, expected {CHECKPOINT_FORMAT}")
    return state
