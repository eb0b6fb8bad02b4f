"""minitorch.fused.linear (the Linear layer's fused bias/activation epilogue, weight [out, in] as
torch.nn.functional.linear's): forward and gradients against torch float64, with and without bias,
for each activation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from minitorch_testing import assert_close, mt

from minitorch.fused.linear import linear


@pytest.mark.parametrize("activation", [None, "gelu", "relu"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_matches_torch(backend, activation, with_bias) -> None:
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((2, 3, 6)), rng.standard_normal((4, 6)), rng.standard_normal(4)
    g = rng.standard_normal((2, 3, 4))
    tx, tw, tb = mt(x, backend, True), mt(w, backend, True), mt(b, backend, True)
    out = linear(tx, tw, tb if with_bias else None, activation)
    out.backward(mt(g, backend))
    rx, rw, rb = (torch.tensor(np.asarray(v, np.float32), dtype=torch.float64, requires_grad=True) for v in (x, w, b))
    pre = rx @ rw.T + (rb if with_bias else 0.0)
    ref = {None: pre, "gelu": torch.nn.functional.gelu(pre, approximate="tanh"), "relu": torch.relu(pre)}[activation]
    ref.backward(torch.tensor(g))
    assert_close(out, ref.detach().numpy(), f"linear {activation} forward")
    assert_close(tx.grad, rx.grad.numpy(), "dx", floor=1e-2)
    assert_close(tw.grad, rw.grad.numpy(), "dweight", floor=1e-2)
    if with_bias:
        assert_close(tb.grad, rb.grad.numpy(), "dbias", floor=1e-2)


def test_linear_rejects_bad_inputs(backend) -> None:
    x = mt(np.zeros((2, 3)), backend)
    with pytest.raises(ValueError, match="activation must be one of"):
        linear(x, mt(np.zeros((4, 3)), backend), activation="tanh")
    with pytest.raises(Exception, match=r"linear: input \(2, 3\) and weight \(4, 4\)"):
        linear(x, mt(np.zeros((4, 4)), backend))


@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_and_feed_forward_add_a_residual(backend, with_bias) -> None:
    """residual=r adds r to the (last) product's output; r's gradient is the output's."""
    from minitorch.fused.linear import feed_forward

    rng = np.random.default_rng(4)
    shapes = ((2, 3, 6), (5, 6), 5, (6, 5), 6, (2, 3, 6), (6, 6), 6, (2, 3, 6))
    x, w1, b1, w2, b2, r, w3, b3, g = (rng.standard_normal(s) for s in shapes)
    names = ("x", "w1", "b1", "w2", "b2", "r", "w3", "b3")
    leaves = [mt(v, backend, True) for v in (x, w1, b1, w2, b2, r, w3, b3)]
    tx, tw1, tb1, tw2, tb2, tr, tw3, tb3 = leaves
    y = feed_forward(tx, tw1, tb1 if with_bias else None, tw2, tb2 if with_bias else None, "gelu", residual=tr)
    out = linear(y, tw3, tb3 if with_bias else None, residual=y)
    out.backward(mt(g, backend))
    ref_leaves = [torch.tensor(np.asarray(v, np.float32), dtype=torch.float64, requires_grad=True) for v in (x, w1, b1, w2, b2, r, w3, b3)]
    rx, rw1, rb1, rw2, rb2, rr, rw3, rb3 = ref_leaves
    h = torch.nn.functional.gelu(rx @ rw1.T + (rb1 if with_bias else 0.0), approximate="tanh")
    ry = rr + h @ rw2.T + (rb2 if with_bias else 0.0)
    ref = ry + ry @ rw3.T + (rb3 if with_bias else 0.0)
    ref.backward(torch.tensor(g))
    assert_close(out, ref.detach().numpy(), "forward")
    for name, mine, theirs in zip(names, leaves, ref_leaves):
        if with_bias or not name.startswith("b"):
            assert_close(mine.grad, theirs.grad.numpy(), f"d{name}", floor=1e-2)


def test_a_residual_is_checked_and_rounded_once_in_bf16(backend) -> None:
    import minitorch

    x, w = mt(np.zeros((2, 3)), backend), mt(np.zeros((4, 3)), backend)
    with pytest.raises(Exception, match=r"linear: residual of shape \(2, 3\) for an output of shape \(2, 4\)"):
        linear(x, w, residual=mt(np.zeros((2, 3)), backend))
    with pytest.raises(ValueError, match="residual is added after the product, so it takes no activation"):
        linear(x, w, activation="gelu", residual=mt(np.zeros((2, 4)), backend))
    # bf16 (spacing 2^-7 at 1): x @ w.T + b + r is rounded once, 1 + 2^-8 + 2^-8 = 1 + 2^-7, where
    # rounding after the bias would give the tie 1 + 2^-8 -> 1, and then 1 again
    one = mt(np.ones((1, 1)), backend).to(minitorch.bfloat16)
    small = mt(np.full((1, 1), 2.0**-8), backend).to(minitorch.bfloat16)
    fused = linear(one, one, small.view(1), residual=small)
    assert fused.dtype is minitorch.bfloat16 and fused.item() == 1.0 + 2.0**-7
    # a residual of a wider dtype is added after the product, promoted as the sum would be
    wide = linear(one, one, residual=mt(np.full((1, 1), 2.0**-12), backend))
    assert wide.dtype is minitorch.float32 and wide.item() == 1.0 + 2.0**-12
