"""Memory-lean training on the CPU backends: the composed fused_linear_cross_entropy against torch
float64, AdamW (in place) against torch.optim.AdamW, and gradient checkpointing (dropout masks
reproduced) against the plain graph."""

from typing import Optional

import numpy as np
import pytest
import torch
from minitorch_testing import FAST, assert_close, mt, t64

import minitorch
from minitorch import AdamW, DecoderLM, Parameter, checkpoint, fused_linear_cross_entropy, nn
from minitorch.checkpoint import Checkpoint
from minitorch.fused.linear_cross_entropy import DEFAULT_CHUNK_BYTES, default_chunk_size

GRAD_SCALE = 1.7  # backward starts from d(loss * GRAD_SCALE), so the incoming gradient is not 1


# ---- fused linear cross-entropy ------------------------------------------------------------------
def loss_problem(N: int, C: int, V: int, seed: int, with_bias: bool):
    """hidden, weight, bias, targets, token weights: ~1/3 of the tokens ignored (weight 0, target -100)."""
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((N, C)).astype(np.float32)
    weight = (3.0 * rng.standard_normal((C, V)) / np.sqrt(C)).astype(np.float32)
    bias = rng.standard_normal(V).astype(np.float32) if with_bias else None
    targets = rng.integers(0, V, N).astype(np.float32)
    weights = rng.uniform(0.2, 2.0, N).astype(np.float32)
    ignored = rng.random(N) < 0.35
    ignored[0] = True
    ignored[-1] = False
    weights[ignored] = 0.0
    targets[ignored] = -100.0
    return hidden, weight, bias, targets, weights


def torch_loss(hidden, weight, bias, targets, weights):
    """(loss, dhidden, dweight, dbias) in float64 for a loss scaled by GRAD_SCALE in backward."""
    h, w = t64(hidden, requires_grad=True), t64(weight, requires_grad=True)
    b = t64(bias, requires_grad=True) if bias is not None else None
    logits = h @ w + (b if b is not None else 0.0)
    ce = torch.nn.functional.cross_entropy(logits, torch.tensor(np.where(weights != 0, targets, 0).astype(np.int64)),
                                           reduction="none")
    tw = t64(weights)
    loss = (ce * tw).sum() / tw.sum()
    (loss * GRAD_SCALE).backward()
    return loss.detach(), h.grad, w.grad, None if b is None else b.grad


def minitorch_loss(backend, hidden, weight, bias, targets, weights, chunk_size: Optional[int]):
    h, w = mt(hidden, backend, True), mt(weight, backend, True)
    b = mt(bias, backend, True) if bias is not None else None
    loss = fused_linear_cross_entropy(h, w, mt(targets, backend), mt(weights, backend), chunk_size=chunk_size, bias=b)
    (loss * GRAD_SCALE).backward()
    return loss, h, w, b


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 11, 64, None])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_loss_matches_torch(backend, chunk_size: Optional[int], with_bias: bool) -> None:
    problem = loss_problem(11, 6, 13, seed=chunk_size or 0, with_bias=with_bias)
    loss, h, w, b = minitorch_loss(backend, *problem, chunk_size)
    ref_loss, ref_dh, ref_dw, ref_db = torch_loss(*problem)
    assert loss.shape == ()
    assert_close(loss, ref_loss, f"loss, chunks of {chunk_size}")
    assert_close(h.grad, ref_dh, f"dhidden, chunks of {chunk_size}")
    assert_close(w.grad, ref_dw, f"dweight, chunks of {chunk_size}")
    if with_bias:
        assert_close(b.grad, ref_db, f"dbias, chunks of {chunk_size}")
    ignored = problem[4] == 0
    assert np.all(h.grad.to_numpy()[ignored] == 0.0), "an ignored token got a gradient"


