"""Mixed precision as PyTorch's autocast: `with minitorch.autocast(dtype=minitorch.bfloat16): ...`.

Inside the context the ops below take their floating inputs in the dtype their rule names (ops
not listed run in the dtype their inputs promote to):

  bfloat16 (the autocast dtype)  matmul (`@`), Linear / fused.linear, fused attention, the fused
                                 linear cross-entropy: inputs cast down, float32 accumulation inside
                                 the kernel (on the CPU backends: float32 math on the 16-bit values),
                                 output in the autocast dtype
  float32                        sum and mean (reductions), softmax, log_softmax, logsumexp,
                                 attn_softmax, LayerNorm, the losses (nn.cross_entropy,
                                 nn.softmax_loss): inputs cast up, output float32

Parameters stay float32 (master weights) and so do their gradients: a cast is an autodiff op whose
gradient is cast back to its input's dtype, so an fp32 weight read through a bf16 copy accumulates
an fp32 gradient, and the optimizer updates float32 values.  A gradient of a working copy (below)
reaches the master without being rounded to the copy's dtype on the way: a bf16 Linear's weight
gradient is float32 (products of bf16 values summed in float32), and stays so (a bf16 `@` gives a
bf16 one, as in PyTorch).

The bf16 copy of a parameter (a leaf tensor that requires grad) is its *working copy*: one
persistent 16-bit buffer per parameter, allocated at the first read and rewritten in place when the
parameter's values have changed, so its address stays (a captured CUDA graph keeps reading it).  A
copy is current while the tensor's `_version` is the one it was written at: in-place writes
(`copy_`, `x[...] = v`) and the optimizers' in-place updates bump it.  Left to autocast, a stale copy
costs one cast pass per weight per optimizer step, and the memory of one 16-bit copy of each weight
the autocast ops read.  AdamW leaves every copy of the parameters it updates current after a step:
a captured CUDA graph that reads copies without autocast's checks (a decoding step) reads current
values, and a training step's forward casts nothing.  On CUDA its multi-tensor update writes each
bfloat16 copy in the same pass as the float32 update (reading `working_copy(p)`, then calling
`working_copy_written(p)` after bumping `p._version`), which saves the cast pass; it ends with
`refresh_working_copies`, which casts only the copies still stale.  Reading a copy
returns the same tensor until the parameter changes; its values are the parameter's latest.  A view
of a parameter made by views alone (permute / transpose, view, narrow / basic slicing: a tied LM head,
`wte.narrow(0, 0, V).transpose(0, 1)`) is read as the same view of the parameter's working copy, so it
costs no cast of its own and keeps its layout.
Activations are cast at each use.

`low_activations=True` keeps the activations in the autocast dtype between ops, as llm.c's bf16
training does: LayerNorm and the attention softmax take 16-bit activations as they are (their
kernels keep float32 statistics inside), and embedding lookups give 16-bit rows (the table stays float32, so its
gradient is summed in float32); sums, means, softmax / log_softmax / logsumexp and the losses still
run in float32.  Residual sums of 16-bit activations then stay 16-bit, so activations move 2 bytes per
value between kernels.

The state is per thread and nests: an inner `autocast(enabled=False)` turns casting off for its
block, an inner `autocast(dtype=...)` changes the dtype.  Backward passes run with autocast off:
their ops take the dtypes the forward pass chose (gradient checkpointing's recomputation restores
the forward's state).  The context also works as a decorator.
"""

from __future__ import annotations

import threading
from contextlib import ContextDecorator
from typing import TYPE_CHECKING, Any, Iterable, List, NamedTuple, Optional, Tuple

from .autodiff import Context, is_grad_enabled, no_grad
from .dtypes import DType, as_dtype, bfloat16, float32
from .tensor_data import TensorData
from .tensor_functions import Function
from .tensor_ops import empty

if TYPE_CHECKING:
    from .tensor import Tensor

LOW_PRECISION_OPS = frozenset({"matmul", "linear", "attention", "linear_cross_entropy"})
FLOAT32_OPS = frozenset({"sum", "softmax", "log_softmax", "logsumexp", "attn_softmax", "layernorm", "cross_entropy"})
# Ops whose kernels compute float32 statistics inside: under low_activations they take 16-bit inputs as they are.
STATISTICS_OPS = frozenset({"attn_softmax", "layernorm"})


