"""minitorch.operators: scalar math, its derivatives and the list helpers, against math/torch."""

import math

import pytest
import torch
from hypothesis import given
from minitorch_testing import away_from_zero, floats

from minitorch import operators as ops

small = floats(-50.0, 50.0)
positive = floats(1e-3, 100.0)


def central(f, x: float, eps: float = 1e-6) -> float:
    return (f(x + eps) - f(x - eps)) / (2.0 * eps)


@given(small, small)
def test_arithmetic_and_comparisons(x: float, y: float) -> None:
    assert ops.mul(x, y) == x * y
    assert ops.add(x, y) == x + y
    assert ops.neg(x) == -x
    assert ops.id(x) == x
    assert ops.lt(x, y) == (1.0 if x < y else 0.0)
    assert ops.lt(x, x) == 0.0
    assert ops.eq(x, y) == (1.0 if x == y else 0.0)
    assert ops.eq(x, x) == 1.0
    assert ops.max(x, y) == (x if x >= y else y)
    assert ops.is_close(x, y) == (1.0 if abs(x - y) < 1e-2 else 0.0)
    assert ops.is_close(x, x + 5e-3) == 1.0


@given(floats(-700.0, 700.0))
def test_sigmoid_is_stable_and_symmetric(x: float) -> None:
    s = ops.sigmoid(x)
    assert 0.0 <= s <= 1.0
    assert s == pytest.approx(torch.sigmoid(torch.tensor(x, dtype=torch.float64)).item(), rel=1e-12, abs=1e-300)
    assert ops.sigmoid(-x) == pytest.approx(1.0 - s, abs=1e-15)


def test_sigmoid_extremes_and_monotone() -> None:
    assert ops.sigmoid(1e4) == 1.0
    assert ops.sigmoid(-1e4) == 0.0
    assert ops.sigmoid(0.0) == 0.5
    values = [ops.sigmoid(x / 10.0) for x in range(-100, 101)]
    assert all(a < b for a, b in zip(values, values[1:]))


@given(small)
def test_relu_tanh_exp(x: float) -> None:
    assert ops.relu(x) == max(x, 0.0)
    assert ops.tanh(x) == math.tanh(x)
    assert ops.exp(x) == math.exp(x)


@given(positive, floats(-3.0, 3.0))
def test_log_inv_pow(x: float, p: float) -> None:
    assert ops.log(x) == math.log(x)
    assert ops.inv(x) == 1.0 / x
    assert ops.inv(-x) == -1.0 / x
    assert ops.pow(x, p) == pytest.approx(x**p, rel=1e-14)


def test_edge_values_follow_ieee_like_the_kernels() -> None:
    assert ops.log(0.0) == -math.inf
    assert math.isnan(ops.log(-1.0))
    assert ops.exp(1000.0) == math.inf
    assert ops.exp(-1000.0) == 0.0
    assert ops.inv(0.0) == math.inf
    assert ops.inv(-0.0) == -math.inf
    assert math.isnan(ops.pow(-2.0, 0.5))
    assert ops.pow(-2.0, 3.0) == -8.0
    assert ops.pow(0.0, -1.0) == math.inf
    assert ops.pow(0.0, 0.0) == 1.0


@given(floats(-8.0, 8.0))
def test_gelu_matches_torch_tanh_approximation(x: float) -> None:
    ref = torch.nn.functional.gelu(torch.tensor(x, dtype=torch.float64), approximate="tanh").item()
    assert ops.gelu(x) == pytest.approx(ref, rel=1e-12, abs=1e-15)


@given(away_from_zero(1e-2, 20.0), floats(-3.0, 3.0))
def test_backward_functions_match_central_differences(x: float, d: float) -> None:
    # d * f'(x) for every *_back; the float64 central difference is good to ~1e-8 here.
    assert ops.relu_back(x, d) == pytest.approx(d * central(ops.relu, x), abs=1e-8)
    assert ops.sigmoid_back(ops.sigmoid(x), d) == pytest.approx(d * central(ops.sigmoid, x), rel=1e-6, abs=1e-9)
    assert ops.tanh_back(ops.tanh(x), d) == pytest.approx(d * central(ops.tanh, x), rel=1e-6, abs=1e-9)
    assert ops.gelu_back(x, d) == pytest.approx(d * central(ops.gelu, x), rel=1e-6, abs=1e-8)
    # 1/x and log x vary on the scale of x itself, so the step scales with it.
    assert ops.inv_back(x, d) == pytest.approx(d * central(ops.inv, x, eps=1e-6 * abs(x)), rel=1e-6, abs=1e-9)
    assert ops.log_back(abs(x), d) == pytest.approx(d * central(ops.log, abs(x), eps=1e-6 * abs(x)), rel=1e-6, abs=1e-9)


def test_relu_back_at_and_around_zero() -> None:
    assert ops.relu_back(0.0, 3.0) == 0.0
    assert ops.relu_back(-1.0, 3.0) == 0.0
    assert ops.relu_back(1e-9, 3.0) == 3.0
