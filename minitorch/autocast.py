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
an fp32 gradient, and the optimizer updates float32 values.

The bf16 copy of a parameter (a leaf tensor that requires grad) is made once and kept with the
parameter until its values change: the cost is one cast pass per weight per optimizer step, and
memory for one 16-bit copy of each weight the autocast ops read.  A copy is valid while the
tensor's `_version` is the one it was made at: in-place writes (`copy_`, `x[...] = v`) and the
optimizers' in-place updates bump it.  Activations are cast at each use.

The state is per thread and nests: an inner `autocast(enabled=False)` turns casting off for its
block, an inner `autocast(dtype=...)` changes the dtype.  Backward passes run with autocast off:
their ops take the dtypes the forward pass chose (gradient checkpointing's recomputation restores
the forward's state).  The context also works as a decorator.
"""

from __future__ import annotations

import threading
from contextlib import ContextDecorator
from typing import Any, List, NamedTuple, Optional, Tuple

from .autodiff import is_grad_enabled
from .dtypes import DType, as_dtype, bfloat16, float32

LOW_PRECISION_OPS = frozenset({"matmul", "linear", "attention", "linear_cross_entropy"})
FLOAT32_OPS = frozenset({"sum", "softmax", "log_softmax", "logsumexp", "attn_softmax", "layernorm", "cross_entropy"})


class AutocastState(NamedTuple):
    """Whether autocast is on, and its dtype (the arguments of the `autocast` that set it)."""

    enabled: bool
    dtype: DType


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
    """

    def __init__(self, dtype: DType = bfloat16, enabled: bool = True):
        low = as_dtype(dtype)
        if not low.is_floating or low is float32:
            raise ValueError(f"autocast dtype must be minitorch.bfloat16 or minitorch.float16, got {dtype!r}")
        self.state = AutocastState(bool(enabled), low)

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
        return tuple(_raised(t) for t in tensors) if state.enabled else tensors
    raise ValueError(f"autocast has no rule for {op!r}; rules: {sorted(LOW_PRECISION_OPS | FLOAT32_OPS)}")


def _raised(t: Optional[Any]) -> Optional[Any]:
    if t is None or not t.dtype.is_floating or t.dtype is float32:
        return t
    return t.to(float32)


def _lowered(t: Optional[Any], dtype: DType) -> Optional[Any]:
    """t in dtype; a parameter's copy comes from (and goes to) its cache, see the module notes."""
    if t is None or not t.dtype.is_floating or t.dtype is dtype:
        return t
    if not (t.is_leaf and t.requires_grad):
        return t.to(dtype)
    cached = getattr(t, "_autocast_copy", None)
    if cached is not None:
        version, copy = cached
        # A copy made under no_grad has no history: where a gradient is wanted it is made again.
        if version == t._version and copy.dtype is dtype and (copy.requires_grad or not is_grad_enabled()):
            return copy
    copy = t.to(dtype)
    t._autocast_copy = (t._version, copy)
    return copy
