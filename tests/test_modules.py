"""Module machinery and the basic layers against torch.nn (CPU, float64, weights copied)."""

import numpy as np
import pytest
import torch
from minitorch_testing import FAST, assert_close, gfloor, grad_of, mt, t64

import minitorch
from minitorch import Dropout, Embedding, LayerNorm1d, Linear, Module, ModuleList, Parameter


def value(p: Parameter) -> np.ndarray:
    return p.value.to_numpy()


# ---- Linear -----------------------------------------------------------------------------------
@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 1, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch_for_any_leading_dims(backend, lead: tuple, bias: bool) -> None:
    layer = Linear(4, 3, bias=bias, backend=backend)
    ref = torch.nn.Linear(4, 3, bias=bias, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(t64(value(layer.weight)))
        if bias:
            ref.bias.copy_(t64(value(layer.bias)))
    x = np.random.default_rng(0).standard_normal(lead + (4,)).astype(np.float32)
    tx, rx = mt(x, backend, requires_grad=True), t64(x, requires_grad=True)
    out, expected = layer(tx), ref(rx)
    assert out.shape == lead + (3,)
    assert_close(out, expected, "linear forward")
    g = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    out.backward(mt(g, backend))
    expected.backward(t64(g))
    assert_close(grad_of(tx, "x"), rx.grad, "linear grad x", floor=gfloor(g))
    assert_close(grad_of(layer.weight.value, "weight"), ref.weight.grad, "linear grad W", floor=gfloor(g))
    if bias:
        assert_close(grad_of(layer.bias.value, "bias"), ref.bias.grad, "linear grad b", floor=gfloor(g))
    else:
        assert layer.bias is None
        assert [n for n, _ in layer.named_parameters()] == ["weight"]


def test_linear_init_is_uniform_in_the_fan_in_bound() -> None:
    minitorch.manual_seed(0)
    layer = Linear(64, 32)
    w = value(layer.weight)
    assert w.shape == (32, 64)
    assert np.abs(w).max() <= 1.0 / 8.0
    assert abs(w.std() - (1.0 / 8.0) / np.sqrt(3.0)) < 0.01
    minitorch.manual_seed(0)
    np.testing.assert_array_equal(value(Linear(64, 32).weight), w)


# ---- Embedding --------------------------------------------------------------------------------
def test_embedding_matches_torch(backend) -> None:
    layer = Embedding(6, 4, backend=backend)
    ref = torch.nn.Embedding(6, 4, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(t64(value(layer.weight)))
    ids = np.array([[0, 5, 2], [2, 2, 1]])
    out = layer(mt(ids, backend))
    expected = ref(torch.tensor(ids))
    assert out.shape == (2, 3, 4)
    assert_close(out, expected, "embedding forward")
    g = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    out.backward(mt(g, backend))
    expected.backward(t64(g))
    assert_close(grad_of(layer.weight.value, "weight"), ref.weight.grad, "embedding grad", floor=gfloor(g))
    assert np.all(layer.weight.value.grad.to_numpy()[[3, 4]] == 0.0)


def test_tied_embedding_adds_its_rows_to_the_heads_gradient(backend, taken_pending) -> None:
    """A table used as the embedding and, transposed, as the LM head: backward reaches the head first,
    and the embedding's scatter starts from the head's gradient (Context.take_pending) instead of zeros
    and a sum; the table's gradient is still torch's."""
    layer = Embedding(6, 4, backend=backend)
    ref = torch.nn.Embedding(6, 4, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(t64(value(layer.weight)))
    ids = np.array([[0, 5, 2], [2, 2, 1]])
    (layer(mt(ids, backend)) @ layer.weight.value.transpose(0, 1)).sum().backward()
    (ref(torch.tensor(ids)) @ ref.weight.t()).sum().backward()
    assert [t is not None for t in taken_pending] == [True]
    assert_close(grad_of(layer.weight.value, "weight"), ref.weight.grad, "tied table's gradient")


def test_tied_embedding_scatters_into_the_fused_heads_gradient_itself(backend) -> None:
    """The fused loss hands its [V, C] gradient over (it keeps no reference to it), so the tied
    embedding's scatter adds its rows into that very tensor (Context.may_write_pending), not into a
    copy; a second backward through the loss is then a clear error. The table's gradient is torch's."""
    V, C = 7, 4
    layer = Embedding(V, C, backend=backend)
    ref = torch.nn.Embedding(V, C, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(t64(value(layer.weight)))
    ids, targets = np.array([0, 5, 2, 2, 2, 1]), np.array([3, 0, 6, 2, 2, 5])
    hidden = layer(mt(ids, backend))
    loss = minitorch.fused_linear_cross_entropy(
        hidden, layer.weight.value.transpose(0, 1), mt(targets, backend), mt(np.ones(6), backend)
    )
    head_grad = loss.history.inputs[0].history.ctx.saved_values[1]._tensor._storage
    loss.backward()
    torch.nn.functional.cross_entropy(ref(torch.tensor(ids)) @ ref.weight.t(), torch.tensor(targets)).backward()
    assert_close(grad_of(layer.weight.value, "weight"), ref.weight.grad, "tied table's gradient")
    assert np.shares_memory(layer.weight.value.grad._tensor._storage, head_grad), "the scatter copied the head's gradient"
    with pytest.raises(RuntimeError, match="backward through this loss ran already"):
        loss.backward()


def test_fast_embedding_rejects_ids_out_of_range() -> None:
    layer = Embedding(3, 2, backend=FAST)
    with pytest.raises(IndexError, match=r"embedding ids must be integers in \[0, 3\), got values in \[0.0, 3.0\]"):
        layer(mt(np.array([0.0, 3.0]), FAST))
    with pytest.raises(IndexError, match=r"embedding ids must be integers in \[0, 3\), got values in \[0.5, 0.5\]"):
        layer(mt(np.array([0.5]), FAST))


# ---- Dropout ----------------------------------------------------------------------------------
def test_dropout_module_follows_train_and_eval(backend) -> None:
    layer = Dropout(0.5)
    x = mt(np.ones((8, 16)), backend)
    minitorch.manual_seed(1)
    out = layer(x).to_numpy()
    assert set(np.unique(out)) <= {0.0, 2.0} and 0 < (out == 0.0).sum() < out.size
    layer.eval()
    assert layer(x) is x
    layer.train()
    assert layer.training
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\], got 1.2"):
        Dropout(1.2)


# ---- LayerNorm1d ------------------------------------------------------------------------------
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 5)])
def test_layernorm1d_matches_torch(backend, fused: bool, shape: tuple) -> None:
    c = shape[-1]
    layer = LayerNorm1d(c, eps=1e-5, backend=backend, use_fused_kernel=fused)
    rng = np.random.default_rng(3)
    gamma = rng.normal(1.0, 0.3, c).astype(np.float32)
    beta = rng.normal(0.0, 0.3, c).astype(np.float32)
    layer.load_state_dict({"weight": gamma, "bias": beta})
    ref = torch.nn.LayerNorm(c, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(t64(gamma))
        ref.bias.copy_(t64(beta))
    x = rng.normal(2.0, 3.0, shape).astype(np.float32)
    tx, rx = mt(x, backend, requires_grad=True), t64(x, requires_grad=True)
    out, expected = layer(tx), ref(rx)
    assert_close(out, expected, f"LayerNorm1d(fused={fused}) forward")
    g = rng.standard_normal(shape).astype(np.float32)
    out.backward(mt(g, backend))
    expected.backward(t64(g))
    assert_close(grad_of(tx, "x"), rx.grad, "LayerNorm1d grad x", floor=gfloor(g))
    assert_close(grad_of(layer.weight.value, "weight"), ref.weight.grad, "LayerNorm1d grad weight", floor=gfloor(g))
    assert_close(grad_of(layer.bias.value, "bias"), ref.bias.grad, "LayerNorm1d grad bias", floor=gfloor(g))


@pytest.mark.parametrize("fused", [False, True])
def test_layernorm1d_folds_the_residual_gradient_of_its_input(backend, fused: bool, taken_pending) -> None:
    """x + LayerNorm(x) (a pre-LN residual): backward reaches the sum before the LayerNorm, whose
    backward (the fused kernel or its composed reference) is handed x's residual gradient and adds it
    (Context.take_pending): x's gradient is still torch's."""
    layer = LayerNorm1d(6, backend=backend, use_fused_kernel=fused)
    x = np.random.default_rng(5).normal(1.0, 2.0, (3, 4, 6)).astype(np.float32)
    tx, rx = mt(x, backend, requires_grad=True), t64(x, requires_grad=True)
    (tx + layer(tx) * 0.5).sum().backward()
    (rx + torch.nn.functional.layer_norm(rx, (6,), eps=1e-5) * 0.5).sum().backward()
    assert [t is not None for t in taken_pending] == ([True] if fused else [])
    assert_close(grad_of(tx, "x"), rx.grad, "grad of x + LayerNorm(x) / 2")


def test_layernorm1d_starts_as_identity_affine() -> None:
    layer = LayerNorm1d(5)
    np.testing.assert_array_equal(value(layer.weight), np.ones(5))
    np.testing.assert_array_equal(value(layer.bias), np.zeros(5))


# ---- Module machinery -------------------------------------------------------------------------
class Block(Module):
    def __init__(self, backend, d_in: int) -> None:
        super().__init__()
        self.linear = Linear(d_in, 4, backend=backend)
        self.norm = LayerNorm1d(4, backend=backend)
        self.drop = Dropout(0.25)

    def forward(self, x):
        return self.drop(self.norm(self.linear(x)).relu())


class Net(Module):
    def __init__(self, backend) -> None:
        super().__init__()
        self.scale = Parameter(mt(np.array([2.0]), backend))
        self.blocks = ModuleList([Block(backend, 3), Block(backend, 4)])
        self.head = Linear(4, 1, backend=backend)
        self.depth = 2

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x) * self.scale.value


