"""Tensor: an n-dimensional array (float32, bfloat16, float16 or bool) with reverse-mode autodiff, on any backend."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Tuple, Type, Union

import numpy as np

from . import tensor_functions as F
from .autocast import autocast, autocast_inputs
from .autodiff import Context, backpropagate, no_grad
from .dtypes import DType, bool_, float32
from .fast_ops import FastOps
from .fused.layernorm import layernorm as _layernorm
from .fused.softmax import attn_softmax as _attn_softmax
from .tensor_convert import Conversions
from .tensor_data import IndexingError, TensorData, UserShape, prod, shape_broadcast
from .tensor_index import Indexing
from .tensor_ops import TensorBackend
from .tensor_reduce import Reductions
from .tensor_views import Views

TensorLike = Union[float, int, "Tensor"]
_ids = itertools.count(1)


def default_backend() -> TensorBackend:
    """The CPU default: numba-parallel FastOps."""
    return TensorBackend(FastOps)


def _elementwise(fn: Type[F.Function], doc: str) -> Callable[["Tensor"], "Tensor"]:
    """A Tensor method applying the one-input Function fn."""

    def method(self: "Tensor") -> "Tensor":
        return fn.apply(self)

    method.__name__ = fn.__name__.lower()
    method.__qualname__ = f"Tensor.{method.__name__}"
    method.__doc__ = doc
    return method


@dataclass
class History:
    """How a tensor was made: the Function, its context and its inputs (None fn for a leaf)."""

    last_fn: Optional[Type[F.Function]] = None
    ctx: Optional[Context] = None
    inputs: Sequence["Tensor"] = field(default_factory=tuple)


class Tensor(Conversions, Views, Indexing, Reductions):
    """An array with a shape, strides, a dtype (minitorch.float32 by default; see minitorch.dtypes),
    a backend, and optional autodiff history.

    Comparisons (<, >, <=, >=, ==, !=, ~, &, |) give 1.0/0.0 values of dtype minitorch.bool, which
    index as a mask (x[x > 0]); any arithmetic on them gives float32 again.  Ops on mixed dtypes
    promote as in PyTorch (bfloat16 with float32 gives float32; a Python number never promotes).
    """

    __array_priority__ = 1000
    grad_ready_hooks: Tuple[Callable[["Tensor"], None], ...] = ()  # see register_grad_ready_hook
    _version = 0  # bumped by in-place writes; autocast's cached casts of a parameter check it

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

    def dim(self) -> int:
        """Number of dims (torch's name)."""
        return self._tensor.dims

    def numel(self) -> int:
        """Number of elements (torch's name)."""
        return self._tensor.size

    @property
    def dtype(self) -> DType:
        """minitorch.float32, bfloat16 or float16, or minitorch.bool for the 1.0/0.0 results of comparisons."""
        return self._tensor.dtype

    @property
    def device(self) -> str:
        """'cuda' for tensors of the CUDA backend, else 'cpu'."""
        return "cuda" if self.backend.cuda else "cpu"

    def _keep_dtype(self, out: "Tensor") -> "Tensor":
        """out (values gathered from this tensor, exact in its dtype) labelled with this tensor's dtype."""
        if out.dtype is not self.dtype:
            out._tensor = out._tensor.with_dtype(self.dtype)
        return out

    def requires_grad_(self, flag: bool = True) -> "Tensor":
        """Make this tensor a leaf that collects .grad (flag=True) or a constant (False); as in torch,
        only a leaf's flag can be turned off (detach() gives a constant copy of any tensor)."""
        if not isinstance(flag, bool):
            raise TypeError(f"requires_grad must be a bool, got {type(flag).__name__} {flag!r}")
        if flag:
            if self.history is None:
                self.history = History()
        elif self.history is not None:
            if not self.is_leaf:
                raise RuntimeError(
                    f"requires_grad_(False) on a tensor of shape {self.shape} that an op made: only a leaf's "
                    f"flag can be turned off; use .detach()"
                )
            self.history = None
        return self

    @property
    def requires_grad(self) -> bool:
        """Whether autodiff tracks this tensor: a leaf made with requires_grad=True, or the result of
        an op on one (outside no_grad()).  Setting it calls requires_grad_()."""
        return self.history is not None

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self.requires_grad_(flag)

    @property
    def is_leaf(self) -> bool:
        """True unless an op recording autodiff history made this tensor (torch's meaning: a constant
        is a leaf too; a leaf that requires grad collects .grad in backward)."""
        return self.history is None or self.history.last_fn is None

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

    def _new_empty(self, shape: UserShape, dtype: DType = float32) -> "Tensor":
        """Uninitialized contiguous tensor on this backend."""
        if type(shape) is not tuple:
            shape = tuple(int(s) for s in shape)
        storage = self.backend.ops.storage_empty(prod(shape), dtype)
        return Tensor(TensorData(storage, shape, dtype=dtype), backend=self.backend)

    def zeros(self, shape: Optional[UserShape] = None, dtype: DType = float32) -> "Tensor":
        """Zeros of a shape (default: this tensor's) and dtype on this backend."""
        out = self._new_empty(self.shape if shape is None else shape, dtype)
        self.backend.fill(out._tensor, 0.0)
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
        if self.history is not None and not self.is_leaf:
            raise RuntimeError(f"copy_ into a tensor of shape {self.shape} that has autodiff history")
        self._version += 1
        if isinstance(src, (int, float)):
            self.backend.fill(self._tensor, float(src))
            return self
        if isinstance(src, np.ndarray):
            if src.shape != self.shape or not self.is_contiguous():
                raise IndexingError(
                    f"copy_ of a numpy array of shape {src.shape} needs a contiguous tensor of that shape, got "
                    f"{self.shape} strides {self._tensor.strides}"
                )
            self.backend.ops.storage_upload(self._tensor._storage, self.dtype.round(src))
            return self
        src = self._ensure(src)
        if shape_broadcast(src.shape, self.shape) != self.shape:
            raise IndexingError(f"copy_: a tensor of shape {src.shape} does not broadcast to {self.shape}")
        self.backend.id_map(src._tensor, out=self._tensor)
        return self

    # ---- iteration ---------------------------------------------------------------------------
    def __len__(self) -> int:
        if self.dims == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator["Tensor"]:
        for i in range(len(self)):
            yield self[i]

    # ---- arithmetic --------------------------------------------------------------------------
    def _ensure(self, b: TensorLike) -> "Tensor":
        if isinstance(b, Tensor):
            if b.backend.ops is not self.backend.ops:
                raise TypeError(
                    f"cannot combine a {self.backend.ops.__name__} tensor {self.shape} with a "
                    f"{b.backend.ops.__name__} tensor {b.shape}: move one with .to(backend)"
                )
            return b
        if not isinstance(b, (int, float)):
            raise TypeError(f"a tensor of shape {self.shape} cannot combine with {type(b).__name__} {b!r}")
        return Tensor(TensorData(self.backend.ops.storage_from_numpy(np.array([b], np.float32)), ()), backend=self.backend)

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
        return F.MatMul.apply(*autocast_inputs("matmul", self, b))

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

    def __le__(self, b: TensorLike) -> "Tensor":
        return (self < b) | (self == b)

    def __ge__(self, b: TensorLike) -> "Tensor":
        return (self > b) | (self == b)

    def __ne__(self, b: TensorLike) -> "Tensor":  # type: ignore[override]
        return ~(self == b)

    def __invert__(self) -> "Tensor":
        """Logical not of a bool tensor."""
        self._need_bool("~")
        return self == 0.0

    def __and__(self, b: "Tensor") -> "Tensor":
        """Logical and of bool tensors."""
        self._need_bool("&", b)
        out = self * b
        out._tensor = out._tensor.with_dtype(bool_)
        return out

    def __or__(self, b: "Tensor") -> "Tensor":
        """Logical or of bool tensors."""
        self._need_bool("|", b)
        return (self + b) > 0.0

    def _need_bool(self, op: str, other: Any = None) -> None:
        for t in (self, other) if other is not None else (self,):
            if getattr(t, "dtype", None) is not bool_:
                raise TypeError(f"{op} needs bool tensors (results of comparisons), got {getattr(t, 'dtype', type(t).__name__)}")

    __hash__ = object.__hash__

    def __neg__(self) -> "Tensor":
        return F.Neg.apply(self)

    def __pow__(self, p: float) -> "Tensor":
        if not isinstance(p, (int, float)):
            raise TypeError(f"tensor ** p needs a Python number p, got {type(p).__name__}")
        return F.PowerScalar.apply(self, float(p))

    def is_close(self, b: "Tensor") -> "Tensor":
        return F.IsClose.apply(self, self._ensure(b))

    def where(self, condition: "Tensor", other: TensorLike) -> "Tensor":
        """This tensor where condition is non-zero, other elsewhere (broadcast; a NaN or inf in the
        branch not taken never leaks); the gradient goes to the branch taken."""
        return F.Where.apply(self._ensure(condition).float(), self, self._ensure(other))

    def masked_fill(self, mask: "Tensor", value: float) -> "Tensor":
        """value where mask is non-zero, this tensor elsewhere."""
        return self._ensure(float(value)).where(mask, self)

    sigmoid = _elementwise(F.Sigmoid, "1 / (1 + exp(-x)), elementwise.")
    relu = _elementwise(F.ReLU, "max(x, 0), elementwise.")
    gelu = _elementwise(F.GELU, "GELU with the tanh approximation, elementwise.")
    log = _elementwise(F.Log, "The natural logarithm, elementwise.")
    exp = _elementwise(F.Exp, "e ** x, elementwise.")
    tanh = _elementwise(F.Tanh, "The hyperbolic tangent, elementwise.")

    # ---- autodiff helpers --------------------------------------------------------------------
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
        # As torch's engine does, each gradient takes its input's dtype (a bf16 use of an fp32 value gets an fp32 one).
        return [
            (inp, g._sum_to(inp.shape).to(inp.dtype) if inp.dtype.is_floating else g._sum_to(inp.shape))
            for inp, g in zip(h.inputs, grads)
            if g is not None and not inp.is_constant()
        ]

    def accumulate_derivative(self, x: "Tensor") -> None:
        """Add x to .grad of this leaf (kept contiguous)."""
        if not self.is_leaf:
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
            grad_output = self._new_empty(self.shape, self.dtype)
            self.backend.fill(grad_output._tensor, 1.0)
        elif grad_output.shape != self.shape:
            raise IndexingError(f"backward gradient of shape {grad_output.shape} for a tensor of shape {self.shape}")
        with no_grad(), autocast(enabled=False):
            backpropagate(self, grad_output)

    def zero_grad_(self) -> None:
        """Drop the accumulated gradient."""
        self.grad = None

    def register_grad_ready_hook(self, hook: Callable[["Tensor"], None]) -> None:
        """Call hook(self) in each backward pass, right after this leaf's .grad has received its
        whole derivative of that pass (every use of it has contributed), while backward goes on
        with the rest of the graph.  Data-parallel training starts gradient communication here."""
        if not (self.is_leaf and self.requires_grad):
            raise RuntimeError(
                f"grad-ready hooks belong on leaf tensors that require grad; this one (shape {self.shape}) is not one"
            )
        self.grad_ready_hooks = (*self.grad_ready_hooks, hook)

    def remove_grad_ready_hook(self, hook: Callable[["Tensor"], None]) -> None:
        """Undo register_grad_ready_hook(hook)."""
        if hook not in self.grad_ready_hooks:
            raise ValueError(f"{hook!r} is not a grad-ready hook of this tensor")
        hooks = list(self.grad_ready_hooks)
        hooks.remove(hook)
        self.grad_ready_hooks = tuple(hooks)
