"""Tensor.narrow against torch.narrow on the CPU: values and gradients (float64 reference), the
errors and their messages, and that the result is a view: writing into it writes the base."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from minitorch_testing import BACKENDS, assert_close, grad_of, mt, mt_strided, t64

import minitorch

RNG = np.random.default_rng(11)
X = RNG.standard_normal((3, 5, 4)).astype(np.float32)
CASES = [(0, 1, 2), (1, 0, 5), (1, -3, 2), (2, 3, 1), (-1, 0, 4), (1, 5, 0), (0, -3, 3), (-2, 2, 0)]


@pytest.mark.parametrize("backend", BACKENDS.values(), ids=BACKENDS.keys())
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dim,start,length", CASES)
def test_values_and_gradient_match_torch(backend, strided: bool, dim: int, start: int, length: int) -> None:
    x = (mt_strided if strided else mt)(X, backend, requires_grad=True)
    ref = t64(X, requires_grad=True)
    out, expected = x.narrow(dim, start, length), ref.narrow(dim, start, length)
    assert out.shape == tuple(expected.shape)
    assert_close(out, expected, f"narrow({dim}, {start}, {length})")
    g = RNG.standard_normal(tuple(expected.shape)).astype(np.float32)
    (out * mt(g, backend)).sum().backward()
    (expected * t64(g)).sum().backward()
    # The gradient is the incoming one inside the range and zero elsewhere.
    assert_close(grad_of(x, "narrow"), ref.grad, f"gradient of narrow({dim}, {start}, {length})", floor=1.0)


@pytest.mark.parametrize("backend", BACKENDS.values(), ids=BACKENDS.keys())
def test_writing_into_the_view_writes_the_base(backend) -> None:
    base = mt(np.zeros(10), backend)
    part = base.narrow(0, 3, 4).view(2, 2)
    part.copy_(np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32))
    np.testing.assert_array_equal(base.to_numpy(), [0, 0, 0, 1, 2, 3, 4, 0, 0, 0])
    rows = mt(np.zeros((3, 4)), backend)
    rows.narrow(1, 1, 2).copy_(5.0)
    ref = torch.zeros(3, 4)
    ref.narrow(1, 1, 2).copy_(torch.tensor(5.0))
    np.testing.assert_array_equal(rows.to_numpy(), ref.numpy())
    # and the view sees later writes into the base
    base.copy_(np.arange(10, dtype=np.float32))
    np.testing.assert_array_equal(part.to_numpy(), [[3, 4], [5, 6]])


def test_bool_dtype_is_kept() -> None:
    mask = mt(X, BACKENDS["fast"]) > 0.0
    part = mask.narrow(1, 1, 2)
    assert part.dtype == minitorch.bool
    np.testing.assert_array_equal(part.to_numpy(), (X > 0.0)[:, 1:3])


@pytest.mark.parametrize(
    "dim,start,length,match",
    [
        (1, 6, 1, r"narrow\(dim=1, start=6, length=1\): start must be in \[-5, 5\] for dim 1 of size 5"),
        (1, -6, 1, r"start must be in \[-5, 5\] for dim 1 of size 5 \(shape \(3, 5, 4\)\)"),
        (1, 2, 4, r"start \(2\) \+ length \(4\) exceeds size 5 of dim 1"),
        (1, -1, 2, r"start \(4\) \+ length \(2\) exceeds size 5 of dim 1"),
        (1, 1, -1, r"narrow\(dim=1, start=1, length=-1\): length must be non-negative"),
        (3, 0, 1, r"dim 3 is out of range for shape \(3, 5, 4\)"),
        (-4, 0, 1, r"dim -4 is out of range"),
    ],
)
def test_errors_match_torch_and_name_dim_start_length_and_size(dim: int, start: int, length: int, match: str) -> None:
    with pytest.raises((IndexError, RuntimeError)) as ref_error:
        t64(X).narrow(dim, start, length)
    with pytest.raises(minitorch.IndexingError, match=match) as error:
        mt(X, BACKENDS["fast"]).narrow(dim, start, length)
    # IndexingError is both an IndexError and a RuntimeError, so it is caught as torch's error is.
    assert isinstance(error.value, type(ref_error.value))


def test_zero_dim_and_non_int_arguments() -> None:
    with pytest.raises(RuntimeError, match="cannot be applied to a 0-dim tensor"):
        torch.tensor(1.0).narrow(0, 0, 1)
    with pytest.raises(minitorch.IndexingError, match=r"narrow\(dim=0, start=0, length=1\) cannot be applied to a 0-dim"):
        minitorch.tensor(1.0).narrow(0, 0, 1)
    with pytest.raises(TypeError, match=r"narrow\(dim=0, start=1.5, length=1\): start must be an int, got float"):
        mt(X, BACKENDS["fast"]).narrow(0, 1.5, 1)
