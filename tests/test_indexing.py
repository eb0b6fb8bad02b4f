"""Indexing and slicing (minitorch.tensor_index) against torch and NumPy on both CPU backends:
forward values and shapes, gradients (the reference gradient of x[key] with incoming g is g
scatter-added at the key's positions: torch's autograd, or np.add.at), views that share storage,
assignment, and the errors that name the key and the shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from minitorch_testing import FAST, arrays, assert_close, f32, mt, mt_strided, shapes, t64

import minitorch

# ---- random keys ------------------------------------------------------------------------------


@st.composite
def basic_keys(draw: st.DrawFn, shape: tuple, negative_steps: bool = False) -> tuple:
    """A key of ints (negative too), slices (any bounds, steps 1..3 or -3..-1), None and at most one ...
    that fits shape."""
    n = len(shape)
    lead = draw(st.integers(0, n))
    trail = draw(st.integers(0, n - lead)) if draw(st.booleans()) else -1  # -1: no ellipsis
    indexed = list(shape[:lead]) + ([Ellipsis] + list(shape[n - trail :]) if trail >= 0 else [])
    key: list = []
    for size in indexed:
        if size is Ellipsis:
            key.append(Ellipsis)
            continue
        kind = draw(st.sampled_from(["int", "slice", "slice", "none+slice"]))
        if kind == "int":
            key.append(draw(st.integers(-size, size - 1)))
            continue
        if kind == "none+slice":
            key.append(None)
        lo, hi = -size - 2, size + 2
        steps = st.sampled_from([1, 2, 3, -1, -2] if negative_steps else [1, 2, 3])
        key.append(slice(draw(st.none() | st.integers(lo, hi)), draw(st.none() | st.integers(lo, hi)), draw(steps)))
    return tuple(key)


def scatter_grad(shape: tuple, key: object, g: np.ndarray) -> np.ndarray:
    """The gradient of sum(x[key] * g) with respect to x: g added at every position the key reads."""
    out = np.zeros(shape)
    np.add.at(out, key, g)
    return out


def check_against_torch(backend, x: np.ndarray, key: object, layout: str, seed: int = 0) -> minitorch.Tensor:
    t = (mt_strided if layout == "strided" else mt)(x, backend, requires_grad=True)
    ref_in = t64(x, requires_grad=True)
    out, ref = t[key], ref_in[key]
    assert out.shape == tuple(ref.shape), f"x{list(x.shape)}[{key!r}]: shape {out.shape} vs {tuple(ref.shape)}"
    assert_close(out, ref, f"x[{key!r}] forward")
    g = np.random.default_rng(seed).standard_normal(tuple(ref.shape)).astype(np.float32)
    out.backward(mt(g, backend))
    ref.backward(t64(g))
    assert_close(t.grad, ref_in.grad, f"x[{key!r}] gradient", floor=1.0)
    return out


# ---- basic indexing: views --------------------------------------------------------------------


@given(data=st.data())
def test_basic_keys_match_torch_and_are_views(backend, data) -> None:
    shape = data.draw(shapes(max_dims=4, max_side=4), label="shape")
    key = data.draw(basic_keys(shape), label="key")
    x = data.draw(arrays(shape), label="x")
    layout = data.draw(st.sampled_from(["contiguous", "strided"]), label="layout")
    check_against_torch(backend, x, key, layout)
    t = mt(x, backend)
    view = t[key]
    if view.numel():
        base = t._tensor._storage
        assert np.shares_memory(view._tensor._storage, base), "a basic key gives a view of the storage"


@given(data=st.data())
def test_negative_steps_match_numpy(backend, data) -> None:
    """torch has no negative steps; NumPy's x[::-k] is the reference (minitorch copies those dims)."""
    shape = data.draw(shapes(max_dims=3, max_side=4), label="shape")
    key = data.draw(basic_keys(shape, negative_steps=True), label="key")
    x = f32(data.draw(arrays(shape), label="x"))
    t = mt(x, backend, requires_grad=True)
    out = t[key]
    assert out.shape == x[key].shape
    assert_close(out, x[key], f"x[{key!r}] forward")
    g = np.random.default_rng(1).standard_normal(x[key].shape)
    out.backward(mt(g, backend))
    assert_close(t.grad, scatter_grad(x.shape, key, f32(g)), f"x[{key!r}] gradient", floor=1.0)


