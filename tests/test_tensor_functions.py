"""Every tensor Function on both CPU backends: forward against NumPy (float64), gradient against
float64 central differences of the same NumPy function (test_fused_reference.py and
test_modules.py check the fused ones and Embedding against torch as well).

Inputs are random float32 arrays of tiny random shapes, contiguous or strided (a permuted view of
reversed storage), with broadcasting between the operands of binary ops.  The central differences
run on the float64 reference, so they carry no float32 noise and the bound stays tight; a wrong
index or a missing broadcast reduction is off by O(1).
"""

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from minitorch_testing import (
    arrays,
    assert_close,
    away_from_zero,
    broadcast_pairs,
    central_grad,
    distinct_arrays,
    f32,
    floats,
    gfloor,
    grad_of,
    mt,
    mt_strided,
    shapes,
    t64,
)

import minitorch
from minitorch.fused.embedding import Embedding as EmbeddingFn

layouts = st.sampled_from(["contiguous", "strided"])



def leaf(arr: np.ndarray, backend, layout: str):
    make = mt if layout == "contiguous" else mt_strided
    return make(arr, backend, requires_grad=True)


def gelu_np(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def sigmoid_np(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# name, minitorch expression, float64 NumPy reference, input elements
UNARY = [
    ("neg", lambda t: -t, lambda x: -x, floats(-5, 5)),
    ("sigmoid", lambda t: t.sigmoid(), sigmoid_np, floats(-8, 8)),
    ("relu", lambda t: t.relu(), lambda x: np.maximum(x, 0.0), away_from_zero(0.01, 5)),
    ("gelu", lambda t: t.gelu(), gelu_np, floats(-5, 5)),
    ("tanh", lambda t: t.tanh(), np.tanh, floats(-5, 5)),
    ("log", lambda t: t.log(), np.log, floats(0.1, 10)),
    ("exp", lambda t: t.exp(), np.exp, floats(-5, 5)),
    ("inv", lambda t: 1.0 / t, lambda x: 1.0 / x, away_from_zero(0.5, 5)),
    ("add_scalar", lambda t: t + 1.5, lambda x: x + 1.5, floats(-5, 5)),
    ("radd_scalar", lambda t: 2 + t, lambda x: 2 + x, floats(-5, 5)),
    ("sub_scalar", lambda t: t - 0.75, lambda x: x - 0.75, floats(-5, 5)),
    ("rsub_scalar", lambda t: 3 - t, lambda x: 3 - x, floats(-5, 5)),
    ("mul_scalar", lambda t: t * 2.5, lambda x: x * 2.5, floats(-5, 5)),
    ("rmul_scalar", lambda t: -1.5 * t, lambda x: -1.5 * x, floats(-5, 5)),
    ("div_scalar", lambda t: t / 4.0, lambda x: x / 4.0, floats(-5, 5)),
    ("square", lambda t: t**2, lambda x: x**2, floats(-5, 5)),
    ("cube", lambda t: t**3, lambda x: x**3, floats(-3, 3)),
    ("sqrt", lambda t: t**0.5, np.sqrt, floats(0.1, 10)),
    ("pow_neg", lambda t: t**-1.5, lambda x: x**-1.5, floats(0.5, 5)),
    ("pow_zero", lambda t: t**0, np.ones_like, floats(-5, 5)),
    ("copy", lambda t: t.contiguous() * 1.0, lambda x: x, floats(-5, 5)),
    (
        "composite",
        lambda t: (t * t + 1.0).log() * t.sigmoid() - t.exp() / 10.0,
        lambda x: np.log(x * x + 1.0) * sigmoid_np(x) - np.exp(x) / 10.0,
        floats(-3, 3),
    ),
]


# The size of the terms an op's result is a difference of, where it cancels: float32 rounds the terms,
# so the result's error scales with them, not with the result (composite is ~0 near one root).
TERMS = {"composite": lambda x: np.abs(np.log(x * x + 1.0) * sigmoid_np(x)) + np.abs(np.exp(x) / 10.0)}


@pytest.mark.parametrize("name,op,ref,elements", UNARY, ids=[u[0] for u in UNARY])
@given(data=st.data())
def test_unary(backend, name, op, ref, elements, data) -> None:
    shape = data.draw(shapes(), label="shape")
    x = data.draw(arrays(shape, elements), label="x")
    gout = data.draw(arrays(shape), label="grad_out")
    t = leaf(x, backend, data.draw(layouts, label="layout"))
    out = op(t)
    floor = float(np.max(TERMS[name](f32(x)), initial=1e-12)) if name in TERMS else 1e-12
    assert_close(out, ref(f32(x)), f"{name} forward", floor=floor)
    out.backward(mt(gout, backend))
    assert_close(grad_of(t, name), central_grad(ref, [f32(x)], 0, f32(gout)), f"{name} grad", floor=gfloor(gout))


BINARY = [
    ("add", lambda a, b: a + b, lambda a, b: a + b, floats(-5, 5)),
    ("sub", lambda a, b: a - b, lambda a, b: a - b, floats(-5, 5)),
    ("mul", lambda a, b: a * b, lambda a, b: a * b, floats(-5, 5)),
    ("div", lambda a, b: a / b, lambda a, b: a / b, away_from_zero(0.5, 5)),
    ("mixed", lambda a, b: (a * b).sigmoid() + a / (b * b + 1.0), lambda a, b: sigmoid_np(a * b) + a / (b * b + 1.0), floats(-3, 3)),
]


@pytest.mark.parametrize("name,op,ref,elements", BINARY, ids=[b[0] for b in BINARY])
@given(data=st.data())
def test_binary_with_broadcasting(backend, name, op, ref, elements, data) -> None:
    pair = data.draw(broadcast_pairs(), label="shapes")
    sa, sb = pair.input_shapes
    a = data.draw(arrays(sa, floats(-5, 5)), label="a")
    b = data.draw(arrays(sb, elements), label="b")
    gout = data.draw(arrays(pair.result_shape), label="grad_out")
    ta = leaf(a, backend, data.draw(layouts, label="layout a"))
    tb = leaf(b, backend, data.draw(layouts, label="layout b"))
    out = op(ta, tb)
    assert_close(out, ref(f32(a), f32(b)), f"{name} forward")
    out.backward(mt(gout, backend))
    xs = [f32(a), f32(b)]
    assert_close(grad_of(ta, name), central_grad(ref, xs, 0, f32(gout)), f"{name} grad a", floor=gfloor(gout))
    assert_close(grad_of(tb, name), central_grad(ref, xs, 1, f32(gout)), f"{name} grad b", floor=gfloor(gout))


# Values on a coarse grid plus near neighbours, so ties and |a - b| < 1e-2 both occur and no
# difference sits near the is_close threshold.
comparable = st.sampled_from([0.0, 0.004, -0.004, 0.25, 1.0, -1.0])

COMPARISONS = [
    ("lt", lambda a, b: a < b, lambda a, b: a < b),
    ("gt", lambda a, b: a > b, lambda a, b: a > b),
    ("eq", lambda a, b: a == b, lambda a, b: a == b),
    ("is_close", lambda a, b: a.is_close(b), lambda a, b: np.abs(a - b) < 1e-2),
    ("lt_scalar", lambda a, b: a < 0.25, lambda a, b: np.broadcast_to(a < np.float32(0.25), np.broadcast_shapes(a.shape, b.shape))),
    ("gt_scalar", lambda a, b: a > 0.0, lambda a, b: np.broadcast_to(a > 0.0, np.broadcast_shapes(a.shape, b.shape))),
    ("eq_scalar", lambda a, b: a == 1.0, lambda a, b: np.broadcast_to(a == 1.0, np.broadcast_shapes(a.shape, b.shape))),
]


@pytest.mark.parametrize("name,op,ref", COMPARISONS, ids=[c[0] for c in COMPARISONS])
@given(data=st.data())
def test_comparisons_give_01_and_no_gradient(backend, name, op, ref, data) -> None:
    pair = data.draw(broadcast_pairs(), label="shapes")
    sa, sb = pair.input_shapes
    a = data.draw(arrays(sa, comparable), label="a")
    b = data.draw(arrays(sb, comparable), label="b")
    ta, tb = mt(a, backend, requires_grad=True), mt(b, backend, requires_grad=True)
    out = op(ta, tb) + 0.0 * (ta + tb)
    expected = np.broadcast_to(ref(a, b), pair.result_shape).astype(np.float64)
    assert_close(out, expected, f"{name} forward", tol=1e-12, floor=1.0)
    out.backward(mt(np.ones(pair.result_shape), backend))
    assert np.all(grad_of(ta, name) == 0.0) and np.all(grad_of(tb, name) == 0.0)


REDUCTIONS = [
    ("sum", lambda t, d, k: t.sum(d, keepdim=k), lambda x, d, k: np.sum(x, axis=d, keepdims=k)),
    ("mean", lambda t, d, k: t.mean(d, keepdim=k), lambda x, d, k: np.mean(x, axis=d, keepdims=k)),
    ("var", lambda t, d, k: t.var(d, keepdim=k), lambda x, d, k: np.var(x, axis=d, keepdims=k)),
    ("var unbiased", lambda t, d, k: t.var(d, correction=1, keepdim=k), lambda x, d, k: np.var(x, axis=d, ddof=1, keepdims=k)),
    ("amax", lambda t, d, k: t.amax(d, keepdim=k), lambda x, d, k: np.max(x, axis=d, keepdims=k)),
    ("max values", lambda t, d, k: t.max(d, keepdim=k).values, lambda x, d, k: np.max(x, axis=d, keepdims=k)),
    ("min values", lambda t, d, k: t.min(d, keepdim=k).values, lambda x, d, k: np.min(x, axis=d, keepdims=k)),
]


@pytest.mark.parametrize("name,op,ref", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
@given(data=st.data())
def test_reduce_one_dim(backend, name, op, ref, data) -> None:
    """dim removed by default (torch's keepdim=False), kept with size 1 with keepdim=True."""
    shape = data.draw(shapes(min_dims=1), label="shape")
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    keepdim = data.draw(st.booleans(), label="keepdim")
    if name == "var unbiased":
        shape = tuple(max(s, 2) if i == dim % len(shape) else s for i, s in enumerate(shape))
    x = data.draw(distinct_arrays(shape), label="x")
    t = leaf(x, backend, data.draw(layouts, label="layout"))
    out = op(t, dim, keepdim)
    expected = ref(f32(x), dim % len(shape), keepdim)
    assert out.shape == expected.shape
    assert_close(out, expected, f"{name}({dim}, keepdim={keepdim}) forward")
    gout = data.draw(arrays(expected.shape), label="grad_out")
    out.backward(mt(gout, backend))
    grad_ref = central_grad(lambda v: ref(v, dim % len(shape), keepdim), [f32(x)], 0, f32(gout))
    assert_close(grad_of(t, name), grad_ref, f"{name}({dim}) grad", floor=gfloor(gout))


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
def test_reduce_several_dims(backend, name) -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    t = mt(x, backend, requires_grad=True)
    for dims, keepdim in (((0, 2), False), ((2, -3), True), ((1,), False)):
        out = getattr(t, name)(dims, keepdim=keepdim)
        expected = getattr(np, name)(f32(x), axis=tuple(d % 3 for d in dims), keepdims=keepdim)
        assert out.shape == expected.shape
        assert_close(out, expected, f"{name}({dims}, keepdim={keepdim})")


REDUCE_ALL = [
    ("sum", lambda t: t.sum(), np.sum),
    ("mean", lambda t: t.mean(), np.mean),
    ("var", lambda t: t.var(), np.var),
    ("var unbiased", lambda t: t.var(correction=1), lambda x: np.var(x, ddof=1)),
    ("max", lambda t: t.max(), np.max),
]


@pytest.mark.parametrize("name,op,ref", REDUCE_ALL, ids=[r[0] for r in REDUCE_ALL])
@given(data=st.data())
def test_reduce_everything_to_0_dims(backend, name, op, ref, data) -> None:
    shape = data.draw(shapes().filter(lambda s: int(np.prod(s)) > 1), label="shape")
    x = data.draw(distinct_arrays(shape), label="x")
    t = leaf(x, backend, data.draw(layouts, label="layout"))
    out = op(t)
    assert out.shape == ()
    assert_close(out, np.asarray(ref(f32(x))), f"{name}() forward")
    out.backward()
    assert_close(grad_of(t, name), central_grad(lambda v: np.asarray(ref(v)), [f32(x)], 0, np.ones(())), f"{name}() grad", floor=1.0)


@given(data=st.data())
def test_all(backend, data) -> None:
    shape = data.draw(shapes(), label="shape")
    x = data.draw(arrays(shape, st.sampled_from([0.0, 1.0, -2.0])), label="x")
    dim = data.draw(st.integers(0, len(shape) - 1), label="dim")
    t = mt(x, backend)
    assert_close(t.all(dim), np.all(x != 0, axis=dim), "all(dim)", floor=1.0)
    assert_close(t.any(dim, keepdim=True), np.any(x != 0, axis=dim, keepdims=True), "any(dim)", floor=1.0)
    assert t.all().dtype == minitorch.bool and bool(t.all()) == bool(np.all(x != 0))


def test_max_ties_take_the_gradient_as_in_torch(backend) -> None:
    """max(dim) sends the gradient to the position it returns (the first max); amax and max() split
    it evenly among the tied elements, as torch does."""
    x = np.array([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]])
    for name, op in (("max(1).values", lambda t: t.max(1).values), ("amax(1)", lambda t: t.amax(1))):
        t, ref = mt(x, backend, requires_grad=True), t64(x, requires_grad=True)
        op(t).backward(mt(np.array([2.0, 5.0]), backend))
        op(ref).backward(torch.tensor([2.0, 5.0], dtype=torch.float64))
        assert_close(t.grad, ref.grad, f"{name} tie grad")
    t = mt(x, backend, requires_grad=True)
    t.max().backward()
    assert_close(t.grad, np.array([[0.0, 0.5, 0.5], [0.0, 0.0, 0.0]]), "max() tie grad")


@given(data=st.data())
def test_permute_and_transpose(backend, data) -> None:
    shape = data.draw(shapes(max_dims=4), label="shape")
    order = tuple(data.draw(st.permutations(range(len(shape))), label="order"))
    x = data.draw(arrays(shape), label="x")
    t = leaf(x, backend, data.draw(layouts, label="layout"))
    out = t.permute(*order)
    assert_close(out, np.transpose(f32(x), order), "permute forward")
    gout = data.draw(arrays(out.shape), label="grad_out")
    (out * 1.0).backward(mt(gout, backend))
    assert_close(grad_of(t, "permute"), np.transpose(f32(gout), np.argsort(order)), "permute grad")
    if len(shape) >= 2:
        assert_close(t.transpose(0, -1), np.swapaxes(f32(x), 0, -1), "transpose")


@given(data=st.data())
def test_view_and_reshape(backend, data) -> None:
    shape = data.draw(shapes(max_dims=4), label="shape")
    size = int(np.prod(shape))
    x = data.draw(arrays(shape), label="x")
    new_shape = data.draw(st.sampled_from([(size,), (1, size), (size, 1), (-1,), (1, -1, 1)]), label="view")
    expected = f32(x).reshape(new_shape)
    t = mt(x, backend, requires_grad=True)
    out = t.view(*new_shape)
    assert_close(out, expected, "view forward")
    gout = data.draw(arrays(expected.shape), label="grad_out")
    out.backward(mt(gout, backend))
    assert_close(grad_of(t, "view"), f32(gout).reshape(shape), "view grad")
    s = mt_strided(x, backend, requires_grad=True)
    r = s.reshape(new_shape)
    assert_close(r, expected, "reshape of a strided tensor")
    r.backward(mt(gout, backend))
    assert_close(grad_of(s, "reshape"), f32(gout).reshape(shape), "reshape grad")


@given(data=st.data())
def test_expand_sums_the_gradient_back(backend, data) -> None:
    pair = data.draw(broadcast_pairs(), label="shapes")
    small = pair.input_shapes[0]
    big = pair.result_shape
    x = data.draw(arrays(small), label="x")
    t = leaf(x, backend, data.draw(layouts, label="layout"))
    out = t.expand(big)
    assert_close(out, np.broadcast_to(f32(x), big), "expand forward")
    gout = data.draw(arrays(big), label="grad_out")
    (out * 1.0).backward(mt(gout, backend))
    grad_ref = central_grad(lambda v: np.broadcast_to(v, big), [f32(x)], 0, f32(gout))
    assert_close(grad_of(t, "expand"), grad_ref, "expand grad", floor=gfloor(gout))


MATMUL_SHAPES = [
    ((2, 3), (3, 2)),
    ((1, 3), (3, 1)),
    ((3, 1), (1, 3)),
    ((2, 2, 3), (2, 3, 2)),
    ((2, 3), (3, 3, 2)),
    ((2, 1, 2, 3), (3, 3, 2)),
    ((1, 2, 3, 2), (2, 1, 2, 3)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
@given(data=st.data())
def test_matmul_batched_and_broadcast(backend, sa, sb, data) -> None:
    a = data.draw(arrays(sa), label="a")
    b = data.draw(arrays(sb), label="b")
    ta = leaf(a, backend, data.draw(layouts, label="layout a"))
    tb = leaf(b, backend, data.draw(layouts, label="layout b"))
    out = ta @ tb
    expected = np.matmul(f32(a), f32(b))
    # A float32 dot product's rounding error scales with its terms, sum |a_k b_k|, not with the sum, which
    # cancellation can make far smaller (hypothesis found [-3.095, 3.016, 0] . [3.094, 3.172, 3.094]).
    terms = np.matmul(np.abs(f32(a)), np.abs(f32(b)))
    scale = float(np.max(terms[np.isfinite(terms)], initial=1e-12))
    assert_close(out, expected, "matmul forward", floor=scale)
    gout = data.draw(arrays(expected.shape), label="grad_out")
    out.backward(mt(gout, backend))
    xs = [f32(a), f32(b)]
    assert_close(grad_of(ta, "matmul"), central_grad(np.matmul, xs, 0, f32(gout)), "matmul grad a", floor=gfloor(gout))
    assert_close(grad_of(tb, "matmul"), central_grad(np.matmul, xs, 1, f32(gout)), "matmul grad b", floor=gfloor(gout))


def test_matmul_of_a_transposed_view_matches_numpy(backend) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 2)).astype(np.float32)
    out = mt(a, backend).transpose(0, 1) @ mt(b, backend)
    assert_close(out, f32(a).T @ f32(b), "a^T @ b")


@given(data=st.data())
def test_a_graph_reusing_its_inputs(backend, data) -> None:
    x = data.draw(arrays((2, 3), floats(-2, 2)), label="x")
    w = data.draw(arrays((3, 3), floats(-2, 2)), label="w")

    def ref(xv, wv):
        h = np.tanh(xv @ wv)
        return (h * xv + h @ wv).sum(axis=1, keepdims=True)

    tx, tw = mt(x, backend, requires_grad=True), mt(w, backend, requires_grad=True)
    h = (tx @ tw).tanh()
    out = (h * tx + h @ tw).sum(1, keepdim=True)
    # The row sums may cancel to far below their terms, so errors are measured against the size
    # of the terms (|h| <= 1): for the output, and for the gradients a bound on |d out / d input|.
    mx, mw = float(np.abs(x).max()), float(np.abs(w).max())
    assert_close(out, ref(f32(x), f32(w)), "graph forward", floor=3.0 * (mx + 3.0 * mw) + 1e-6)
    gout = data.draw(arrays((2, 1)), label="grad_out")
    out.backward(mt(gout, backend))
    xs = [f32(x), f32(w)]
    scale = gfloor(gout) * (1.0 + 3.0 * (mx + mw) ** 2)
    assert_close(grad_of(tx, "x"), central_grad(ref, xs, 0, f32(gout)), "graph grad x", floor=scale)
    assert_close(grad_of(tw, "w"), central_grad(ref, xs, 1, f32(gout)), "graph grad w", floor=scale)


def attn_softmax_np(x: np.ndarray, mask: np.ndarray, causal: bool) -> np.ndarray:
    """Softmax over the last dim of x + mask[b, None, None, :]; causally hidden keys and rows with
    no key left give zeros."""
    _, _, tq, tk = x.shape
    s = x + mask[:, None, None, :]
    if causal:
        hidden = np.arange(tk)[None, :] > np.arange(tq)[:, None] + (tk - tq)
        s = np.where(hidden, -np.inf, s)
    live = ~np.all(np.isneginf(s), axis=-1, keepdims=True)
    shifted = np.where(live, s - np.max(np.where(live, s, 0.0), axis=-1, keepdims=True), -np.inf)
    e = np.exp(shifted)
    return np.where(live, e / np.where(live, e.sum(axis=-1, keepdims=True), 1.0), 0.0)


@given(data=st.data())
def test_attn_softmax_function(backend, data) -> None:
    shape = data.draw(shapes(min_dims=4, max_dims=4), label="shape")
    causal = data.draw(st.booleans(), label="causal")
    x = data.draw(arrays(shape), label="x")
    mask = data.draw(arrays((shape[0], shape[3]), st.sampled_from([0.0, -np.inf, -1.5])), label="mask")
    tx = mt(x, backend, requires_grad=True)
    out = tx.attn_softmax(mt(mask, backend), causal=causal)
    ref = lambda v: attn_softmax_np(v, f32(mask), causal)  # noqa: E731
    assert_close(out, ref(f32(x)), "attn_softmax forward")
    gout = data.draw(arrays(shape), label="grad_out")
    out.backward(mt(gout, backend))
    assert_close(grad_of(tx, "attn_softmax"), central_grad(ref, [f32(x)], 0, f32(gout)), "attn_softmax grad", floor=gfloor(gout))


def layernorm_np(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


@given(data=st.data())
def test_layernorm_function(backend, data) -> None:
    shape = data.draw(shapes(max_dims=3, max_side=4), label="shape")
    c = shape[-1]
    # A ramp across each row keeps its std away from 0 (near-constant rows, where rstd magnifies
    # float32 rounding, are covered in test_fused_reference.py); one-element rows normalize to 0.
    x = data.draw(arrays(shape, floats(-2, 2)), label="x") + np.linspace(-2.0, 2.0, c, dtype=np.float32)
    assume(c == 1 or np.std(x, axis=-1).min() > 0.1)
    gamma = data.draw(arrays((c,), floats(-2, 2)), label="gamma")
    beta = data.draw(arrays((c,), floats(-2, 2)), label="beta")
    ts = [mt(v, backend, requires_grad=True) for v in (x, gamma, beta)]
    out = ts[0].layernorm(ts[1], ts[2])
    xs = [f32(x), f32(gamma), f32(beta)]
    # Normalized values are O(1), so the output's error scale is max|gamma| (where beta is small).
    assert_close(out, layernorm_np(*xs), "layernorm forward", floor=float(np.abs(xs[1]).max()) + 1e-6)
    gout = data.draw(arrays(shape), label="grad_out")
    out.backward(mt(gout, backend))
    for i, name in enumerate(["x", "gamma", "beta"]):
        grad_ref = central_grad(layernorm_np, xs, i, f32(gout))
        assert_close(grad_of(ts[i], name), grad_ref, f"layernorm grad {name}", floor=gfloor(gout))


@given(data=st.data())
def test_embedding_function(backend, data) -> None:
    vocab = data.draw(st.integers(1, 5), label="vocab")
    dim = data.draw(st.integers(1, 3), label="dim")
    ids = data.draw(hnp.arrays(np.int64, shapes(max_dims=2), elements=st.integers(0, vocab - 1)), label="ids")
    w = data.draw(arrays((vocab, dim)), label="weight")
    tw = mt(w, backend, requires_grad=True)
    out = EmbeddingFn.apply(tw, mt(ids, backend))
    assert_close(out, f32(w)[ids], "embedding forward")
    gout = data.draw(arrays(ids.shape + (dim,)), label="grad_out")
    out.backward(mt(gout, backend))
    grad_ref = central_grad(lambda v: v[ids], [f32(w)], 0, f32(gout))
    assert_close(grad_of(tw, "embedding"), grad_ref, "embedding grad", floor=gfloor(gout))
