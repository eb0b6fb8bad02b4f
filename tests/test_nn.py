"""minitorch.nn against torch on the CPU in float64 (the same float32 inputs): values and gradients
of softmax, logsoftmax, logsumexp, max/argmax, gelu, one_hot, softmax_loss and cross_entropy, and
dropout's scaling, training flag and statistics."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from minitorch_testing import FAST, arrays, assert_close, distinct_arrays, floats, gfloor, grad_of, mt, shapes, t64

import minitorch
from minitorch import nn


def check_against_torch(backend, x: np.ndarray, op, ref_op, what: str, seed: int = 0) -> None:
    """op(minitorch tensor) vs ref_op(float64 torch tensor): values and the gradient of a random
    weighting of the output."""
    tx = mt(x, backend, requires_grad=True)
    rx = t64(x, requires_grad=True)
    out, ref = op(tx), ref_op(rx)
    assert_close(out, ref, f"{what} forward")
    g = np.random.default_rng(seed).standard_normal(tuple(ref.shape)).astype(np.float32)
    out.backward(mt(g, backend))
    ref.backward(t64(g))
    assert_close(grad_of(tx, what), rx.grad, f"{what} grad", floor=gfloor(g))


@given(data=st.data())
def test_softmax_and_logsoftmax(backend, data) -> None:
    shape = data.draw(shapes(max_dims=3, max_side=4), label="shape")
    dim = data.draw(st.integers(0, len(shape) - 1), label="dim")
    x = data.draw(arrays(shape, floats(-10, 10)), label="x")
    check_against_torch(backend, x, lambda t: nn.softmax(t, dim), lambda r: torch.softmax(r, dim), "softmax")
    check_against_torch(backend, x, lambda t: nn.logsoftmax(t, dim), lambda r: torch.log_softmax(r, dim), "logsoftmax")


def test_softmax_rows_sum_to_one_without_overflow(backend) -> None:
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1000.0, -1002.0]], dtype=np.float32)
    out = nn.softmax(mt(x, backend), 1)
    assert_close(out, torch.softmax(t64(x), 1), "softmax of large logits")
    assert_close(out.sum(1), np.ones(2), "row sums")
    assert_close(nn.logsoftmax(mt(x, backend), 1), torch.log_softmax(t64(x), 1), "logsoftmax of large logits")


@pytest.mark.parametrize("keepdim", [True, False])
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_logsumexp_keepdim(backend, dim: int, keepdim: bool) -> None:
    x = np.random.default_rng(dim + 5).normal(0.0, 3.0, (2, 3, 4)).astype(np.float32)
    check_against_torch(
        backend, x, lambda t: nn.logsumexp(t, dim, keepdim=keepdim),
        lambda r: torch.logsumexp(r, dim, keepdim=keepdim), f"logsumexp(dim={dim}, keepdim={keepdim})",
    )


def test_logsumexp_max_trick_and_1d(backend) -> None:
    x = np.array([500.0, 501.0, -300.0], dtype=np.float32)
    out = nn.logsumexp(mt(x, backend), 0)
    assert out.shape == ()
    assert_close(out, torch.logsumexp(t64(x), 0), "logsumexp of large values")
    assert nn.logsumexp(mt(x, backend), 0, keepdim=True).shape == (1,)


@given(data=st.data())
def test_max_and_argmax(backend, data) -> None:
    shape = data.draw(shapes(max_dims=3, max_side=4), label="shape")
    dim = data.draw(st.integers(0, len(shape) - 1), label="dim")
    x = data.draw(distinct_arrays(shape), label="x")
    check_against_torch(backend, x, lambda t: t.amax(dim, keepdim=True), lambda r: torch.amax(r, dim, keepdim=True), "max")
    check_against_torch(backend, x, lambda t: t.max(dim).values, lambda r: torch.max(r, dim).values, "max(dim).values")
    index = mt(x, backend).argmax(dim)
    assert index.dtype == minitorch.int64
    np.testing.assert_array_equal(index.numpy(), torch.argmax(torch.tensor(x), dim).numpy())
    hot = nn.one_hot(index, shape[dim])
    ref = F.one_hot(torch.argmax(torch.tensor(x), dim), shape[dim])
    assert_close(hot, ref.double(), "one_hot of argmax", tol=1e-12, floor=1.0)


def test_gelu_tanh_approximation(backend) -> None:
    x = np.linspace(-6.0, 6.0, 25, dtype=np.float32).reshape(5, 5)
    check_against_torch(backend, x, lambda t: nn.gelu(t, approximate="tanh"), lambda r: F.gelu(r, approximate="tanh"), "gelu")


def test_gelu_exact_by_default_as_torch(backend) -> None:
    x = np.linspace(-6.0, 6.0, 25, dtype=np.float32).reshape(5, 5)
    check_against_torch(backend, x, nn.gelu, F.gelu, "gelu (exact)")
    check_against_torch(backend, x, nn.GELU(), torch.nn.GELU(), "nn.GELU()")


def test_one_hot(backend) -> None:
    ids = np.array([[0, 3, 1], [2, 2, 4]])
    out = nn.one_hot(mt(ids, backend), 5)
    assert out.shape == (2, 3, 5)
    assert_close(out, F.one_hot(torch.tensor(ids), 5).double(), "one_hot", tol=1e-12, floor=1.0)


def _loss_inputs(seed: int, lead: tuple, vocab: int):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, lead + (vocab,)).astype(np.float32)
    target = rng.integers(0, vocab, lead)
    return logits, target


@pytest.mark.parametrize("lead", [(4,), (2, 3)])
def test_softmax_loss_per_row(backend, lead: tuple) -> None:
    logits, target = _loss_inputs(1, lead, 5)
    tt = mt(target, backend)

    def ref(r: torch.Tensor) -> torch.Tensor:
        flat = F.cross_entropy(r.reshape(-1, 5), torch.tensor(target.reshape(-1)), reduction="none")
        return flat.reshape(lead)

    check_against_torch(backend, logits, lambda t: nn.softmax_loss(t, tt), ref, "softmax_loss")


def test_cross_entropy_mean(backend) -> None:
    logits, target = _loss_inputs(2, (2, 3), 4)
    tt = mt(target, backend)
    check_against_torch(
        backend, logits, lambda t: nn.cross_entropy(t, tt),
        lambda r: F.cross_entropy(r.reshape(-1, 4), torch.tensor(target.reshape(-1))),
        "cross_entropy",
    )


def test_cross_entropy_with_per_token_weights(backend) -> None:
    logits, target = _loss_inputs(3, (2, 4), 6)
    weights = np.array([[1.0, 1.0, 0.0, 0.0], [0.5, 1.0, 2.0, 0.0]], dtype=np.float32)
    tt, tw = mt(target, backend), mt(weights, backend)

    def ref(r: torch.Tensor) -> torch.Tensor:
        per_token = F.cross_entropy(r.reshape(-1, 6), torch.tensor(target.reshape(-1)), reduction="none")
        w = t64(weights).reshape(-1)
        return (per_token * w).sum() / w.sum()

    check_against_torch(backend, logits, lambda t: nn.cross_entropy(t, tt, tw), ref, "weighted cross_entropy")
    tx = mt(logits, backend, requires_grad=True)
    nn.cross_entropy(tx, tt, tw).backward()
    assert np.all(tx.grad.to_numpy()[0, 2:] == 0.0), "tokens of weight 0 get no gradient"


def test_loss_shape_errors() -> None:
    logits = minitorch.zeros((2, 3, 4))
    with pytest.raises(minitorch.IndexingError, match=r"softmax_loss: logits \(2, 3, 4\) need targets of shape \(2, 3\), got \(2, 4\)"):
        nn.softmax_loss(logits, minitorch.zeros((2, 4)))
    with pytest.raises(minitorch.IndexingError, match=r"cross_entropy: weights \(3, 2\) must match targets \(2, 3\)"):
        nn.cross_entropy(logits, minitorch.zeros((2, 3)), minitorch.ones((3, 2)))


# ---- dropout ----------------------------------------------------------------------------------
def test_dropout_identity_cases(backend) -> None:
    x = mt(np.arange(1.0, 7.0).reshape(2, 3), backend)
    assert nn.dropout(x, 0.5, training=False) is x
    assert nn.dropout(x, 0.0) is x
    np.testing.assert_array_equal(nn.dropout(x, 1.0).to_numpy(), np.zeros((2, 3)))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_inverted_scaling_and_statistics(p: float) -> None:
    n = 200_000
    minitorch.manual_seed(11)
    x = mt(np.full(n, 2.0), FAST, requires_grad=True)
    out = nn.dropout(x, p)
    values = out.to_numpy()
    kept = values != 0.0
    np.testing.assert_allclose(values[kept], 2.0 / (1.0 - p), rtol=1e-6)
    # Binomial(n, p): the dropped fraction is within 5 standard deviations of p.
    sigma = np.sqrt(p * (1.0 - p) / n)
    assert abs((1.0 - kept.mean()) - p) < 5 * sigma
    assert abs(values.mean() - 2.0) < 5 * 2.0 * np.sqrt(p / (1.0 - p) / n)
    out.sum().backward()
    np.testing.assert_allclose(x.grad.to_numpy(), kept / (1.0 - p), rtol=1e-6)


def test_dropout_is_seeded_and_fresh_per_call(backend) -> None:
    x = mt(np.ones((4, 25)), backend)
    minitorch.manual_seed(5)
    a = nn.dropout(x, 0.5).to_numpy()
    minitorch.manual_seed(5)
    b = nn.dropout(x, 0.5).to_numpy()
    c = nn.dropout(x, 0.5).to_numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_dropout_rejects_bad_probabilities() -> None:
    x = minitorch.zeros((2,))
    for p in (-0.1, 1.5):
        with pytest.raises(ValueError, match=rf"dropout probability must be in \[0, 1\], got {p}"):
            nn.dropout(x, p)
