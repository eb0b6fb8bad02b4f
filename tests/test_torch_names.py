"""The names a PyTorch user reaches for, each against torch on the CPU (float64 reference): conversions,
views, softmax/log_softmax, cat/stack, arange, *_like, where/masked_fill, clamp, comparisons and
bool tensors, dtype/device, reductions' keepdim, and Module.to / state_dict / load_state_dict."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from minitorch_testing import FAST, SIMPLE, assert_close, f32, grad_of, mt, t64

import minitorch

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)


def both(backend, fn_ours, fn_torch, *arrays: np.ndarray, what: str) -> None:
    """fn_ours on minitorch tensors and fn_torch on float64 torch tensors agree, forward and backward."""
    ours = [mt(a, backend, requires_grad=True) for a in arrays]
    refs = [t64(a, requires_grad=True) for a in arrays]
    out, ref = fn_ours(*ours), fn_torch(*refs)
    assert out.shape == tuple(ref.shape), f"{what}: shape {out.shape} vs {tuple(ref.shape)}"
    assert_close(out, ref, f"{what} forward")
    g = RNG.standard_normal(tuple(ref.shape)).astype(np.float32)
    out.backward(mt(g, backend))
    ref.backward(t64(g))
    for i, (o, r) in enumerate(zip(ours, refs)):
        if r.grad is None:
            assert o.grad is None, f"{what}: input {i} is unused but got a gradient"
        else:
            assert_close(grad_of(o, what), r.grad, f"{what} gradient {i}", floor=1.0)


VIEWS = {
    ".T": (lambda t: t.T, lambda r: r.permute(2, 1, 0)),
    "unsqueeze(1)": (lambda t: t.unsqueeze(1), lambda r: r.unsqueeze(1)),
    "unsqueeze(-1)": (lambda t: t.unsqueeze(-1), lambda r: r.unsqueeze(-1)),
    "squeeze()": (lambda t: t[:, :1].squeeze(), lambda r: r[:, :1].squeeze()),
    "squeeze(1)": (lambda t: t[:, :1].squeeze(1), lambda r: r[:, :1].squeeze(1)),
    "squeeze(0) keeps size 2": (lambda t: t.squeeze(0), lambda r: r.squeeze(0)),
    "flatten()": (lambda t: t.flatten(), lambda r: r.flatten()),
    "flatten(1)": (lambda t: t.flatten(1), lambda r: r.flatten(1)),
    "flatten(0, 1) of a permuted view": (lambda t: t.permute(1, 0, 2).flatten(0, 1), lambda r: r.permute(1, 0, 2).flatten(0, 1)),
    "reshape(4, -1)": (lambda t: t.transpose(0, 2).reshape(4, -1), lambda r: r.transpose(0, 2).reshape(4, -1)),
    "transpose(0, 1)": (lambda t: t.transpose(0, 1), lambda r: r.transpose(0, 1)),
    "expand(2, -1, 3, 4)": (lambda t: t[:1].expand(2, -1, 3, 4), lambda r: r[:1].expand(2, -1, 3, 4)),
    "narrow(2, 1, 2)": (lambda t: t.narrow(2, 1, 2), lambda r: r.narrow(2, 1, 2)),
    "softmax(1)": (lambda t: t.softmax(1), lambda r: r.softmax(1)),
    "log_softmax(-1)": (lambda t: t.log_softmax(-1), lambda r: r.log_softmax(-1)),
    "logsumexp(2)": (lambda t: t.logsumexp(2), lambda r: r.logsumexp(2)),
    "clamp(-0.5, 0.7)": (lambda t: t.clamp(-0.5, 0.7), lambda r: r.clamp(-0.5, 0.7)),
    "mean(1)": (lambda t: t.mean(1), lambda r: r.mean(1)),
    "sum((0, 2), keepdim=True)": (lambda t: t.sum((0, 2), keepdim=True), lambda r: r.sum((0, 2), keepdim=True)),
    "var(2)": (lambda t: t.var(2, correction=1), lambda r: r.var(2)),
    "max()": (lambda t: t.max(), lambda r: r.max()),
    "masked_fill": (lambda t: t.masked_fill(t > 0.5, -1.0), lambda r: r.masked_fill(r > 0.5, -1.0)),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_views_and_functions_match_torch(backend, name: str) -> None:
    ours, ref = VIEWS[name]
    both(backend, ours, ref, X, what=name)


def test_cat_and_stack_match_torch(backend) -> None:
    a, b = X, RNG.standard_normal((2, 1, 4)).astype(np.float32)
    both(backend, lambda x, y: minitorch.cat([x, y, x], 1), lambda x, y: torch.cat([x, y, x], 1), a, b, what="cat")
    both(backend, lambda x, y: minitorch.cat([x.T, x.T], -1), lambda x, y: torch.cat([x.permute(2, 1, 0)] * 2, -1), a, b, what="cat of views")
    both(backend, lambda x, y: minitorch.stack([x, x * 2.0], 1), lambda x, y: torch.stack([x, x * 2.0], 1), a, b, what="stack")
    with pytest.raises(minitorch.IndexingError, match=r"cat along dim 0: tensor 1 has shape \(2, 1, 4\), tensor 0 has \(2, 3, 4\)"):
        minitorch.cat([mt(a, backend), mt(b, backend)], 0)
    with pytest.raises(minitorch.IndexingError, match="stack needs tensors of one shape"):
        minitorch.stack([mt(a, backend), mt(b, backend)])


def test_where_selects_without_leaking_inf_or_nan(backend) -> None:
    cond = X > 0.0
    both(backend, lambda x, y: minitorch.where(x > 0.0, x, y * 2.0), lambda x, y: torch.where(x > 0.0, x, y * 2.0),
         X, X[:1, :1], what="where")  # fmt: skip
    t = mt(X, backend)
    out = minitorch.where(t > 0.0, t, -math.inf)
    assert_close(out, np.where(cond, f32(X), -np.inf), "where with -inf")
    blown = (t * 0.0).log()  # -inf everywhere
    assert_close(minitorch.where(t > 0.0, 1.0, blown), np.where(cond, 1.0, -np.inf), "where with an inf branch")
    assert_close(t.where(t > 0.0, 0.0), np.where(cond, f32(X), 0.0), "Tensor.where")


def test_arange_like_and_creation(backend) -> None:
    assert minitorch.arange(5, backend=backend).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    for args in ((2, 7), (1, 2, 0.25), (5, 0, -2), (3, 3)):
        assert_close(minitorch.arange(*args, backend=backend), torch.arange(*args, dtype=torch.float64), f"arange{args}")
    t = mt(X, backend)
    assert minitorch.zeros_like(t).shape == X.shape and minitorch.zeros_like(t).backend is backend
    assert minitorch.ones_like(t).to_numpy().sum() == X.size
    assert minitorch.tensor([[True, False]]).dtype == minitorch.bool
    assert minitorch.tensor(3.5).shape == () and minitorch.tensor(3.5).item() == 3.5
    assert minitorch.zeros((2,), backend="cpu").backend is FAST


@pytest.mark.parametrize(
    "data,message",
    [
        ([1.0, None], r"tensor\(\) needs numbers or bools, got NoneType None"),
        (["a", "b"], r"tensor\(\) needs numbers or bools, got str 'a'"),
        ("text", r"tensor\(\) needs numbers or bools, got str 'text'"),
        ([[1.0, 2.0], [3.0]], r"tensor\(\) needs a rectangular nested list of numbers"),
    ],
)
def test_tensor_rejects_none_strings_and_ragged_lists(data, message) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        minitorch.tensor(data)


def test_conversions_dtype_device_and_repr(backend) -> None:
    t = mt(X, backend)
    assert isinstance(t.numpy(), np.ndarray) and t.numpy().dtype == np.float32
    np.testing.assert_array_equal(t.numpy(), X)
    assert t.tolist() == X.tolist()
    assert t[0, 0, 0].tolist() == float(X[0, 0, 0])
    assert float(t[1, 2, 3]) == float(X[1, 2, 3]) and int(mt(np.array(3.7), backend)) == 3
    assert t.dtype == minitorch.float32 == np.float32 and t.device == "cpu"
    assert t.dim() == 3 and t.numel() == X.size
    mask = t > 0.0
    assert mask.dtype == minitorch.bool and mask.numpy().dtype == np.bool_
    np.testing.assert_array_equal(mask.numpy(), X > 0.0)
    assert (mask * 1.0).dtype == minitorch.float32 and mask.float().dtype == minitorch.float32
    assert "dtype=minitorch.bool" in repr(mask) and f"backend={backend.ops.__name__}" in repr(t)
    assert bool(t[0, 0, 0] == float(X[0, 0, 0]))
    with pytest.raises(RuntimeError, match=r"truth value of a tensor of shape \(2, 3, 4\) is ambiguous"):
        bool(t)
    with pytest.raises(TypeError, match="~ needs bool tensors"):
        ~t


def test_comparisons_and_logic_match_torch(backend) -> None:
    a, b = mt(X, backend), mt(X[:, :1] * 0.5, backend)
    ra, rb = torch.tensor(X), torch.tensor(X[:, :1] * 0.5)
    for name, ours, ref in [
        ("<=", a <= b, ra <= rb), (">=", a >= b, ra >= rb), ("!=", a != b, ra != rb), ("== 0", a == 0.0, ra == 0.0),
        ("~", ~(a > 0.0), ~(ra > 0.0)), ("&", (a > 0.0) & (b > 0.0), (ra > 0.0) & (rb > 0.0)),
        ("|", (a > 1.0) | (b < 0.0), (ra > 1.0) | (rb < 0.0)),
        ("any(1)", (a > 1.0).any(1), (ra > 1.0).any(1)), ("all(2, keepdim)", (a > -1.0).all(2, keepdim=True), (ra > -1.0).all(2, keepdim=True)),
    ]:  # fmt: skip
        assert ours.dtype == minitorch.bool, name
        np.testing.assert_array_equal(ours.numpy(), ref.numpy(), err_msg=name)


def test_argmax_matches_torch(backend) -> None:
    x = np.array([[1.0, 5.0, 5.0, -2.0], [7.0, 0.0, 7.0, 7.0], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    t, r = mt(x, backend), torch.tensor(x)
    for dim in (0, 1, -1):
        for keepdim in (False, True):
            np.testing.assert_array_equal(t.argmax(dim, keepdim).numpy(), r.argmax(dim, keepdim).numpy())
    assert t.argmax().item() == r.argmax().item()


def test_module_to_and_state_dict_round_trip() -> None:
    minitorch.manual_seed(3)
    net = minitorch.Linear(4, 2, backend=FAST)
    x = mt(X[0], FAST)
    before = net(x).to_numpy()
    weights = net.weight.value
    assert net.to(SIMPLE) is net and net.weight.value.backend is SIMPLE and net.weight.value.requires_grad
    assert_close(net(mt(X[0], SIMPLE)), before, "module moved to another backend")
    net.to("cpu")
    state = net.state_dict()
    assert set(state) == {"weight", "bias"} and isinstance(state["weight"], np.ndarray)
    other = minitorch.Linear(4, 2, backend=FAST)
    kept = other.weight.value
    other.load_state_dict({k: minitorch.tensor(v) for k, v in state.items()})
    assert other.weight.value is kept, "load_state_dict copies into the parameters in place"
    assert_close(other(x), before, "loaded module")
    result = other.load_state_dict({"weight": state["weight"], "extra": np.zeros(1)}, strict=False)
    assert result.missing_keys == ["bias"] and result.unexpected_keys == ["extra"]
    with pytest.raises(KeyError, match=r"missing \['bias'\], unexpected \['extra'\]"):
        other.load_state_dict({"weight": state["weight"], "extra": np.zeros(1)})
    assert weights.backend is FAST
