"""GPT-2 built from minitorch modules, with llm.c's parameter layout for loading and saving.

The model is llm.c's GPT-2: token and learned position embeddings, ``num_layers`` pre-LN
``TransformerLayer`` blocks (biases, GELU MLP of width 4C, LayerNorm eps 1e-5, no dropout), a final
LayerNorm and an LM head tied to the token embedding: ``logits = hidden @ wte[:V].T``. The
embedding table has ``padded_vocab_size`` rows (llm.c pads V to a multiple of 128); rows V..Vp-1
are never looked up and give no logits, so they stay as loaded (zero in a fresh model).

minitorch's Linear weights are ``[out, in]``, as llm.c's (and torch's): every parameter is copied
as it is. llm.c's ``qkvw`` ``[3C, C]`` holds the rows of Q, then K, then V, as MultiHeadAttention's
packed ``qkv_projection.weight`` does.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

import numpy as np

import minitorch
from minitorch import (
    AttentionConfig, Embedding, IndexingError, LayerNorm1d, Module, ModuleList, Parameter, Tensor, TransformerLayer,
    checkpoint, nn,
)
from project.gpt2.llmc import GPT2Config, parameter_shapes, read_checkpoint, write_checkpoint

LN_EPS = 1e-5
INIT_STD = 0.02
LOSSES = ("naive", "fused")


def _layer_parameters(layer: TransformerLayer) -> dict[str, Parameter]:
    """llm.c's per-layer names -> parameters."""
    attn, ff = layer.attention, layer.ff
    return {
        "ln1w": layer.ln_1.weight, "ln1b": layer.ln_1.bias,
        "qkvw": attn.qkv_projection.weight, "qkvb": attn.qkv_projection.bias,
        "attprojw": attn.out_projection.weight, "attprojb": attn.out_projection.bias,
        "ln2w": layer.ln_2.weight, "ln2b": layer.ln_2.bias,
        "fcw": ff.linear_in.weight, "fcb": ff.linear_in.bias,
        "fcprojw": ff.linear_out.weight, "fcprojb": ff.linear_out.bias,
    }  # fmt: skip