class AutocastState(NamedTuple):
    """Whether autocast is on, its dtype and whether activations stay in it (the arguments of the
    `autocast` that set it)."""

    enabled: bool
    dtype: DType
    low_activations: bool = False


_OFF = AutocastState(False, bfloat16)
_local = threading.local()


def _stack() -> List[AutocastState]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def autocast_state() -> AutocastState:
    """This thread's autocast state (off outside any autocast context)."""
    stack = _stack()
    return stack[-1] if stack else _OFF


def is_autocast_enabled() -> bool:
    """Whether this thread runs inside an enabled autocast context."""
    return autocast_state().enabled


def get_autocast_dtype() -> DType:
    """The dtype of the innermost autocast context (bfloat16 outside any)."""
    return autocast_state().dtype


class autocast(ContextDecorator):
    """Run a block (or a decorated function) in mixed precision; see the module notes.

    dtype: the low-precision dtype, minitorch.bfloat16 (default) or minitorch.float16 (or their names).
    enabled: False turns autocast off inside the block (e.g. for a part that must run in float32).
    low_activations: True keeps activations in dtype between ops (LayerNorm and the attention softmax
    take them as they are, embedding lookups give dtype rows); False follows PyTorch's rules.
    """

    def __init__(self, dtype: DType = bfloat16, enabled: bool = True, low_activations: bool = False):
        low = as_dtype(dtype)
        if not low.is_floating or low is float32:
            raise ValueError(f"autocast dtype must be minitorch.bfloat16 or minitorch.float16, got {dtype!r}")
        self.state = AutocastState(bool(enabled), low, bool(low_activations))

    @classmethod
    def restore(cls, state: AutocastState) -> "autocast":
        """The context that sets `state` again (e.g. a recomputation under the forward's state)."""
        return cls(state.dtype, state.enabled, state.low_activations)

    def __enter__(self) -> "autocast":
        _stack().append(self.state)
        return self

    def __exit__(self, *exc: Any) -> None:
        _stack().pop()


def autocast_inputs(op: str, *tensors: Any) -> Tuple[Any, ...]:
    """The inputs of `op` as autocast's rule for it says (None and non-floating tensors pass as they
    are); all of them unchanged when autocast is off.  op is one of LOW_PRECISION_OPS or FLOAT32_OPS."""
    state = autocast_state()
    if op in LOW_PRECISION_OPS:
        return tuple(_lowered(t, state.dtype) for t in tensors) if state.enabled else tensors
    if op in FLOAT32_OPS:
        return tuple(_raised(t) for t in tensors) if raised_to_float32(op) else tensors
    raise ValueError(f"autocast has no rule for {op!r}; rules: {sorted(LOW_PRECISION_OPS | FLOAT32_OPS)}")


def raised_to_float32(op: str) -> bool:
    """Whether autocast_inputs(op, ...) now gives op its 16-bit floating inputs as float32 (op one of
    FLOAT32_OPS): a kernel that reads 16-bit values into float32 math may then take them as they are."""
    state = autocast_state()
    return state.enabled and not (state.low_activations and op in STATISTICS_OPS)


def activation_dtype(dtype: DType) -> DType:
    """The dtype of the activations an op that starts a stream of them (an embedding lookup) gives
    for parameters of dtype: the autocast dtype under low_activations, dtype otherwise."""
    state = autocast_state()
    if not (state.enabled and state.low_activations) or not dtype.is_floating:
        return dtype
    return state.dtype


def _raised(t: Optional[Any]) -> Optional[Any]:
    if t is None or not t.dtype.is_floating or t.dtype is float32:
        return t
    return t.to(float32)


def _lowered(t: Optional[Any], dtype: DType) -> Optional[Any]:
    """t in dtype; a parameter is read through its working copy, see the module notes."""
    if t is None or not t.dtype.is_floating or t.dtype is dtype:
        return t
    if not (t.is_leaf and t.requires_grad):
        chain = _views_of_a_parameter(t)
        return t.to(dtype) if chain is None else _replay_views(_lowered(chain[0], dtype), chain[1:])
    version, copy = getattr(t, "_autocast_copy", (None, None))
    if copy is None or copy.dtype is not dtype:
        buffer, stale = empty(t.backend.ops, t.shape, dtype), True
    else:
        buffer, stale = copy._tensor, version != t._version
        # A copy read under no_grad has no history: where a gradient is wanted it gets one (no cast).
        if not stale and (copy.requires_grad or not is_grad_enabled()):
            return copy
    copy = WorkingCopy.apply(t, buffer, stale)
    copy._grad_dtype = t.dtype  # gradients reach the master as they come (a 16-bit Linear's dW is float32)
    t._autocast_copy = (t._version, copy)
    return copy


