"""TensorData: index/position math, strides, permute and broadcasting, against NumPy."""

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from minitorch_testing import broadcast_pairs, shapes

from minitorch import IndexingError, TensorData, shape_broadcast
from minitorch.tensor_data import (
    MAX_DIMS,
    broadcast_index,
    index_to_position,
    prod,
    strides_from_shape,
    to_index,
)

data_shapes = shapes(max_dims=5, max_side=4)


def numbered(shape: tuple) -> TensorData:
    """Contiguous TensorData whose element at storage position i holds the value i."""
    return TensorData(np.arange(prod(shape), dtype=np.float32), shape)


@given(data_shapes)
def test_strides_and_size_match_numpy(shape: tuple) -> None:
    ref = np.zeros(shape, dtype=np.float32)
    td = numbered(shape)
    assert td.strides == strides_from_shape(shape) == tuple(s // ref.itemsize for s in ref.strides)
    assert td.size == ref.size
    assert td.dims == ref.ndim
    assert td.shape == shape
    assert td.is_contiguous()


@given(data_shapes)
def test_to_index_walks_row_major_order(shape: tuple) -> None:
    td = numbered(shape)
    idx = np.zeros(len(shape), dtype=np.int64)
    for ordinal, ref in enumerate(np.ndindex(*shape)):
        to_index(ordinal, np.array(shape), idx)
        assert tuple(idx) == ref
        assert index_to_position(idx, np.array(td.strides)) == ordinal
    assert list(td.indices()) == list(np.ndindex(*shape))


@given(data_shapes, st.data())
def test_permute_views_the_same_storage_like_numpy_transpose(shape: tuple, data: st.DataObject) -> None:
    order = tuple(data.draw(st.permutations(range(len(shape)))))
    td = numbered(shape)
    view = td.permute(*order)
    ref = np.arange(prod(shape), dtype=np.float32).reshape(shape).transpose(order)
    assert view.shape == ref.shape
    assert view._storage is td._storage
    for idx in np.ndindex(*ref.shape):
        assert view.get(idx) == ref[idx]
    # Size-1 dims do not affect layout: the view is row-major iff the other dims keep their order.
    kept_order = [d for d in order if shape[d] > 1]
    assert view.is_contiguous() == (kept_order == sorted(kept_order))


@given(data_shapes)
def test_sample_is_a_valid_index(shape: tuple) -> None:
    td = numbered(shape)
    for _ in range(5):
        idx = td.sample()
        assert len(idx) == len(shape) and all(0 <= i < s for i, s in zip(idx, shape))
        assert td.get(idx) == td.index(idx)


@given(broadcast_pairs(max_dims=4, max_side=4))
def test_shape_broadcast_matches_numpy(pair) -> None:
    a, b = pair.input_shapes
    assert shape_broadcast(a, b) == pair.result_shape == np.broadcast_shapes(a, b)
    assert shape_broadcast(b, a) == pair.result_shape


@given(broadcast_pairs(max_dims=4, max_side=4))
def test_broadcast_index_reads_what_numpy_broadcasting_reads(pair) -> None:
    small, _ = pair.input_shapes
    big = pair.result_shape
    values = np.arange(prod(small), dtype=np.float32).reshape(small)
    spread = np.broadcast_to(values, big)
    td = TensorData(values.reshape(-1).copy(), small)
    out_index = np.zeros(len(small), dtype=np.int64)
    for idx in np.ndindex(*big):
        broadcast_index(np.array(idx), np.array(big), np.array(small), out_index)
        assert td.get(tuple(out_index)) == spread[idx]


@pytest.mark.parametrize(
    "a,b",
    [((2, 3), (4,)), ((2, 3), (3, 2)), ((5, 1, 4), (2, 3, 4)), ((3,), (2, 2))],
)
def test_shape_broadcast_names_both_shapes(a: tuple, b: tuple) -> None:
    with pytest.raises(IndexingError, match=re.escape(f"shapes {a} and {b} cannot be broadcast together")):
        shape_broadcast(a, b)


def test_element_access_and_errors() -> None:
    td = numbered((2, 3))
    td.set((1, 2), 42.0)
    assert td.get((1, 2)) == 42.0
    assert td._storage[5] == 42.0
    with pytest.raises(IndexingError, match=r"index \(2, 0\) is out of range for shape \(2, 3\)"):
        td.get((2, 0))
    with pytest.raises(IndexingError, match=r"index \(0, -1\) is out of range"):
        td.get((0, -1))
    with pytest.raises(IndexingError, match=r"index \(0,\) has 1 dims but the shape \(2, 3\) has 2"):
        td.index((0,))
    with pytest.raises(IndexingError, match=r"permute order \(0, 0\) is not a permutation of the 2 dims of \(2, 3\)"):
        td.permute(0, 0)


def test_construction_errors() -> None:
    storage = np.zeros(4, dtype=np.float32)
    with pytest.raises(IndexingError, match=r"strides \(1,\) do not match shape \(2, 2\)"):
        TensorData(storage, (2, 2), (1,))
    with pytest.raises(IndexingError, match=r"shape \(-1,\) has a negative size"):
        TensorData(storage, (-1,))
    too_many = (1,) * (MAX_DIMS + 1)
    with pytest.raises(IndexingError, match=rf"has {MAX_DIMS + 1} dims; at most {MAX_DIMS} are supported"):
        TensorData(storage, too_many)


def test_contiguity_ignores_size_one_dims() -> None:
    storage = np.zeros(6, dtype=np.float32)
    assert TensorData(storage, (2, 1, 3), (3, 100, 1)).is_contiguous()
    assert not TensorData(storage, (2, 3), (1, 2)).is_contiguous()
    assert not TensorData(storage, (2, 3), (0, 1)).is_contiguous()


def test_is_transposed_names_the_transpose_of_a_contiguous_matrix() -> None:
    storage = np.zeros(6, dtype=np.float32)
    square = TensorData(storage, (2, 3))
    assert square.permute(1, 0).is_transposed()
    assert not square.is_transposed()  # contiguous itself
    assert not TensorData(storage, (2, 3), (1, 3)).is_transposed()  # neither layout
    assert not TensorData(storage, (1, 2, 3)).permute(0, 2, 1).is_transposed()  # not 2-D
