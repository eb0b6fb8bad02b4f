"""The device-free parts of the training loop: width padding, the step on the CPU backend (the same
update as the plain forward/backward/AdamW sequence, with the loss summed in the accumulator), and
the step timer."""

from __future__ import annotations

import numpy as np
import pytest

import minitorch
from minitorch import DecoderLM
from project.common.train_step import StepTimer
from project.translation.batches import Batch
from project.translation.model import batch_loss
from project.translation.step import TranslationStep, pad_width
from project.translation.tokenizer import PAD_ID

FAST = minitorch.TensorBackend(minitorch.FastOps)


def _batch(rng: np.random.Generator, B: int, T: int) -> Batch:
    tokens = rng.integers(3, 40, size=(B, T))
    tokens[0, -3:] = PAD_ID
    weights = (tokens != PAD_ID).astype(np.float32)
    return Batch(tokens=tokens, targets=np.roll(tokens, -1, axis=1), weights=weights)


def test_pad_width_adds_weightless_padding() -> None:
    batch = _batch(np.random.default_rng(0), 3, 13)
    padded = pad_width(batch, 8)
    assert padded.tokens.shape == (3, 16)
    np.testing.assert_array_equal(padded.tokens[:, :13], batch.tokens)
    assert (padded.tokens[:, 13:] == PAD_ID).all() and (padded.weights[:, 13:] == 0).all()
    assert padded.n_targets == batch.n_targets
    assert pad_width(padded, 8) is padded


def _model() -> DecoderLM:
    minitorch.manual_seed(5)
    return DecoderLM(n_vocab=40, n_embd=16, n_head=2, n_positions=16, n_layers=1, p_dropout=0.0, backend=FAST)


def test_train_step_equals_the_plain_update_on_the_cpu() -> None:
    rng = np.random.default_rng(1)
    batches = [_batch(rng, 2, 9) for _ in range(3)]
    model = _model()
    opt = minitorch.AdamW(model.parameters(), lr=1e-2, max_grad_norm=0.5)
    step = TranslationStep(model, opt, FAST, "naive", use_graphs=False)
    assert not any(step(b, lr=1e-2) for b in batches)
    ref_model = _model()
    ref_opt = minitorch.AdamW(ref_model.parameters(), lr=1e-2, max_grad_norm=0.5)
    total = 0.0
    for b in batches:
        loss = batch_loss(ref_model, b, FAST)
        ref_opt.zero_grad()
        loss.backward()
        ref_opt.step()
        total += loss.item() * b.n_targets
    for p, r in zip(model.parameters(), ref_model.parameters()):
        np.testing.assert_array_equal(p.value.to_numpy(), r.value.to_numpy())
    assert step.loss_total() == pytest.approx(total, rel=1e-6)


def test_graphs_need_cuda() -> None:
    model = _model()
    with pytest.raises(ValueError, match="CUDA graphs need the CUDA backend"):
        TranslationStep(model, minitorch.AdamW(model.parameters()), FAST, "naive", use_graphs=True)


def test_step_timer_median_leaves_out_unsteady_steps(monkeypatch) -> None:
    clock = iter([0.0, 1.0, 1.5, 2.5, 3.0])
    monkeypatch.setattr("project.common.train_step.time.perf_counter", lambda: next(clock))
    timer = StepTimer(FAST)
    timer.start()
    timer.mark(100, steady=False)  # 1.0 s
    timer.mark(100, steady=True)  # 0.5 s: 200 tokens/s
    timer.mark(100, steady=True)  # 1.0 s: 100 tokens/s
    timer.mark(300, steady=True)  # 0.5 s: 600 tokens/s
    assert timer.median_tokens_per_s() == pytest.approx(200.0)
