"""Property tests of issue 33 (hypothesis, both CPU backends): int64 indexing and gathers against
NumPy, reductions of arrays holding NaN, int64 arithmetic exact over the whole int64 range, and
shapes that do not broadcast raising an error that names both."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from minitorch_testing import arrays, shapes

import minitorch

INT64 = np.iinfo(np.int64)


def ints(shape: tuple, lo: int = INT64.min, hi: int = INT64.max) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.int64, shape, elements=st.integers(lo, hi))


@st.composite
def nan_arrays(draw: st.DrawFn, shape: tuple) -> np.ndarray:
    """float32 arrays with NaN at some (possibly no) positions, and ties."""
    x = draw(hnp.arrays(np.float32, shape, elements=st.sampled_from([-2.0, -0.5, 0.0, 1.5, 3.0])))
    nan = draw(hnp.arrays(np.bool_, shape))
    return np.where(nan, np.float32(np.nan), x)


@given(data=st.data())
def test_int64_index_tensors_pick_as_numpy(backend, data) -> None:
    shape = data.draw(shapes(max_dims=3, max_side=4), label="shape")
    x = data.draw(arrays(shape), label="x")
    dim = data.draw(st.integers(0, len(shape) - 1), label="dim")
    positions = data.draw(hnp.arrays(np.int64, data.draw(shapes(max_dims=2, max_side=3)), elements=st.integers(-shape[dim], shape[dim] - 1)), label="positions")
    t = minitorch.tensor(x, backend=backend)
    key = (slice(None),) * dim + (minitorch.tensor(positions, backend=backend),)
    np.testing.assert_array_equal(t[key].numpy(), x[(slice(None),) * dim + (positions,)])


@given(data=st.data())
def test_gather_is_take_along_axis(backend, data) -> None:
    shape = data.draw(shapes(max_dims=3, max_side=4), label="shape")
    x = data.draw(arrays(shape), label="x")
    dim = data.draw(st.integers(0, len(shape) - 1), label="dim")
    index_shape = tuple(data.draw(st.integers(1, 4)) if d == dim else s for d, s in enumerate(shape))
    index = data.draw(ints(index_shape, 0, shape[dim] - 1), label="index")
    out = minitorch.tensor(x, backend=backend).gather(dim, minitorch.tensor(index, backend=backend))
    np.testing.assert_array_equal(out.numpy(), np.take_along_axis(x, index, dim))


@given(data=st.data())
def test_reductions_with_nan_match_numpy(backend, data) -> None:
    shape = data.draw(shapes(max_dims=3, max_side=4), label="shape")
    x = data.draw(nan_arrays(shape), label="x")
    dim = data.draw(st.integers(0, len(shape) - 1), label="dim")
    t = minitorch.tensor(x, backend=backend)
    np.testing.assert_array_equal(t.max().numpy(), np.max(x))
    np.testing.assert_array_equal(t.amin(dim).numpy(), np.min(x, axis=dim))
    values, indices = t.max(dim)
    np.testing.assert_array_equal(values.numpy(), np.max(x, axis=dim))
    np.testing.assert_array_equal(indices.numpy(), np.argmax(x, axis=dim))  # the first max, or the first NaN
    np.testing.assert_array_equal(t.argmin(dim).numpy(), np.argmin(x, axis=dim))
    np.testing.assert_array_equal(t.argmax().numpy(), np.argmax(x))
    np.testing.assert_array_equal(t.sort(dim).values.numpy(), np.sort(x, axis=dim))  # NaN last


@given(data=st.data())
def test_int64_arithmetic_is_exact(backend, data) -> None:
    shape = data.draw(shapes(max_dims=2, max_side=4), label="shape")
    a = data.draw(ints(shape), label="a")
    b = data.draw(ints(shape, -(2**31), 2**31).filter(lambda v: bool(np.all(v != 0))), label="b")
    k = data.draw(st.integers(-(2**40), 2**40).filter(lambda v: v != 0), label="k")
    ta, tb = minitorch.tensor(a, backend=backend), minitorch.tensor(b, backend=backend)
    with np.errstate(over="ignore"):
        expected = {
            "a + b": a + b, "a - b": a - b, "a * b": a * b, "a // b": a // b, "a % b": a % b,
            "a + k": a + np.int64(k), "a * k": a * np.int64(k), "a // k": a // np.int64(k), "-a": -a,
            "a.sum(0)": a.sum(0), "a.cumsum(-1)": a.cumsum(-1), "max(a, b)": np.maximum(a, b),
        }  # fmt: skip
    got = {
        "a + b": ta + tb, "a - b": ta - tb, "a * b": ta * tb, "a // b": ta // tb, "a % b": ta % tb,
        "a + k": ta + k, "a * k": ta * k, "a // k": ta // k, "-a": -ta,
        "a.sum(0)": ta.sum(0), "a.cumsum(-1)": ta.cumsum(-1), "max(a, b)": ta.maximum(tb),
    }  # fmt: skip
    for name, out in got.items():
        assert out.dtype == minitorch.int64, name
        np.testing.assert_array_equal(out.numpy(), expected[name], err_msg=name)
    np.testing.assert_array_equal((ta < tb).numpy(), a < b)
    np.testing.assert_array_equal((ta == ta).numpy(), np.ones(shape, bool))


@given(a_shape=shapes(max_dims=3, max_side=3, min_dims=0), b_shape=shapes(max_dims=3, max_side=3, min_dims=0))
def test_broadcasting_as_numpy_or_an_error_naming_both_shapes(backend, a_shape, b_shape) -> None:
    a, b = minitorch.zeros(a_shape, backend=backend), minitorch.ones(b_shape, backend=backend)
    try:
        expected = np.broadcast_shapes(a_shape, b_shape)
    except ValueError:
        with pytest.raises(minitorch.IndexingError) as err:
            a * b
        assert f"shapes {a_shape} and {b_shape} cannot be broadcast together" in str(err.value)
        return
    assert (a * b).shape == expected and (a + b).shape == expected
