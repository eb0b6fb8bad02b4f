"""The calls a PyTorch user types first (issue 33), each written once against a namespace `m` that
is either torch or minitorch, so the same line runs on both: CASES, and `check(case, backend)`,
which runs a case on minitorch (on backend) and on torch (on the CPU) and compares values, dtypes,
shapes and the gradients of the floating-point inputs.  tests/test_torch_habits.py runs the table on
the CPU backends, kernel_tests/test_torch_habits_cuda.py on CUDA.

A case is fn(m, dev, *inputs) with `dev` the device to create tensors on ("cpu" for torch, the
backend for minitorch); inputs are NumPy arrays: float arrays become float32 tensors that require
grad (when the case compares gradients), integer arrays int64 tensors, bool arrays bool tensors.
"""

from __future__ import annotations

import math
from typing import Any, Callable, List, NamedTuple, Tuple

import numpy as np
import torch

import minitorch

RNG = np.random.default_rng(33)
X = RNG.standard_normal((3, 4))
Y = RNG.standard_normal((3, 4))
P = RNG.uniform(0.5, 2.0, (3, 4))  # positive
V = RNG.standard_normal(4)
M = RNG.standard_normal((4, 2))
B3 = RNG.standard_normal((2, 3, 4))
I = RNG.integers(-20, 20, (3, 4)).astype(np.int64)  # noqa: E741
BIG = np.array([2**40 + 1, -(2**50) - 3, 16777217, 7], dtype=np.int64)
NAN = X.copy()
NAN[1, 2] = np.nan
LOGITS = RNG.standard_normal((5, 3))
TARGETS = np.array([0, 2, 1, 1, 0], dtype=np.int64)
IGNORED = np.array([0, -100, 1, -100, 2], dtype=np.int64)
IDS = np.array([[0, 3], [2, 2]], dtype=np.int64)
INDEX = np.array([[0, 3, 1], [2, 2, 0], [1, 0, 3]], dtype=np.int64)


class Case(NamedTuple):
    name: str
    fn: Callable[..., Any]
    inputs: Tuple[np.ndarray, ...] = ()
    grad: bool = True  # compare the gradients of the float inputs
    dtype: bool = True  # compare result dtypes (off where minitorch documents another one)


