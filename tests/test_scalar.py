"""Scalar autodiff: forward values against Python math, derivatives against torch float64 and
central differences (derivative_check)."""

import math

import pytest
import torch
from hypothesis import given
from minitorch_testing import floats

from minitorch import Scalar, derivative_check, operators
from minitorch.autodiff import Context
from minitorch.scalar_functions import ScalarFunction

small = floats(-4.0, 4.0)
positive = floats(0.1, 4.0)


@given(small, small)
def test_binary_forward(a: float, b: float) -> None:
    x, y = Scalar(a), Scalar(b)
    assert (x + y).data == a + b
    assert (x - y).data == a - b
    assert (x * y).data == a * b
    assert (x < y).data == float(a < b)
    assert (x > y).data == float(a > b)
    assert (x == y).data == float(a == b)
    assert (x + 2.0).data == a + 2.0
    assert (3.0 - x).data == 3.0 - a
    assert (2.0 * x).data == 2.0 * a
    assert (-x).data == -a


@given(small, positive)
def test_unary_and_division_forward(a: float, p: float) -> None:
    x, q = Scalar(a), Scalar(p)
    assert (x / q).data == pytest.approx(a / p)
    assert (1.0 / q).data == pytest.approx(1.0 / p)
    assert q.log().data == math.log(p)
    assert x.exp().data == math.exp(a)
    assert x.sigmoid().data == pytest.approx(1.0 / (1.0 + math.exp(-a)))
    assert x.relu().data == max(a, 0.0)
    assert x.tanh().data == math.tanh(a)
    assert (q**a).data == pytest.approx(p**a)


COMPOSITES = [
    ("poly", lambda x, y: x * x * y + 3.0 * y - x),
    ("div", lambda x, y: (x + 5.0) / (y * y + 1.0)),
    ("log_exp", lambda x, y: (x * y).exp().log() + (x - y).sigmoid()),
    ("tanh_relu", lambda x, y: (x * 0.5).tanh() * (y + 10.0).relu()),
    ("pow", lambda x, y: (y * y + 1.0) ** (x * 0.5)),
]


@pytest.mark.parametrize("name,f", COMPOSITES, ids=[c[0] for c in COMPOSITES])
@given(small, small)
def test_composite_derivatives_pass_derivative_check(name: str, f, a: float, b: float) -> None:
    derivative_check(f, Scalar(a), Scalar(b))


@pytest.mark.parametrize("name,f", COMPOSITES, ids=[c[0] for c in COMPOSITES])
@given(small, small)
def test_composite_derivatives_match_torch(name: str, f, a: float, b: float) -> None:
    x, y = Scalar(a), Scalar(b)
    out = f(x, y)
    out.backward()
    tx = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    ty = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    ref = f(tx, ty)
    ref.backward()
    assert out.data == pytest.approx(ref.item(), rel=1e-12, abs=1e-12)
    assert x.derivative == pytest.approx(tx.grad.item(), rel=1e-9, abs=1e-12)
    assert y.derivative == pytest.approx(ty.grad.item(), rel=1e-9, abs=1e-12)


def test_backward_with_an_output_derivative() -> None:
    x = Scalar(3.0)
    (x * x).backward(2.0)
    assert x.derivative == 12.0


def test_comparisons_pass_no_derivative() -> None:
    x, y = Scalar(1.0), Scalar(2.0)
    ((x < y) + (x == y) + x * 0.0).backward()
    assert x.derivative == 0.0
    assert y.derivative == 0.0


class WrongSquare(ScalarFunction):
    """x^2 with a derivative that is off by a factor of two."""

    @staticmethod
    def forward(ctx: Context, a: float) -> float:
        ctx.save_for_backward(a)
        return operators.mul(a, a)

    @staticmethod
    def backward(ctx: Context, d_out: float) -> float:
        (a,) = ctx.saved_values
        return a * d_out


def test_derivative_check_reports_a_wrong_derivative() -> None:
    with pytest.raises(AssertionError, match=r"arg 0: autodiff 1\.5 vs central difference (2\.9999|3\.0000)"):
        derivative_check(lambda x: WrongSquare.apply(x), Scalar(1.5))


def test_only_leaves_accumulate() -> None:
    y = Scalar(2.0) * 3.0
    with pytest.raises(RuntimeError, match="only leaf Scalars"):
        y.accumulate_derivative(1.0)
