"""Scalar: a float that records the operations made on it, for reverse-mode autodiff."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Type, Union

from .autodiff import Context, Variable, backpropagate, central_difference
from .scalar_functions import (
    EQ,
    LT,
    Add,
    Exp,
    Inv,
    Log,
    Mul,
    Neg,
    Pow,
    ReLU,
    ScalarFunction,
    Sigmoid,
    Tanh,
)

ScalarLike = Union[float, int, "Scalar"]
_ids = itertools.count(1)


@dataclass
class ScalarHistory:
    """How a Scalar was made: the function, its context and its inputs (None for a leaf)."""

    last_fn: Optional[Type[ScalarFunction]] = None
    ctx: Optional[Context] = None
    inputs: Sequence["Scalar"] = field(default_factory=tuple)


class Scalar:
    """A float with autodiff.  Arithmetic on Scalars builds a graph that `backward` walks."""

    def __init__(self, v: float, back: Optional[ScalarHistory] = None, name: Optional[str] = None):
        self.data = float(v)
        self.history = back if back is not None else ScalarHistory()
        self.derivative: Optional[float] = None
        self._id = next(_ids)
        self.name = name if name is not None else str(self._id)

    def __repr__(self) -> str:
        return f"Scalar({self.data})"

    def __mul__(self, b: ScalarLike) -> "Scalar":
        return Mul.apply(self, b)

    def __truediv__(self, b: ScalarLike) -> "Scalar":
        return Mul.apply(self, Inv.apply(b))

    def __rtruediv__(self, b: ScalarLike) -> "Scalar":
        return Mul.apply(b, Inv.apply(self))

    def __add__(self, b: ScalarLike) -> "Scalar":
        return Add.apply(self, b)

    def __bool__(self) -> bool:
        return bool(self.data)

    def __lt__(self, b: ScalarLike) -> "Scalar":
        return LT.apply(self, b)

    def __gt__(self, b: ScalarLike) -> "Scalar":
        return LT.apply(b, self)

    def __eq__(self, b: ScalarLike) -> "Scalar":  # type: ignore[override]
        return EQ.apply(self, b)

    def __hash__(self) -> int:
        return self._id

    def __sub__(self, b: ScalarLike) -> "Scalar":
        return Add.apply(self, Neg.apply(b))

    def __neg__(self) -> "Scalar":
        return Neg.apply(self)

    def __radd__(self, b: ScalarLike) -> "Scalar":
        return self + b

    def __rmul__(self, b: ScalarLike) -> "Scalar":
        return self * b

    def __rsub__(self, b: ScalarLike) -> "Scalar":
        return Add.apply(b, Neg.apply(self))

    def __pow__(self, b: ScalarLike) -> "Scalar":
        return Pow.apply(self, b)

    def log(self) -> "Scalar":
        return Log.apply(self)

    def exp(self) -> "Scalar":
        return Exp.apply(self)

    def sigmoid(self) -> "Scalar":
        return Sigmoid.apply(self)

    def relu(self) -> "Scalar":
        return ReLU.apply(self)

    def tanh(self) -> "Scalar":
        return Tanh.apply(self)

    # Variable protocol
    def accumulate_derivative(self, x: Any) -> None:
        """Add x to the derivative of this leaf."""
        if not self.is_leaf:
            raise RuntimeError("only leaf Scalars accumulate derivatives")
        self.derivative = (self.derivative or 0.0) + x

    @property
    def unique_id(self) -> int:
        return self._id

    @property
    def is_leaf(self) -> bool:
        return self.history.last_fn is None

    def is_constant(self) -> bool:
        return False

    @property
    def parents(self) -> Iterable[Variable]:
        return self.history.inputs

    def chain_rule(
        self, d_output: Any, pending: Any = None, output_alone: bool = False
    ) -> Iterable[Tuple[Variable, Any, bool, bool]]:
        """(input, derivative, False, False) per input: scalar functions fold nothing in, and a float
        has no storage to write into."""
        h = self.history
        assert h.last_fn is not None and h.ctx is not None
        grads = h.last_fn._backward(h.ctx, d_output)
        return [(inp, g, False, False) for inp, g in zip(h.inputs, grads)]

    def backward(self, d_output: Optional[float] = None) -> None:
        """Backpropagate from this scalar (derivative 1 unless given)."""
        backpropagate(self, 1.0 if d_output is None else d_output)


def derivative_check(f: Any, *scalars: Scalar, tol: float = 1e-2) -> None:
    """Assert that autodiff derivatives of f at scalars match central differences."""
    for s in scalars:
        s.derivative = None
    out = f(*scalars)
    out.backward()
    vals = [s.data for s in scalars]
    failures: List[str] = []
    for i, s in enumerate(scalars):
        check = central_difference(lambda *v: f(*(Scalar(x) for x in v)).data, *vals, arg=i)
        got = s.derivative or 0.0
        if abs(got - check) > tol * max(1.0, abs(check)):
            failures.append(f"arg {i}: autodiff {got} vs central difference {check} at {vals}")
    if failures:
        raise AssertionError("derivative check failed for " + str(f) + ": " + "; ".join(failures))
