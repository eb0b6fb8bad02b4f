"""Basic layers with torch.nn's names, parameters and layouts: Linear, Embedding, LayerNorm
(LayerNorm1d: its older name), Dropout, ReLU and GELU.

Parameters are named and shaped as torch.nn's (Linear.weight [out, in] and bias [out],
Embedding.weight [num, dim], LayerNorm.weight and bias), so a torch state_dict of the same
architecture loads by name.  A state of the older layout (`weights`, Linear's [in, out]) is
rewritten on load (Module.upgrade_state).  `backend=` or `device=` (a TensorBackend, "cpu" or
"cuda"; default the CPU default) says where the parameters live.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Union

import numpy as np

from .autocast import autocast_inputs
from .fused.embedding import embedding
from .fused.linear import linear
from .module import Module, Parameter
from .nn import functional as F
from .rng import next_seed
from .tensor import Tensor
from .tensor_create import tensor_from_numpy
from .tensor_data import IndexingError


def _init_rng() -> np.random.Generator:
    return np.random.default_rng(next_seed())


def _place(backend: Any, device: Any) -> Any:
    if device is not None and backend is not None:
        raise ValueError(f"pass backend= or device=, not both (got {backend!r} and {device!r})")
    return device if device is not None else backend


def _renamed(state: Dict[str, Any], prefix: str, transpose: bool = False) -> None:
    """The older entry `<prefix>weights` as `<prefix>weight` (transposed: Linear's old [in, out])."""
    old = state.pop(f"{prefix}weights", None)
    if old is not None and f"{prefix}weight" not in state:
        values = old.to_numpy() if hasattr(old, "to_numpy") else np.asarray(old, dtype=np.float32)
        state[f"{prefix}weight"] = np.ascontiguousarray(values.T) if transpose else values


class Linear(Module):
    """y = x @ weight.T + bias over the last dim of x (any leading dims), as torch.nn.Linear:
    weight [out_features, in_features], bias [out_features], both uniform in +-1/sqrt(in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, backend: Optional[Any] = None, *,
                 device: Optional[Any] = None):  # fmt: skip
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        backend = _place(backend, device)
        bound = 1.0 / np.sqrt(in_features)
        rng = _init_rng()
        # Drawn as [in, out] and stored transposed: the same initial model for a seed as before the
        # layout followed torch's.
        draws = rng.uniform(-bound, bound, (in_features, out_features)).T
        self.weight = Parameter(tensor_from_numpy(np.ascontiguousarray(draws), backend=backend))
        self.bias = (
            Parameter(tensor_from_numpy(rng.uniform(-bound, bound, (out_features,)), backend=backend)) if bias else None
        )

    def forward(self, x: Tensor, activation: Optional[str] = None, residual: Optional[Tensor] = None) -> Tensor:
        """act(x @ weight.T + bias) over the last dim; activation None, "gelu" (tanh approximation)
        or "relu" (fused into the matmul's epilogue on CUDA); plus residual [..., out_features] when
        given (no activation; in the epilogue too: minitorch.fused.linear)."""
        if x.shape[-1] != self.in_features:
            raise IndexingError(f"Linear({self.in_features}, {self.out_features}) got input of shape {x.shape}")
        return linear(x, self.weight.value, None if self.bias is None else self.bias.value, activation, residual)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def _upgrade_entries(self, state: Dict[str, Any], prefix: str) -> None:
        """The older layout: `weights` [in, out]."""
        _renamed(state, prefix, transpose=True)


class Embedding(Module):
    """Rows of weight [num_embeddings, embedding_dim] looked up by integer ids, standard normal at
    first (as torch.nn.Embedding)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, backend: Optional[Any] = None, *,
                 device: Optional[Any] = None):  # fmt: skip
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        draws = _init_rng().standard_normal((num_embeddings, embedding_dim))
        self.weight = Parameter(tensor_from_numpy(draws, backend=_place(backend, device)))

    def forward(self, x: Tensor) -> Tensor:
        """x [...] of ids -> [..., embedding_dim]."""
        return embedding(self.weight.value, x)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"

    def _upgrade_entries(self, state: Dict[str, Any], prefix: str) -> None:
        """The older name: `weights`."""
        _renamed(state, prefix)


class LayerNorm(Module):
    """LayerNorm over the trailing dims normalized_shape (an int: the last dim), as
    torch.nn.LayerNorm: (x - mean) / sqrt(var + eps) * weight + bias, weight ones and bias zeros at
    first (none with elementwise_affine=False; no bias with bias=False).

    use_fused_kernel=True runs Tensor.layernorm (one fused op; a fused kernel on CUDA); otherwise
    the normalization is composed from tensor ops.  Inside minitorch.autocast it runs in float32.
    """

    def __init__(
        self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-5, elementwise_affine: bool = True,
        bias: bool = True, *, backend: Optional[Any] = None, device: Optional[Any] = None, use_fused_kernel: bool = False,
    ):  # fmt: skip
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(int(s) for s in normalized_shape)
        if not shape or any(s < 1 for s in shape):
            raise ValueError(f"LayerNorm normalized_shape must be positive sizes, got {normalized_shape!r}")
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.use_fused_kernel = use_fused_kernel
        backend = _place(backend, device)
        self.weight = Parameter(tensor_from_numpy(np.ones(shape), backend=backend)) if elementwise_affine else None
        self.bias = Parameter(tensor_from_numpy(np.zeros(shape), backend=backend)) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        k = len(self.normalized_shape)
        if x.shape[x.dims - k :] != self.normalized_shape:
            raise IndexingError(f"LayerNorm({self.normalized_shape}) got input of shape {x.shape}")
        (x,) = autocast_inputs("layernorm", x)
        lead = x.shape[: x.dims - k]
        flat = x.contiguous().view(*lead, -1)
        size = flat.shape[-1]
        gamma = flat.zeros((size,)) + 1.0 if self.weight is None else self.weight.value.view(-1)
        beta = flat.zeros((size,)) if self.bias is None else self.bias.value.view(-1)
        if self.use_fused_kernel:
            out = flat.layernorm(gamma, beta, self.eps)
        else:
            d = flat.dims - 1
            centered = flat - flat.mean(d, keepdim=True)
            var = (centered * centered).mean(d, keepdim=True)
            out = centered * ((var + self.eps) ** -0.5) * gamma + beta
        return out.view(*x.shape)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}"

    def _upgrade_entries(self, state: Dict[str, Any], prefix: str) -> None:
        """The older name: `weights`."""
        _renamed(state, prefix)


LayerNorm1d = LayerNorm


class Dropout(Module):
    """Inverted dropout with probability p (default 0.5, as torch's) while training; identity in eval mode."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p!r}")
        self.p = float(p)

    @property
    def active(self) -> bool:
        """Whether forward changes anything: training with p > 0."""
        return self.training and self.p > 0.0

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, training=self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class ReLU(Module):
    """max(x, 0), elementwise."""

    def forward(self, x: Tensor) -> Tensor:
        return x.relu()


class GELU(Module):
    """GELU, elementwise: exact (approximate="none", torch's default) or the tanh approximation."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        F.check_gelu_approximation(approximate)
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"
