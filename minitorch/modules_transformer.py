"""Transformer modules: MultiHeadAttention, FeedForward, TransformerLayer (pre-LN) and DecoderLM.

Shapes: B batch, T sequence length, C = n_embd, H heads of size D = C / H, V vocabulary.
Every tensor a forward pass builds (position ids, causal masks) comes from backend ops, so a CUDA
model never moves data between host and device inside forward or backward.

Dropout sits on the attention output (after its projection), on the feed-forward output and on
the embeddings, never on the [B, H, T, T] attention probabilities: that keeps the naive and the
fused attention paths (which never materialize the probabilities) the same model.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np

from . import nn
from .attention_config import AttentionConfig, resolve_attention_config
from .checkpoint import checkpoint
from .fused.attention import fused_attention_qkv
from .fused.linear import feed_forward
from .fused.masks import masked_scores
from .kv_cache import KVCache, LayerCache
from .module import Module, ModuleList
from .modules_basic import Dropout, Embedding, LayerNorm1d, Linear
from .tensor import Tensor
from .tensor_create import tensor_from_numpy
from .tensor_data import IndexingError


def plus_residual(dropout: Dropout, residual: Optional[Tensor], product: Callable[[Optional[Tensor]], Tensor]) -> Tensor:
    """dropout(product(None)) + residual (just the first term without a residual), where product(r)
    is a sublayer's last product with r added in its epilogue: product(residual) itself when dropout
    is off, so that the block's residual stream costs no pass of its own (fused.linear)."""
    if residual is not None and not dropout.active:
        return product(residual)
    out = dropout(product(None))
    return out if residual is None else residual + out


