"""The dtype behaviour of the row ops and the optimizer on the CPU backends (bfloat16 emulated),
which the CUDA kernels match: LayerNorm's output and input gradient in the input's dtype, its
statistics and parameter gradients float32."""

from __future__ import annotations

import numpy as np
import pytest

import minitorch
from minitorch import bfloat16, float32

BACKEND = minitorch.TensorBackend(minitorch.FastOps)


def _tensor(arr: np.ndarray, dtype=float32, requires_grad: bool = False) -> minitorch.Tensor:
    t = minitorch.tensor_from_numpy(np.asarray(arr, np.float32), backend=BACKEND).to(dtype)
    return t.detach().requires_grad_(True) if requires_grad else t


def test_layernorm_of_bfloat16_input_is_float32_math_rounded_once() -> None:
    rng = np.random.default_rng(0)
    x = bfloat16.round(rng.normal(3.0, 2.0, (5, 33)).astype(np.float32))
    gamma, beta = rng.normal(size=33).astype(np.float32), rng.normal(size=33).astype(np.float32)
    xb = _tensor(x, bfloat16, requires_grad=True)
    g, b = _tensor(gamma, requires_grad=True), _tensor(beta, requires_grad=True)
    out = xb.layernorm(g, b)
    assert out.dtype is bfloat16
    x32 = _tensor(x, requires_grad=True)
    g32, b32 = _tensor(gamma, requires_grad=True), _tensor(beta, requires_grad=True)
    want = x32.layernorm(g32, b32)
    np.testing.assert_array_equal(out.to_numpy(), bfloat16.round(want.to_numpy()))

    dy = bfloat16.round(rng.normal(size=(5, 33)).astype(np.float32))
    (out * _tensor(dy, bfloat16)).sum().backward()
    (want * _tensor(dy)).sum().backward()
    assert xb.grad.dtype is bfloat16 and g.grad.dtype is float32 and b.grad.dtype is float32
    np.testing.assert_array_equal(xb.grad.to_numpy(), bfloat16.round(x32.grad.to_numpy()))
    np.testing.assert_allclose(g.grad.to_numpy(), g32.grad.to_numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.grad.to_numpy(), b32.grad.to_numpy(), rtol=1e-5, atol=1e-5)


def test_layernorm_statistics_are_float32() -> None:
    from minitorch.fused.layernorm import layernorm_reference

    x = _tensor(np.linspace(-1.0, 1.0, 24).reshape(3, 8), bfloat16)
    out, mean, rstd = layernorm_reference(x, _tensor(np.ones(8)), _tensor(np.zeros(8)), 1e-5)
    assert out.dtype is bfloat16 and mean.dtype is float32 and rstd.dtype is float32


def test_layernorm_casts_16bit_gamma_and_beta_up() -> None:
    x = _tensor(np.arange(12.0).reshape(2, 6), bfloat16)
    g = _tensor(np.full(6, 1.5), bfloat16, requires_grad=True)
    out = x.layernorm(g, _tensor(np.zeros(6), bfloat16))
    assert out.dtype is bfloat16
    out.sum().backward()
    assert g.grad.dtype is bfloat16, "a bfloat16 parameter gets a bfloat16 gradient through the cast"


def _params(*shapes):
    rng = np.random.default_rng(1)
    return [minitorch.Parameter(_tensor(rng.standard_normal(s))) for s in shapes]


def test_adamw_working_copies_are_the_masters_rounded() -> None:
    params = _params((3, 5), (7,))
    opt = minitorch.AdamW(params, lr=0.05, working_dtype=bfloat16)
    copies = [opt.working_copy(p) for p in params]
    for p, w in zip(params, copies):
        assert w.dtype is bfloat16 and w.shape == p.value.shape
        np.testing.assert_array_equal(w.to_numpy(), bfloat16.round(p.value.to_numpy()))
    params[0].value.grad = _tensor(np.ones((3, 5)))
    before = params[1].value.to_numpy()
    opt.step()
    assert opt.working_copy(params[0]) is copies[0], "a working copy keeps its tensor"
    np.testing.assert_array_equal(copies[0].to_numpy(), bfloat16.round(params[0].value.to_numpy()))
    np.testing.assert_array_equal(copies[1].to_numpy(), bfloat16.round(before), "no gradient: no update")
    params[1].value.copy_(np.full(7, 0.1, np.float32))
    opt.refresh_working()
    np.testing.assert_array_equal(copies[1].to_numpy(), bfloat16.round(np.full(7, 0.1, np.float32)))


def test_adamw_working_copy_errors() -> None:
    params = _params((2,))
    with pytest.raises(ValueError, match="working_dtype"):
        minitorch.AdamW(params, working_dtype=minitorch.float16)
    with pytest.raises(KeyError, match="no working copy"):
        minitorch.AdamW(params).working_copy(params[0])


def test_attn_softmax_of_bfloat16_scores_is_float32_math_rounded_once() -> None:
    rng = np.random.default_rng(2)
    scores = bfloat16.round(rng.normal(0.0, 3.0, (2, 3, 4, 9)).astype(np.float32))
    mask = np.zeros((2, 9), np.float32)
    mask[1, 6:] = -np.inf
    sb = _tensor(scores, bfloat16, requires_grad=True)
    s32 = _tensor(scores, requires_grad=True)
    out = minitorch.fused.attn_softmax(sb, _tensor(mask), causal=True)
    want = minitorch.fused.attn_softmax(s32, _tensor(mask), causal=True)
    assert out.dtype is bfloat16
    np.testing.assert_array_equal(out.to_numpy(), bfloat16.round(want.to_numpy()))
    dy = bfloat16.round(rng.normal(size=scores.shape).astype(np.float32))
    (out * _tensor(dy, bfloat16)).sum().backward()
    assert sb.grad.dtype is bfloat16
    y = _tensor(out.to_numpy())
    g = _tensor(dy)
    expected = (y * (g - (g * y).sum(3, keepdim=True))).to_numpy()
    np.testing.assert_array_equal(sb.grad.to_numpy(), bfloat16.round(expected))


def test_embedding_gathers_bfloat16_rows_of_a_float32_master() -> None:
    rng = np.random.default_rng(3)
    weight = _tensor(rng.standard_normal((6, 5)), requires_grad=True)
    ids = _tensor(np.array([[1, 4, 1], [0, 5, 1]], np.float32))
    rows = minitorch.fused.embedding(weight, ids, dtype=bfloat16)
    assert rows.dtype is bfloat16
    np.testing.assert_array_equal(rows.to_numpy(), bfloat16.round(weight.to_numpy()[[[1, 4, 1], [0, 5, 1]]]))
    dy = bfloat16.round(rng.standard_normal((2, 3, 5)).astype(np.float32))
    (rows * _tensor(dy, bfloat16)).sum().backward()
    assert weight.grad.dtype is float32
    want = np.zeros((6, 5), np.float32)
    np.add.at(want, np.array([1, 4, 1, 0, 5, 1]), dy.reshape(6, 5))
    np.testing.assert_allclose(weight.grad.to_numpy(), want, rtol=1e-6)
