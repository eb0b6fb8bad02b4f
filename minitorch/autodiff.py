"""Reverse-mode automatic differentiation shared by Scalar and Tensor.

A value that takes part in autodiff follows the `Variable` protocol: it has a unique id, knows
whether it is a leaf (made by the user) or constant (no history), who its parents are, and how to
turn the derivative of its output into derivatives of its inputs (`chain_rule`).

Where an input is used more than once, its derivatives are summed. A Function's backward may do that
sum itself (`Function.folds_pending`): `Context.take_pending(i, dtype)` gives it the derivative
gathered so far for input i, which it adds into its own (e.g. as the addend of its kernel:
LayerNorm's input gradient and the residual stream's), and the engine then keeps the result instead
of adding the two. It adds into a new tensor unless the gathered one is backward's alone
(`Context.may_write_pending`): made by the engine's sums, or handed over by the op that made it
(`Context.hand_over`) and passed on through views (`Function.passes_gradient_on`). Then nothing else
refers to its storage and the op may add into it in place: the tied embedding scatters its rows into
the LM head's [V, C] gradient itself, not into a copy of it.

A derivative may still be in the making when a Function returns it (`Tensor.settle`: a bf16
Linear's weight gradient, queued on a side stream beside the rest of backward). The engine hands such
derivatives on as they are and settles them where a kernel would read them: before a sum, before a
fold, before a grad-ready hook, and before a Function's backward unless that Function settles its
gradient itself (`Function.settles_own_gradient`: a parameter's working copy passes its weight
gradient on untouched); `backpropagate` settles the rest at its end (the backend's `settle_side`
hook). Work that only reads a derivative beside (the output gradient that weight gradient is made
from) is waited for only before something writes into it: an in-place fold
(`Context.may_write_pending`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Protocol, Set, Tuple


def central_difference(f: Any, *vals: Any, arg: int = 0, epsilon: float = 1e-6) -> Any:
    """(f(.., x + eps, ..) - f(.., x - eps, ..)) / (2 eps) for argument number `arg`."""
    up = list(vals)
    down = list(vals)
    up[arg] = up[arg] + epsilon
    down[arg] = down[arg] - epsilon
    return (f(*up) - f(*down)) / (2.0 * epsilon)


class Variable(Protocol):
    """What backpropagate needs of a value."""

    def accumulate_derivative(self, x: Any) -> None: ...

    @property
    def unique_id(self) -> int: ...

    @property
    def is_leaf(self) -> bool: ...

    def is_constant(self) -> bool: ...

    @property
    def parents(self) -> Iterable["Variable"]: ...

    def chain_rule(
        self, d_output: Any, pending: Optional[Callable[["Variable"], Tuple[Any, bool]]] = None,
        output_alone: bool = False,
    ) -> Iterable[Tuple["Variable", Any, bool, bool]]:  # fmt: skip
        """(input, its derivative, whether that includes the derivative gathered for it so far,
        whether the derivative is backward's alone) for each input. pending(input) gives the gathered
        derivative (None when there is none) and whether it is backward's alone; None offers nothing
        to fold. output_alone: whether d_output is backward's alone."""


def topological_sort(variable: Variable) -> List[Variable]:
    """All non-constant variables reachable from `variable`, newest first: a variable is made after
    the ones it uses (unique ids count up), so each comes after every variable using it, and of two
    uses of one value the later one in forward runs first in backward, as in PyTorch's engine (which
    orders by sequence number). So the order is the program's, not the graph walk's: an op early in
    forward that can fold a value's other gradients into its own (Context.take_pending: a pre-LN
    block's LayerNorm, a tied head's embedding) finds them gathered.

    Iterative, so a graph thousands of ops deep does not hit Python's recursion limit.
    """
    found: Dict[int, Variable] = {}
    stack: List[Variable] = [variable]
    while stack:
        var = stack.pop()
        if var.unique_id in found or var.is_constant():
            continue
        found[var.unique_id] = var
        if not var.is_leaf:
            stack.extend(p for p in var.parents if p.unique_id not in found and not p.is_constant())
    return [found[i] for i in sorted(found, reverse=True)]


def backpropagate(variable: Variable, deriv: Any) -> None:
    """Run the chain rule from `variable` (whose derivative is `deriv`) back to the leaves.

    Intermediate derivatives are summed per variable and dropped as soon as they have been passed
    on.  A leaf accumulates its derivative as soon as the last variable using it has passed its
    share on, not at its place in the topological order, so a model's parameters get their
    gradients one after another while the rest of backward runs (what data-parallel training
    overlaps communication with); then its grad-ready hooks run (`Tensor.register_grad_ready_hook`).
    """
    if variable.is_leaf:
        _finish_leaf(variable, deriv)
        return
    order = topological_sort(variable)
    uses: Dict[int, int] = {}
    for var in order:
        if not var.is_leaf:
            for parent in var.parents:
                if not parent.is_constant():
                    uses[parent.unique_id] = uses.get(parent.unique_id, 0) + 1
    derivs = {variable.unique_id: deriv}
    alone: Set[int] = set()  # the keys of derivs whose derivative nothing but backward refers to

    def offered(p: Variable) -> Tuple[Any, bool]:  # to fold: read (written into: Context.may_write_pending)
        found = derivs.get(p.unique_id)
        _settle(found)
        return found, p.unique_id in alone

    for var in order:
        if var.is_leaf:
            continue
        d = derivs.pop(var.unique_id, None)
        d_alone = var.unique_id in alone
        alone.discard(var.unique_id)
        if d is not None:
            for parent, d_parent, folded, d_parent_alone in var.chain_rule(d, offered, d_alone):
                if not parent.is_constant():
                    key = parent.unique_id
                    if folded or key not in derivs:
                        derivs[key] = d_parent
                        mine = d_parent_alone
                    else:
                        _settle(derivs[key])
                        _settle(d_parent)
                        derivs[key] = derivs[key] + d_parent
                        mine = True  # a new sum
                    (alone.add if mine else alone.discard)(key)
        for parent in var.parents:
            if not parent.is_constant():
                _use_done(parent, uses, derivs)
    _settle_side(variable)


def _use_done(parent: Variable, uses: Dict[int, int], derivs: Dict[int, Any]) -> None:
    """One use of `parent` has passed its derivative on; a leaf whose last use it was is finished."""
    key = parent.unique_id
    uses[key] -= 1
    if uses[key] == 0 and parent.is_leaf and key in derivs:
        _finish_leaf(parent, derivs.pop(key))


def _finish_leaf(leaf: Variable, deriv: Any) -> None:
    """Accumulate a leaf's complete derivative of this backward pass, then run its grad-ready hooks."""
    leaf.accumulate_derivative(deriv)
    hooks = getattr(leaf, "grad_ready_hooks", ())
    if hooks:
        _settle(deriv)
    for hook in hooks:
        hook(leaf)


def _settle_side(variable: Variable) -> None:
    """The end of backward: the device's current stream waits for all the work backward left running
    beside it (the backend's `settle_side` hook, where its ops have one), so that what follows (an
    optimizer, a read of .grad, the end of a CUDA graph capture) sees it done."""
    ops = getattr(getattr(variable, "backend", None), "ops", None)
    settle_side = getattr(ops, "settle_side", None)
    if settle_side is not None:
        settle_side()


def _settle(deriv: Any, write: bool = False) -> None:
    """Wait for work still making a derivative beside the current stream before a kernel reads it, and
    with write for work still reading it too, before a kernel writes into it (Tensor.settle);
    derivatives without such work (numbers, CPU tensors) are as they are."""
    settle = getattr(deriv, "settle", None)
    if settle is not None:
        settle(write)


_grad_enabled = [True]


def is_grad_enabled() -> bool:
    """Whether new operations record history for backward."""
    return _grad_enabled[0]


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Context in which operations record no history (evaluation, optimizer updates)."""
    previous = _grad_enabled[0]
    _grad_enabled[0] = False
    try:
        yield
    finally:
        _grad_enabled[0] = previous


@contextlib.contextmanager
def enable_grad() -> Iterator[None]:
    """Context in which operations record history even inside no_grad (a recomputation that
    backward itself runs, as gradient checkpointing does)."""
    previous = _grad_enabled[0]
    _grad_enabled[0] = True
    try:
        yield
    finally:
        _grad_enabled[0] = previous


@dataclass
class Context:
    """Per-call storage a Function's forward leaves for its backward."""

    no_grad: bool = False
    saved_values: Tuple[Any, ...] = field(default_factory=tuple)
    needs_input_grad: Tuple[bool, ...] = ()  # per tensor input, as in torch: backward may skip the others
    # during backward: per tensor input, the derivative gathered for it so far (None: none, or not
    # offered) and whether it is backward's alone, the inputs whose returned gradient includes it
    # (take_pending), and those whose returned gradient backward may write into (hand_over)
    pending: Tuple[Any, ...] = ()
    pending_alone: Tuple[bool, ...] = ()
    folded: Set[int] = field(default_factory=set)
    handed_over: Set[int] = field(default_factory=set)

    def take_pending(self, i: int, dtype: Any) -> Any:
        """The derivative backward has gathered so far for tensor input i, of input i's shape, when
        there is one of this dtype (else None): the gradient this backward returns for input i must
        then include it, the op adding it (e.g. as its kernel's addend, into a new tensor unless
        may_write_pending(i): others may share the pending one) in place of the engine's sum."""
        found = self.pending[i] if i < len(self.pending) else None
        if found is None or found.dtype is not dtype:
            return None
        self.folded.add(i)
        return found

    def may_write_pending(self, i: int) -> bool:
        """Whether the derivative take_pending(i, ...) handed over is backward's alone (nothing else
        refers to its storage: the engine made it, or the op that made it handed it over and only
        views passed it on), so that the op may add into it in place instead of into a new tensor.
        When it may, the current stream first waits for work still reading it beside it (Tensor.settle
        with write: a bf16 Linear's weight gradient made from it on the side stream)."""
        alone = i in self.folded and i < len(self.pending_alone) and self.pending_alone[i]
        if alone:
            _settle(self.pending[i], write=True)
        return alone

    def hand_over(self, *inputs: int) -> None:
        """Declare the gradients this backward returns for these tensor inputs backward's alone: new
        tensors, or saved ones this op will not read again (a later op may then write into them)."""
        self.handed_over.update(inputs)

    def save_for_backward(self, *values: Any) -> None:
        """Keep values for backward (skipped when no backward will run)."""
        if self.no_grad:
            return
        self.saved_values = values

    @property
    def saved_tensors(self) -> Tuple[Any, ...]:
        """The saved values, as tensors are named in PyTorch."""
        return self.saved_values
