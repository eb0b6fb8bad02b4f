"""minitorch.fused_attention on the CPU backends (the composed reference in TensorOps): output,
log-sum-exp and gradients of q, k, v against naive attention in torch float64 from the same float32
inputs, for both activations, padding masks (including rows with every key removed), causal
masking with Tq == Tk and Tq != Tk, and the argument checks."""

import math
from typing import Optional

import numpy as np
import pytest
import torch
from minitorch_testing import FAST, assert_close, mt, naive_attention, t64

import minitorch
from minitorch.fused.attention import attention_weights

TOL = 1e-5


def make_mask(rng: np.random.Generator, B: int, Tk: int, kind: str) -> Optional[np.ndarray]:
    """None; or [B, Tk] additive: batch 0 keeps every key with a random additive term, the others
    keep a random prefix, and with kind "inf" and B > 2 the last batch loses every key."""
    if kind == "none":
        return None
    fill = -np.inf if kind == "inf" else -1e9
    mask = np.zeros((B, Tk), dtype=np.float32)
    for b in range(1, B):
        keep = 0 if kind == "inf" and b == B - 1 and B > 2 else int(rng.integers(1, Tk + 1))
        mask[b, keep:] = fill
    mask[0] += rng.normal(0.0, 0.5, Tk).astype(np.float32)
    return mask


def check(backend, B: int, H: int, Tq: int, Tk: int, D: int, causal: bool, activation: str, mask_kind: str,
          seed: int = 0) -> None:  # fmt: skip
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, D)))
    g = rng.standard_normal((B, H, Tq, D)).astype(np.float32)
    mask = make_mask(rng, B, Tk, mask_kind)
    tq, tk, tv = (mt(x, backend, requires_grad=True) for x in (q, k, v))
    tmask = None if mask is None else mt(mask, backend)
    out = minitorch.fused_attention(tq, tk, tv, tmask, causal=causal, activation=activation)
    out.backward(mt(g, backend))
    scale = 1.0 / math.sqrt(D)
    _, lse = attention_weights(tq.detach(), tk.detach(), tmask, causal, activation, scale)
    rq, rk, rv = (t64(x, requires_grad=True) for x in (q, k, v))
    ref, ref_lse = naive_attention(rq, rk, rv, None if mask is None else t64(mask), causal, activation, scale)
    ref.backward(t64(g))
    what = f"[{B},{H},{Tq},{Tk},{D}] causal={causal} {activation} mask={mask_kind}"
    assert_close(out, ref, f"{what} out", tol=TOL)
    assert_close(lse, ref_lse, f"{what} lse", tol=TOL)
    for name, t, r in (("dq", tq, rq), ("dk", tk, rk), ("dv", tv, rv)):
        assert t.grad is not None, f"{what}: no gradient reached {name}"
        assert_close(t.grad, r.grad, f"{what} {name}", tol=TOL, floor=0.1)
    if mask_kind == "inf" and B > 2:
        assert np.all(out.to_numpy()[B - 1] == 0.0), f"{what}: the batch with every key removed is not zero"


@pytest.mark.parametrize("activation", ["softmax", "relu"])
@pytest.mark.parametrize("mask_kind", ["none", "inf", "finite"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Tq,Tk", [(1, 1), (5, 5), (4, 7), (7, 3)])
def test_reference_matches_naive_attention(Tq: int, Tk: int, causal: bool, mask_kind: str, activation: str) -> None:
    check(FAST, 3, 2, Tq, Tk, 4, causal, activation, mask_kind, seed=Tq * 10 + Tk)


@pytest.mark.parametrize("activation", ["softmax", "relu"])
def test_both_cpu_backends(backend, activation: str) -> None:
    check(backend, 2, 1, 3, 4, 3, True, activation, "inf", seed=1)


def test_explicit_scale_and_broadcast_mask() -> None:
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 2, 3, 4)).astype(np.float32) for _ in range(3))
    mask = np.zeros((1, 3), dtype=np.float32)
    mask[0, 2] = -np.inf
    out = minitorch.fused_attention(mt(q, FAST), mt(k, FAST), mt(v, FAST), mt(mask, FAST), scale=0.25)
    ref, _ = naive_attention(t64(q), t64(k), t64(v), t64(np.repeat(mask, 2, axis=0)), False, "softmax", 0.25)
    assert_close(out, ref, "scale=0.25, mask [1, Tk]")


def test_argument_errors_name_the_shapes() -> None:
    q = mt(np.zeros((1, 2, 3, 4)), FAST)
    k = mt(np.zeros((1, 2, 5, 4)), FAST)
    with pytest.raises(ValueError, match="'tanh'"):
        minitorch.fused_attention(q, k, k, activation="tanh")
    with pytest.raises(minitorch.IndexingError, match=r"q \(1, 2, 3, 4\)"):
        minitorch.fused_attention(q, mt(np.zeros((1, 2, 5, 3)), FAST), k)
    with pytest.raises(minitorch.IndexingError, match=r"\(2, 3, 4\)"):
        minitorch.fused_attention(mt(np.zeros((2, 3, 4)), FAST), k, k)
    with pytest.raises(minitorch.IndexingError, match=r"mask of shape \(1, 4\)"):
        minitorch.fused_attention(q, k, k, mt(np.zeros((1, 4)), FAST))
    with pytest.raises(minitorch.IndexingError, match="at least one key"):
        empty = mt(np.zeros((1, 2, 0, 4)), FAST)
        minitorch.fused_attention(q, empty, empty)


@pytest.mark.parametrize("activation", ["softmax", "relu"])
@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_attention_fused_matches_naive(causal: bool, activation: str) -> None:
    """MultiHeadAttention(attention="fused") computes what the naive path computes: output and
    parameter gradients, with a padding mask of -1e9 (the training program's) and of -inf."""
    B, T, C, H = 2, 5, 8, 2
    rng = np.random.default_rng(3)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    g = rng.standard_normal((B, T, C)).astype(np.float32)
    for fill in (-1e9, -np.inf):
        mask = np.zeros((B, T), dtype=np.float32)
        mask[1, 3:] = fill
        mods = {
            path: minitorch.MultiHeadAttention(
                C, H, causal=causal, p_dropout=0.0, backend=FAST, attention=path, activation=activation
            )
            for path in ("naive", "fused")
        }
        mods["fused"].load_state_dict(mods["naive"].state_dict())
        outs, grads = {}, {}
        for path, mod in mods.items():
            out = mod(mt(x, FAST), mt(mask, FAST))
            out.backward(mt(g, FAST))
            outs[path] = out.to_numpy()
            grads[path] = {n: p.value.grad.to_numpy() for n, p in mod.named_parameters()}
        np.testing.assert_allclose(outs["fused"], outs["naive"], rtol=1e-5, atol=1e-5)
        for name in grads["naive"]:
            np.testing.assert_allclose(grads["fused"][name], grads["naive"][name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_multi_head_attention_rejects_unknown_options() -> None:
    with pytest.raises(ValueError, match="attention"):
        minitorch.MultiHeadAttention(8, 2, backend=FAST, attention="flash")
    with pytest.raises(ValueError, match="activation"):
        minitorch.MultiHeadAttention(8, 2, backend=FAST, activation="gelu")
