"""Tensor: an n-dimensional float32 array with reverse-mode autodiff, on any backend."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence, Tuple, Type, Union

import numpy as np

from . import tensor_functions as F
from .autodiff import Context, backpropagate, no_grad
from .fast_ops import FastOps
from .fused.layernorm import layernorm as _layernorm
from .fused.softmax import attn_softmax as _attn_softmax
from .tensor_reduce import Reductions
from .tensor_data import IndexingError, TensorData, UserShape, prod, resolve_shape, shape_args, shape_broadcast
from .tensor_ops import TensorBackend

TensorLike = Union[float, int, "Tensor"]
_ids = itertools.count(1)


def default_backend() -> TensorBackend:
    """The CPU default: numba-parallel FastOps."""
    return TensorBackend(FastOps)


@dataclass
class History:
    """How a tensor was made: the Function, its context and its inputs (None fn for a leaf)."""

    last_fn: Optional[Type[F.Function]] = None
    ctx: Optional[Context] = None
    inputs: Sequence["Tensor"] = field(default_factory=tuple)


class Tensor(Reductions):
    """A float32 array with a shape, strides, a backend, and optional autodiff history."""

    __array_priority__ = 1000
    grad_ready_hooks: Tuple[Callable[["Tensor"], None], ...] = ()  # see register_grad_ready_hook

    def __init__(
        self,
        v: TensorData,
        back: Optional[History] = None,
        name: Optional[str] = None,
        backend: Optional[TensorBackend] = None,
    ):
        self._tensor = v
        self.history = back
        self.backend = backend if backend is not None else default_backend()
        self.grad: Optional[Tensor] = None
        self.unique_id = next(_ids)
        self._name = name

    # ---- properties and autodiff flags -------------------------------------------------------
    @property
    def name(self) -> str:
        """A label for debugging (the unique id unless one was given)."""
        return self._name if self._name is not None else str(self.unique_id)

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    @property
    def shape(self) -> UserShape:
        return self._tensor.shape

    @property
    def size(self) -> int:
        return self._tensor.size

    @property
    def dims(self) -> int:
        return self._tensor.dims

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        """Make this tensor a leaf that collects .grad (flag=True) or a constant (False)."""
        if flag:
            if self.history is None:
                self.history = History()
        else:
            self.history = None
        return self

    def requires_grad(self) -> bool:
        return self.history is not None

    def is_leaf(self) -> bool:
        return self.history is not None and self.history.last_fn is None

    def is_constant(self) -> bool:
        return self.history is None

    def is_contiguous(self) -> bool:
        return self._tensor.is_contiguous()

    def detach(self) -> "Tensor":
        """The same data with no history."""
        return Tensor(self._tensor, backend=self.backend)

    # ---- construction helpers used by ops ----------------------------------------------------
    def _new(self, td: TensorData) -> "Tensor":
        return Tensor(td, backend=self.backend)

    def _new_empty(self, shape: UserShape) -> "Tensor":
        """Uninitialized contiguous tensor on this backend."""
        if type(shape) is not tuple:
            shape = tuple(int(s) for s in shape)
        return Tensor(TensorData(self.backend.ops.storage_empty(prod(shape)), shape), backend=self.backend)

    def zeros(self, shape: Optional[UserShape] = None) -> "Tensor":
        """Zeros of a shape (default: this tensor's) on this backend."""
        out = self._new_empty(self.shape if shape is None else shape)
        self.backend.ops.fill(out._tensor, 0.0)
        return out

    def _arange(self, n: int) -> "Tensor":
        out = self._new_empty((n,))
        self.backend.ops.arange(out._tensor)
        return out

    def copy_(self, src: Union[TensorLike, np.ndarray]) -> "Tensor":
        """Write src (a number, a tensor broadcasting to this shape, or a numpy array of this shape)
        into this tensor's storage, in place; for tensors without history (buffers, optimizer state,
        parameters' data).  From numpy to a CUDA tensor the copy is queued without waiting for the
        GPU (through pinned staging buffers)."""
        if self.history is not None and not self.is_leaf():
            raise RuntimeError(f"copy_ into a tensor of shape {self.shape} that has autodiff history")
        if isinstance(src, (int, float)):
            self.backend.ops.fill(self._tensor, float(src))
            return self
        if isinstance(src, np.ndarray):
            if src.shape != self.shape or not self.is_contiguous():
                raise IndexingError(
                    f"copy_ of a numpy array of shape {src.shape} needs a contiguous tensor of that shape, got "
                    f"{self.shape} strides {self._tensor.strides}"
                )
            self.backend.ops.storage_upload(self._tensor._storage, src)
            return self
        src = self._ensure(src)
        if shape_broadcast(src.shape, self.shape) != self.shape:
            raise IndexingError(f"copy_: a tensor of shape {src.shape} does not broadcast to {self.shape}")
        self.backend.id_map(src._tensor, out=self._tensor)
        return self

    def _view(self, shape: Sequence[int]) -> "Tensor":
        shape = resolve_shape(tuple(int(s) for s in shape), self.size, self.shape)
        if not self._tensor.is_contiguous():
            raise IndexingError(
                f"view of a non-contiguous tensor (shape {self.shape}, strides {self._tensor.strides}) "
                f"to {shape}: call .contiguous() first, or use .reshape()"
            )
        return self._new(TensorData(self._tensor._storage, shape))

    # ---- conversions -------------------------------------------------------------------------
    def to_numpy(self) -> np.ndarray:
        """A float32 numpy copy of the values (a device->host copy for GPU tensors)."""
        flat = self.backend.ops.storage_to_numpy(self._tensor._storage)
        if self.size == 0:
            return np.zeros(self.shape, dtype=np.float32)
        item = flat.itemsize
        view = np.lib.stride_tricks.as_strided(
            flat, shape=self.shape, strides=tuple(s * item for s in self._tensor.strides)
        )
        return np.array(view, dtype=np.float32, copy=True)

    def item(self) -> float:
        """The single value of a one-element tensor."""
        if self.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return float(self.to_numpy().reshape(-1)[0])

    def to(self, backend: TensorBackend) -> "Tensor":
        """A copy on another backend (the same tensor if it is already there).

        The copy is a new leaf: it keeps the requires_grad flag but not the history.
        """
        if backend.ops is self.backend.ops:
            return self
        out = Tensor(TensorData(backend.ops.storage_from_numpy(self.to_numpy()), self.shape), backend=backend)
        return out.requires_grad_(self.requires_grad())

    def to_torch(self) -> Any:
        """A torch tensor sharing this tensor's memory (zero-copy on both CPU and GPU)."""
        import torch

        storage = self._tensor._storage
        base = torch.from_numpy(storage) if isinstance(storage, np.ndarray) else storage
        return base.as_strided(self.shape, self._tensor.strides)

    # ---- printing and indexing ---------------------------------------------------------------
    def __repr__(self) -> str:
        text = np.array2string(self.to_numpy(), precision=4, separator=", ", threshold=200, edgeitems=3)
        extra = f", backend={self.backend.ops.__name__}"
        if self.requires_grad():
            extra += ", requires_grad=True"
        return f"tensor({text}{extra})"

    def __getitem__(self, key: Union[int, Sequence[int]]) -> float:
        key2 = (key,) if isinstance(key, int) else tuple(key)
        position = self._tensor.index(key2)
        storage = self._tensor._storage
        if isinstance(storage, np.ndarray):
            return float(storage[position])
        return float(self.backend.ops.storage_to_numpy(storage[position : position + 1])[0])

    def __setitem__(self, key: Union[int, Sequence[int]], val: float) -> None:
        key2 = (key,) if isinstance(key, int) else tuple(key)
        self._tensor.set(key2, val)

    def __len__(self) -> int:
        return self.shape[0]

    # ---- arithmetic --------------------------------------------------------------------------
    def _ensure(self, b: TensorLike) -> "Tensor":
        if isinstance(b, Tensor):
            if b.backend.ops is not self.backend.ops:
                raise TypeError(
                    f"cannot combine a {self.backend.ops.__name__} tensor {self.shape} with a "
                    f"{b.backend.ops.__name__} tensor {b.shape}: move one with .to(backend)"
                )
            return b
        return Tensor(TensorData(self.backend.ops.storage_from_numpy(np.array([b], np.float32)), (1,)), backend=self.backend)

    def __add__(self, b: TensorLike) -> "Tensor":
        if isinstance(b, (int, float)):
            return F.AddScalar.apply(self, float(b))
        return F.Add.apply(self, self._ensure(b))

    def __radd__(self, b: TensorLike) -> "Tensor":
        return self + b

    def __sub__(self, b: TensorLike) -> "Tensor":
        if isinstance(b, (int, float)):
            return F.AddScalar.apply(self, -float(b))
        return F.Add.apply(self, -self._ensure(b))

    def __rsub__(self, b: TensorLike) -> "Tensor":
        return F.AddScalar.apply(-self, float(b)) if isinstance(b, (int, float)) else self._ensure(b) - self

    def __mul__(self, b: TensorLike) -> "Tensor":
        if isinstance(b, (int, float)):
            return F.MulScalar.apply(self, float(b))
        return F.Mul.apply(self, self._ensure(b))

    def __rmul__(self, b: TensorLike) -> "Tensor":
        return self * b

    def __truediv__(self, b: TensorLike) -> "Tensor":
        if isinstance(b, (int, float)):
            return F.MulScalar.apply(self, 1.0 / float(b))
        return F.Mul.apply(self, F.Inv.apply(self._ensure(b)))

    def __rtruediv__(self, b: TensorLike) -> "Tensor":
        if isinstance(b, (int, float)):
            return F.MulScalar.apply(F.Inv.apply(self), float(b))
        return self._ensure(b) / self

    def __matmul__(self, b: "Tensor") -> "Tensor":
        b = self._ensure(b)
        if self.dims < 2 or b.dims < 2:
            raise IndexingError(f"matmul needs tensors of at least 2 dims, got {self.shape} @ {b.shape}")
        if self.shape[-1] != b.shape[-2]:
            raise IndexingError(
                f"matmul shapes {self.shape} @ {b.shape}: inner sizes {self.shape[-1]} and {b.shape[-2]} differ"
            )
        shape_broadcast(self.shape[:-2], b.shape[:-2])
        return F.MatMul.apply(self, b)

    def __lt__(self, b: TensorLike) -> "Tensor":
        if isinstance(b, (int, float)):
            return F.LTScalar.apply(self, float(b))
        return F.LT.apply(self, self._ensure(b))

    def __gt__(self, b: TensorLike) -> "Tensor":
        if isinstance(b, (int, float)):
            return F.LTScalar.apply(-self, -float(b))
        return F.LT.apply(self._ensure(b), self)

    def __eq__(self, b: TensorLike) -> "Tensor":  # type: ignore[override]
        if isinstance(b, (int, float)):
            return F.EQScalar.apply(self, float(b))
        return F.EQ.apply(self, self._ensure(b))

    __hash__ = object.__hash__

    def __neg__(self) -> "Tensor":
        return F.Neg.apply(self)

    def __pow__(self, p: float) -> "Tensor":
        if not isinstance(p, (int, float)):
            raise TypeError(f"tensor ** p needs a Python number p, got {type(p).__name__}")
        return F.PowerScalar.apply(self, float(p))

    def is_close(self, b: "Tensor") -> "Tensor":
        return F.IsClose.apply(self, self._ensure(b))

    def sigmoid(self) -> "Tensor":
        return F.Sigmoid.apply(self)

    def relu(self) -> "Tensor":
        return F.ReLU.apply(self)

    def gelu(self) -> "Tensor":
        """GELU with the tanh approximation."""
        return F.GELU.apply(self)

    def log(self) -> "Tensor":
        return F.Log.apply(self)

    def exp(self) -> "Tensor":
        return F.Exp.apply(self)

    def tanh(self) -> "Tensor":
        return F.Tanh.apply(self)

    # ---- views and layout --------------------------------------------------------------------
    def view(self, *shape: Union[int, Sequence[int]]) -> "Tensor":
        """Same data with another shape (one size may be -1); the tensor must be contiguous."""
        return F.View.apply(self, shape_args(shape))

    def reshape(self, *shape: Union[int, Sequence[int]]) -> "Tensor":
        """view() after a contiguous copy when one is needed."""
        return self.contiguous().view(*shape)

    def permute(self, *order: Union[int, Sequence[int]]) -> "Tensor":
        """Dims reordered (a view)."""
        dims = tuple(self._dim(d) for d in shape_args(order))
        return F.Permute.apply(self, dims)

    def transpose(self, dim0: int = -2, dim1: int = -1) -> "Tensor":
        """Two dims swapped (a view)."""
        order = list(range(self.dims))
        a, b = self._dim(dim0), self._dim(dim1)
        order[a], order[b] = order[b], order[a]
        return self.permute(*order)

    def contiguous(self) -> "Tensor":
        """This tensor if its layout is row-major, else a row-major copy."""
        if self.is_contiguous():
            return self
        return F.Copy.apply(self)

    def expand(self, shape: Sequence[int]) -> "Tensor":
        """A broadcast view of this tensor with a larger shape (stride 0 on broadcast dims)."""
        shape = tuple(int(s) for s in shape)
        if shape_broadcast(self.shape, shape) != shape:
            raise IndexingError(f"cannot expand shape {self.shape} to {shape}")
        return F.Expand.apply(self, shape)

    def _expand_view(self, shape: UserShape) -> "Tensor":
        offset = len(shape) - self.dims
        strides = [0] * offset
        for size, own, stride in zip(shape[offset:], self.shape, self._tensor.strides):
            strides.append(stride if own == size else 0)
        return self._new(TensorData(self._tensor._storage, shape, tuple(strides)))

    def _sum_to(self, shape: UserShape) -> "Tensor":
        """Sum a broadcast gradient back to the shape of the input it belongs to."""
        if self.shape == tuple(shape):
            return self
        out = self
        offset = self.dims - len(shape)
        for d in range(self.dims):
            if d < offset or shape[d - offset] == 1 and self.shape[d] != 1:
                out = out._new(out.backend.add_reduce(out._tensor, d))
        return out.contiguous()._view(shape)

    # ---- fused ops ---------------------------------------------------------------------------
    def attn_softmax(self, mask: Optional["Tensor"] = None, causal: bool = False) -> "Tensor":
        """Softmax over the last dim of attention scores [B, H, Tq, Tk]; see minitorch.fused.attn_softmax."""
        return _attn_softmax(self, mask, causal)

    def layernorm(self, gamma: "Tensor", beta: "Tensor", eps: float = 1e-5) -> "Tensor":
        """LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * gamma + beta; see minitorch.fused.layernorm."""
        return _layernorm(self, gamma, beta, eps)

    # ---- autodiff ----------------------------------------------------------------------------
    @property
    def parents(self) -> Iterable["Tensor"]:
        assert self.history is not None
        return self.history.inputs

    def chain_rule(self, d_output: Any) -> Iterable[Tuple["Tensor", Any]]:
        h = self.history
        assert h is not None and h.last_fn is not None and h.ctx is not None
        grads = h.last_fn._backward(h.ctx, d_output)
        return [(inp, g._sum_to(inp.shape)) for inp, g in zip(h.inputs, grads)]

    def accumulate_derivative(self, x: "Tensor") -> None:
        """Add x to .grad of this leaf (kept contiguous)."""
        if not self.is_leaf():
            raise RuntimeError("only leaf tensors accumulate derivatives")
        x = x.contiguous()
        self.grad = x if self.grad is None else x._new(self.backend.add_zip(self.grad._tensor, x._tensor))

    def backward(self, grad_output: Optional["Tensor"] = None) -> None:
        """Backpropagate from this tensor; grad_output defaults to 1 for a one-element tensor."""
        if self.history is None:
            raise RuntimeError(
                f"backward() on a tensor of shape {self.shape} that has no history: no input of it requires grad"
            )
        if grad_output is None:
            if self.size != 1:
                raise RuntimeError(f"backward() without a gradient needs a one-element tensor, got shape {self.shape}")
            grad_output = self._new_empty(self.shape)
            self.backend.ops.fill(grad_output._tensor, 1.0)
        elif grad_output.shape != self.shape:
            raise IndexingError(f"backward gradient of shape {grad_output.shape} for a tensor of shape {self.shape}")
        with no_grad():
            backpropagate(self, grad_output)

    def zero_grad_(self) -> None:
        """Drop the accumulated gradient."""
        self.grad = None

    def register_grad_ready_hook(self, hook: Callable[["Tensor"], None]) -> None:
        """Call hook(self) in each backward pass, right after this leaf's .grad has received its
        whole derivative of that pass (every use of it has contributed), while backward goes on
        with the rest of the graph.  Data-parallel training starts gradient communication here."""
        if not self.is_leaf():
            raise RuntimeError(f"grad-ready hooks belong on leaf tensors; this one (shape {self.shape}) is not a leaf")
        self.grad_ready_hooks = (*self.grad_ready_hooks, hook)

    def remove_grad_ready_hook(self, hook: Callable[["Tensor"], None]) -> None:
        """Undo register_grad_ready_hook(hook)."""
        if hook not in self.grad_ready_hooks:
            raise ValueError(f"{hook!r} is not a grad-ready hook of this tensor")
        hooks = list(self.grad_ready_hooks)
        hooks.remove(hook)
        self.grad_ready_hooks = tuple(hooks)