def test_fused_loss_equals_lm_head_plus_cross_entropy() -> None:
    """The same number as minitorch's own unfused path (Linear logits + nn.cross_entropy)."""
    hidden, weight, bias, targets, weights = loss_problem(9, 5, 17, seed=4, with_bias=True)
    targets[weights == 0] = 0.0  # nn.cross_entropy one-hot encodes every target
    fused = fused_linear_cross_entropy(mt(hidden, FAST), mt(weight, FAST), mt(targets, FAST), mt(weights, FAST),
                                       chunk_size=4, bias=mt(bias, FAST))
    logits = mt(hidden, FAST) @ mt(weight, FAST) + mt(bias, FAST)
    naive = nn.cross_entropy(logits, mt(targets, FAST), mt(weights, FAST))
    assert_close(fused, naive.to_numpy(), "fused vs naive loss")


def test_fused_loss_all_weights_zero_gives_zero() -> None:
    hidden, weight, bias, targets, weights = loss_problem(6, 4, 9, seed=5, with_bias=True)
    weights[:] = 0.0
    loss, h, w, b = minitorch_loss(FAST, hidden, weight, bias, targets, weights, 4)
    assert loss.item() == 0.0
    for name, t in (("hidden", h), ("weight", w), ("bias", b)):
        assert np.all(t.grad.to_numpy() == 0.0), f"d{name} is not zero for all-zero token weights"


def test_fused_loss_without_grad_computes_the_same_loss() -> None:
    problem = loss_problem(8, 4, 10, seed=6, with_bias=False)
    with_grad, _, _, _ = minitorch_loss(FAST, *problem, 3)
    hidden, weight, _, targets, weights = problem
    h, w = mt(hidden, FAST, True), mt(weight, FAST, True)
    with minitorch.no_grad():
        loss = fused_linear_cross_entropy(h, w, mt(targets, FAST), mt(weights, FAST), chunk_size=3)
    assert loss.history is None
    assert loss.item() == with_grad.item()


def test_fused_loss_checks_its_inputs() -> None:
    hidden, weight, _, targets, weights = loss_problem(5, 4, 7, seed=7, with_bias=False)
    h, w, t, tw = mt(hidden, FAST), mt(weight, FAST), mt(targets, FAST), mt(weights, FAST)
    bad = targets.copy()
    bad[-1] = 7.0  # == V, on a token that counts
    with pytest.raises(ValueError, match=r"targets must be integers in \[0, 7\).*token 4"):
        fused_linear_cross_entropy(h, w, mt(bad, FAST), tw)
    bad[-1] = 2.5
    with pytest.raises(ValueError, match="token 4"):
        fused_linear_cross_entropy(h, w, mt(bad, FAST), tw)
    with pytest.raises(minitorch.IndexingError, match=r"got \(5, 4\) and \(3, 7\)"):
        fused_linear_cross_entropy(h, mt(weight[:3], FAST), t, tw)
    with pytest.raises(minitorch.IndexingError, match=r"targets and token_weights of shape \(5,\)"):
        fused_linear_cross_entropy(h, w, mt(targets[:4], FAST), tw)
    with pytest.raises(minitorch.IndexingError, match=r"bias must have shape \(7,\)"):
        fused_linear_cross_entropy(h, w, t, tw, bias=mt(np.zeros(6), FAST))
    for chunk in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="chunk_size must be a positive int"):
            fused_linear_cross_entropy(h, w, t, tw, chunk_size=chunk)
    with pytest.raises(TypeError, match="weight must be a tensor on FastOps"):
        fused_linear_cross_entropy(h, mt(weight, minitorch.SimpleBackend), t, tw)


