"""Indexing, slicing, assignment and the torch-named functions on the CUDA backend, against torch on
the CPU in float64 (NumPy for negative steps): forward values and shapes, gradients, views that share
device memory, and the results staying on the GPU."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest
import torch

import minitorch

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)
RNG = np.random.default_rng(18)
X = RNG.standard_normal((3, 4, 5)).astype(np.float32)


def gpu(arr: Any, requires_grad: bool = False) -> minitorch.Tensor:
    return minitorch.tensor_from_numpy(np.asarray(arr, dtype=np.float32), backend=CUDA, requires_grad=requires_grad)


def ref64(arr: np.ndarray, requires_grad: bool = False) -> torch.Tensor:
    return torch.tensor(arr.astype(np.float64), requires_grad=requires_grad)


def close(out: minitorch.Tensor, ref: Any, what: str, tol: float = 1e-5) -> None:
    assert out.backend is CUDA, f"{what}: the result left the GPU"
    r = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    o = out.to_numpy().astype(np.float64)
    assert o.shape == r.shape, f"{what}: shape {o.shape} vs {r.shape}"
    finite = np.isfinite(r)
    assert np.array_equal(o[~finite], r[~finite]), f"{what}: inf/nan entries differ"
    if finite.any():
        err = np.abs(o[finite] - r[finite]).max() / max(np.abs(r[finite]).max(), 1.0)
        assert err < tol, f"{what}: relative error {err:.3g}"


def forward_backward(ours: Callable, theirs: Callable, *arrays: np.ndarray, what: str) -> None:
    ts = [gpu(a, requires_grad=True) for a in arrays]
    rs = [ref64(a, requires_grad=True) for a in arrays]
    out, ref = ours(*ts), theirs(*rs)
    close(out, ref, f"{what} forward")
    g = RNG.standard_normal(tuple(ref.shape)).astype(np.float32)
    out.backward(gpu(g))
    ref.backward(torch.tensor(g.astype(np.float64)))
    for i, (t, r) in enumerate(zip(ts, rs)):
        if r.grad is not None:
            close(t.grad, r.grad, f"{what} gradient {i}")


KEYS = [
    1, -1, (0, 2), (slice(1, None), slice(None, None, 2)), (Ellipsis, 3), (None, 1, Ellipsis, None),
    (slice(None), slice(-3, -1), 4), [2, 0, 2], (slice(None), [3, -4]), ([[0, 1], [2, 2]], slice(None), [1, 0]),
    (1, slice(None), [0, 4]), (slice(None), [1, 2], None, [1, 3]), (np.array([True, False, True]),),
]  # fmt: skip


@pytest.mark.parametrize("key", KEYS, ids=[str(i) for i in range(len(KEYS))])
def test_keys_match_torch(key: Any) -> None:
    forward_backward(lambda t: t[key], lambda r: r[key], X, what=f"x[{key!r}]")
    # The same values through a non-contiguous view: a (5, 4, 3) tensor permuted back to (3, 4, 5).
    XT = np.ascontiguousarray(X.transpose(2, 1, 0))
    forward_backward(lambda t: t.permute(2, 1, 0)[key], lambda r: r.permute(2, 1, 0)[key], XT, what=f"strided x[{key!r}]")


def test_negative_steps_and_masks() -> None:
    t = gpu(X, requires_grad=True)
    out = t[::-1, 1, ::-2]
    close(out, X.astype(np.float64)[::-1, 1, ::-2], "x[::-1, 1, ::-2]")
    out.backward(gpu(np.ones(out.shape)))
    expected = np.zeros(X.shape)
    np.add.at(expected, (slice(None, None, -1), 1, slice(None, None, -2)), 1.0)
    close(t.grad, expected, "negative-step gradient")
    close(t[t > 0.5], X.astype(np.float64)[X > 0.5], "x[x > 0.5] with a mask on the GPU")
    close(t[gpu([2.0, 0.0])], X.astype(np.float64)[[2, 0]], "x[index tensor on the GPU]")


def test_views_share_device_memory_and_assignment() -> None:
    t = gpu(np.arange(24.0).reshape(4, 6))
    block = t[1:3, ::2]
    assert block.to_torch().data_ptr() == t.to_torch().data_ptr() + (6 * 4), "the view starts mid-storage"
    block[0, 1] = 99.0
    t[3] = gpu([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    t[t < 2.0] = -1.0
    t[[0, 0], [5, 5]] = 7.0
    expected = np.arange(24.0).reshape(4, 6)
    expected[1, 2] = 99.0
    expected[3] = [1, 2, 3, 4, 5, 6]
    expected[expected < 2.0] = -1.0
    expected[0, 5] = 7.0
    close(t, expected, "assignments")


FUNCTIONS = {
    ".T": (lambda t: t.T, lambda r: r.permute(2, 1, 0)),
    "unsqueeze/squeeze": (lambda t: t.unsqueeze(1).squeeze(1)[:, :1].squeeze(), lambda r: r.unsqueeze(1).squeeze(1)[:, :1].squeeze()),
    "flatten(1)": (lambda t: t.flatten(1), lambda r: r.flatten(1)),
    "reshape of a view": (lambda t: t.transpose(0, 2).reshape(5, -1), lambda r: r.transpose(0, 2).reshape(5, -1)),
    "softmax(1)": (lambda t: t.softmax(1), lambda r: r.softmax(1)),
    "log_softmax(-1)": (lambda t: t.log_softmax(-1), lambda r: r.log_softmax(-1)),
    "mean(1)": (lambda t: t.mean(1), lambda r: r.mean(1)),
    "sum()": (lambda t: t.sum(), lambda r: r.sum()),
    "amax(2, keepdim=True)": (lambda t: t.amax(2, keepdim=True), lambda r: r.amax(2, keepdim=True)),
    "max(2, keepdim=True).values": (lambda t: t.max(2, keepdim=True).values, lambda r: r.max(2, keepdim=True).values),
    "var((0, 2))": (lambda t: t.var((0, 2), correction=1), lambda r: r.var((0, 2))),
    "clamp": (lambda t: t.clamp(-0.3, 0.4), lambda r: r.clamp(-0.3, 0.4)),
    "masked_fill": (lambda t: t.masked_fill(t > 0.0, 2.0), lambda r: r.masked_fill(r > 0.0, 2.0)),
    "cat": (lambda t: minitorch.cat([t, t[:, :1] * 2.0], 1), lambda r: torch.cat([r, r[:, :1] * 2.0], 1)),
    "stack": (lambda t: minitorch.stack([t, t.exp()], -1), lambda r: torch.stack([r, r.exp()], -1)),
    "where": (lambda t: minitorch.where(t > 0.0, t, t * -3.0), lambda r: torch.where(r > 0.0, r, r * -3.0)),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_torch_named_functions_match_torch(name: str) -> None:
    ours, theirs = FUNCTIONS[name]
    forward_backward(ours, theirs, X, what=name)


def test_conversions_creation_and_modules(tmp_path) -> None:
    t = gpu(X)
    assert t.device == "cuda" and t.dtype == minitorch.float32 and (t > 0).dtype == minitorch.bool
    np.testing.assert_array_equal(t.numpy(), X)
    assert t[1, 2, 3].item() == float(X[1, 2, 3]) and t[0, 0].tolist() == X[0, 0].tolist()
    close(minitorch.arange(1, 2, 0.25, backend=CUDA), torch.arange(1, 2, 0.25, dtype=torch.float64), "arange")
    close(minitorch.zeros_like(t) + minitorch.ones_like(t), np.ones(X.shape), "zeros_like + ones_like")
    close(minitorch.where(t > 0.0, t, -math.inf), np.where(X > 0, X.astype(np.float64), -np.inf), "where with -inf")
    np.testing.assert_array_equal(t.argmax(1).numpy(), torch.tensor(X).argmax(1).numpy())
    minitorch.save({"t": t}, tmp_path / "t.npz")
    back = minitorch.load(tmp_path / "t.npz", backend="cuda")["t"]
    assert back.backend is CUDA
    np.testing.assert_array_equal(back.numpy(), X)
    minitorch.manual_seed(0)
    layer = minitorch.Linear(5, 2)
    expected = layer(minitorch.tensor(X)).to_numpy()
    layer.to("cuda")
    close(layer(t), expected, "Linear moved with Module.to('cuda')")