def gpt2_init_params(config: GPT2Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Fresh float32 parameters in llm.c's layout with GPT-2's initialisation: weights normal with
    std 0.02, the residual projections (attprojw, fcprojw) 0.02 / sqrt(2 L), biases 0, LayerNorm
    scales 1; the padding rows V..Vp-1 of wte 0."""
    rng = np.random.default_rng(seed)
    residual_std = INIT_STD / math.sqrt(2 * config.num_layers)
    params = {}
    for name, shape in parameter_shapes(config).items():
        if name in ("ln1w", "ln2w", "lnfw"):
            params[name] = np.ones(shape, dtype=np.float32)
        elif name.endswith("b"):
            params[name] = np.zeros(shape, dtype=np.float32)
        else:
            std = residual_std if name in ("attprojw", "fcprojw") else INIT_STD
            params[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    params["wte"][config.vocab_size :] = 0.0
    return params


class GPT2(Module):
    """GPT-2 of a ``GPT2Config``, parameters on ``backend`` (default: the CPU default).

    use_fused_kernel, attention ("naive" | "fused") and activation ("softmax" | "relu": relu of
    the causal scores instead of their softmax) are resolved once into `attention_config`
    (minitorch.AttentionConfig.from_flags), which every TransformerLayer and the final LayerNorm
    follow; recompute_layers
    runs each layer under minitorch.checkpoint (gradient checkpointing). The parameters start as
    the modules initialise them: load a checkpoint (``from_checkpoint``) or GPT-2's initialisation
    (``fresh``) into them.
    """

    def __init__(
        self,
        config: GPT2Config,
        backend: Optional[Any] = None,
        use_fused_kernel: bool = False,
        attention: str = "naive",
        activation: str = "softmax",
        recompute_layers: bool = False,
    ):
        super().__init__()
        self.config = config
        self.recompute_layers = recompute_layers
        self.attention_config = AttentionConfig.from_flags(use_fused_kernel, attention, activation)
        C = config.channels
        self.wte = Embedding(config.padded_vocab_size, C, backend=backend)
        self.wpe = Embedding(config.max_seq_len, C, backend=backend)
        self.layers = ModuleList(
            [
                TransformerLayer(
                    C, config.num_heads, p_dropout=0.0, ln_eps=LN_EPS, backend=backend, config=self.attention_config
                )
                for _ in range(config.num_layers)
            ]
        )
        self.ln_f = LayerNorm1d(C, eps=LN_EPS, backend=backend, use_fused_kernel=self.attention_config.fused_layernorm)

    @classmethod
    def fresh(cls, config: GPT2Config, seed: int = 0, **options: Any) -> GPT2:
        """A model with GPT-2's initialisation (``gpt2_init_params(config, seed)``); options as __init__."""
        model = cls(config, **options)
        model.load_llmc_params(gpt2_init_params(config, seed))
        return model

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, **options: Any) -> GPT2:
        """The model of an llm.c checkpoint, float32 (version 3) or bfloat16 (version 5: the float32
        parameters hold its values exactly); options as __init__."""
        config, params = read_checkpoint(path)
        model = cls(config, **options)
        model.load_llmc_params(params)
        return model

    @property
    def backend(self) -> Any:
        """The backend that holds the parameters."""
        return self.wte.weight.value.backend

    # ---- llm.c layout --------------------------------------------------------------------------
    def _llmc_slots(self) -> Iterator[tuple[str, int, Parameter]]:
        """(llm.c name, layer or -1, parameter) for every parameter."""
        yield "wte", -1, self.wte.weight
        yield "wpe", -1, self.wpe.weight
        for index, layer in enumerate(self.layers):
            for name, param in _layer_parameters(layer).items():
                yield name, index, param
        yield "lnfw", -1, self.ln_f.weight
        yield "lnfb", -1, self.ln_f.bias

    def load_llmc_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Set every parameter from llm.c-layout arrays (``read_checkpoint``'s dict) of this
        model's config; ValueError naming the tensor when one is missing or has the wrong shape."""
        shapes = parameter_shapes(self.config)
        for name, shape in shapes.items():
            if name not in params:
                raise ValueError(f"llm.c parameters lack {name!r} (expected shape {shape})")
            if tuple(np.shape(params[name])) != shape:
                raise ValueError(
                    f"llm.c parameter {name!r} has shape {tuple(np.shape(params[name]))}, expected {shape} "
                    f"for {self.config}"
                )
        backend = self.backend
        for name, layer, param in self._llmc_slots():
            value = np.asarray(params[name] if layer < 0 else params[name][layer])
            param.update(minitorch.tensor_from_numpy(value, backend=backend))

    def _llmc_arrays(self, read: Callable[[Parameter], np.ndarray]) -> dict[str, np.ndarray]:
        out = {name: np.zeros(shape, dtype=np.float32) for name, shape in parameter_shapes(self.config).items()}
        for name, layer, param in self._llmc_slots():
            (out[name] if layer < 0 else out[name][layer])[...] = read(param)
        return out

    def llmc_params(self) -> dict[str, np.ndarray]:
        """Every parameter as float32 arrays in llm.c's layout (what ``write_checkpoint`` takes)."""
        return self._llmc_arrays(lambda p: p.value.to_numpy())

    def llmc_grads(self) -> dict[str, np.ndarray]:
        """The gradients after backward, in llm.c's layout (zeros where a parameter has none)."""
        return self._llmc_arrays(lambda p: np.zeros(p.value.shape) if p.value.grad is None else p.value.grad.to_numpy())

    def save_checkpoint(self, path: str | os.PathLike, dtype: str = "float32") -> Path:
        """Write the model as an llm.c checkpoint (atomically) of dtype "float32" (version 3) or
        "bfloat16" (version 5, rounded to nearest even); returns the path."""
        return write_checkpoint(path, self.config, self.llmc_params(), dtype)

    # ---- forward -------------------------------------------------------------------------------
    def check_ids(self, ids: np.ndarray) -> np.ndarray:
        """ids as a [B, T] integer array, after checking every id is in [0, vocab_size) and T <=
        max_seq_len (so no id reaches the padding rows); ValueError naming the first bad one."""
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"token ids must be a non-empty [B, T] integer array, got {ids.dtype} {ids.shape}")
        V = self.config.vocab_size
        bad = np.flatnonzero((ids < 0) | (ids >= V))
        if bad.size:
            raise ValueError(f"token id {ids.reshape(-1)[bad[0]]} is outside [0, {V}) (the model's vocab_size)")
        if ids.shape[1] > self.config.max_seq_len:
            raise ValueError(f"sequence length {ids.shape[1]} exceeds the model's max_seq_len {self.config.max_seq_len}")
        return ids

    def token_ids(self, ids: np.ndarray) -> Tensor:
        """A [B, T] tensor on the model's backend from an integer array, checked (check_ids)."""
        return minitorch.tensor_from_numpy(self.check_ids(ids), backend=self.backend)

    def hidden_states(self, idx: Tensor) -> Tensor:
        """[B, T] token ids -> the final LayerNorm's output [B, T, C]."""
        if idx.dims != 2:
            raise IndexingError(f"GPT2 expects token ids of shape [B, T], got {idx.shape}")
        T = idx.shape[1]
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's max_seq_len {self.config.max_seq_len}")
        x = self.wte(idx) + self.wpe(idx._arange(T))
        for layer in self.layers:
            x = checkpoint(layer, x, None) if self.recompute_layers else layer(x)
        return self.ln_f(x)

    def lm_head(self) -> Tensor:
        """The tied LM head [C, V]: the first vocab_size rows of wte, transposed (a view)."""
        return self.wte.weight.value.narrow(0, 0, self.config.vocab_size).transpose(0, 1)

    def forward(self, idx: Tensor) -> Tensor:
        """[B, T] token ids -> logits [B, T, vocab_size]."""
        hidden = self.hidden_states(idx)
        B, T, C = hidden.shape
        return (hidden.reshape(B * T, C) @ self.lm_head()).view(B, T, self.config.vocab_size)

    def loss(self, idx: Tensor, targets: Tensor, kind: str = "naive") -> Tensor:
        """Mean next-token cross-entropy (shape (1,)) of [B, T] inputs against [B, T] targets.

        kind "naive": the [B*T, V] logits, then nn.cross_entropy; "fused":
        minitorch.fused_linear_cross_entropy on the final hidden states and the tied head, which
        never makes the logits. wte's gradient gets the head's and the embedding's parts."""
        if kind not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {kind!r}")
        if targets.shape != idx.shape:
            raise IndexingError(f"targets of shape {targets.shape} for inputs of shape {idx.shape}")
        if kind == "naive":
            logits = self.forward(idx)
            B, T, V = logits.shape
            return nn.cross_entropy(logits.view(B * T, V), targets.contiguous().view(B * T))
        hidden = self.hidden_states(idx)
        B, T, C = hidden.shape
        weights = minitorch.ones((B * T,), backend=self.backend)
        # The whole padded table as the head, its padding columns no classes: its gradient is written
        # straight into the table's layout (a narrowed head's would be a zero-filled table plus a copy).
        return minitorch.fused_linear_cross_entropy(
            hidden.reshape(B * T, C), self.wte.weight.value.transpose(0, 1), targets.contiguous().view(B * T),
            weights, classes=self.config.vocab_size,
        )  # fmt: skip

    def next_token_logits(self, idx: Tensor) -> np.ndarray:
        """[B, T] token ids -> the logits of the token after each sequence, [B, vocab_size] (host),
        computing the head only for the last position."""
        with minitorch.no_grad():
            hidden = self.hidden_states(idx)
            B, T, C = hidden.shape
            last = [hidden.reshape(B * T, C).narrow(0, b * T + T - 1, 1) for b in range(B)]
            return np.concatenate([(row @ self.lm_head()).to_numpy() for row in last], axis=0)