@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_loss_over_padded_classes(with_bias: bool) -> None:
    """classes=7 of a weight with 10 columns (llm.c's padded vocabulary): the loss and gradients of
    the first 7 columns alone, zero gradients for the 3 padding columns, whatever they hold, and a
    target of 7 (a padding column) is out of range."""
    hidden, weight, bias, targets, weights = loss_problem(9, 5, 7, seed=8, with_bias=with_bias)
    rng = np.random.default_rng(9)
    padded = np.concatenate([weight, rng.standard_normal((5, 3)).astype(np.float32)], 1)
    padded_bias = None if bias is None else np.concatenate([bias, rng.standard_normal(3).astype(np.float32)])
    h, w = mt(hidden, FAST, True), mt(padded, FAST, True)
    b = None if bias is None else mt(padded_bias, FAST, True)
    loss = fused_linear_cross_entropy(h, w, mt(targets, FAST), mt(weights, FAST), chunk_size=4, bias=b, classes=7)
    (loss * GRAD_SCALE).backward()
    ref_loss, ref_dh, ref_dw, ref_db = torch_loss(hidden, weight, bias, targets, weights)
    assert_close(loss, ref_loss, "loss over the first 7 classes")
    assert_close(h.grad, ref_dh, "dhidden")
    dw = w.grad.to_numpy()
    assert_close(dw[:, :7], ref_dw, "dweight of the classes")
    assert np.all(dw[:, 7:] == 0.0), "a padding column got a gradient"
    if b is not None:
        assert_close(b.grad.to_numpy()[:7], ref_db, "dbias of the classes")
        assert np.all(b.grad.to_numpy()[7:] == 0.0)
    bad = targets.copy()
    bad[-1] = 7.0
    with pytest.raises(ValueError, match=r"targets must be integers in \[0, 7\)"):
        fused_linear_cross_entropy(h, w, mt(bad, FAST), mt(weights, FAST), classes=7)
    for classes in (0, 11, 2.0):
        with pytest.raises(ValueError, match=r"classes must be an int in \[1, 10\]"):
            fused_linear_cross_entropy(h, w, mt(targets, FAST), mt(weights, FAST), classes=classes)


