"""Tensor: an n-dimensional array (float32, bfloat16, float16, int64 or bool) with reverse-mode autodiff, on any backend."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Tuple, Type, Union

import numpy as np

from . import tensor_functions as F
from .autocast import autocast
from .autodiff import Context, backpropagate, no_grad
from .dtypes import DType, float32, int64
from .fast_ops import FastOps
from .fused.layernorm import layernorm as _layernorm
from .fused.softmax import attn_softmax as _attn_softmax
from .tensor_convert import Conversions
from .tensor_data import IndexingError, TensorData, UserShape, prod, shape_broadcast
from .tensor_index import Indexing
from .tensor_math import Arithmetic
from .tensor_ops import TensorBackend
from .tensor_reduce import Reductions
from .tensor_views import Views

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


class Tensor(Arithmetic, Conversions, Views, Indexing, Reductions):
    """An array with a shape, strides, a dtype (minitorch.float32 by default, int64 for integer data;
    see minitorch.dtypes), a backend, and optional autodiff history.

    Comparisons (<, >, <=, >=, ==, !=, ~, &, |) give 1.0/0.0 values of dtype minitorch.bool, which
    index as a mask (x[x > 0]); arithmetic between bools gives float32 (PyTorch keeps bool), a bool's
    sum is int64.  Ops on mixed dtypes promote as in PyTorch (bfloat16 with float32 gives float32,
    int64 with a float gives the float; a Python number never promotes its own category).
    """

    __array_priority__ = 1000
    grad_ready_hooks: Tuple[Callable[["Tensor"], None], ...] = ()  # see register_grad_ready_hook
    _version = 0  # bumped by in-place writes; autocast's cached casts of a parameter check it
    _grad_dtype: Optional[DType] = None  # the dtype of its gradients where not its own (autocast's working copies)
    # True on the 1 that backward() starts from when given no gradient: a Function that gets it as its
    # output's gradient may take it as the multiplicative identity (fused_linear_cross_entropy then
    # hands over the gradients it made in forward without a scaling pass).
    is_unit_seed = False

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

    def size(self, dim: Optional[int] = None) -> Union[UserShape, int]:
        """The shape, or the size of one dim (size(0), size(-1)), as torch's size(); numel() counts
        the elements."""
        if dim is None:
            return self.shape
        return self.shape[self._dim(dim)]

    @property
    def dims(self) -> int:
        return self._tensor.dims

    @property
    def ndim(self) -> int:
        """Number of dims (torch's name; dim() too)."""
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
            if not self.dtype.is_floating:
                raise RuntimeError(f"only floating-point tensors can require gradients, not {self.dtype.name} (as in torch)")
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
        """0 .. n - 1 as int64 on this backend."""
        out = self._new_empty((n,), int64)
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
        self.settle(write=True)
        if isinstance(src, (int, float)):
            self.backend.fill(self._tensor, src)
            return self
        if isinstance(src, np.ndarray):
            if src.shape != self.shape or not self.is_contiguous():
                raise IndexingError(
                    f"copy_ of a numpy array of shape {src.shape} needs a contiguous tensor of that shape, got "
                    f"{self.shape} strides {self._tensor.strides}"
                )
            self.backend.ops.storage_upload(self._tensor._storage, self.dtype.host_values(src))
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
        from .tensor_create import full  # a fill kernel: no host-to-device copy, so CUDA graphs capture it

        return full((), b, backend=self.backend)

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

    def chain_rule(
        self, d_output: Any, pending: Optional[Callable[["Tensor"], Tuple[Any, bool]]] = None,
        output_alone: bool = False,
    ) -> Iterable[Tuple["Tensor", Any, bool, bool]]:  # fmt: skip
        h = self.history
        assert h is not None and h.last_fn is not None and h.ctx is not None
        ctx, fn = h.ctx, h.last_fn
        if pending is not None and fn.folds_pending:
            # an input used twice by this op is not offered: both uses would fold it in
            uses = Counter(inp.unique_id for inp in h.inputs)
            offered = [(None, False) if uses[inp.unique_id] > 1 else pending(inp) for inp in h.inputs]
            ctx.pending = tuple(found for found, _ in offered)
            ctx.pending_alone = tuple(mine for _, mine in offered)
        if not fn.settles_own_gradient:
            d_output.settle()
        try:
            grads = fn._backward(ctx, d_output)
            folded, handed = ctx.folded, ctx.handed_over
        finally:
            ctx.pending, ctx.pending_alone, ctx.folded, ctx.handed_over = (), (), set(), set()
        passed_on = fn.passes_gradient_on and output_alone
        out = []
        for i, (inp, g) in enumerate(zip(h.inputs, grads)):
            if g is None or inp.is_constant():
                continue
            # As torch's engine does, each gradient takes its input's dtype (a bf16 use of an fp32 value gets
            # an fp32 one), except that a float32 master weight's 16-bit working copy passes float32 ones on
            # unrounded. A gradient made here (a sum or a cast) is backward's alone.
            dtype = (inp._grad_dtype or inp.dtype) if inp.dtype.is_floating else g.dtype
            if g.shape != inp.shape or g.dtype is not dtype:
                g.settle()  # a kernel reads it
            given = g._sum_to(inp.shape).to(dtype)
            out.append((inp, given, i in folded, given is not g or i in handed or passed_on))
        return out

    def accumulate_derivative(self, x: "Tensor") -> None:
        """Add x to .grad of this leaf (kept contiguous)."""
        if not self.is_leaf:
            raise RuntimeError("only leaf tensors accumulate derivatives")
        if self.grad is not None or not x.is_contiguous():
            x.settle()
        x = x.contiguous()
        self.grad = x if self.grad is None else x._new(self.backend.add_zip(self.grad._tensor, x._tensor))

    def settle(self, write: bool = False) -> None:
        """Make the device's current stream wait for work still making this tensor beside it (a bf16
        Linear's weight gradient on the side stream, TensorData.in_flight), and with write for work
        still reading it beside it too (the output gradient that weight gradient is made from,
        TensorData.read_beside); a no-op when there is none.  Backward hands such gradients on as they
        are and settles them where a kernel reads them (a sum, a cast, an accumulation, a grad-ready
        hook) or writes into them (an in-place fold, Context.may_write_pending), and all at its end
        (the backend's settle_side, see autodiff.backpropagate)."""
        self._tensor.settle(write)

    def backward(self, grad_output: Optional["Tensor"] = None) -> None:
        """Backpropagate from this tensor; grad_output defaults to 1 for a one-element tensor."""
        if self.history is None:
            raise RuntimeError(
                f"backward() on a tensor of shape {self.shape} that has no history: no input of it requires grad"
            )
        if grad_output is None:
            if self.numel() != 1:
                raise RuntimeError(f"backward() without a gradient needs a one-element tensor, got shape {self.shape}")
            grad_output = self._new_empty(self.shape, self.dtype)
            self.backend.fill(grad_output._tensor, 1.0)
            grad_output.is_unit_seed = True
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
