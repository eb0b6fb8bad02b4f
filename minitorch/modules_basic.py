"""Basic layers: Linear, Embedding, Dropout, LayerNorm1d.

`backend=` (a minitorch.TensorBackend, default the CPU default) says where the parameters live."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import nn
from .autocast import autocast_inputs
from .fused.embedding import embedding
from .fused.linear import linear
from .module import Module, Parameter
from .rng import next_seed
from .tensor import Tensor
from .tensor_create import tensor_from_numpy
from .tensor_data import IndexingError


def _init_rng() -> np.random.Generator:
    return np.random.default_rng(next_seed())


class Linear(Module):
    """y = x @ W + b over the last dim of x (any leading dims); W is [in_size, out_size]."""

    def __init__(self, in_size: int, out_size: int, bias: bool = True, backend: Optional[Any] = None):
        super().__init__()
        self.in_size = in_size
        self.out_size = out_size
        bound = 1.0 / np.sqrt(in_size)
        rng = _init_rng()
        self.weights = Parameter(
            tensor_from_numpy(rng.uniform(-bound, bound, (in_size, out_size)), backend=backend)
        )
        self.bias = (
            Parameter(tensor_from_numpy(rng.uniform(-bound, bound, (out_size,)), backend=backend)) if bias else None
        )

    def forward(self, x: Tensor, activation: Optional[str] = None) -> Tensor:
        """act(x @ W + b) over the last dim; activation None, "gelu" or "relu" (fused into the
        matmul's epilogue on CUDA)."""
        if x.shape[-1] != self.in_size:
            raise IndexingError(f"Linear({self.in_size}, {self.out_size}) got input of shape {x.shape}")
        return linear(x, self.weights.value, None if self.bias is None else self.bias.value, activation)


class Embedding(Module):
    """Rows of a [num_embeddings, embedding_dim] table looked up by integral ids."""

    def __init__(self, num_embeddings: int, embedding_dim: int, backend: Optional[Any] = None):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weights = Parameter(
            tensor_from_numpy(_init_rng().standard_normal((num_embeddings, embedding_dim)), backend=backend)
        )

    def forward(self, x: Tensor) -> Tensor:
        """x [...] of ids -> [..., embedding_dim]."""
        return embedding(self.weights.value, x)


class Dropout(Module):
    """Inverted dropout while training; identity in eval mode."""

    def __init__(self, p_dropout: float = 0.1):
        super().__init__()
        if not 0.0 <= p_dropout <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p_dropout}")
        self.p_dropout = p_dropout

    def forward(self, x: Tensor) -> Tensor:
        return nn.dropout(x, self.p_dropout, training=self.training)


class LayerNorm1d(Module):
    """LayerNorm over the last dim with learned scale (weights) and shift (bias).

    use_fused_kernel=True runs Tensor.layernorm (one fused op; a fused kernel on CUDA); otherwise
    the normalization is composed from tensor ops.  Inside minitorch.autocast it runs in float32.
    """

    def __init__(self, dim: int, eps: float = 1e-5, backend: Optional[Any] = None, use_fused_kernel: bool = False):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.use_fused_kernel = use_fused_kernel
        self.weights = Parameter(tensor_from_numpy(np.ones(dim), backend=backend))
        self.bias = Parameter(tensor_from_numpy(np.zeros(dim), backend=backend))

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.dim:
            raise IndexingError(f"LayerNorm1d({self.dim}) got input of shape {x.shape}")
        (x,) = autocast_inputs("layernorm", x)
        if self.use_fused_kernel:
            return x.layernorm(self.weights.value, self.bias.value, self.eps)
        d = x.dims - 1
        centered = x - x.mean(d, keepdim=True)
        var = (centered * centered).mean(d, keepdim=True)
        return centered * ((var + self.eps) ** -0.5) * self.weights.value + self.bias.value