def test_default_chunk_size() -> None:
    # the fewest chunks within DEFAULT_CHUNK_BYTES of logits, as even as multiples of 128 rows allow
    most = lambda vocab, itemsize: DEFAULT_CHUNK_BYTES // (vocab * itemsize) // 128 * 128  # noqa: E731
    assert most(50304, 4) == 2560 and most(50304, 2) == 5248
    assert default_chunk_size(8192, 50304) == 2048  # 4 chunks, not 3 x 2560 + 512
    assert default_chunk_size(4096, 50304, itemsize=2) == 4096
    assert default_chunk_size(16384, 50304, itemsize=2) == 4096  # 4 chunks, not 3 x 5248 + 640
    assert default_chunk_size(100, 50257) == 100
    for n, vocab, itemsize in ((16384, 50257, 4), (10**8, 7, 4), (5000, 50304, 2), (129, 50304, 4)):
        rows = default_chunk_size(n, vocab, itemsize)
        assert (rows % 128 == 0 or rows == n) and rows * vocab * itemsize <= DEFAULT_CHUNK_BYTES
        assert -(-n // rows) == -(-n // most(vocab, itemsize))  # no more chunks than the largest would take
    assert default_chunk_size(10**6, 10**9) == 1


# ---- AdamW -------------------------------------------------------------------------------------------
SHAPES = [(3, 4), (5,), (1,), (2, 3, 3)]


@pytest.mark.parametrize(
    "lr,betas,eps,weight_decay",
    [(1e-3, (0.9, 0.999), 1e-8, 1e-2), (0.05, (0.8, 0.95), 1e-6, 0.1), (0.01, (0.5, 0.9), 1e-3, 0.0)],
)
def test_adamw_matches_torch_in_place(backend, lr: float, betas, eps: float, weight_decay: float) -> None:
    rng = np.random.default_rng(11)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    ours = [Parameter(mt(v, backend)) for v in init]
    theirs = [t64(v, requires_grad=True) for v in init]
    opt = AdamW(ours, lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay)
    ref = torch.optim.AdamW(theirs, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    tensors = [p.value for p in ours]
    storages = [p.value._tensor._storage for p in ours]
    for step in range(6):
        for p, t, s in zip(ours, theirs, SHAPES):
            g = (rng.standard_normal(s) * 10.0 ** rng.uniform(-2, 1)).astype(np.float32)
            p.value.grad = mt(g, backend)
            t.grad = t64(g)
        opt.step()
        ref.step()
        for i, (p, t) in enumerate(zip(ours, theirs)):
            assert_close(p.value, t, f"parameter {i} after step {step + 1}")
            assert p.value is tensors[i] and p.value._tensor._storage is storages[i], "AdamW replaced a parameter"
    moments = [(opt.m[i]._tensor._storage, opt.v[i]._tensor._storage) for i in range(len(ours))]
    opt.step()
    assert moments == [(opt.m[i]._tensor._storage, opt.v[i]._tensor._storage) for i in range(len(ours))]


def test_adamw_state_dict_resumes_exactly() -> None:
    rng = np.random.default_rng(12)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(5)]

    def run(params, opt, steps):
        for gs in steps:
            for p, g in zip(params, gs):
                p.value.grad = mt(g, FAST)
            opt.step()

    straight = [Parameter(mt(v, FAST)) for v in init]
    run(straight, AdamW(straight, lr=0.02), grads)
    first = [Parameter(mt(v, FAST)) for v in init]
    opt = AdamW(first, lr=0.02)
    run(first, opt, grads[:2])
    resumed = [Parameter(mt(p.value.to_numpy(), FAST)) for p in first]
    opt2 = AdamW(resumed, lr=0.02)
    opt2.load_state_dict(opt.state_dict())
    run(resumed, opt2, grads[2:])
    for a, b in zip(straight, resumed):
        np.testing.assert_array_equal(a.value.to_numpy(), b.value.to_numpy())


def test_adamw_rejects_bad_hyperparameters() -> None:
    p = [Parameter(mt(np.zeros(2), FAST))]
    for kwargs in ({"beta1": 1.0}, {"beta2": -0.1}, {"lr": -1.0}, {"weight_decay": -0.5}):
        with pytest.raises(ValueError, match="AdamW"):
            AdamW(p, **kwargs)


# ---- gradient checkpointing ---------------------------------------------------------------------------
def dropout_block(x: minitorch.Tensor, w: minitorch.Tensor, mask: Optional[minitorch.Tensor]) -> minitorch.Tensor:
    """Uses a parameter it does not take as an argument, dropout, and an optional constant mask."""
    y = nn.dropout((x @ w).tanh(), 0.5)
    return y * mask if mask is not None else y


def run_block(use_checkpoint: bool, with_mask: bool):
    minitorch.manual_seed(21)
    rng = np.random.default_rng(3)
    x = mt(rng.standard_normal((4, 5)), FAST, True)
    w = mt(rng.standard_normal((5, 6)), FAST, True)
    mask = mt(rng.uniform(0.5, 1.5, (4, 6)), FAST) if with_mask else None
    fn = lambda a, m: dropout_block(a, w, m)  # noqa: E731
    h = x * 2.0
    out = checkpoint(fn, h, mask) if use_checkpoint else fn(h, mask)
    (out.sum() * GRAD_SCALE).backward()
    after = minitorch.rand((4,), backend=FAST).to_numpy()
    return out.to_numpy(), x.grad.to_numpy(), w.grad.to_numpy(), after


@pytest.mark.parametrize("with_mask", [False, True])
def test_checkpoint_reproduces_dropout_and_gradients(with_mask: bool) -> None:
    plain = run_block(False, with_mask)
    ckpt = run_block(True, with_mask)
    for name, a, b in zip(("output", "dx", "dw (a parameter inside fn)", "next random draw"), plain, ckpt):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert np.count_nonzero(plain[0] == 0.0) > 0, "dropout did not drop anything: the test would prove nothing"


def test_checkpoint_keeps_only_its_inputs() -> None:
    x = mt(np.ones((2, 3)), FAST, True)
    w = mt(np.ones((3, 3)), FAST, True)
    out = checkpoint(lambda a: ((a @ w).exp() * 3.0).tanh(), x)
    assert out.history.last_fn is Checkpoint
    parents = list(out.parents)
    assert len(parents) == 1 and parents[0] is x, "the graph should hold fn's inputs and nothing fn computed"


def test_checkpoint_falls_back_when_nothing_needs_grad() -> None:
    w = mt(np.full((3, 2), 0.5), FAST, True)
    x = mt(np.ones((4, 3)), FAST)  # a constant input, but w inside fn needs its gradient
    out = checkpoint(lambda a: a @ w, x)
    out.sum().backward()
    np.testing.assert_allclose(w.grad.to_numpy(), np.full((3, 2), 4.0))
    with minitorch.no_grad():
        y = checkpoint(lambda a: a @ w, mt(np.ones((4, 3)), FAST, True))
    assert y.history is None


def test_checkpoint_needs_a_tensor_result() -> None:
    x = mt(np.ones(3), FAST, True)
    with pytest.raises(TypeError, match="fn must return one Tensor"):
        checkpoint(lambda a: (a, a), x)


def lm_gradients(recompute_layers: bool, fused: bool, training: bool = True):
    minitorch.manual_seed(5)
    model = DecoderLM(23, 16, 2, 10, n_layers=2, p_dropout=0.25, backend=FAST, use_fused_kernel=fused,
                      recompute_layers=recompute_layers)
    if not training:
        model.eval()
    rng = np.random.default_rng(0)
    idx = mt(rng.integers(0, 23, (3, 7)), FAST)
    mask = mt(np.where(np.arange(7)[None, :] < np.array([[7], [5], [6]]), 0.0, -1e9), FAST)
    loss = nn.cross_entropy(model(idx, mask).view(21, 23), mt(rng.integers(0, 23, 21), FAST))
    loss.backward()
    return loss.item(), {name: p.value.grad.to_numpy() for name, p in model.named_parameters()}


@pytest.mark.parametrize("fused", [False, True])
def test_checkpointed_decoder_lm_has_the_same_gradients(fused: bool) -> None:
    loss, grads = lm_gradients(False, fused)
    ckpt_loss, ckpt_grads = lm_gradients(True, fused)
    assert ckpt_loss == loss
    for name, g in grads.items():
        np.testing.assert_array_equal(ckpt_grads[name], g, err_msg=name)
    _, no_dropout = lm_gradients(False, fused, training=False)
    assert any(not np.array_equal(no_dropout[n], g) for n, g in grads.items()), "dropout masks had no effect"


def test_decoder_lm_fused_loss_equals_its_logits_loss() -> None:
    """What the training program's --loss fused computes: the LM head's input and weights given to
    fused_linear_cross_entropy, the same loss and gradients as logits + nn.cross_entropy."""
    rng = np.random.default_rng(1)
    idx = mt(rng.integers(0, 23, (2, 6)), FAST)
    targets = mt(rng.integers(0, 23, 12), FAST)
    weights = mt((rng.random(12) < 0.7).astype(np.float32), FAST)

    def run(fused: bool):
        minitorch.manual_seed(9)
        model = DecoderLM(23, 16, 2, 10, n_layers=1, p_dropout=0.0, backend=FAST)
        if fused:
            hidden = model.hidden_states(idx).view(12, 16)
            head = model.lm_head
            loss = fused_linear_cross_entropy(hidden, head.weight.value.T, targets, weights, chunk_size=5,
                                              bias=head.bias.value)
        else:
            loss = nn.cross_entropy(model(idx).view(12, 23), targets, weights)
        loss.backward()
        return loss.to_numpy(), {n: p.value.grad.to_numpy() for n, p in model.named_parameters()}

    naive_loss, naive_grads = run(False)
    fused_loss, fused_grads = run(True)
    assert_close(fused_loss, naive_loss, "loss")
    for name, g in naive_grads.items():
        assert_close(fused_grads[name], g, f"gradient of {name}", floor=1e-3)


def test_training_program_fused_loss_and_checkpointing(tmp_path) -> None:
    """run_machine_translation with --loss fused --recompute-layers true trains the same model as the plain
    program (same seed): the same losses up to float rounding."""
    from mt_program import TINY, write_corpus

    from project.translation import main as run_mt

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_corpus(corpus)
    common = TINY + ["--epochs", "1", "--data-dir", str(corpus)]
    plain = run_mt.main(common + ["--out-dir", str(tmp_path / "plain")])["history"][0]
    lean = run_mt.main(common + ["--out-dir", str(tmp_path / "lean"), "--loss", "fused", "--recompute-layers", "true"])
    record = lean["history"][0]
    assert lean["config"]["loss"] == "fused" and lean["config"]["recompute_layers"] is True
    for key in ("train_loss", "valid_loss"):
        assert abs(record[key] - plain[key]) <= 1e-4 * abs(plain[key]), f"{key}: {record[key]} vs {plain[key]}"