def _cases() -> List[Case]:
    c = Case
    return [
        # ---- creation: varargs sizes, dtype= and device= keywords, dtypes from the data ----------
        c("tensor([16777217]) is int64", lambda m, d: m.tensor([16777217], device=d)),
        c("tensor of floats", lambda m, d: m.tensor([[1.5, 2.0]], device=d)),
        c("tensor of bools", lambda m, d: m.tensor([True, False], device=d)),
        c("tensor(3).item() is an int", lambda m, d: m.tensor(3, device=d).item()),
        c("ones(2, 3)", lambda m, d: m.ones(2, 3, device=d)),
        c("ones((2, 3), dtype=int64)", lambda m, d: m.ones((2, 3), dtype=m.int64, device=d)),
        c("zeros(3)", lambda m, d: m.zeros(3, device=d)),
        c("zeros([2, 2])", lambda m, d: m.zeros([2, 2], device=d)),
        c("full((2, 2), 7) is int64", lambda m, d: m.full((2, 2), 7, device=d)),
        c("full((2,), 1.5)", lambda m, d: m.full((2,), 1.5, device=d)),
        c("arange(5) is int64", lambda m, d: m.arange(5, device=d)),
        c("arange(1, 4, 0.5)", lambda m, d: m.arange(1, 4, 0.5, device=d)),
        c("arange(-3, 7, 3)", lambda m, d: m.arange(-3, 7, 3, device=d)),
        c("arange(5, dtype=float32)", lambda m, d: m.arange(5, dtype=m.float32, device=d)),
        c("eye(3)", lambda m, d: m.eye(3, device=d)),
        c("eye(2, 3)", lambda m, d: m.eye(2, 3, device=d)),
        c("linspace(0, 1, 5)", lambda m, d: m.linspace(0, 1, 5, device=d)),
        c("linspace(-1, 2, 7)", lambda m, d: m.linspace(-1, 2, 7, device=d)),
        c("randn(2, 3): shape and dtype", lambda m, d: (m.randn(2, 3, device=d).shape, m.randn(2, 3, device=d).dtype)),
        c("zeros_like", lambda m, d, x: m.zeros_like(x), (X,), grad=False),
        c("ones_like(dtype=int64)", lambda m, d, x: m.ones_like(x, dtype=m.int64), (X,), grad=False),
        c("full_like", lambda m, d, x: m.full_like(x, 2.5), (X,), grad=False),
        c("from_numpy of int64", lambda m, d: m.from_numpy(np.arange(6).reshape(2, 3))),
        c("from_numpy of float32", lambda m, d: m.from_numpy(np.ones((2, 2), np.float32))),
        # ---- sizes and flags -----------------------------------------------------------------
        c("size()", lambda m, d, x: tuple(x.size()), (B3,)),
        c("size(0), size(-1)", lambda m, d, x: (x.size(0), x.size(-1)), (B3,)),
        c("ndim, dim(), numel()", lambda m, d, x: (x.ndim, x.dim(), x.numel()), (B3,)),
        c("requires_grad, is_leaf of a leaf", lambda m, d, x: (x.requires_grad, x.is_leaf), (X,)),
        c("requires_grad, is_leaf of a result", lambda m, d, x: ((x * 2).requires_grad, (x * 2).is_leaf), (X,)),
        c("requires_grad, is_leaf of detach()", lambda m, d, x: (x.detach().requires_grad, x.detach().is_leaf), (X,)),
        c("dtype of an argmax", lambda m, d, x: x.argmax(1).dtype, (X,)),
        # ---- views ---------------------------------------------------------------------------
        c("t()", lambda m, d, x: x.t(), (X,)),
        c("T", lambda m, d, x: x.T, (X,)),
        c("clone()", lambda m, d, x: x.clone() * 2, (X,)),
        c("chunk(2, 1)", lambda m, d, x: x.chunk(2, 1), (X,)),
        c("chunk(3) of 4 rows", lambda m, d, x: x.T.chunk(3), (X,)),
        c("split(3, 1)", lambda m, d, x: x.split(3, 1), (X,)),
        c("split([1, 3], 1)", lambda m, d, x: x.split([1, 3], 1), (X,)),
        # ---- elementwise ---------------------------------------------------------------------
        c("abs()", lambda m, d, x: x.abs(), (X,)),
        c("abs(x)", lambda m, d, x: abs(x), (X,)),
        c("sqrt()", lambda m, d, x: x.sqrt(), (P,)),
        c("sin(), cos()", lambda m, d, x: (x.sin(), x.cos()), (X,)),
        c("exp(), log()", lambda m, d, x: (x.exp(), x.log()), (P,)),
        c("2 ** x", lambda m, d, x: 2 ** x, (X,)),
        c("x ** 2", lambda m, d, x: x**2, (X,)),
        c("x ** y", lambda m, d, x, y: x**y, (P, X)),
        c("x / y", lambda m, d, x, y: x / y, (X, P)),
        c("3 / x", lambda m, d, x: 3 / x, (P,)),
        c("x // 0.7", lambda m, d, x: x // 0.7, (X,), grad=False),
        c("x % 1.5", lambda m, d, x: x % 1.5, (X,)),
        c("x % y", lambda m, d, x, y: x % y, (X, P)),
        c("maximum, minimum", lambda m, d, x, y: (x.maximum(y), x.minimum(y)), (X, Y)),
        c("max(other)", lambda m, d, x, y: x.max(y), (X, Y)),
        c("comparisons", lambda m, d, x, y: (x < y, x <= y, x == x, x != y, x >= 0.5), (X, Y), grad=False),
        # ---- matrix products -----------------------------------------------------------------
        c("1-D @ 1-D", lambda m, d, v: v @ v, (V,)),
        c("2-D @ 1-D", lambda m, d, x, v: x @ v, (X, V)),
        c("1-D @ 2-D", lambda m, d, v, w: v @ w, (V, M)),
        c("matmul(x, w)", lambda m, d, x, w: m.matmul(x, w), (X, M)),
        c("batched @ broadcast", lambda m, d, b, w: b @ w, (B3, M)),
        # ---- reductions ----------------------------------------------------------------------
        c("max()", lambda m, d, x: x.max(), (X,)),
        c("max(1): (values, indices)", lambda m, d, x: x.max(1), (X,)),
        c("max(1, keepdim=True)", lambda m, d, x: x.max(1, keepdim=True), (X,)),
        c("min(0): (values, indices)", lambda m, d, x: x.min(0), (X,)),
        c("max(1).values, .indices", lambda m, d, x: (x.max(1).values, x.max(1).indices), (X,)),
        c("amax((0, 1)), amin(1)", lambda m, d, x: (x.amax((0, 1)), x.amin(1)), (B3,)),
        c("argmax(), argmax(1), argmin(0)", lambda m, d, x: (x.argmax(), x.argmax(1), x.argmin(0)), (X,)),
        c("sum(), mean(1)", lambda m, d, x: (x.sum(), x.mean(1)), (X,)),
        c("std(), std(1)", lambda m, d, x: (x.std(), x.std(1)), (X,)),
        c("topk(2)", lambda m, d, x: x.topk(2), (X,)),
        c("topk(2, dim=0, largest=False)", lambda m, d, x: x.topk(2, dim=0, largest=False), (X,)),
        c("sort()", lambda m, d, x: x.sort(), (X,)),
        c("sort(0, descending=True)", lambda m, d, x: x.sort(0, descending=True), (X,)),
        c("argsort(1)", lambda m, d, x: x.argsort(1), (X,)),
        c("cumsum(1)", lambda m, d, x: x.cumsum(1), (X,)),
        c("cumsum(0) of bools is int64", lambda m, d, x: (x > 0).cumsum(0), (X,), grad=False),
        c("gather(1, index)", lambda m, d, x, i: x.gather(1, i), (X, INDEX[:, :2])),
        c("gather(0, index)", lambda m, d, x, i: x.gather(0, i[:, :2] % 3), (X, INDEX)),
        c("sum of a bool tensor is int64", lambda m, d, x: (x > 0).sum(), (X,), grad=False),
        # ---- NaN propagates ------------------------------------------------------------------
        c("max() with NaN", lambda m, d, x: x.max(), (NAN,), grad=False),
        c("max(1), min(0) with NaN", lambda m, d, x: (x.max(1), x.min(0)), (NAN,), grad=False),
        c("argmax(1), argmin(1) with NaN", lambda m, d, x: (x.argmax(1), x.argmin(1)), (NAN,), grad=False),
        c("amax(0) with NaN", lambda m, d, x: x.amax(0), (NAN,), grad=False),
        c("maximum with NaN", lambda m, d, x, y: x.maximum(y), (NAN, Y), grad=False),
        # ---- int64 ---------------------------------------------------------------------------
        c("int64 + - * by ints", lambda m, d, i: (i + 3, i - 2, i * 4, -i, i * i), (I,)),
        c("int64 // and %", lambda m, d, i: (i // 3, i % 3, i // -4, i % -4), (I,)),
        c("int64 ** 2", lambda m, d, i: i**2, (I,)),
        c("int64 / int64 is float32", lambda m, d, i: i / 7, (I,)),
        c("int64 * 2.5 is float32", lambda m, d, i: i * 2.5, (I,)),
        c("int64 + float32 tensor", lambda m, d, i, x: i + x, (I, X), grad=False),
        c("int64 sum, max, abs, cumsum", lambda m, d, i: (i.sum(), i.max(), i.abs(), i.cumsum(1)), (I,)),
        c("int64 argmax, sort", lambda m, d, i: (i.argmax(0), i.sort(dim=1, stable=True)), (I,)),
        c("int64 exact beyond 2^24", lambda m, d, b: (b + 1, b * 2, b // 3, b.sum()), (BIG,)),
        c("int64 comparisons", lambda m, d, i: (i > 0, i == 3, i < -5), (I,)),
        # ---- conversions ---------------------------------------------------------------------
        c("long()", lambda m, d, x: x.long(), (X,), grad=False),
        c("to(dtype=int64), to(device=)", lambda m, d, x: (x.to(dtype=m.int64), x.to(device=d) * 2), (X,)),
        c("int() (values; torch's dtype is int32)", lambda m, d, x: x.int(), (X,), grad=False, dtype=False),
        c("float() of int64", lambda m, d, i: i.float(), (I,)),
        c("item() of a bool", lambda m, d: m.tensor([True], device=d).item()),
        c("tolist() of int64", lambda m, d, i: i.tolist(), (I,)),
        c("np.asarray", lambda m, d, x: np.asarray(x), (X,), grad=False),
        c("np.asarray of int64", lambda m, d, i: np.asarray(i), (I,)),
        # ---- in place ------------------------------------------------------------------------
        c("add_(y, alpha=2)", lambda m, d, x, y: x.add_(y, alpha=2), (X, Y), grad=False),
        c("sub_, mul_", lambda m, d, x, y: x.sub_(y).mul_(3.0), (X, Y), grad=False),
        c("zero_()", lambda m, d, x: x.zero_(), (X,), grad=False),
        c("fill_(2.5)", lambda m, d, x: x.fill_(2.5), (X,), grad=False),
        # ---- nn.functional -------------------------------------------------------------------
        c("cross_entropy", lambda m, d, z, t: m.nn.functional.cross_entropy(z, t), (LOGITS, TARGETS)),
        c("cross_entropy ignore_index", lambda m, d, z, t: m.nn.functional.cross_entropy(z, t, ignore_index=-100), (LOGITS, IGNORED)),
        c("cross_entropy reduction sum/none", lambda m, d, z, t: (
            m.nn.functional.cross_entropy(z, t, reduction="sum"), m.nn.functional.cross_entropy(z, t, reduction="none")),
          (LOGITS, TARGETS)),  # fmt: skip
        c("cross_entropy label_smoothing", lambda m, d, z, t: m.nn.functional.cross_entropy(z, t, label_smoothing=0.1), (LOGITS, TARGETS)),
        c("mse_loss", lambda m, d, x, y: m.nn.functional.mse_loss(x, y), (X, Y)),
        c("mse_loss sum", lambda m, d, x, y: m.nn.functional.mse_loss(x, y, reduction="sum"), (X, Y)),
        c("gelu (exact)", lambda m, d, x: m.nn.functional.gelu(x), (X,)),
        c("gelu tanh", lambda m, d, x: m.nn.functional.gelu(x, approximate="tanh"), (X,)),
        c("relu, softmax, log_softmax", lambda m, d, x: (
            m.nn.functional.relu(x), m.nn.functional.softmax(x, 1), m.nn.functional.log_softmax(x, 0)), (X,)),
        c("one_hot is int64", lambda m, d, i: m.nn.functional.one_hot(i, 4), (IDS,)),
        c("embedding(ids, weight)", lambda m, d, i, w: m.nn.functional.embedding(i, w), (IDS, X.T)),
        c("linear(x, w, b)", lambda m, d, x, w, b: m.nn.functional.linear(x, w, b), (X, M.T, RNG.standard_normal(2))),
        c("layer_norm", lambda m, d, x, w, b: m.nn.functional.layer_norm(x, (4,), w, b), (X, V, V * 0.5)),
        c("dropout(p=0)", lambda m, d, x: m.nn.functional.dropout(x, 0.0), (X,)),
    ]


CASES = _cases()


# ---- running a case on both libraries ---------------------------------------------------------
def _inputs(lib: Any, arrays: Tuple[np.ndarray, ...], grad: bool, backend: Any) -> list:
    out = []
    for a in arrays:
        if a.dtype.kind == "f":
            values = a.astype(np.float32)
            t = minitorch.tensor(values, backend=backend) if lib is minitorch else torch.tensor(values)
            out.append(t.requires_grad_(True) if grad else t)
        else:
            out.append(minitorch.tensor(a, backend=backend) if lib is minitorch else torch.tensor(a))
    return out


def _dtype_name(d: Any) -> str:
    return str(d).split(".")[-1]


def _flatten(value: Any) -> list:
    if isinstance(value, (tuple, list)) and not (value and isinstance(value[0], (int, float, bool))):
        return [leaf for v in value for leaf in _flatten(v)]
    return [value]


def compare(ours: Any, ref: Any, what: str, dtype: bool = True, tol: float = 2e-5) -> None:
    """ours (minitorch's result) equals ref (torch's): tensors in shape, dtype and values (float:
    within tol of max|ref|, NaN where NaN; int and bool exactly), other values as they are."""
    if isinstance(ref, torch.Tensor):
        assert isinstance(ours, minitorch.Tensor), f"{what}: got {type(ours).__name__}, torch gives a tensor"
        assert ours.shape == tuple(ref.shape), f"{what}: shape {ours.shape} vs torch's {tuple(ref.shape)}"
        if dtype:
            assert ours.dtype.name == _dtype_name(ref.dtype), f"{what}: dtype {ours.dtype.name} vs torch's {ref.dtype}"
        compare(ours.detach().numpy(), ref.detach().numpy(), what, dtype, tol)
    elif isinstance(ref, np.ndarray):
        got = np.asarray(ours)
        assert got.shape == ref.shape, f"{what}: shape {got.shape} vs {ref.shape}"
        if ref.dtype.kind == "f":
            assert np.array_equal(np.isnan(got), np.isnan(ref)), f"{what}: NaN at other places:\n{got}\nvs\n{ref}"
            scale = max(float(np.max(np.abs(ref[~np.isnan(ref)]), initial=0.0)), 1e-6)
            err = float(np.max(np.abs(np.where(np.isnan(ref), 0.0, got - ref)), initial=0.0)) / scale
            assert err < tol, f"{what}: relative error {err:.3g}\n{got}\nvs\n{ref}"
        else:
            np.testing.assert_array_equal(got, ref, err_msg=what)
    elif isinstance(ref, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(ref), f"{what}: {ours!r} vs {ref!r}"
        for i, (a, b) in enumerate(zip(ours, ref)):
            compare(a, b, f"{what}[{i}]", dtype, tol)
    elif isinstance(ref, torch.dtype):
        assert _dtype_name(ours) == _dtype_name(ref), f"{what}: dtype {ours} vs torch's {ref}"
    elif isinstance(ref, float):
        assert type(ours) is float and math.isclose(ours, ref, rel_tol=tol, abs_tol=1e-6), f"{what}: {ours!r} vs {ref!r}"
    else:
        assert type(ours) is type(ref) and ours == ref, f"{what}: {ours!r} ({type(ours).__name__}) vs torch's {ref!r}"


def check(case: Case, backend: Any) -> None:
    """Run case on minitorch (backend) and torch (CPU) and compare results and gradients."""
    ours_in = _inputs(minitorch, case.inputs, case.grad, backend)
    ref_in = _inputs(torch, case.inputs, case.grad, None)
    ours, ref = case.fn(minitorch, backend, *ours_in), case.fn(torch, "cpu", *ref_in)
    compare(ours, ref, case.name, case.dtype)
    if not case.grad:
        return
    outs = [(o, r) for o, r in zip(_flatten(ours), _flatten(ref)) if isinstance(r, torch.Tensor) and r.requires_grad]
    if not outs:
        return
    loss_ours, loss_ref = 0.0, 0.0
    for k, (o, r) in enumerate(outs):
        g = np.random.default_rng(k).standard_normal(tuple(r.shape)).astype(np.float32)
        loss_ours = loss_ours + (o * minitorch.tensor(g, backend=backend)).sum()
        loss_ref = loss_ref + (r * torch.tensor(g)).sum()
    loss_ours.backward()
    loss_ref.backward()
    for i, (o, r) in enumerate(zip(ours_in, ref_in)):
        if isinstance(r, torch.Tensor) and r.requires_grad:
            if r.grad is None:
                assert o.grad is None, f"{case.name}: input {i} got a gradient torch does not give"
            else:
                assert o.grad is not None, f"{case.name}: no gradient reached input {i}"
                compare(o.grad, r.grad, f"{case.name}: gradient of input {i}", tol=5e-5)