def _views_of_a_parameter(t: "Tensor") -> Optional[List["Tensor"]]:
    """[leaf, view of it, ..., t] when t is made from a contiguous leaf that requires grad by views
    alone (permute / transpose, view, narrow / basic slicing), else None."""
    from .tensor_functions import Permute, View
    from .tensor_index import StridedView

    chain = [t]
    while not chain[-1].is_leaf:
        history = chain[-1].history
        if history is None or history.last_fn not in (Permute, View, StridedView) or len(history.inputs) != 1:
            return None
        chain.append(history.inputs[0])
    leaf = chain[-1]
    return chain[::-1] if leaf.requires_grad and leaf.is_contiguous() else None


def _replay_views(copy: "Tensor", views: List["Tensor"]) -> "Tensor":
    """The views that made each of `views` from its input, applied in turn to copy (the lowered leaf):
    a transposed head of a tied embedding reads the embedding's working copy, not a cast of its own,
    and its float32 weight gradient (the fused classifier's) reaches the master without a round trip
    through bf16."""
    from .tensor_functions import Permute, View
    from .tensor_index import StridedView

    out = copy
    for node in views:
        fn, saved = node.history.last_fn, node.history.ctx.saved_values
        if fn is Permute:
            out = Permute.apply(out, saved[0])
        elif fn is View:
            out = View.apply(out, node.shape)
        else:
            out = StridedView.apply(out, saved[1])
        out._grad_dtype = copy._grad_dtype  # as the copy's: gradients reach the master unrounded
    return out


class WorkingCopy(Function):
    """A parameter read through its 16-bit working copy: forward writes the parameter's values into
    the copy's buffer when they are stale and returns the copy; backward hands the gradient on in
    the parameter's dtype (as it is when it already is: the float32 dW of a 16-bit Linear)."""

    passes_gradient_on = True  # the gradient itself, or a cast of it (a new tensor)
    settles_own_gradient = True  # the gradient itself may stay in flight (a weight gradient on the side stream)

    @staticmethod
    def forward(ctx: Context, param: "Tensor", buffer: TensorData, stale: bool) -> "Tensor":
        if stale:
            param.backend.cast(param._tensor, buffer.dtype, buffer)
        ctx.save_for_backward(param.dtype)
        return param._new(buffer)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (dtype,) = ctx.saved_values
        if grad_output.dtype is dtype:
            return grad_output
        grad_output.settle()
        return grad_output._new(grad_output.backend.cast(grad_output._tensor, dtype))


def refresh_working_copies(tensors: Iterable["Tensor"]) -> None:
    """Write the values of each of tensors whose working copy is stale into that copy (one cast
    each; nothing for a tensor without a copy or with a current one)."""
    for t in tensors:
        version, copy = getattr(t, "_autocast_copy", (None, None))
        if copy is not None and version != t._version:
            t.backend.cast(t._tensor, copy.dtype, copy._tensor)
            t._autocast_copy = (t._version, t._new(copy._tensor))  # its next read for a gradient adds history


def working_copy(t: "Tensor") -> Optional[TensorData]:
    """The buffer of parameter t's working copy (contiguous, of the autocast dtype it was read in),
    or None when no autocast op has read t: what an optimizer writes along with t's update."""
    copy = getattr(t, "_autocast_copy", (None, None))[1]
    return None if copy is None else copy._tensor


def current_working_copy(t: "Tensor", dtype: DType) -> TensorData:
    """The buffer of parameter t's working copy in dtype, made now when t has none and rewritten when
    stale: what an optimizer that keeps its parameters' copies (AdamW's working_dtype) holds on to."""
    with no_grad():
        return _lowered(t, dtype)._tensor


def working_copy_written(t: "Tensor") -> None:
    """Declare that t's working copy holds t's current values (its writer updated both in one
    pass, then bumped t._version): autocast's next read casts nothing."""
    copy = getattr(t, "_autocast_copy", (None, None))[1]
    if copy is not None:
        # as refresh_working_copies: the next read for a gradient is a new node of that step's graph,
        # which backward orders by that read (a tied head's gradient gathered before the embedding's)
        t._autocast_copy = (t._version, t._new(copy._tensor))