def test_views_share_storage_and_writes_show_through(backend) -> None:
    t = mt(np.arange(24.0).reshape(4, 6), backend)
    row, col, block = t[2], t[:, 1], t[1:3, ::2]
    assert row.shape == (6,) and col.shape == (4,) and block.shape == (2, 3)
    t[2, 0] = -1.0
    assert row[0].item() == -1.0 and col.tolist() == [1.0, 7.0, 13.0, 19.0]
    block[0, 1] = 99.0  # writes into t[1, 2]
    assert t[1, 2].item() == 99.0
    assert t[3, 5].shape == () and t[3, 5].item() == 23.0
    assert t[None, ..., None].shape == (1, 4, 6, 1)


def test_iteration_and_len(backend) -> None:
    t = mt(np.arange(6.0).reshape(3, 2), backend)
    assert len(t) == 3
    assert [r.tolist() for r in t] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(t[0, 0])


# ---- advanced indexing: gathers ---------------------------------------------------------------

ADVANCED_KEYS = [
    [2, 0, 0, -1],
    (slice(None), [1, 0]),
    ([[0, 1], [2, 2]], slice(None), [1, 0]),  # separated arrays: their dims go first
    (slice(None), [1, 2], slice(None, 2)),  # adjacent: they stay in place
    (Ellipsis, [3, -4]),
    (1, slice(None), [0, 3]),  # ints apply first (torch's order)
    (slice(None), [1, 2], None, [1, 3]),
    ([1], [[0], [2]], [2, 1]),  # three arrays broadcasting to (2, 2)
    ([], slice(None)),
    (np.array([2, 1]), slice(1, None), np.int64(2)),
]


@pytest.mark.parametrize("key", ADVANCED_KEYS, ids=[str(i) for i in range(len(ADVANCED_KEYS))])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_integer_array_keys_match_torch(backend, key, layout) -> None:
    x = np.random.default_rng(2).standard_normal((3, 4, 5)).astype(np.float32)
    check_against_torch(backend, x, key, layout)


@given(data=st.data())
def test_random_gathers_along_a_dim_match_torch(backend, data) -> None:
    shape = data.draw(shapes(max_dims=3, max_side=4), label="shape")
    dim = data.draw(st.integers(0, len(shape) - 1), label="dim")
    n = shape[dim]
    ids = data.draw(st.lists(st.integers(-n, n - 1), min_size=0, max_size=5), label="ids")
    x = data.draw(arrays(shape), label="x")
    check_against_torch(backend, x, (slice(None),) * dim + (ids,), "contiguous")
    t = mt(x, backend, requires_grad=True)
    assert_close(t.index_select(dim, [i % n for i in ids]), np.take(f32(x), [i % n for i in ids], axis=dim), "index_select")


def test_index_tensors_and_boolean_masks(backend) -> None:
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    check_against_torch(backend, x, x > 0.2, "contiguous")
    check_against_torch(backend, x, (slice(None), np.array([True, False, True, True])), "strided")
    t = mt(x, backend, requires_grad=True)
    picked = t[t > 0.2]  # a comparison's result is a bool tensor: it indexes as a mask
    assert (t > 0.2).dtype == minitorch.bool
    assert_close(picked, x[x > 0.2], "x[x > 0.2]")
    ids = minitorch.tensor([2.0, 0.0, -1.0], backend=backend)
    assert_close(t[ids], f32(x)[[2, 0, -1]], "x[index tensor]")
    assert_close(t[:, minitorch.tensor([True, False, False, True], backend=backend)], f32(x)[:, [0, 3]], "bool tensor")
    mask = (t > 0.0) & (t < 1.0) | (t == t[0, 0])
    assert_close(t[mask], x[((x > 0) & (x < 1)) | (x == x[0, 0])], "combined masks")


# ---- assignment -------------------------------------------------------------------------------

