"""Code written for the original minitorch API runs here with the same numbers: Tensor.var is the
population variance (correction=1 gives torch's unbiased one), a LayerNorm composed from mean/var
matches Tensor.layernorm, and the seed-API spellings (tensor(list, backend=..., requires_grad=True),
attn_softmax(mask), layernorm(gamma, beta), backward(grad), .grad.to_numpy(), nn.softmax(x, dim=...))
keep working (mean and var with keepdim=True, as in torch, where the kept dim is needed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from minitorch_testing import assert_close, mt

import minitorch


def test_var_is_the_population_variance_by_default(backend) -> None:
    x = np.random.default_rng(0).standard_normal((4, 7)).astype(np.float32)
    t = mt(x, backend)
    assert_close(t.var(1), np.var(x.astype(np.float64), axis=1), "var(1)")
    assert_close(t.var(), np.var(x.astype(np.float64)), "var()")
    assert_close(t.var(0, correction=1), np.var(x.astype(np.float64), axis=0, ddof=1), "var(0, correction=1)")
    assert_close(t.var(1, keepdim=True), np.var(x.astype(np.float64), axis=1, keepdims=True), "var(1, keepdim=True)")
    with pytest.raises(ValueError, match="correction must be a non-negative int"):
        t.var(1, correction=-1)


def _seed_layernorm(x: minitorch.Tensor, gamma: minitorch.Tensor, beta: minitorch.Tensor, eps: float) -> minitorch.Tensor:
    """LayerNorm as code for the original minitorch writes it, from mean and var."""
    dim = x.dims - 1
    mean = x.mean(dim, keepdim=True)
    var = x.var(dim, keepdim=True)
    return (x - mean) / ((var + eps) ** 0.5) * gamma + beta


def test_layernorm_composed_from_mean_and_var_matches_tensor_layernorm(backend) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    gamma = rng.standard_normal(16).astype(np.float32)
    beta = rng.standard_normal(16).astype(np.float32)
    g = rng.standard_normal((3, 5, 16)).astype(np.float32)
    grads = []
    outs = []
    for fn in (_seed_layernorm, lambda a, b, c, e: a.layernorm(b, c, e)):
        tx, tg, tb = mt(x, backend, True), mt(gamma, backend, True), mt(beta, backend, True)
        out = fn(tx, tg, tb, 1e-5)
        out.backward(mt(g, backend))
        outs.append(out.to_numpy())
        grads.append([t.grad.to_numpy() for t in (tx, tg, tb)])
    ref = torch.nn.functional.layer_norm(torch.tensor(x, dtype=torch.float64), (16,), torch.tensor(gamma, dtype=torch.float64),
                                         torch.tensor(beta, dtype=torch.float64), 1e-5).numpy()
    assert_close(outs[0], ref, "composed LayerNorm vs torch")
    assert_close(outs[1], ref, "Tensor.layernorm vs torch")
    for name, a, b in zip(("dx", "dgamma", "dbeta"), grads[0], grads[1]):
        assert_close(a, b.astype(np.float64), f"{name}: composed vs Tensor.layernorm", floor=1e-2)


def test_seed_api_spellings(backend) -> None:
    x = minitorch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]], backend=backend, requires_grad=True)
    y = minitorch.nn.softmax(x, dim=1)
    y.backward(minitorch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], backend=backend))
    ref = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    torch.softmax(ref, 1).backward(torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64))
    assert_close(x.grad.to_numpy(), ref.grad.numpy(), "nn.softmax(x, dim=1) gradient")
    scores = minitorch.tensor(np.zeros((1, 1, 2, 3)).tolist(), backend=backend)
    mask = minitorch.tensor([[0.0, 0.0, -1e8]], backend=backend)
    assert_close(scores.attn_softmax(mask).to_numpy(), np.array([[[[0.5, 0.5, 0.0]] * 2]]), "attn_softmax(mask)")
    ln = x.layernorm(minitorch.tensor([1.0, 1.0, 1.0], backend=backend), minitorch.tensor([0.0, 0.0, 0.0], backend=backend))
    assert ln.shape == (2, 3)
