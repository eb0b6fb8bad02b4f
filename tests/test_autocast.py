"""minitorch.autocast: which ops run in which dtype, the context's nesting and thread-local state,
float32 master weights and gradients, the per-step cache of parameters' bf16 copies, gradient
checkpointing under autocast, and a Linear + GELU + Linear block against torch CPU float64 and
within bounds measured from torch CPU autocast's own bf16 error on the same inputs."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from minitorch_testing import FAST, mt, rel_err

import minitorch
from minitorch import bfloat16, float16, float32, nn
from minitorch.autocast import autocast_inputs, working_copy_written
from minitorch.fused.linear import feed_forward, linear
from minitorch.tensor_functions import Function


def _inputs(backend, rows: int = 6, width: int = 8):
    rng = np.random.default_rng(0)
    x = mt(rng.standard_normal((rows, width)), backend, requires_grad=True)
    w = mt(rng.standard_normal((width, width)) / np.sqrt(width), backend, requires_grad=True)
    return x, w


def test_op_rules_give_these_output_dtypes(backend) -> None:
    x, w = _inputs(backend)
    q = x.view(1, 2, 3, 8)
    mask = minitorch.zeros((1, 3), backend=backend)
    ids = minitorch.tensor([1.0, 0.0, 3.0, 2.0, 0.0, 1.0], backend=backend)
    ones = minitorch.ones((6,), backend=backend)
    lin = minitorch.Linear(8, 4, backend=backend)
    norms = [minitorch.LayerNorm1d(8, backend=backend, use_fused_kernel=fused) for fused in (False, True)]
    with minitorch.autocast(dtype=bfloat16):
        low = {
            "matmul": x @ w, "linear": linear(x, w.T, None, "gelu"), "Linear": lin(x),
            "fused_attention": minitorch.fused_attention(q, q, q, mask, causal=True),
            "fused_attention_qkv": minitorch.fused_attention_qkv(x.view(2, 1, 24), 2),
            "elementwise": (x @ w).gelu() * 2.0,
        }  # fmt: skip
        h = x @ w
        high = {
            "sum": h.sum(), "mean": h.mean(1), "var": h.var(0), "softmax": h.softmax(1), "log_softmax": h.log_softmax(1),
            "logsumexp": h.logsumexp(1), "attn_softmax": h.view(1, 1, 6, 8).attn_softmax(causal=True),
            "LayerNorm1d": norms[0](h), "LayerNorm1d fused": norms[1](h),
            "layernorm": h.layernorm(norms[0].weight.value, norms[0].bias.value),
            "cross_entropy": nn.cross_entropy(h, ids), "promoted": h + x,
            "fused_linear_cross_entropy": minitorch.fused_linear_cross_entropy(x, w, ids, ones),
        }  # fmt: skip
        assert h.max().dtype is bfloat16  # max is exact in any dtype: no rule
    for name, t in low.items():
        assert t.dtype is bfloat16, name
    for name, t in high.items():
        assert t.dtype is float32, name
    assert (x @ w).dtype is float32  # outside the context


def test_nesting_disabling_dtype_and_threads() -> None:
    x, w = _inputs(FAST)
    seen = []
    with minitorch.autocast():
        assert minitorch.is_autocast_enabled() and minitorch.get_autocast_dtype() is bfloat16
        with minitorch.autocast(enabled=False):
            assert (x @ w).dtype is float32 and not minitorch.is_autocast_enabled()
            with minitorch.autocast(dtype=float16):
                assert (x @ w).dtype is float16
        assert (x @ w).dtype is bfloat16
        worker = threading.Thread(target=lambda: seen.append(((x @ w).dtype, minitorch.is_autocast_enabled())))
        worker.start()
        worker.join()
    assert seen == [(float32, False)] and not minitorch.is_autocast_enabled()

    @minitorch.autocast()
    def product(a, b):
        return a @ b

    assert product(x, w).dtype is bfloat16 and (x @ w).dtype is float32
    assert minitorch.autocast(dtype="float16").state.dtype is float16
    for bad in (float32, minitorch.bool):
        with pytest.raises(ValueError, match="autocast dtype must be minitorch.bfloat16 or minitorch.float16"):
            minitorch.autocast(dtype=bad)
    with pytest.raises(TypeError, match="expected a minitorch dtype"):
        minitorch.autocast(dtype="int8")
    with pytest.raises(ValueError, match="autocast has no rule for 'exp'"):
        autocast_inputs("exp", x)


def test_master_weights_and_gradients_stay_float32(backend) -> None:
    x, w = _inputs(backend)
    with minitorch.autocast():
        y = (x @ w) @ w  # w read twice through its bf16 copy
        loss = nn.cross_entropy(y, minitorch.tensor([1.0, 2.0, 3.0, 0.0, 5.0, 7.0], backend=backend))
    loss.backward()
    assert loss.dtype is float32 and w.dtype is float32 and x.grad.dtype is float32 and w.grad.dtype is float32
    opt = minitorch.AdamW([minitorch.Parameter(w)], lr=1e-2)
    opt.step()
    assert w.dtype is float32


def test_a_parameters_copy_is_cached_until_it_changes(backend) -> None:
    x, w = _inputs(backend)
    param = minitorch.Parameter(w)
    with minitorch.autocast():
        first = autocast_inputs("matmul", w)[0]
        assert autocast_inputs("linear", w)[0] is first and first.dtype is bfloat16 and first.requires_grad
        h = x * 1.0  # an activation (not a leaf): cast at each use
        assert autocast_inputs("matmul", h)[0] is not autocast_inputs("matmul", h)[0]
        with minitorch.no_grad():
            assert autocast_inputs("matmul", w)[0] is first  # a copy with history serves no_grad too
        ((x @ w).sum() * 1.0).backward()
        minitorch.AdamW([param], lr=0.1).step()  # an in-place update
        second = autocast_inputs("matmul", w)[0]
        assert second is not first
        np.testing.assert_array_equal(second.to_numpy(), bfloat16.round(w.to_numpy()))
        with minitorch.no_grad():
            w.copy_(w * 0.5)
        third = autocast_inputs("matmul", w)[0]
        assert third is not second and np.array_equal(third.to_numpy(), bfloat16.round(w.to_numpy()))


def test_a_copy_written_by_the_optimizer_is_read_as_a_new_node(backend) -> None:
    """After working_copy_written (AdamW's fused update writes the copy), the next read is not cast
    again, and for a gradient it is a new node of that step's graph, made after the ops read before
    it (backward's order is then the step's own: unique ids count up)."""
    x, w = _inputs(backend)
    with minitorch.autocast():
        first = autocast_inputs("matmul", w)[0]
        (x @ first).sum().backward()
        with minitorch.no_grad():
            w.copy_(w * 0.5)
        first.backend.cast(w._tensor, bfloat16, first._tensor)  # the optimizer's write of the copy
        working_copy_written(w)
        before = x * 1.0
        second = autocast_inputs("matmul", w)[0]
    assert second is not first and second._tensor is first._tensor and second.requires_grad
    assert second.unique_id > before.unique_id
    np.testing.assert_array_equal(second.to_numpy(), bfloat16.round(w.to_numpy()))


def test_a_view_of_a_parameter_reads_its_working_copy(backend) -> None:
    """A tied head (narrowed rows of an embedding, transposed) is the same view of the embedding's
    working copy: no cast of its own, the transposed layout kept, and the gradient of a bf16 product
    through it reaches the float32 parameter (against torch CPU float64 on the bf16-rounded values)."""
    rng = np.random.default_rng(1)
    table = mt(rng.standard_normal((10, 8)), backend, requires_grad=True)
    x = mt(rng.standard_normal((5, 8)), backend)
    with minitorch.autocast():
        head = table.narrow(0, 0, 7).transpose(0, 1)
        low = autocast_inputs("matmul", head)[0]
        copy = autocast_inputs("matmul", table)[0]
        assert low.dtype is bfloat16 and low.shape == (8, 7) and low._tensor.is_transposed()
        assert np.shares_memory(low._tensor._storage, copy._tensor._storage)
        np.testing.assert_array_equal(low.to_numpy(), bfloat16.round(table.to_numpy()[:7].T))
        (x @ head).sum().backward()
    assert table.grad.dtype is float32
    rounded = torch.tensor(bfloat16.round(table.to_numpy()), dtype=torch.float64, requires_grad=True)
    tx = torch.tensor(bfloat16.round(x.to_numpy()), dtype=torch.float64)
    (tx @ rounded[:7].t()).sum().backward()
    # the gradient of a bf16 `@` is bf16 (as torch's), so the reference's is rounded once
    np.testing.assert_allclose(table.grad.to_numpy(), bfloat16.round(rounded.grad.numpy()), rtol=2**-8, atol=1e-6)


class _Float32Gradient(Function):
    """sum(a), whose gradient is a float32 third everywhere: what the fused classifier hands a bf16
    head (a float32 weight gradient of a bf16 product)."""

    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a.shape)
        return a.float().sum()

    @staticmethod
    def backward(ctx, grad_output):
        (shape,) = ctx.saved_values
        return minitorch.full(shape, 1 / 3, backend=grad_output.backend)


def test_a_float32_gradient_through_a_view_of_a_working_copy_is_not_rounded(backend) -> None:
    """The view of a working copy passes a float32 gradient on to the master as it is (a round trip
    through bf16 would make 1/3 into 0.333984375), zeros outside the narrowed rows."""
    table = minitorch.tensor(np.ones((5, 3), np.float32), backend=backend).requires_grad_(True)
    with minitorch.autocast():
        low = autocast_inputs("matmul", table.narrow(0, 0, 4).transpose(0, 1))[0]
    _Float32Gradient.apply(low).backward()
    want = np.zeros((5, 3), np.float32)
    want[:4] = np.float32(1 / 3)
    np.testing.assert_array_equal(table.grad.to_numpy(), want)


def test_a_copy_made_under_no_grad_is_remade_for_grad(backend) -> None:
    x, w = _inputs(backend)
    with minitorch.autocast():
        with minitorch.no_grad():
            plain = autocast_inputs("matmul", w)[0]
        assert not plain.requires_grad
        tracked = autocast_inputs("matmul", w)[0]
        assert tracked is not plain and tracked.requires_grad
        (x @ w).sum().backward()
    assert w.grad is not None and w.grad.dtype is float32


def test_backward_inside_the_context_equals_backward_outside() -> None:
    def grads(backward_inside: bool):
        x, w = _inputs(FAST)
        with minitorch.autocast():
            loss = ((x @ w).gelu() @ w).sum()
            if backward_inside:
                loss.backward()
        if not backward_inside:
            loss.backward()
        return x.grad.to_numpy(), w.grad.to_numpy()

    for inside, outside in zip(grads(True), grads(False)):
        np.testing.assert_array_equal(inside, outside)


def test_gradient_checkpointing_recomputes_under_the_forward_autocast_state() -> None:
    def run(recompute: bool):
        minitorch.manual_seed(5)
        model = minitorch.DecoderLM(
            n_vocab=13, n_embd=16, n_head=2, n_positions=8, n_layers=2, p_dropout=0.1, backend=FAST, recompute_layers=recompute
        )
        ids = minitorch.tensor([[1.0, 4.0, 2.0, 7.0], [3.0, 3.0, 0.0, 12.0]], backend=FAST)
        minitorch.manual_seed(6)
        with minitorch.autocast():
            logits = model(ids)
            loss = nn.cross_entropy(logits, ids)
        assert logits.dtype is bfloat16
        loss.backward()
        return [p.value.grad.to_numpy() for p in model.parameters()], [p.value.grad.dtype for p in model.parameters()]

    (plain, dtypes), (recomputed, _) = run(False), run(True)
    assert set(dtypes) == {float32}
    for a, b in zip(plain, recomputed):
        np.testing.assert_array_equal(a, b)


def _block_inputs():
    rng = np.random.default_rng(0)
    B, C, M = 64, 96, 384
    return {
        "x": rng.standard_normal((B, C)), "w1": (rng.standard_normal((C, M)) / np.sqrt(C)).T, "b1": rng.standard_normal(M) * 0.1,
        "w2": (rng.standard_normal((M, C)) / np.sqrt(M)).T, "b2": rng.standard_normal(C) * 0.1, "g": rng.standard_normal((B, C)),
    }  # fmt: skip


def _torch_block(inputs, dtype, autocast: bool):
    ts = {k: torch.tensor(np.asarray(v, np.float32), dtype=dtype, requires_grad=k != "g") for k, v in inputs.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        h = torch.nn.functional.gelu(torch.nn.functional.linear(ts["x"], ts["w1"], ts["b1"]), approximate="tanh")
        y = torch.nn.functional.linear(h, ts["w2"], ts["b2"])
    y.backward(ts["g"].to(y.dtype))
    return [y] + [ts[k].grad for k in ("x", "w1", "b1", "w2", "b2")]


def test_linear_gelu_linear_block_against_torch_float64_and_torch_autocast() -> None:
    """Our bf16 block's error against float64, and its distance from torch CPU autocast's result, stay
    within 2x of torch autocast's own error against float64 on the same inputs, for the output and
    every gradient; the gradients of the float32 leaves are float32."""
    inputs = _block_inputs()
    exact = _torch_block(inputs, torch.float64, autocast=False)
    torch_bf16 = _torch_block(inputs, torch.float32, autocast=True)
    assert torch_bf16[0].dtype == torch.bfloat16
    leaves = {k: mt(v, FAST, requires_grad=k != "g") for k, v in inputs.items()}
    with minitorch.autocast():
        h = linear(leaves["x"], leaves["w1"], leaves["b1"], "gelu")
        y = linear(h, leaves["w2"], leaves["b2"])
    assert h.dtype is bfloat16 and y.dtype is bfloat16
    y.backward(leaves["g"].to(bfloat16))
    ours = [y] + [leaves[k].grad for k in ("x", "w1", "b1", "w2", "b2")]
    for name, mine, theirs, ref in zip(("y", "dx", "dw1", "db1", "dw2", "db2"), ours, torch_bf16, exact):
        if name != "y":
            assert mine.dtype is float32, name
        bound = rel_err(theirs.float(), ref)
        assert 1e-4 < bound < 3e-2, f"{name}: torch's own bf16 error {bound:.3g} is not a bf16 error"
        assert rel_err(mine, ref) <= 2.0 * bound, f"{name}: error {rel_err(mine, ref):.3g} vs torch's bf16 {bound:.3g}"
        apart = rel_err(mine, theirs.float().detach().numpy().astype(np.float64))
        assert apart <= 2.0 * bound, f"{name}: {apart:.3g} from torch autocast's result, whose own error is {bound:.3g}"


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("bias", [True, False])
def test_feed_forward_equals_its_two_linears(autocast: bool, activation: str, bias: bool) -> None:
    """feed_forward is linear(linear(x, w1, b1, act), w2, b2) as one Function: the same output and
    gradients bit for bit on the CPU (both compose the same ops), in float32 and under autocast; shapes
    that do not chain raise IndexingError naming them."""
    inputs = _block_inputs()

    def run(fused: bool):
        leaves = {k: mt(v, FAST, requires_grad=k != "g") for k, v in inputs.items()}
        b1, b2 = (leaves[k] if bias else None for k in ("b1", "b2"))
        with minitorch.autocast(enabled=autocast):
            if fused:
                y = feed_forward(leaves["x"], leaves["w1"], b1, leaves["w2"], b2, activation)
            else:
                y = linear(linear(leaves["x"], leaves["w1"], b1, activation), leaves["w2"], b2)
        y.backward(leaves["g"].to(y.dtype))
        names = ("x", "w1", "b1", "w2", "b2") if bias else ("x", "w1", "w2")
        return [y] + [leaves[k].grad for k in names]

    for got, want in zip(run(True), run(False)):
        assert got.dtype is want.dtype
        np.testing.assert_array_equal(got.to_numpy(), want.to_numpy())
    x, w1, w2 = (mt(inputs[k], FAST) for k in ("x", "w1", "w2"))
    with pytest.raises(minitorch.IndexingError, match=r"weight_out \(96, 96\)"):
        feed_forward(x, w1, None, w2.narrow(1, 0, 96), None)
    with pytest.raises(ValueError, match="activation"):
        feed_forward(x, w1, None, w2, None, "tanh")
