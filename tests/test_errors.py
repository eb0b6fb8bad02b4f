"""Bad input raises a clear exception whose message names the shapes or values involved."""

import re

import numpy as np
import pytest
import torch
from minitorch_testing import FAST, SIMPLE, mt

import minitorch
from minitorch import IndexingError


def zeros(shape, backend=FAST, requires_grad=False):
    return minitorch.zeros(shape, backend=backend, requires_grad=requires_grad)


def raises(kind, text):
    return pytest.raises(kind, match=re.escape(text))


def test_zip_shape_mismatch_names_both_shapes(backend) -> None:
    a, b = zeros((2, 3), backend), zeros((4,), backend)
    for op in (lambda: a + b, lambda: a * b, lambda: a - b, lambda: a < b, lambda: a == b):
        with raises(IndexingError, "shapes (2, 3) and (4,) cannot be broadcast together"):
            op()
    with raises(IndexingError, "matmul shapes (2, 2, 3) @ (3, 3, 4): batch dims: shapes (2,) and (3,) cannot be broadcast together"):
        zeros((2, 2, 3), backend) @ zeros((3, 3, 4), backend)


def test_matmul_shape_errors(backend) -> None:
    with raises(IndexingError, "matmul shapes (2, 3) @ (4, 5): inner sizes 3 and 4 differ"):
        zeros((2, 3), backend) @ zeros((4, 5), backend)
    with raises(IndexingError, "matmul needs tensors of at least 1 dim, got (2, 3) @ ()"):
        zeros((2, 3), backend) @ zeros((), backend)
    with raises(IndexingError, "matmul shapes (2, 3) @ (4,): inner sizes 3 and 4 differ"):
        zeros((2, 3), backend) @ zeros((4,), backend)


def test_view_errors(backend) -> None:
    t = zeros((2, 3), backend)
    with raises(IndexingError, "cannot view shape (2, 3) (6 elements) as (4, 2) (8 elements)"):
        t.view(4, 2)
    with raises(IndexingError, "cannot view shape (2, 3) (6 elements) as (-1, 4)"):
        t.view(-1, 4)
    with raises(IndexingError, "view shape (-1, -1) has more than one -1"):
        t.view(-1, -1)
    with raises(
        IndexingError,
        "view of a non-contiguous tensor (shape (3, 2), strides (1, 3)) to (6,): call .contiguous() first, or use .reshape()",
    ):
        t.permute(1, 0).view(6)


def test_mixing_backends() -> None:
    fast, simple = zeros((2, 3), FAST), zeros((3, 3), SIMPLE)
    with raises(TypeError, "cannot combine a FastOps tensor (2, 3) with a SimpleOps tensor (3, 3): move one with .to(backend)"):
        fast @ simple
    with raises(TypeError, "cannot combine a SimpleOps tensor (3, 3) with a FastOps tensor (2, 3)"):
        simple + fast


def test_attn_softmax_bad_shapes(backend) -> None:
    scores = zeros((2, 3, 4, 5), backend)
    with raises(IndexingError, "attn_softmax expects scores [B, H, Tq, Tk], got shape (3, 4, 5)"):
        zeros((3, 4, 5), backend).attn_softmax()
    with raises(
        IndexingError,
        "attn_softmax mask of shape (2, 4) does not broadcast to [B, 1, 1, Tk] = (2, 1, 1, 5) for scores (2, 3, 4, 5)",
    ):
        scores.attn_softmax(zeros((2, 4), backend))
    with raises(IndexingError, "attn_softmax mask of shape (2, 3, 1, 5) does not broadcast to [B, 1, 1, Tk]"):
        scores.attn_softmax(zeros((2, 3, 1, 5), backend))
    with raises(IndexingError, "attn_softmax mask of shape (1, 2, 1, 1, 5) has more than 4 dims"):
        scores.attn_softmax(zeros((1, 2, 1, 1, 5), backend))


