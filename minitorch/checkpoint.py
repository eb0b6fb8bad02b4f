"""Gradient checkpointing: keep a function's inputs instead of its activations, recompute in backward.

`checkpoint(layer, x, mask)` returns what `layer(x, mask)` returns, but the autodiff graph holds only
one node for the whole call, which keeps x (and mask) and nothing that the layer computed inside.
Backward runs the layer again, with history, on the same inputs and the same random numbers, and
backpropagates through that fresh graph.  Memory of a deep model drops from every layer's
activations to one layer's worth plus each layer's input, for one extra forward pass of compute.
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

from .autocast import autocast, autocast_state
from .autodiff import Context, enable_grad, is_grad_enabled, no_grad
from .rng import get_rng_state, set_rng_state
from .tensor import Tensor
from .tensor_functions import Function


class Checkpoint(Function):
    """fn(*args) recorded as one autodiff node whose saved state is the inputs, not the activations.

    forward(fn, needs_grad, *args): saves minitorch's RNG state (get_rng_state) and autocast state,
    runs fn under no_grad, so nothing inside records history and every intermediate tensor is freed as soon as fn
    is done with it, and saves fn, the flags and the inputs.

    backward(grad_output): sets the RNG state saved in forward (so dropout and anything else drawing
    random numbers repeat exactly the draws of forward), runs fn again under the forward's autocast
    state with history on fresh leaves
    that hold the same input values, puts the RNG state back to what it was when backward started,
    and backpropagates grad_output through the recomputed graph.  Leaves that fn uses without
    taking them as arguments (a module's parameters) accumulate their .grad there, exactly as
    without checkpointing; the gradients of the arguments are returned to the outer graph.

    needs_grad[i] says whether args[i] is a tensor that requires grad; only those become leaves of
    the recomputation (others, e.g. a padding mask, stay constants and get a zero gradient).
    fn must return a single Tensor and must compute the same function when run again: it may not
    depend on state that changes between forward and backward (a module switched between train and
    eval, a parameter updated in place) other than the RNG.
    """

    @staticmethod
    def forward(ctx: Context, fn: Callable[..., Tensor], needs_grad: Tuple[bool, ...], *args: Any) -> Tensor:
        rng_state = get_rng_state()
        with no_grad():
            out = fn(*args)
        if not isinstance(out, Tensor):
            raise TypeError(f"checkpoint: fn must return one Tensor, got {type(out).__name__}")
        ctx.save_for_backward(fn, needs_grad, rng_state, autocast_state(), args)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: Tensor) -> Tuple[Tensor, ...]:
        fn, needs_grad, rng_state, cast_state, args = ctx.saved_values
        leaves = tuple(a.detach().requires_grad_(True) if need else a for a, need in zip(args, needs_grad))
        resume_state = get_rng_state()
        set_rng_state(rng_state)
        try:
            with enable_grad(), autocast.restore(cast_state):
                out = fn(*leaves)
        finally:
            set_rng_state(resume_state)
        out.backward(grad_output)
        grads = []
        for leaf, need in zip(leaves, needs_grad):
            if not isinstance(leaf, Tensor):
                continue
            grads.append(leaf.grad if need and leaf.grad is not None else leaf.zeros())
        return tuple(grads)


def checkpoint(fn: Callable[..., Tensor], *args: Any) -> Tensor:
    """fn(*args) with gradient checkpointing (see Checkpoint): the same value and, after backward,
    the same gradients (dropout masks included), while the graph keeps only the inputs of fn.

    args may mix tensors and other values (None, flags).  When no history is being recorded
    (no_grad) or no tensor argument requires grad, fn simply runs: a checkpoint node with no input
    that needs a gradient would cut the gradients of the parameters inside fn.
    """
    needs_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
    if not is_grad_enabled() or not any(needs_grad):
        return fn(*args)
    return Checkpoint.apply(fn, needs_grad, *args)