SET_KEYS = [
    (1, 2.5),
    ((slice(None), 1), np.array([1.0, 2.0, 3.0])),
    ((slice(0, 3, 2), slice(1, None)), np.array([[7.0, 8.0, 9.0]])),  # broadcast over the rows
    ((Ellipsis, -1), -3.0),
    ((slice(None, None, -1), 0), np.array([10.0, 20.0, 30.0])),
    ([2, 0], np.array([[1.0, 2.0, 3.0, 4.0]])),
    (([0, 0, 2], [1, 1, 3]), np.array([5.0, 6.0, 7.0])),  # repeated position: the last write wins
]


@pytest.mark.parametrize("key,value", SET_KEYS, ids=[str(i) for i in range(len(SET_KEYS))])
def test_setitem_matches_numpy(backend, key, value) -> None:
    x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    for as_tensor in (False, True):
        t = mt(x, backend)
        t[key] = mt(value, backend) if as_tensor and isinstance(value, np.ndarray) else value
        expected = x.copy()
        expected[key] = value
        assert_close(t, expected, f"x[{key!r}] = {value!r}")


def test_setitem_with_masks_and_into_views(backend) -> None:
    x = np.random.default_rng(4).standard_normal((4, 5)).astype(np.float32)
    t = mt(x, backend)
    t[t < 0] = 0.0
    assert_close(t, np.maximum(x, 0.0), "x[x < 0] = 0")
    t = mt_strided(x, backend)
    t[1:3] = [[1.0, 2.0, 3.0, 4.0, 5.0]]
    expected = x.copy()
    expected[1:3] = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert_close(t, expected, "assignment through a strided layout")
    leaf = mt(x, backend, requires_grad=True)
    with minitorch.no_grad():
        leaf[0, :2] = 5.0
    assert leaf.to_numpy()[0, :2].tolist() == [5.0, 5.0]


def test_setitem_refuses_tensors_with_history(backend) -> None:
    leaf = mt(np.zeros((2, 3)), backend, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad .write inside minitorch.no_grad"):
        leaf[0] = 1.0
    made = leaf * 2.0
    with pytest.raises(RuntimeError, match="has autodiff history"):
        made[0] = 1.0


# ---- errors -----------------------------------------------------------------------------------

ERRORS = [
    ((2, 0), r"index 2 is out of range for dim 0 of size 2 \(key \(2, 0\), shape \(2, 3\)\)"),
    ((0, -4), r"index -4 is out of range for dim 1 of size 3 \(key \(0, -4\), shape \(2, 3\)\)"),
    ((0, 0, 0), r"too many indices for a tensor of shape \(2, 3\): key \(0, 0, 0\) indexes 3 dims"),
    ((Ellipsis, Ellipsis), r"only one ellipsis"),
    ((slice(None, None, 0),), r"slice step cannot be zero"),
    ("a", r"tensor indices must be ints, slices, None"),
    (([0, 5],), r"index 5 is out of range for dim 0 of size 2"),
    (([0.5],), r"index arrays must hold integers or booleans, got dtype float64"),
    ((np.array([True, False, True]),), r"boolean index of shape \(3,\) does not match the indexed dims \(2,\)"),
    (([0, 1], [0, 1, 2]), r"index arrays of shapes \(2,\), \(3,\) cannot be broadcast together"),
]


@pytest.mark.parametrize("key,message", ERRORS, ids=[str(i) for i in range(len(ERRORS))])
def test_bad_keys_name_the_key_and_the_shape(key, message) -> None:
    t = minitorch.zeros((2, 3))
    with pytest.raises(IndexError, match=message):
        t[key]


def test_non_integer_index_tensor_is_an_error() -> None:
    t = minitorch.zeros((2, 3))
    with pytest.raises(IndexError, match=r"index tensor of shape \(1,\) holds non-integer values"):
        t[minitorch.tensor([0.5])]


def test_gathers_through_fastops_kernels_only_copy() -> None:
    t = mt(np.arange(6.0).reshape(2, 3), FAST)
    picked = t[[1, 1]]
    picked[0, 0] = -5.0
    assert t[1, 0].item() == 3.0, "an advanced key gives a copy"
    assert torch.equal(torch.tensor(picked.to_numpy()), torch.tensor([[-5.0, 4.0, 5.0], [3.0, 4.0, 5.0]]))
