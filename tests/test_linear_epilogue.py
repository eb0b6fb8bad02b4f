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