NAMES = [
    "scale",
    "blocks.0.linear.weight", "blocks.0.linear.bias", "blocks.0.norm.weight", "blocks.0.norm.bias",
    "blocks.1.linear.weight", "blocks.1.linear.bias", "blocks.1.norm.weight", "blocks.1.norm.bias",
    "head.weight", "head.bias",
]


def test_registration_and_named_parameters() -> None:
    net = Net(FAST)
    assert [n for n, _ in net.named_parameters()] == NAMES
    assert len(net.parameters()) == len(NAMES)
    assert all(p.value.requires_grad and p.value.is_leaf for p in net.parameters())
    assert net.depth == 2 and "depth" not in dict(net.named_parameters())
    assert [type(m).__name__ for m in net.modules()] == ["ModuleList", "Linear"]
    assert len(net.blocks) == 2 and net.blocks[-1] is list(net.blocks)[1]
    assert isinstance(net.blocks[0].linear.weight, Parameter)
    with pytest.raises(AttributeError, match="Net has no attribute 'missing'"):
        net.missing
    text = repr(net)
    assert "(blocks): ModuleList(" in text and "(head): Linear(in_features=4, out_features=1, bias=True)" in text


def test_train_and_eval_reach_every_descendant() -> None:
    net = Net(FAST)
    net.eval()
    assert not net.training and not net.blocks.training
    assert all(not b.training and not b.drop.training for b in net.blocks)
    net.train()
    assert net.training and all(b.drop.training for b in net.blocks)


