"""Label smoothing in nn.cross_entropy and in the composed fused_linear_cross_entropy, value and
gradient against torch.nn.functional.cross_entropy(label_smoothing=...) in float64."""

import numpy as np
import pytest
import torch
from minitorch_testing import FAST, assert_close, mt, t64

from minitorch import fused_linear_cross_entropy, nn

GRAD_SCALE = 1.7  # backward starts from d(loss * GRAD_SCALE), so the incoming gradient is not 1
SMOOTHINGS = [0.0, 0.1, 1.0]


def problem(N: int, C: int, V: int, seed: int):
    """hidden, weight, bias, targets, token weights (a third of the tokens ignored: weight 0, target -100)."""
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((N, C)).astype(np.float32)
    weight = (2.0 * rng.standard_normal((C, V)) / np.sqrt(C)).astype(np.float32)
    bias = rng.standard_normal(V).astype(np.float32)
    targets = rng.integers(0, V, N).astype(np.float32)
    weights = rng.uniform(0.2, 2.0, N).astype(np.float32)
    ignored = rng.random(N) < 0.35
    ignored[0], ignored[-1] = True, False
    weights[ignored] = 0.0
    targets[ignored] = -100.0
    return hidden, weight, bias, targets, weights


def torch_smoothed(logits: torch.Tensor, targets: np.ndarray, weights, label_smoothing: float) -> torch.Tensor:
    """Per-token smoothed cross-entropy of float64 logits, token-weighted mean (or plain mean)."""
    ids = torch.tensor(np.where(targets >= 0, targets, 0).astype(np.int64))
    ce = torch.nn.functional.cross_entropy(logits, ids, reduction="none", label_smoothing=label_smoothing)
    if weights is None:
        return ce.mean()
    tw = t64(weights)
    return (ce * tw).sum() / tw.sum()


@pytest.mark.parametrize("label_smoothing", SMOOTHINGS)
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_matches_torch(backend, label_smoothing: float, weighted: bool) -> None:
    _, _, _, targets, weights = problem(9, 4, 7, seed=1)
    logits = (np.random.default_rng(2).standard_normal((9, 7)) * 3.0).astype(np.float32)
    if not weighted:
        targets = np.abs(targets) % 7
    x = mt(logits, backend, requires_grad=True)
    loss = nn.cross_entropy(
        x, mt(targets, backend), mt(weights, backend) if weighted else None, label_smoothing=label_smoothing
    )
    (loss * GRAD_SCALE).backward()
    ref_x = t64(logits, requires_grad=True)
    ref = torch_smoothed(ref_x, targets, weights if weighted else None, label_smoothing)
    (ref * GRAD_SCALE).backward()
    what = f"cross_entropy(label_smoothing={label_smoothing}, weighted={weighted})"
    assert_close(loss, ref.detach(), what)
    assert_close(x.grad, ref_x.grad, f"{what} gradient")


@pytest.mark.parametrize("label_smoothing", SMOOTHINGS)
@pytest.mark.parametrize("chunk_size", [4, None])
def test_fused_linear_cross_entropy_matches_torch(backend, label_smoothing: float, chunk_size) -> None:
    hidden, weight, bias, targets, weights = problem(11, 5, 13, seed=3)
    h, w, b = mt(hidden, backend, True), mt(weight, backend, True), mt(bias, backend, True)
    loss = fused_linear_cross_entropy(
        h, w, mt(targets, backend), mt(weights, backend), chunk_size=chunk_size, bias=b, label_smoothing=label_smoothing
    )
    (loss * GRAD_SCALE).backward()
    rh, rw, rb = t64(hidden, True), t64(weight, True), t64(bias, True)
    ref = torch_smoothed(rh @ rw + rb, targets, weights, label_smoothing)
    (ref * GRAD_SCALE).backward()
    what = f"fused_linear_cross_entropy(label_smoothing={label_smoothing}, chunk_size={chunk_size})"
    assert_close(loss, ref.detach(), what)
    for name, got, want in (("hidden", h, rh), ("weight", w, rw), ("bias", b, rb)):
        assert_close(got.grad, want.grad, f"{what} d{name}")


def test_fused_and_unfused_smoothed_losses_agree() -> None:
    hidden, weight, bias, targets, weights = problem(16, 6, 10, seed=4)
    args = [mt(a, FAST) for a in (hidden, weight, bias, targets, weights)]
    fused = fused_linear_cross_entropy(args[0], args[1], args[3], args[4], bias=args[2], label_smoothing=0.1)
    logits = args[0] @ args[1] + args[2]
    plain = nn.cross_entropy(logits, args[3], args[4], label_smoothing=0.1)
    assert_close(fused, plain.to_numpy(), "fused vs unfused smoothed loss")


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_label_smoothing_outside_0_1_is_rejected(bad: float) -> None:
    hidden, weight, _, targets, weights = problem(4, 3, 5, seed=5)
    h, w, t, tw = (mt(a, FAST) for a in (hidden, weight, targets, weights))
    with pytest.raises(ValueError, match="label_smoothing must be in \\[0, 1\\]"):
        fused_linear_cross_entropy(h, w, t, tw, label_smoothing=bad)
    with pytest.raises(ValueError, match="label_smoothing must be in \\[0, 1\\]"):
        nn.cross_entropy(h @ w, mt(np.abs(targets) % 5, FAST), label_smoothing=bad)


def test_fused_linear_cross_entropy_from_the_unit_seed_and_from_a_gradient(backend) -> None:
    """backward() started at the loss (its implicit 1: the gradients made in forward handed over as
    they are) and backward(g) (scaled by g) both give torch's float64 gradients, a tied head's
    transposed weight included."""
    hidden, weight, bias, targets, weights = problem(9, 4, 7, seed=6)
    rh, rw, rb = t64(hidden, True), t64(weight, True), t64(bias, True)
    ref = torch_smoothed(rh @ rw + rb, targets, weights, 0.0)
    ref.backward()
    for g in (None, 0.5):
        h, b = mt(hidden, backend, True), mt(bias, backend, True)
        table = mt(np.ascontiguousarray(weight.T), backend, True)  # [V, C], read as its transpose
        loss = fused_linear_cross_entropy(h, table.transpose(0, 1), mt(targets, backend), mt(weights, backend), bias=b)
        assert loss.shape == ()
        loss.backward(None if g is None else mt(np.array(g), backend))
        scale = 1.0 if g is None else g
        what = f"backward({g})"
        assert_close(h.grad, rh.grad * scale, f"{what} dhidden")
        assert_close(table.grad, rw.grad.T * scale, f"{what} dweight (tied)")
        assert_close(b.grad, rb.grad * scale, f"{what} dbias")
