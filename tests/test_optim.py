"""SGD and Adam against torch.optim (float64) over several steps fed the same gradients."""

from typing import Callable, List

import numpy as np
import pytest
import torch
from minitorch_testing import FAST, assert_close, mt, t64

import minitorch
from minitorch import SGD, Adam, Parameter

SHAPES = [(3, 4), (5,)]
STEPS = 6


def gradient_sequence(seed: int) -> List[List[np.ndarray]]:
    """Per step, one gradient per parameter; magnitudes vary by 100x so the moments matter."""
    rng = np.random.default_rng(seed)
    return [
        [(rng.standard_normal(s) * 10.0 ** rng.uniform(-1, 1)).astype(np.float32) for s in SHAPES]
        for _ in range(STEPS)
    ]


def run_both(backend, make_ours: Callable, make_torch: Callable, seed: int = 0) -> None:
    rng = np.random.default_rng(100 + seed)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    ours = [Parameter(mt(v, backend)) for v in init]
    theirs = [t64(v, requires_grad=True) for v in init]
    opt, ref = make_ours(ours), make_torch(theirs)
    for step, grads in enumerate(gradient_sequence(seed)):
        opt.zero_grad()
        ref.zero_grad()
        for p, t, g in zip(ours, theirs, grads):
            p.value.grad = mt(g, backend)
            t.grad = t64(g)
        opt.step()
        ref.step()
        for i, (p, t) in enumerate(zip(ours, theirs)):
            assert p.value.backend is backend
            assert_close(p.value, t, f"parameter {i} after step {step + 1}")


def test_sgd(backend) -> None:
    run_both(backend, lambda ps: SGD(ps, lr=0.1), lambda ts: torch.optim.SGD(ts, lr=0.1))


def test_sgd_momentum(backend) -> None:
    run_both(
        backend, lambda ps: SGD(ps, lr=0.05, momentum=0.9), lambda ts: torch.optim.SGD(ts, lr=0.05, momentum=0.9), seed=1
    )


@pytest.mark.parametrize(
    "lr,beta1,beta2,eps",
    [(1e-3, 0.9, 0.999, 1e-8), (0.05, 0.8, 0.95, 1e-6), (0.01, 0.5, 0.9, 1e-3)],
)
def test_adam_with_bias_corrections(backend, lr: float, beta1: float, beta2: float, eps: float) -> None:
    run_both(
        backend,
        lambda ps: Adam(ps, lr=lr, beta1=beta1, beta2=beta2, eps=eps),
        lambda ts: torch.optim.Adam(ts, lr=lr, betas=(beta1, beta2), eps=eps),
        seed=2,
    )


def test_adam_weight_decay_is_decoupled_like_adamw(backend) -> None:
    run_both(
        backend,
        lambda ps: Adam(ps, lr=0.01, weight_decay=0.1),
        lambda ts: torch.optim.AdamW(ts, lr=0.01, weight_decay=0.1),
        seed=3,
    )


def test_adam_first_step_moves_every_weight_by_lr() -> None:
    # With bias correction m_hat / sqrt(v_hat) = g / |g| on step 1, whatever the gradient's scale.
    p = Parameter(mt(np.zeros(4), FAST))
    opt = Adam([p], lr=0.01, eps=1e-12)
    p.value.grad = mt(np.array([1e-3, -5.0, 200.0, -0.25]), FAST)
    opt.step()
    np.testing.assert_allclose(p.value.to_numpy(), [-0.01, 0.01, -0.01, 0.01], rtol=1e-6)


def test_parameters_without_gradients_are_left_alone() -> None:
    a, b = Parameter(mt(np.ones(2), FAST)), Parameter(mt(np.ones(2), FAST))
    for opt in (SGD([a, b], lr=0.5), Adam([a, b], lr=0.5)):
        a.value.grad = mt(np.array([1.0, -1.0]), FAST)
        before = b.value.to_numpy()
        opt.step()
        np.testing.assert_array_equal(b.value.to_numpy(), before)
        assert a.value.requires_grad and a.value.is_leaf


def test_zero_grad_clears_gradients() -> None:
    p = Parameter(mt(np.ones(3), FAST))
    (p.value * 2.0).sum().backward()
    assert p.value.grad is not None
    SGD([p]).zero_grad()
    assert p.value.grad is None


def test_a_training_step_through_autodiff_matches_torch() -> None:
    rng = np.random.default_rng(5)
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w = Parameter(mt(w0, FAST))
    rw = t64(w0, requires_grad=True)
    opt, ref = Adam([w], lr=0.1), torch.optim.Adam([rw], lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        ref.zero_grad()
        ((mt(x, FAST) @ w.value).tanh() ** 2).sum().backward()
        ((t64(x) @ rw).tanh() ** 2).sum().backward()
        opt.step()
        ref.step()
    assert_close(w.value, rw, "weights after 3 Adam steps")


def test_adam_state_dict_resumes_exactly() -> None:
    grads = gradient_sequence(4)
    init = np.random.default_rng(6).standard_normal(SHAPES[0]).astype(np.float32)

    def fresh():
        p = Parameter(mt(init, FAST))
        return p, Adam([p], lr=0.02)

    p, opt = fresh()
    for g in grads:
        p.value.grad = mt(g[0], FAST)
        opt.step()
    q, resumed = fresh()
    for g in grads[:3]:
        q.value.grad = mt(g[0], FAST)
        resumed.step()
    saved_values, saved = q.value.to_numpy(), resumed.state_dict()
    assert saved["t"] == 3
    r, restored = fresh()
    r.update(minitorch.tensor_from_numpy(saved_values, backend=FAST))
    restored.load_state_dict(saved)
    for g in grads[3:]:
        r.value.grad = mt(g[0], FAST)
        restored.step()
    np.testing.assert_array_equal(r.value.to_numpy(), p.value.to_numpy())
