"""The Tensor class: import, constructors, conversions (NumPy, torch), printing, autodiff flags,
gradient accumulation, broadcasting gradients and batched matmul against torch."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from minitorch_testing import FAST, SIMPLE, assert_close, f32, mt, t64

import minitorch

REPO = Path(__file__).resolve().parent.parent


def test_import_minitorch_works_without_a_gpu() -> None:
    code = "import minitorch; print(minitorch.CudaKernelOps.__name__, minitorch.FastOps.__name__)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["CudaKernelOps", "FastOps"]


def test_public_api() -> None:
    for name in [
        "tensor", "tensor_from_numpy", "zeros", "ones", "rand", "Tensor", "TensorBackend", "SimpleOps",
        "FastOps", "CudaKernelOps", "Module", "Parameter", "Linear", "Embedding", "Dropout",
        "LayerNorm1d", "SGD", "Adam", "nn",
    ]:
        assert hasattr(minitorch, name), name


def test_default_backend_is_fastops() -> None:
    assert minitorch.tensor([1.0]).backend.ops is minitorch.FastOps
    assert minitorch.TensorBackend(minitorch.FastOps) is FAST


def test_constructors(backend) -> None:
    t = minitorch.tensor([[1, 2, 3], [4, 5, 6]], backend=backend)
    assert t.shape == (2, 3) and t.numel() == 6 and t.size() == (2, 3) and t.dims == 2 and len(t) == 2
    assert t.dtype == minitorch.int64 and t.to_numpy().dtype == np.int64, "integer data is int64, as in torch"
    assert minitorch.tensor([[1.0, 2, 3]], backend=backend).to_numpy().dtype == np.float32
    np.testing.assert_array_equal(t.to_numpy(), [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(minitorch.zeros((2, 2), backend=backend).to_numpy(), np.zeros((2, 2)))
    np.testing.assert_array_equal(minitorch.ones((3,), backend=backend).to_numpy(), np.ones(3))
    np.testing.assert_array_equal(minitorch.full((2,), 2.5, backend=backend).to_numpy(), [2.5, 2.5])
    assert minitorch.ones((2,), backend=backend, requires_grad=True).requires_grad
    assert not minitorch.zeros((2,), backend=backend).requires_grad


def test_rand_is_uniform_and_seeded(backend) -> None:
    minitorch.manual_seed(7)
    a = minitorch.rand((20000,), backend=backend).to_numpy()
    minitorch.manual_seed(7)
    b = minitorch.rand((20000,), backend=backend).to_numpy()
    np.testing.assert_array_equal(a, b)
    assert 0.0 <= a.min() and a.max() < 1.0
    assert abs(a.mean() - 0.5) < 0.01
    assert abs(a.var() - 1.0 / 12.0) < 0.005
    c = minitorch.rand((20000,), backend=backend).to_numpy()
    assert not np.array_equal(a, c)


def test_rng_state_round_trip() -> None:
    minitorch.manual_seed(3)
    state = minitorch.get_rng_state()
    a = minitorch.rand((5,)).to_numpy()
    minitorch.set_rng_state(state)
    np.testing.assert_array_equal(minitorch.rand((5,)).to_numpy(), a)


def test_item_to_numpy_and_indexing(backend) -> None:
    t = minitorch.tensor([[1.5, -2.0], [3.0, 4.25]], backend=backend)
    assert minitorch.tensor([2.5], backend=backend).item() == 2.5
    assert t.sum().item() == pytest.approx(6.75)
    assert t[1, 1] == 4.25 and t[(0, 1)] == -2.0
    t[0, 0] = 9.0
    assert t.to_numpy()[0, 0] == 9.0
    p = t.permute(1, 0)
    assert not p.is_contiguous()
    np.testing.assert_array_equal(p.to_numpy(), t.to_numpy().T)
    assert p[0, 1] == 3.0
    copy = t.to_numpy()
    copy[0, 0] = -1.0
    assert t[0, 0] == 9.0, "to_numpy returns a copy"


def test_repr_shows_values_backend_and_grad_flag(backend) -> None:
    t = minitorch.tensor([[1.0, 2.5], [-3.0, 0.125]], backend=backend)
    text = repr(t)
    assert text.startswith("tensor([[")
    for value in ["1.", "2.5", "-3.", "0.125"]:
        assert value in text
    assert f"backend={backend.ops.__name__}" in text
    assert "requires_grad" not in text
    assert repr(t.requires_grad_(True)).endswith(", requires_grad=True)")
    big = repr(minitorch.zeros((100, 100), backend=backend))
    assert "..." in big and len(big) < 2000


def test_tensor_from_numpy_any_layout(backend) -> None:
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    cases = {
        "fortran": np.asfortranarray(base),
        "strided": base[::2, 1::3],
        "reversed": base[::-1, ::-2],
        "transposed": base.T,
        "int": base.astype(np.int64),
        "bool": base > 10,
        "3d view": base.reshape(2, 3, 4).transpose(2, 0, 1)[:, 1:, :],
    }
    for name, arr in cases.items():
        t = minitorch.tensor_from_numpy(arr, backend=backend)
        assert t.shape == arr.shape, name
        assert t.is_contiguous(), name
        np.testing.assert_array_equal(t.to_numpy(), arr.astype(np.float32), err_msg=name)
    arr = np.ones((2, 2), dtype=np.float32)
    t = minitorch.tensor_from_numpy(arr, backend=backend)
    arr[0, 0] = 5.0
    assert t[0, 0] == 1.0, "tensor_from_numpy copies"


def test_requires_grad_flag_is_honoured(backend) -> None:
    x = mt(np.array([1.0, 2.0]), backend, requires_grad=True)
    w = mt(np.array([3.0, 4.0]), backend).requires_grad_(True)
    assert x.requires_grad and x.is_leaf and w.requires_grad
    assert w.requires_grad_(False) is w
    assert not w.requires_grad and w.is_constant()
    y = (x * w).sum()
    y.backward()
    assert w.grad is None
    np.testing.assert_array_equal(x.grad.to_numpy(), [3.0, 4.0])
    frozen = mt(np.array([1.0, 2.0]), backend, requires_grad=False)
    out = frozen * 2.0
    assert out.is_constant() and out.history is None


def test_detach_and_no_grad(backend) -> None:
    x = mt(np.array([1.0, 2.0]), backend, requires_grad=True)
    d = (x * 2.0).detach()
    assert d.is_constant()
    np.testing.assert_array_equal(d.to_numpy(), [2.0, 4.0])
    ((x * 3.0) + d).sum().backward()
    np.testing.assert_array_equal(x.grad.to_numpy(), [3.0, 3.0])
    with minitorch.no_grad():
        assert (x * 2.0).is_constant()


def test_gradients_accumulate_until_zero_grad(backend) -> None:
    x = mt(np.array([1.0, -2.0, 3.0]), backend, requires_grad=True)
    (x * x).sum().backward()
    (x * 2.0).sum().backward()
    np.testing.assert_array_equal(x.grad.to_numpy(), [4.0, -2.0, 8.0])
    x.zero_grad_()
    assert x.grad is None
    (x * 1.0).sum().backward()
    np.testing.assert_array_equal(x.grad.to_numpy(), [1.0, 1.0, 1.0])


def test_backward_with_an_explicit_gradient(backend) -> None:
    x = mt(np.array([[1.0, 2.0], [3.0, 4.0]]), backend, requires_grad=True)
    (x * x).backward(mt(np.array([[1.0, 0.0], [0.5, 2.0]]), backend))
    np.testing.assert_array_equal(x.grad.to_numpy(), [[2.0, 0.0], [3.0, 16.0]])


def test_to_moves_between_backends_as_a_new_leaf() -> None:
    x = mt(np.array([1.0, 2.0]), SIMPLE, requires_grad=True)
    y = (x * 2.0).to(FAST)
    assert y.backend is FAST and y.is_leaf
    np.testing.assert_array_equal(y.to_numpy(), [2.0, 4.0])
    assert x.to(SIMPLE) is x


def test_to_torch_is_zero_copy(backend) -> None:
    t = minitorch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], backend=backend)
    view = t.to_torch()
    assert view.dtype == torch.float32 and tuple(view.shape) == (2, 3)
    view[0, 1] = 20.0
    assert t[0, 1] == 20.0
    t[1, 2] = 60.0
    assert view[1, 2].item() == 60.0
    p = t.permute(1, 0).to_torch()
    assert p.data_ptr() == view.data_ptr()
    np.testing.assert_array_equal(p.numpy(), t.to_numpy().T)


def test_from_torch_is_zero_copy(backend) -> None:
    src = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = minitorch.from_torch(src, backend=backend)
    assert t.shape == (2, 3) and t.backend is backend
    src[1, 1] = 42.0
    assert t[1, 1] == 42.0
    assert minitorch.from_torch(src).backend is FAST
    transposed = minitorch.from_torch(src.t(), backend=backend)
    np.testing.assert_array_equal(transposed.to_numpy(), src.t().numpy())


def test_broadcast_gradients_are_summed_back_like_torch(backend) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 1, 3)).astype(np.float32)
    b = rng.standard_normal((4, 1)).astype(np.float32)
    c = rng.standard_normal((3,)).astype(np.float32)
    ta, tb, tc = (mt(v, backend, requires_grad=True) for v in (a, b, c))
    out = (ta * tb + tc) / (tb * tb + 1.0)
    ra, rb, rc = (t64(v, requires_grad=True) for v in (a, b, c))
    ref = (ra * rb + rc) / (rb * rb + 1.0)
    assert_close(out, ref, "broadcast forward")
    g = rng.standard_normal(ref.shape).astype(np.float32)
    out.backward(mt(g, backend))
    ref.backward(t64(g))
    for t, r, name in [(ta, ra, "a"), (tb, rb, "b"), (tc, rc, "c")]:
        assert t.grad.shape == t.shape
        assert_close(t.grad, r.grad, f"grad {name}")


def test_batched_4d_matmul_with_broadcasting_like_torch() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 1, 5, 7)).astype(np.float32)
    b = rng.standard_normal((3, 7, 4)).astype(np.float32)
    ta, tb = mt(a, FAST, requires_grad=True), mt(b, FAST, requires_grad=True)
    out = ta @ tb
    ra, rb = t64(a, requires_grad=True), t64(b, requires_grad=True)
    ref = ra @ rb
    assert out.shape == (2, 3, 5, 4)
    assert_close(out, ref, "4-D matmul")
    g = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    out.backward(mt(g, FAST))
    ref.backward(t64(g))
    assert_close(ta.grad, ra.grad, "4-D matmul grad a")
    assert_close(tb.grad, rb.grad, "4-D matmul grad b")
    lhs = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    rhs = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    attn_like = mt(lhs, FAST).transpose(2, 3) @ mt(rhs, FAST)
    assert_close(attn_like, np.swapaxes(f32(lhs), 2, 3) @ f32(rhs), "strided 4-D matmul")


def test_fast_matmul_on_a_larger_problem() -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, 96)).astype(np.float32)
    b = rng.standard_normal((96, 80)).astype(np.float32)
    assert_close(mt(a, FAST) @ mt(b, FAST), f32(a) @ f32(b), "64x96 @ 96x80")
    bt = mt(np.ascontiguousarray(b.T), FAST).transpose(0, 1)
    assert_close(mt(a, FAST) @ bt, f32(a) @ f32(b), "a @ strided b")


def test_backends_agree_on_a_computation() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    results = []
    for b in (SIMPLE, FAST):
        tx, tw = mt(x, b, requires_grad=True), mt(w, b, requires_grad=True)
        loss = ((tx @ tw).sigmoid() * 2.0 - 1.0).sum()
        loss.backward()
        results.append((loss.item(), tx.grad.to_numpy(), tw.grad.to_numpy()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    assert_close(results[0][1], results[1][1], "x grads agree")
    assert_close(results[0][2], results[1][2], "w grads agree")