def test_state_dict_round_trip() -> None:
    minitorch.manual_seed(1)
    a = Net(FAST)
    minitorch.manual_seed(2)
    b = Net(FAST)
    a.eval()
    b.eval()
    x = mt(np.random.default_rng(4).standard_normal((5, 3)), FAST)
    assert not np.allclose(a(x).to_numpy(), b(x).to_numpy())
    state = a.state_dict()
    assert list(state) == NAMES and all(isinstance(v, np.ndarray) for v in state.values())
    b.load_state_dict(state)
    np.testing.assert_array_equal(b(x).to_numpy(), a(x).to_numpy())
    assert all(p.value.requires_grad for p in b.parameters())
    state["scale"][0] = 100.0
    assert a.scale.value.item() == 2.0, "state_dict holds copies"


def test_load_state_dict_errors() -> None:
    net = Net(FAST)
    state = net.state_dict()
    del state["head.bias"]
    state["extra"] = np.zeros(1)
    with pytest.raises(KeyError, match=r"missing \['head.bias'\], unexpected \['extra'\]"):
        net.load_state_dict(state)
    state = net.state_dict()
    state["head.weight"] = np.zeros((1, 3))
    with pytest.raises(ValueError, match=r"parameter head.weight: saved shape \(1, 3\) differs from \(1, 4\)"):
        net.load_state_dict(state)


def test_parameter_update_keeps_the_value_trainable() -> None:
    p = Parameter(mt(np.zeros(2), FAST), name="w")
    assert p.value.requires_grad and p.value.name == "w"
    p.update(mt(np.ones(2), FAST))
    assert p.value.requires_grad and p.value.name == "w"
    np.testing.assert_array_equal(p.value.to_numpy(), [1.0, 1.0])