class MultiHeadAttention(Module):
    """Multi-head self-attention: softmax((x Wq)(x Wk)^T / sqrt(D) + masks) (x Wv), then Wout.

    q, k and v come from one Linear of width 3C, qkv_projection: its weight [3C, C] holds the rows
    of Wq, then Wk, then Wv (torch's in_proj_weight and llm.c's qkvw), and its bias bq, bk, bv.
    load_state_dict also takes the older layout of three Linears q_projection, k_projection and
    v_projection (see upgrade_state).

    forward(x [B, T, C], padding_mask=None, cache=None, residual=None) -> [B, T, C]. padding_mask is
    additive, shape [B, T]: 0 for a real key, a large negative value (-1e9) or -inf for a padded one.
    causal=True keeps key j of query i only when j <= i.  residual [B, T, C] is added to the output
    (a block's x + attention(...)), inside the output projection's epilogue when dropout is off.

    config (minitorch.AttentionConfig; default: from_flags of the keywords use_fused_kernel,
    attention and activation) chooses the path.  attention "fused" runs the whole of
    softmax(q k^T / sqrt(D) + masks) v as minitorch.fused_attention_qkv (on CUDA: no [B, H, T, T]
    tensor in forward or backward); "naive" builds the scores and adds the masks
    (fused.masks.masked_scores), then takes their softmax, as Tensor.attn_softmax (one fused op that
    applies the masks itself) with fused_softmax.  activation "relu" replaces the softmax by
    relu(q k^T / sqrt(D) + masks) (masked keys give 0), on either path.

    cache (a LayerCache of a KVCache, for decoding): x holds the next T positions of each row; their
    keys and values are appended to the cache and the queries attend to every filled slot (the
    cache's key mask replaces padding_mask; causal within the new positions).  The scores are then
    [B, H, T, L] for L filled slots, computed as on the naive path, their softmax fused where
    config.decode_fused_softmax.  A softmax decoding step in the cache's device-slot mode (T = 1)
    runs fused.slot_attention instead, on every path.
    """

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        causal: bool = True,
        p_dropout: float = 0.1,
        bias: bool = True,
        backend: Optional[Any] = None,
        use_fused_kernel: bool = False,
        attention: str = "naive",
        activation: str = "softmax",
        config: Optional[AttentionConfig] = None,
    ):
        super().__init__()
        if n_head < 1 or n_embd % n_head:
            raise ValueError(f"n_embd {n_embd} must be a positive multiple of n_head {n_head}")
        self.attention_config = resolve_attention_config(
            "MultiHeadAttention", config, use_fused_kernel, attention, activation
        )
        self.n_embd = n_embd
        self.n_head = n_head
        self.head_dim = n_embd // n_head
        self.causal = causal
        self.qkv_projection = Linear(n_embd, 3 * n_embd, bias=bias, backend=backend)
        self.out_projection = Linear(n_embd, n_embd, bias=bias, backend=backend)
        self.dropout = Dropout(p_dropout)

    def _upgrade_entries(self, state: Dict[str, Any], prefix: str) -> None:
        """The older layout: separate q_projection, k_projection and v_projection Linears (of the
        older Linear layout, weights [in, out]), packed here into qkv_projection's older layout
        (weights side by side along the output columns, biases end to end), which Linear upgrades."""
        for part in ("weights", "bias"):
            names = [f"{prefix}{n}_projection.{part}" for n in "qkv"]
            if all(n in state for n in names):
                values = [state.pop(n) for n in names]
                arrays = [v.to_numpy() if hasattr(v, "to_numpy") else np.asarray(v, dtype=np.float32) for v in values]
                state[f"{prefix}qkv_projection.{part}"] = np.concatenate(arrays, axis=-1)

    def forward(
        self, x: Tensor, padding_mask: Optional[Tensor] = None, cache: Optional[LayerCache] = None,
        residual: Optional[Tensor] = None,
    ) -> Tensor:  # fmt: skip
        if x.dims != 3 or x.shape[2] != self.n_embd:
            raise IndexingError(f"MultiHeadAttention(n_embd={self.n_embd}) expects [B, T, {self.n_embd}], got {x.shape}")
        B, T, C = x.shape
        if padding_mask is not None and padding_mask.shape != (B, T):
            raise IndexingError(f"padding_mask must have shape [B, T] = {(B, T)}, got {padding_mask.shape}")
        H, D = self.n_head, self.head_dim
        if cache is not None:
            if padding_mask is not None:
                raise ValueError("MultiHeadAttention: with a cache, padding comes from the cache's key mask")
            return self._forward_cached(x, cache, residual)
        qkv = self.qkv_projection(x)
        config = self.attention_config
        if config.attention == "fused":
            out = fused_attention_qkv(
                qkv, H, padding_mask, causal=self.causal, activation=config.activation, scale=1.0 / math.sqrt(D)
            )
            # In bf16 on CUDA out is already laid out [B, T, H, D]: contiguous() is then no copy.
            attended = out.permute(0, 2, 1, 3).contiguous().view(B, T, C)
            return self._project(attended, residual)
        # Views of qkv as [B, T, 3, H, D]; the 1/sqrt(D) scale goes on q rather than on the [B, H, T, T] scores.
        heads = qkv.view(B, T, 3, H, D)
        q = (heads[:, :, 0] * (1.0 / math.sqrt(D))).permute(0, 2, 1, 3)
        k_t = heads[:, :, 1].permute(0, 2, 3, 1)
        v = heads[:, :, 2].permute(0, 2, 1, 3)
        probs = self._probabilities(q @ k_t, padding_mask, self.causal, config.fused_softmax)
        attended = (probs @ v).permute(0, 2, 1, 3).contiguous().view(B, T, C)
        return self._project(attended, residual)

    def _project(self, attended: Tensor, residual: Optional[Tensor]) -> Tensor:
        """dropout(out_projection(attended)), plus residual when given (see plus_residual)."""
        return plus_residual(self.dropout, residual, lambda r: self.out_projection(attended, residual=r))

    def _forward_cached(self, x: Tensor, cache: LayerCache, residual: Optional[Tensor]) -> Tensor:
        B, T, C = x.shape
        H, D = self.n_head, self.head_dim
        qkv = self.qkv_projection(x)
        keys, values = cache.append(qkv[:, :, C : 2 * C], qkv[:, :, 2 * C :], H)
        if cache.cache.slot is not None and self.attention_config.activation == "softmax":
            attended = cache.attend(qkv.view(B, 3 * C)[:, :C], H, 1.0 / math.sqrt(D))
            return self._project(attended.view(B, T, C), residual)
        q = (qkv[:, :, :C] * (1.0 / math.sqrt(D))).view(B, T, H, D).permute(0, 2, 1, 3)
        mask = cache.cache.key_mask(keys.shape[1])
        fused = self.attention_config.decode_fused_softmax
        probs = self._probabilities(q @ keys.permute(0, 2, 3, 1), mask, True, fused)
        attended = probs @ values.permute(0, 2, 1, 3)
        if T > 1:
            attended = attended.permute(0, 2, 1, 3).contiguous()
        return self._project(attended.view(B, T, C), residual)

    def _probabilities(self, scores: Tensor, mask: Optional[Tensor], causal: bool, fused: bool) -> Tensor:
        """The attention weights of scores [B, H, Tq, Tk] under the additive key mask [B, Tk] and the
        causal rule: fused, Tensor.attn_softmax applies both; otherwise the masked scores' softmax
        (or relu, the relu activation)."""
        if fused:
            return scores.attn_softmax(mask, causal=causal)
        scores, _ = masked_scores(scores, mask, causal)
        return nn.softmax(scores, 3) if self.attention_config.activation == "softmax" else scores.relu()


