"""Issue 33, no silent differences from PyTorch: every call of tests/torch_habits.py's table against
torch on both CPU backends (values, dtypes, shapes, gradients), and each bad input against the
error it must raise (the message naming what is wrong), where PyTorch raises too or minitorch
chooses not to support a case."""

from __future__ import annotations

import json
import re
from typing import Any, Callable

import numpy as np
import pytest
import torch
from minitorch_testing import FAST
from torch_habits import CASES, check

import minitorch
from minitorch import nn


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_call_matches_torch(backend, case) -> None:
    check(case, backend)


def _x() -> minitorch.Tensor:
    return minitorch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])


def _foreign_npz(tmp_path: Any) -> str:
    header = json.dumps({"format": "minitorch", "version": 1, "tree": {"array": "0"}}).encode()
    path = tmp_path / "pickled.npz"
    np.savez(path, __minitorch__=np.frombuffer(header, dtype=np.uint8), **{"0": np.array([{"a": 1}], dtype=object)})
    return str(path)


ERRORS = [
    ("requires_grad='yes'", lambda: minitorch.tensor([1.0], requires_grad="yes"), TypeError, "requires_grad must be a bool, got str 'yes'"),
    ("requires_grad_(1)", lambda: _x().requires_grad_(1), TypeError, "requires_grad must be a bool, got int 1"),
    ("ones(2, 'cpu')", lambda: minitorch.ones(2, "cpu"), TypeError, "ones() sizes must be ints, got str 'cpu' in (2, 'cpu') (pass the backend as backend= or device=)"),
    ("zeros(2.5)", lambda: minitorch.zeros(2.5), TypeError, "zeros() sizes must be ints, got float 2.5"),
    ("zeros(-1)", lambda: minitorch.zeros(-1), ValueError, "zeros() sizes must be non-negative, got (-1,)"),
    ("device='tpu'", lambda: minitorch.zeros(2, device="tpu"), ValueError, "expected a minitorch.TensorBackend, 'cpu' or 'cuda', got 'tpu'"),
    ("double()", lambda: _x().double(), TypeError, "minitorch has no float64 dtype: double() of a float32 tensor (2, 3)"),
    ("dtype=float64", lambda: minitorch.zeros(2, dtype=np.float64), TypeError, "expected a minitorch dtype"),
    ("int64 requires grad", lambda: minitorch.tensor([1, 2], requires_grad=True), RuntimeError, "only floating-point tensors can require gradients, not int64"),
    ("requires_grad_(False) of a result", lambda: (_x().requires_grad_() * 2).requires_grad_(False), RuntimeError, "only a leaf's flag can be turned off"),
    ("cross_entropy target 2.5", lambda: nn.cross_entropy(minitorch.zeros(2, 3), minitorch.tensor([0.0, 2.5])), ValueError, "cross_entropy: targets must be integers in [0, 3) where they count; token 1 has target 2.5"),
    ("cross_entropy target 7", lambda: nn.cross_entropy(minitorch.zeros(2, 3), minitorch.tensor([7, 0])), ValueError, "token 0 has target 7"),
    ("cross_entropy target -1", lambda: nn.cross_entropy(minitorch.zeros(2, 3), minitorch.tensor([0, -1])), ValueError, "token 1 has target -1"),
    ("softmax_loss target 3", lambda: nn.softmax_loss(minitorch.zeros(2, 3), minitorch.tensor([3, 0])), ValueError, "softmax_loss: targets must be integers in [0, 3)"),
    ("cross_entropy reduction", lambda: nn.cross_entropy(minitorch.zeros(2, 3), minitorch.tensor([0, 1]), reduction="avg"), ValueError, "reduction must be one of ('mean', 'sum', 'none'), got 'avg'"),
    ("matmul batch mismatch", lambda: minitorch.zeros(3, 2, 3) @ minitorch.zeros(4, 3, 5), minitorch.IndexingError, "matmul shapes (3, 2, 3) @ (4, 3, 5): batch dims: shapes (3,) and (4,) cannot be broadcast together"),
    ("max over two dims", lambda: _x().max((0, 1)), TypeError, "max(dim) takes one int dim, got (0, 1); amax(dims) reduces several"),
    ("argmax of an empty dim", lambda: minitorch.zeros(2, 0).argmax(1), minitorch.IndexingError, "argmax(dim=1) of a tensor of shape (2, 0): the dim is empty"),
    ("int64 // 0", lambda: minitorch.tensor([4, 5]) // 0, ZeroDivisionError, "integer floordiv of a tensor of shape (2,) by zero"),
    ("int64 % tensor with 0", lambda: minitorch.tensor([4, 5]) % minitorch.tensor([1, 0]), ZeroDivisionError, "holding 0"),
    ("int64 ** -1", lambda: minitorch.tensor([4]) ** -1, ValueError, "integers to negative integer powers are not allowed"),
    ("add_ of a float into int64", lambda: minitorch.tensor([1, 2]).add_(0.5), RuntimeError, "add_: result type float32 can't be cast to the int64 of the tensor written"),
    ("add_ into a leaf that requires grad", lambda: _x().requires_grad_().add_(1.0), RuntimeError, "requires grad (write inside minitorch.no_grad())"),
    ("gather out of range", lambda: _x().gather(1, minitorch.tensor([[0], [3]])), minitorch.IndexingError, "gather(dim=1): index 3 is out of range for size 3"),
    ("gather with a float index", lambda: _x().gather(1, minitorch.tensor([[0.0]])), TypeError, "gather(dim=1) needs an int64 index, got float32"),
    ("topk too large", lambda: _x().topk(4), ValueError, "topk: k must be an int in [0, 3] for dim -1 of shape (2, 3), got 4"),
    ("t() of 3 dims", lambda: minitorch.zeros(2, 2, 2).t(), minitorch.IndexingError, "t() expects a tensor of at most 2 dims, got shape (2, 2, 2)"),
    ("split sizes", lambda: _x().split([1, 1], 1), ValueError, "split sizes [1, 1] do not add up to size 3 of dim 1"),
    ("chunk(0)", lambda: _x().chunk(0), ValueError, "chunk expects a positive number of chunks, got 0"),
    ("index with a float tensor", lambda: [1, 2][minitorch.tensor([1.0])], TypeError, "only one-element int64 tensors can be used as an index"),
    ("mean of int64", lambda: minitorch.tensor([1, 2]).mean(), TypeError, "mean needs a floating-point tensor, got int64"),
    ("arange step 0", lambda: minitorch.arange(0, 3, 0), ValueError, "arange step must not be zero"),
    ("full of a string", lambda: minitorch.full((2,), "a"), TypeError, "full() fill_value must be a number, got str 'a'"),
    ("Linear input size", lambda: nn.Linear(3, 2)(minitorch.zeros(2, 4)), minitorch.IndexingError, "Linear(3, 2) got input of shape (2, 4)"),
    ("Dropout(1.5)", lambda: nn.Dropout(1.5), ValueError, "dropout probability must be in [0, 1], got 1.5"),
    ("GELU('fast')", lambda: nn.GELU("fast"), ValueError, "gelu approximate must be one of ('none', 'tanh'), got 'fast'"),
    ("train('yes')", lambda: nn.Linear(2, 2).train("yes"), TypeError, "train(mode) takes a bool, got str 'yes'"),
    ("mse_loss shapes", lambda: nn.mse_loss(minitorch.zeros(2), minitorch.zeros(3)), minitorch.IndexingError, "mse_loss: input (2,) and target (3,) must have the same shape"),
]


@pytest.mark.parametrize("name,call,kind,message", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_input_raises_a_clear_error(name: str, call: Callable[[], Any], kind: type, message: str) -> None:
    with pytest.raises(kind, match=re.escape(message)):
        call()


def test_loading_a_pickle_gives_no_pickle_hint(tmp_path) -> None:
    with pytest.raises(minitorch.LoadError) as err:
        minitorch.load(_foreign_npz(tmp_path))
    assert "holds pickled Python objects: not written by minitorch.save" in str(err.value)
    assert "allow_pickle" not in str(err.value)


def test_from_numpy_shares_memory_as_torch() -> None:
    arr = np.zeros((2, 3), np.float32)
    t = minitorch.from_numpy(arr)
    arr[0, 1] = 5.0
    assert t[0, 1].item() == 5.0 and torch.from_numpy(arr)[0, 1].item() == 5.0


def test_module_habits(backend) -> None:
    """repr with sizes, train()/eval() return self, Sequential indexing, zero_grad, state_dict names."""
    model = nn.Sequential(nn.Linear(4, 8, backend=backend), nn.ReLU(), nn.LayerNorm(8, backend=backend), nn.Linear(8, 2, backend=backend))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    assert repr(model) == repr(ref)
    assert model.train() is model and model.eval() is model and not model[0].training
    assert list(model.state_dict()) == list(ref.state_dict())
    assert all(model.state_dict()[k].shape == tuple(v.shape) for k, v in ref.state_dict().items())
    model(minitorch.ones(3, 4, backend=backend)).sum().backward()
    assert model[0].weight.value.grad is not None
    model.zero_grad()
    assert all(p.value.grad is None for p in model.parameters())
    assert len(model) == 4 and isinstance(model[-1], nn.Linear)


def test_cuda_is_available_answers_without_raising() -> None:
    assert minitorch.cuda.is_available() is (minitorch.cuda_unavailable_reason() is None)


def test_int64_round_trips_through_save_and_load(tmp_path) -> None:
    ids = minitorch.tensor([2**40 + 1, -3], backend=FAST)
    minitorch.save({"ids": ids}, tmp_path / "ids.npz")
    back = minitorch.load(tmp_path / "ids.npz")["ids"]
    assert back.dtype == minitorch.int64 and back.tolist() == [2**40 + 1, -3]
