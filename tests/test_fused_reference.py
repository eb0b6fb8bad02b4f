"""The fused hooks' composed references on the CPU backends: Tensor.attn_softmax and
Tensor.layernorm, values and gradients against torch float64 on the same float32 inputs."""

from typing import Optional

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from minitorch_testing import FAST, assert_close, f32, gfloor, grad_of, mt, mt_strided, t64

NEG_INF = -np.inf


# ---- attention softmax ------------------------------------------------------------------------
def attn_ref(x: torch.Tensor, mask: Optional[np.ndarray], causal: bool) -> torch.Tensor:
    """softmax(x + mask) over keys, causal keys j > i + (Tk - Tq) removed, rows with every key
    removed set to zero (filled before the softmax so no NaN reaches the gradient)."""
    B, H, Tq, Tk = x.shape
    s = x
    if mask is not None:
        s = s + t64(mask).reshape(B, 1, 1, Tk)
    if causal:
        i = torch.arange(Tq).view(Tq, 1)
        j = torch.arange(Tk).view(1, Tk)
        s = s.masked_fill(j > i + (Tk - Tq), float("-inf"))
    dead = torch.isneginf(s).all(dim=-1, keepdim=True)
    return torch.softmax(s.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)


def check_attn(backend, x: np.ndarray, mask: Optional[np.ndarray], causal: bool,
               given: Optional[np.ndarray] = None) -> np.ndarray:
    """Compare values and input gradients for mask [B, Tk] (passed to minitorch as `given`, any
    shape broadcasting to it, when set); returns the minitorch output as NumPy."""
    tx = mt(x, backend, requires_grad=True)
    tmask = None if mask is None else mt(mask if given is None else given, backend)
    out = tx.attn_softmax(tmask, causal=causal)
    rx = t64(x, requires_grad=True)
    ref = attn_ref(rx, mask, causal)
    assert out.shape == x.shape
    assert_close(out, ref, "attn_softmax forward")
    g = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    out.backward(mt(g, backend))
    ref.backward(t64(g))
    assert_close(grad_of(tx, "attn_softmax"), rx.grad, "attn_softmax grad", floor=gfloor(g))
    return out.to_numpy()


def scores(shape: tuple, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 2.0, shape).astype(np.float32)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 1, 1, 1), (2, 2, 3, 7), (1, 2, 5, 5)])
def test_attn_softmax_plain(backend, shape: tuple) -> None:
    out = check_attn(backend, scores(shape), None, False)
    np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("form", ["B,Tk", "B,1,1,Tk", "Tk"])
def test_attn_softmax_padding_mask(backend, form: str) -> None:
    x = scores((2, 2, 3, 5), seed=1)
    mask = np.zeros((2, 5), dtype=np.float32)
    mask[1, 3:] = NEG_INF
    if form == "Tk":
        mask[0] = mask[1]
    else:
        mask[0, 0] = NEG_INF
    given = {"B,Tk": mask, "B,1,1,Tk": mask.reshape(2, 1, 1, 5), "Tk": mask[1]}[form]
    out = check_attn(backend, x, mask, False, given=given)
    assert np.all(out[1, :, :, 3:] == 0.0)


def test_attn_softmax_fully_masked_rows_give_zeros(backend) -> None:
    x = scores((3, 2, 2, 4), seed=2)
    mask = np.zeros((3, 4), dtype=np.float32)
    mask[0, :] = NEG_INF
    mask[2, 1:] = NEG_INF
    out = check_attn(backend, x, mask, False)
    assert np.all(out[0] == 0.0)
    np.testing.assert_allclose(out[2, :, :, 0], 1.0, rtol=1e-6)


@pytest.mark.parametrize("tq,tk", [(4, 4), (3, 5), (1, 6), (5, 3)])
def test_attn_softmax_causal(backend, tq: int, tk: int) -> None:
    out = check_attn(backend, scores((2, 2, tq, tk), seed=3), None, True)
    for i in range(tq):
        last = i + tk - tq
        assert np.all(out[:, :, i, max(last + 1, 0):] == 0.0)
        if last >= 0:
            np.testing.assert_allclose(out[:, :, i].sum(-1), 1.0, rtol=1e-6)
        else:
            assert np.all(out[:, :, i] == 0.0), "a query with no visible key gives a zero row"


def test_attn_softmax_causal_with_padding(backend) -> None:
    mask = np.zeros((2, 5), dtype=np.float32)
    mask[0, 4] = NEG_INF
    mask[1, :3] = NEG_INF
    check_attn(backend, scores((2, 2, 4, 5), seed=4), mask, True)


