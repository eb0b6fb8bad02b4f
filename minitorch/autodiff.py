"""Reverse-mode automatic differentiation shared by Scalar and Tensor.

A value that takes part in autodiff follows the `Variable` protocol: it has a unique id, knows
whether it is a leaf (made by the user) or constant (no history), who its parents are, and how to
turn the derivative of its output into derivatives of its inputs (`chain_rule`).

Where an input is used more than once, its derivatives are summed. A Function's backward may do that
sum itself (`Function.folds_pending`): `Context.take_pending(i, dtype)` gives it the derivative
gathered so far for input i, which it adds into its own (e.g. as the addend of its kernel:
LayerNorm's input gradient and the residual stream's), and the engine then keeps the result instead
of adding the two.
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
        self, d_output: Any, pending: Optional[Callable[["Variable"], Any]] = None
    ) -> Iterable[Tuple["Variable", Any, bool]]:
        """(input, its derivative, whether that already includes `pending(input)`, the derivative
        gathered for it so far) for each input; pending: None offers nothing to fold."""


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
    for var in order:
        if var.is_leaf:
            continue
        d = derivs.pop(var.unique_id, None)
        if d is not None:
            for parent, d_parent, folded in var.chain_rule(d, lambda p: derivs.get(p.unique_id)):
                if not parent.is_constant():
                    key = parent.unique_id
                    derivs[key] = d_parent if folded or key not in derivs else derivs[key] + d_parent
        for parent in var.parents:
            if not parent.is_constant():
                _use_done(parent, uses, derivs)


def _use_done(parent: Variable, uses: Dict[int, int], derivs: Dict[int, Any]) -> None:
    """One use of `parent` has passed its derivative on; a leaf whose last use it was is finished."""
    key = parent.unique_id
    uses[key] -= 1
    if uses[key] == 0 and parent.is_leaf and key in derivs:
        _finish_leaf(parent, derivs.pop(key))


def _finish_leaf(leaf: Variable, deriv: Any) -> None:
    """Accumulate a leaf's complete derivative of this backward pass, then run its grad-ready hooks."""
    leaf.accumulate_derivative(deriv)
    for hook in getattr(leaf, "grad_ready_hooks", ()):
        hook(leaf)


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
    # offered), and the inputs whose returned gradient includes it (take_pending)
    pending: Tuple[Any, ...] = ()
    folded: Set[int] = field(default_factory=set)

    def take_pending(self, i: int, dtype: Any) -> Any:
        """The derivative backward has gathered so far for tensor input i, of input i's shape, when
        there is one of this dtype (else None): the gradient this backward returns for input i must
        then include it, the op adding it (e.g. as its kernel's addend, into a new tensor: never into
        the pending one, which others may share) in place of the engine's sum."""
        found = self.pending[i] if i < len(self.pending) else None
        if found is None or found.dtype is not dtype:
            return None
        self.folded.add(i)
        return found

    def save_for_backward(self, *values: Any) -> None:
        """Keep values for backward (skipped when no backward will run)."""
        if self.no_grad:
            return
        self.saved_values = values

    @property
    def saved_tensors(self) -> Tuple[Any, ...]:
        """The saved values, as tensors are named in PyTorch."""
        return self.saved_values
