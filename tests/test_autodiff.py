"""minitorch.autodiff: central_difference, topological_sort, backpropagate, Context, no_grad."""

import math

import pytest
from hypothesis import given
from minitorch_testing import floats

import minitorch
from minitorch import Context, Scalar, backpropagate, central_difference, no_grad, topological_sort
from minitorch.autodiff import is_grad_enabled


@given(floats(-3.0, 3.0), floats(-3.0, 3.0))
def test_central_difference_of_smooth_functions(x: float, y: float) -> None:
    assert central_difference(lambda a: a * a * a, x) == pytest.approx(3 * x * x, abs=1e-6)
    assert central_difference(math.sin, x) == pytest.approx(math.cos(x), abs=1e-8)
    assert central_difference(lambda a, b: a * b + b, x, y, arg=1) == pytest.approx(x + 1.0, abs=1e-8)
    assert central_difference(lambda a, b: a * b + b, x, y, arg=0, epsilon=1e-3) == pytest.approx(y, abs=1e-8)


def _diamond():
    """x -> a = x * 2, b = x * x -> c = a + b -> d = c * c: x reaches d along two paths."""
    x = Scalar(1.5, name="x")
    a = x * 2.0
    b = x * x
    c = a + b
    d = c * c
    return x, a, b, c, d


def test_topological_sort_puts_each_variable_before_its_inputs() -> None:
    x, a, b, c, d = _diamond()
    order = topological_sort(d)
    ids = [v.unique_id for v in order]
    assert ids[0] == d.unique_id
    assert len(ids) == len(set(ids))
    position = {v.unique_id: i for i, v in enumerate(order)}
    for v in order:
        if not v.is_leaf:
            for parent in v.parents:
                assert position[v.unique_id] < position[parent.unique_id]
    assert {x.unique_id, a.unique_id, b.unique_id, c.unique_id} <= set(ids)


def test_topological_sort_skips_constants() -> None:
    x = minitorch.tensor([1.0, 2.0], requires_grad=True)
    k = minitorch.tensor([3.0, 4.0])
    y = (x * k).sum()
    order = topological_sort(y)
    assert k.unique_id not in {v.unique_id for v in order}
    assert x.unique_id in {v.unique_id for v in order}


def test_backpropagate_sums_the_paths_of_a_diamond() -> None:
    x, _, _, _, d = _diamond()
    backpropagate(d, 1.0)
    # d = (2x + x^2)^2, d' = 2 (2x + x^2)(2 + 2x)
    c = 2 * 1.5 + 1.5**2
    assert x.derivative == pytest.approx(2 * c * (2 + 2 * 1.5))


def test_backpropagate_scales_by_the_output_derivative_and_accumulates() -> None:
    x = Scalar(2.0)
    y = x * x
    backpropagate(y, 3.0)
    assert x.derivative == pytest.approx(12.0)
    backpropagate(x * 5.0, 1.0)
    assert x.derivative == pytest.approx(17.0)


def test_deep_graph_does_not_recurse() -> None:
    x = Scalar(0.5)
    y = x
    for _ in range(20000):
        y = y + 0.001
    y = y * x
    y.backward()
    assert y.data == pytest.approx(0.5 * 20.5)
    assert x.derivative == pytest.approx(20.5 + 0.5)


def test_context_skips_saving_when_no_backward_will_run() -> None:
    ctx = Context()
    ctx.save_for_backward(1.0, 2.0)
    assert ctx.saved_values == (1.0, 2.0)
    assert ctx.saved_tensors == (1.0, 2.0)
    quiet = Context(no_grad=True)
    quiet.save_for_backward(1.0)
    assert quiet.saved_values == ()


def test_no_grad_stops_recording_and_restores_the_flag() -> None:
    x = minitorch.tensor([1.0, 2.0], requires_grad=True)
    assert is_grad_enabled()
    with no_grad():
        assert not is_grad_enabled()
        y = x * 2.0
        with no_grad():
            pass
        assert not is_grad_enabled()
    assert is_grad_enabled()
    assert y.is_constant()
    assert (x * 2.0).history is not None


def test_no_grad_restores_the_flag_after_an_exception() -> None:
    with pytest.raises(ValueError):
        with no_grad():
            raise ValueError("boom")
    assert is_grad_enabled()
