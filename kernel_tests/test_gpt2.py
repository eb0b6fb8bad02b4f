"""GPT-2 training on CUDA equals the CPU backend: two AdamW steps of a small GPT-2 (the program's
GPT2Step: loss, backward, global-norm clip, update) from the same llm.c-layout parameters and
batches give the same losses, first-step gradients and final parameters, with softmax and ReLU
attention, on CUDA's naive path and on its all-fused path (fused LayerNorm, fused attention, fused
linear cross-entropy) against the CPU's naive path."""

import functools

import numpy as np
import pytest

import minitorch
from project.gpt2.llmc import GPT2Config
from project.gpt2.model import GPT2, gpt2_init_params
from project.gpt2.training import GPT2Step

from fused_testing import rel_err

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)
CPU = minitorch.TensorBackend(minitorch.FastOps)
CONFIG = GPT2Config(max_seq_len=64, vocab_size=250, padded_vocab_size=256, num_layers=2, num_heads=4, channels=128)
B, T, LR = 4, 64, 1e-3


def two_steps(backend, activation: str, fused: bool, graphs: bool = False):
    """(losses of both steps, llm.c-layout gradients of step 1, parameters after step 2). graphs: the
    first step runs eagerly and is captured, the second replays the graph (gradients then None: after
    a capture they are the graph's buffers, written by the next replay)."""
    model = GPT2(CONFIG, backend=backend, use_fused_kernel=fused, attention="fused" if fused else "naive",
                 activation=activation)
    model.load_llmc_params(gpt2_init_params(CONFIG, seed=0))
    # AdamW divides each gradient by its magnitude: with eps 1e-8, gradients of ~1e-9, whose float32
    # rounding differs between backends by ~1e-10, would move by visibly different fractions of lr.
    # eps 1e-5 (gradients here are ~1e-4..1e-2) keeps the comparison about the computation.
    optimizer = minitorch.AdamW(model.parameters(), lr=LR, weight_decay=0.1, eps=1e-5, max_grad_norm=1.0)
    rng = np.random.default_rng(1)
    step = GPT2Step(model, optimizer, "fused" if fused else "naive", use_graphs=graphs)
    losses, grads = [], None
    for _ in range(2):
        tokens = rng.integers(0, CONFIG.vocab_size, (B, T + 1))
        losses.append(step(tokens[:, :-1], tokens[:, 1:], LR)[0])
        grads = grads or (None if graphs else model.llmc_grads())
    step.release_graphs()
    return losses, grads, model.llmc_params()


@functools.lru_cache(maxsize=None)
def cpu_reference(activation: str):
    return two_steps(CPU, activation, fused=False)


@pytest.mark.parametrize("fused", [False, True], ids=["naive", "all-fused"])
@pytest.mark.parametrize("activation", ["softmax", "relu"])
def test_gpt2_training_steps_on_cuda_equal_cpu(activation: str, fused: bool) -> None:
    ref_losses, ref_grads, ref_params = cpu_reference(activation)
    losses, grads, params = two_steps(CUDA, activation, fused)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for name, ref in ref_grads.items():
        assert rel_err(grads[name], ref) < 1e-4, f"gradient of {name}: rel err {rel_err(grads[name], ref):.2e}"
    for name, ref in ref_params.items():
        # An AdamW step moves each value by about lr; allow 1% of that.
        assert np.abs(params[name] - ref).max() < 0.01 * LR, f"{name} after two steps"


def test_gpt2_training_step_graph_replay_equals_cpu() -> None:
    """The all-fused step captured in a CUDA graph and replayed: the replayed step's loss and the
    parameters after it match the CPU backend's eager steps."""
    ref_losses, _, ref_params = cpu_reference("softmax")
    losses, _, params = two_steps(CUDA, "softmax", fused=True, graphs=True)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for name, ref in ref_params.items():
        assert np.abs(params[name] - ref).max() < 0.01 * LR, f"{name} after the replayed step"