def test_attn_softmax_finite_large_negative_mask_is_additive(backend) -> None:
    x = scores((2, 2, 3, 4), seed=5)
    mask = np.zeros((2, 4), dtype=np.float32)
    mask[0, 2:] = -1e8
    out = check_attn(backend, x, mask, False)
    assert np.all(out[0, :, :, 2:] < 1e-30)
    # A row masked entirely by -1e8 is no dead row: the mask is an ordinary additive value.  The
    # sum x + (-1e8) is a float32 add, so the reference is softmax of the float32-rounded sums.
    everything = np.full((2, 4), -1e8, dtype=np.float32)
    tx = mt(x, backend, requires_grad=True)
    out = tx.attn_softmax(mt(everything, backend))
    rounded = (x + everything.reshape(2, 1, 1, 4)).astype(np.float32)
    rx = t64(x, requires_grad=True)
    ref = torch.softmax(t64(rounded) + (rx - rx.detach()), dim=-1)
    assert_close(out, ref, "attn_softmax with a -1e8 row")
    np.testing.assert_allclose(out.to_numpy().sum(-1), 1.0, rtol=1e-6)
    g = np.random.default_rng(6).standard_normal(x.shape).astype(np.float32)
    out.backward(mt(g, backend))
    ref.backward(t64(g))
    assert_close(tx.grad, rx.grad, "attn_softmax grad with a -1e8 row", floor=gfloor(g))


def test_attn_softmax_is_out_of_place_and_the_mask_takes_no_gradient(backend) -> None:
    x = scores((1, 2, 2, 3), seed=7)
    tx = mt(x, backend, requires_grad=True)
    mask = mt(np.array([[0.0, -1.0, 0.5]]), backend, requires_grad=True)
    out = tx.attn_softmax(mask)
    np.testing.assert_array_equal(tx.to_numpy(), x)
    out.sum().backward()
    assert mask.grad is None
    assert tx.grad is not None


def test_attn_softmax_of_a_strided_input(backend) -> None:
    x = scores((2, 2, 3, 4), seed=8)
    out = mt_strided(x, backend).attn_softmax(causal=True)
    assert_close(out, attn_ref(t64(x), None, True), "attn_softmax of a strided view")


# ---- layernorm --------------------------------------------------------------------------------
def check_layernorm(backend, x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5,
                    tol: float = 1e-5, strided: bool = False) -> None:
    tx = (mt_strided if strided else mt)(x, backend, requires_grad=True)
    tg, tb = mt(gamma, backend, requires_grad=True), mt(beta, backend, requires_grad=True)
    out = tx.layernorm(tg, tb, eps)
    rx, rg, rb = t64(x, requires_grad=True), t64(gamma, requires_grad=True), t64(beta, requires_grad=True)
    ref = F.layer_norm(rx, (x.shape[-1],), rg, rb, eps)
    assert_close(out, ref, "layernorm forward", tol=tol)
    g = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    out.backward(mt(g, backend))
    ref.backward(t64(g))
    assert_close(grad_of(tx, "x"), rx.grad, "layernorm grad x", tol=tol, floor=gfloor(g))
    assert_close(grad_of(tg, "gamma"), rg.grad, "layernorm grad gamma", tol=tol, floor=gfloor(g))
    assert_close(grad_of(tb, "beta"), rb.grad, "layernorm grad beta", tol=tol, floor=gfloor(g))


def ln_params(c: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.normal(1.0, 0.5, c).astype(np.float32), rng.normal(0.0, 0.5, c).astype(np.float32)


@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 5), (7,), (1, 1), (3, 2)])
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_layernorm(backend, shape: tuple, eps: float) -> None:
    x = np.random.default_rng(9).normal(0.5, 2.0, shape).astype(np.float32)
    check_layernorm(backend, x, *ln_params(shape[-1], 10), eps=eps)


def test_layernorm_of_a_strided_input(backend) -> None:
    x = np.random.default_rng(11).normal(0.0, 1.0, (3, 4)).astype(np.float32)
    check_layernorm(backend, x, *ln_params(4, 12), strided=True)


@pytest.mark.parametrize("c", [8, 64, 257])
def test_layernorm_rows_with_mean_100_and_std_0_01(c: int) -> None:
    # Needs a numerically sound variance (E[x^2] - E[x]^2 in float32 is off by ~6e-4 here, more
    # than the variance 1e-4 itself).  The bound is set by float32 itself: the row mean, stored in
    # float32, can be off by half an ulp of 100 = 3.8e-6 = 3.8e-4 standard deviations, which
    # shifts every normalized value of the row; torch's float32 layer_norm lands at 2e-4..4e-4.
    rng = np.random.default_rng(c)
    x = (100.0 + 0.01 * rng.standard_normal((6, c))).astype(np.float32)
    check_layernorm(FAST, x, *ln_params(c, 13), tol=1e-3)


def test_layernorm_rows_with_mean_100_on_both_backends(backend) -> None:
    rng = np.random.default_rng(14)
    x = (100.0 + 0.01 * rng.standard_normal((2, 6))).astype(np.float32)
    check_layernorm(backend, x, *ln_params(6, 15), tol=1e-3)


def test_layernorm_of_constant_rows_is_beta(backend) -> None:
    x = np.full((2, 4), 3.0, dtype=np.float32)
    gamma, beta = ln_params(4, 16)
    tx = mt(x, backend, requires_grad=True)
    out = tx.layernorm(mt(gamma, backend), mt(beta, backend))
    assert_close(out, np.broadcast_to(f32(beta), (2, 4)), "layernorm of constant rows")
    out.sum().backward()
    assert np.isfinite(tx.grad.to_numpy()).all()
