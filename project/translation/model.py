"""The translation program's model: the DecoderLM a run's configuration describes, the loss of a
batch (the English side's tokens only), and the validation loss. Everything numeric runs as
minitorch tensor ops on the chosen backend.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

import numpy as np

import minitorch
from minitorch import AttentionConfig, DecoderLM, Tensor, TensorBackend, nn
from project.common import evaluation
from project.translation.batches import Batch, eval_batches
from project.translation.tokenizer import PAD_ID


def attention_config(config: Dict[str, Any]) -> AttentionConfig:
    """How the run's model computes its attention and LayerNorms: its --use-fused-kernel, --attention
    and --activation resolved once (a checkpoint older than the last two trained with their defaults)."""
    return AttentionConfig.from_flags(
        config["use_fused_kernel"], config.get("attention", "naive"), config.get("activation", "softmax")
    )


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
        recompute_layers=config.get("recompute_layers", False),
        config=attention_config(config),
    )


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
            hidden.view(B * T, C), head.weight.value.T, targets, weights, bias=bias, label_smoothing=label_smoothing
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
    """Per-target-token cross-entropy over all sequences (unsmoothed, in eval mode, summed on the
    backend), with a progress bar."""

    def loss_of(batch: Batch) -> Tuple[Tensor, float]:
        tokens, targets, weights = batch_tensors(batch, backend)
        logits = model(tokens)
        B, T, V = logits.shape
        return (nn.softmax_loss(logits.view(B * T, V), targets) * weights).sum(), batch.n_targets

    total = -(-len(sequences) // batch_size)
    return evaluation.validation_loss(model, eval_batches(sequences, batch_size), loss_of, total)