class FeedForward(Module):
    """Linear(n_embd, middle_dim) -> GELU (tanh approximation) -> Linear(middle_dim, n_embd) -> dropout.
    forward(x, residual=None): residual is added to the output (a block's x + ff(...)), inside the
    second product's epilogue when dropout is off."""

    def __init__(
        self,
        n_embd: int,
        middle_dim: int = 256,
        p_dropout: float = 0.1,
        bias: bool = True,
        backend: Optional[Any] = None,
    ):
        super().__init__()
        self.linear_in = Linear(n_embd, middle_dim, bias=bias, backend=backend)
        self.linear_out = Linear(middle_dim, n_embd, bias=bias, backend=backend)
        self.dropout = Dropout(p_dropout)

    def forward(self, x: Tensor, residual: Optional[Tensor] = None) -> Tensor:
        first, second = self.linear_in, self.linear_out
        weights = (first.weight.value, None if first.bias is None else first.bias.value, second.weight.value,
                   None if second.bias is None else second.bias.value)  # fmt: skip
        return plus_residual(self.dropout, residual, lambda r: feed_forward(x, *weights, "gelu", r))


class TransformerLayer(Module):
    """Pre-LN block: x + attention(ln_1(x)), then + feed_forward(ln_2(x)).

    The feed-forward width is 4 * n_embd unless middle_dim says otherwise.  config
    (minitorch.AttentionConfig; default: from_flags of use_fused_kernel, attention and activation,
    so use_fused_kernel selects the fused LayerNorm and, where the attention path has a separate
    softmax, the fused softmax) goes to the LayerNorms and to MultiHeadAttention.
    """

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        p_dropout: float = 0.1,
        ln_eps: float = 1e-5,
        bias: bool = True,
        backend: Optional[Any] = None,
        use_fused_kernel: bool = False,
        causal: bool = True,
        middle_dim: Optional[int] = None,
        attention: str = "naive",
        activation: str = "softmax",
        config: Optional[AttentionConfig] = None,
    ):
        super().__init__()
        config = resolve_attention_config("TransformerLayer", config, use_fused_kernel, attention, activation)
        self.attention_config = config
        self.ln_1 = LayerNorm1d(n_embd, eps=ln_eps, backend=backend, use_fused_kernel=config.fused_layernorm)
        self.attention = MultiHeadAttention(
            n_embd, n_head, causal=causal, p_dropout=p_dropout, bias=bias, backend=backend, config=config
        )
        self.ln_2 = LayerNorm1d(n_embd, eps=ln_eps, backend=backend, use_fused_kernel=config.fused_layernorm)
        self.ff = FeedForward(
            n_embd, 4 * n_embd if middle_dim is None else middle_dim, p_dropout=p_dropout, bias=bias, backend=backend
        )

    def forward(self, x: Tensor, padding_mask: Optional[Tensor] = None, cache: Optional[LayerCache] = None) -> Tensor:
        x = self.attention(self.ln_1(x), padding_mask, cache, residual=x)
        return self.ff(self.ln_2(x), residual=x)