def test_layernorm_bad_shapes_and_eps(backend) -> None:
    x = zeros((2, 3), backend)
    with raises(IndexingError, "layernorm of input (2, 3) needs gamma and beta of shape (3,), got (4,) and (3,)"):
        x.layernorm(zeros((4,), backend), zeros((3,), backend))
    with raises(IndexingError, "layernorm of input (2, 3) needs gamma and beta of shape (3,), got (3,) and (1, 3)"):
        x.layernorm(zeros((3,), backend), zeros((1, 3), backend))
    with raises(ValueError, "layernorm eps must be positive, got 0.0"):
        x.layernorm(zeros((3,), backend), zeros((3,), backend), eps=0.0)


def test_backward_needs_a_gradient_for_a_non_scalar(backend) -> None:
    x = zeros((2, 3), backend, requires_grad=True)
    with raises(RuntimeError, "backward() without a gradient needs a one-element tensor, got shape (2,)"):
        x.sum(1).backward()
    with raises(IndexingError, "backward gradient of shape (3, 2) for a tensor of shape (2, 3)"):
        (x * 2.0).backward(zeros((3, 2), backend))


def test_misc_tensor_errors(backend) -> None:
    t = zeros((2, 3), backend)
    with raises(ValueError, "item() needs a tensor with one element, got shape (2, 3)"):
        t.item()
    with raises(IndexError, "index 2 is out of range for dim 0 of size 2 (key (2, 0), shape (2, 3))"):
        t[2, 0]
    with raises(IndexingError, "dim 2 is out of range for shape (2, 3)"):
        t.sum(2)
    with raises(IndexingError, "permute order (0, 0) is not a permutation of the 2 dims of (2, 3)"):
        t.permute(0, 0)
    with raises(IndexingError, "shapes (2, 3) and (3, 3) cannot be broadcast together"):
        t.expand((3, 3))
    with raises(TypeError, "a tensor of shape (2, 3) cannot combine with str '2'"):
        t ** "2"
    with raises(ValueError, "int64 tensor ** -1: integers to negative integer powers are not allowed"):
        t.long() ** -1


def test_construction_errors() -> None:
    with raises(ValueError, "tensor() needs a rectangular nested list of numbers"):
        minitorch.tensor([[1.0, 2.0], [3.0]])
    with raises(TypeError, "cannot make a tensor from a numpy array of dtype complex128"):
        minitorch.tensor_from_numpy(np.zeros(3, dtype=complex))
    with raises(TypeError, "from_torch needs a float32 tensor, got torch.float64"):
        minitorch.from_torch(torch.zeros(3, dtype=torch.float64))
    with raises(IndexingError, "shape (1, 1, 1, 1, 1, 1, 1, 1, 1) has 9 dims; at most 8 are supported"):
        minitorch.zeros((1,) * 9)


def test_module_input_errors() -> None:
    with raises(IndexingError, "Linear(3, 2) got input of shape (2, 4)"):
        minitorch.Linear(3, 2)(zeros((2, 4)))
    with raises(IndexingError, "LayerNorm((3,)) got input of shape (2, 4)"):
        minitorch.LayerNorm1d(3)(zeros((2, 4)))
    with raises(IndexError, "embedding ids must be integers in [0, 3), got values in [-1.0, 1.0]"):
        minitorch.Embedding(3, 2)(mt(np.array([1.0, -1.0]), FAST))


def test_backward_without_history_is_an_error() -> None:
    x = minitorch.tensor([1.0, 2.0])
    with raises(RuntimeError, "backward() on a tensor of shape () that has no history"):
        x.sum().backward()


def test_unbiased_var_of_one_element_is_an_error() -> None:
    x = minitorch.tensor([[1.0], [2.0]])
    with raises(ValueError, "var with correction=1 over 1 element(s) (shape (2, 1), dim 1) is undefined"):
        x.var(1, correction=1)