class DecoderLM(Module):
    """Decoder-only language model: token + position embeddings -> dropout -> n_layers pre-LN
    TransformerLayers -> final LayerNorm -> LM head.

    forward(idx [B, T] of integral token ids, padding_mask [B, T] additive, optional) -> logits
    [B, T, n_vocab]; hidden_states gives the [B, T, n_embd] input of the LM head, so a caller that
    needs a few positions' logits (greedy decoding) can apply lm_head to those alone, or hand it
    with lm_head's weight (transposed) to minitorch.fused_linear_cross_entropy, which never makes the logits.

    recompute_layers=True runs each TransformerLayer under minitorch.checkpoint: backward
    recomputes a layer's activations (same dropout masks) instead of keeping them from forward,
    so training holds one layer's activations plus each layer's input; gradients are unchanged.
    config (minitorch.AttentionConfig; default: from_flags of use_fused_kernel, attention ("naive" |
    "fused") and activation ("softmax" | "relu")) goes to every TransformerLayer and the final LayerNorm.

    Incremental decoding: new_cache(...) makes a KVCache; hidden_states(ids, cache=cache) then runs
    only the new positions ids [B, T] (the prompt first, then one token per step), appending their
    keys and values, so each step costs one position instead of the whole prefix.
    """

    def __init__(
        self,
        n_vocab: int,
        n_embd: int,
        n_head: int,
        n_positions: int,
        n_layers: int = 4,
        p_dropout: float = 0.1,
        ln_eps: float = 1e-5,
        bias: bool = True,
        backend: Optional[Any] = None,
        use_fused_kernel: bool = False,
        recompute_layers: bool = False,
        attention: str = "naive",
        activation: str = "softmax",
        config: Optional[AttentionConfig] = None,
    ):
        super().__init__()
        config = resolve_attention_config("DecoderLM", config, use_fused_kernel, attention, activation)
        self.attention_config = config
        self.n_vocab = n_vocab
        self.recompute_layers = recompute_layers
        self.n_embd = n_embd
        self.n_positions = n_positions
        self.token_embeddings = Embedding(n_vocab, n_embd, backend=backend)
        self.position_embeddings = Embedding(n_positions, n_embd, backend=backend)
        self.dropout = Dropout(p_dropout)
        self.layers = ModuleList(
            [
                TransformerLayer(
                    n_embd, n_head, p_dropout=p_dropout, ln_eps=ln_eps, bias=bias, backend=backend, config=config
                )
                for _ in range(n_layers)
            ]
        )
        self.ln = LayerNorm1d(n_embd, eps=ln_eps, backend=backend, use_fused_kernel=config.fused_layernorm)
        self.lm_head = Linear(n_embd, n_vocab, bias=bias, backend=backend)

    def new_cache(self, like: Tensor, rows: int, capacity: int, pads: Optional[Sequence[int]] = None) -> KVCache:
        """An empty KVCache for `rows` sequences of up to `capacity` slots on like's backend;
        pads[r]: left-padding slots of row r (see KVCache)."""
        return KVCache(like, len(self.layers), rows, capacity, self.n_embd, pads)

    def hidden_states(
        self, idx: Tensor, padding_mask: Optional[Tensor] = None, cache: Optional[KVCache] = None,
        positions: Optional[np.ndarray | Tensor] = None,
    ) -> Tensor:  # fmt: skip
        """[B, T] ids -> the final LayerNorm's output [B, T, n_embd].  With a cache, idx holds the
        next T slots after the cache's filled ones, at position ids `positions` [B, T] (default
        cache.positions(T), or cache.slot_positions() in its device-slot mode), each below
        n_positions: a NumPy array is checked, a Tensor on the model's backend is not (its values
        stay where they are, e.g. on the device, for a step replayed from a CUDA graph)."""
        if idx.dims != 2:
            raise IndexingError(f"DecoderLM expects token ids of shape [B, T], got {idx.shape}")
        B, T = idx.shape
        if cache is None:
            if positions is not None:
                raise ValueError("DecoderLM.hidden_states: positions are for decoding with a cache; pass cache= too")
            if T > self.n_positions:
                raise ValueError(f"sequence length {T} exceeds the model's n_positions {self.n_positions}")
            position_ids = idx._arange(T)
        else:
            if B != cache.rows:
                raise IndexingError(f"DecoderLM: ids {idx.shape} for a KVCache of {cache.rows} rows")
            if positions is None and cache.slot is not None:
                positions = cache.slot_positions()
            if isinstance(positions, Tensor):
                if positions.shape != (B, T):
                    raise ValueError(f"DecoderLM: positions must be [B, T] = {(B, T)}, got {positions.shape}")
                position_ids = positions
            else:
                ids = cache.positions(T) if positions is None else np.asarray(positions)
                if ids.shape != (B, T) or ids.min() < 0 or ids.max() >= self.n_positions:
                    raise ValueError(
                        f"DecoderLM: positions must be [B, T] = {(B, T)} ids in [0, {self.n_positions}), got shape "
                        f"{ids.shape} with range [{ids.min()}, {ids.max()}]"
                    )
                position_ids = tensor_from_numpy(ids, backend=idx.backend)
        x = self.dropout(self.token_embeddings(idx) + self.position_embeddings(position_ids))
        for i, layer in enumerate(self.layers):
            if cache is not None:
                x = layer(x, padding_mask, cache.layers[i])
            elif self.recompute_layers:
                x = checkpoint(layer, x, padding_mask)
            else:
                x = layer(x, padding_mask)
        if cache is not None:
            cache.advance(T)
        return self.ln(x)

    def forward(self, idx: Tensor, padding_mask: Optional[Tensor] = None) -> Tensor:
        return self.lm_head(self.hidden_states(idx, padding_mask))
