"""The host-loop pieces on CUDA: the multi-tensor gradient norm, clip and AdamW against torch, the
fused Linear epilogue against torch, and CUDA-graph replays of the translation program's training
step equal to eager steps (with dropout) over 20 steps, in float32 and in bf16 (--dtype bf16: the
graph reads the weights' working copies, which each replayed update rewrites), and step readouts
read past the readback ring's length."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import minitorch
from minitorch import DecoderLM
from minitorch.fused.linear import linear
from minitorch.graphs import StepGraphs
from project.common.precision import compute_precision
from project.translation.batches import Batch
from project.translation.model import batch_loss
from project.translation.step import TranslationStep
from project.translation.tokenizer import PAD_ID

from fused_testing import rel_err

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)


@pytest.mark.parametrize("max_norm", [0.05, None])
def test_multi_tensor_clip_and_adamw_match_torch(max_norm) -> None:
    """165 parameters (two launches of at most 160 tensors), one larger than a 32768-element chunk and
    of odd size; three steps of clipped AdamW against torch in float64."""
    rng = np.random.default_rng(0)
    shapes = [(3, 5)] * 80 + [(7,)] * 80 + [(301, 257), (1,), (64, 64), (2, 3, 4), (33,)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [minitorch.Parameter(minitorch.tensor_from_numpy(x, backend=CUDA)) for x in init]
    ref = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in init]
    opt = minitorch.AdamW(params, lr=1e-2, weight_decay=0.1, max_grad_norm=max_norm)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for p, r, g in zip(params, ref, grads):
            p.value.grad = minitorch.tensor_from_numpy(g, backend=CUDA)
            r.grad = torch.tensor(g, dtype=torch.float64)
        norm = float(torch.sqrt(sum((r.grad**2).sum() for r in ref)))
        if max_norm is not None:
            for r in ref:
                r.grad *= max_norm / max(norm, max_norm)
        opt.step()
        ref_opt.step()
        assert abs(opt.grad_norm().item() - norm) <= 1e-5 * norm
        for p, r in zip(params, ref):
            assert rel_err(p.value.to_numpy(), r.detach().numpy()) < 1e-5


@pytest.mark.parametrize("activation", [None, "gelu", "relu"])
def test_linear_epilogue_matches_torch(activation) -> None:
    rng = np.random.default_rng(1)
    x, w, b, g = (rng.standard_normal(s).astype(np.float32) for s in ((300, 96), (130, 96), (130,), (300, 130)))
    tx, tw, tb = (minitorch.tensor_from_numpy(v, backend=CUDA, requires_grad=True) for v in (x, w, b))
    out = linear(tx, tw, tb, activation)
    out.backward(minitorch.tensor_from_numpy(g, backend=CUDA))
    rx, rw, rb = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, w, b))
    pre = rx @ rw.T + rb
    ref = {None: pre, "gelu": torch.nn.functional.gelu(pre, approximate="tanh"), "relu": torch.relu(pre)}[activation]
    ref.backward(torch.tensor(g, dtype=torch.float64))
    assert rel_err(out.to_numpy(), ref.detach().numpy()) < 1e-5
    for name, t, r in (("dx", tx, rx), ("dw", tw, rw), ("db", tb, rb)):
        assert rel_err(t.grad.to_numpy(), r.grad.numpy()) < 1e-5, name


def _batches(n: int, V: int, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        T = (13, 21, 16)[i % 3]  # widths padded to 16, 24, 16: two graphs, each replayed
        tokens = rng.integers(3, V, size=(4, T))
        tokens[:, -2:] = PAD_ID
        targets = np.roll(tokens, -1, axis=1)
        weights = (tokens != PAD_ID).astype(np.float32)
        out.append(Batch(tokens=tokens, targets=targets, weights=weights))
    return out


def _train(use_graphs: bool, loss_kind: str, dtype: str = "fp32"):
    minitorch.manual_seed(7)
    model = DecoderLM(n_vocab=50, n_embd=32, n_head=4, n_positions=32, n_layers=2, p_dropout=0.1, backend=CUDA,
                      use_fused_kernel=True)
    opt = minitorch.AdamW(model.parameters(), lr=3e-3, max_grad_norm=1.0)
    step = TranslationStep(model, opt, CUDA, loss_kind, use_graphs=use_graphs, dtype=dtype)
    replays = sum(step(batch, lr=3e-3 * (1 + i % 4)) for i, batch in enumerate(_batches(20, 50, 3)))
    params = [p.value.to_numpy() for p in model.parameters()]
    return params, step.loss_total(), replays, step.captured


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("loss_kind", ["naive", "fused"])
def test_graph_replays_equal_eager_steps(loss_kind: str, dtype: str) -> None:
    eager, eager_loss, eager_replays, _ = _train(False, loss_kind, dtype)
    graphed, graph_loss, replays, captured = _train(True, loss_kind, dtype)
    assert eager_replays == 0 and captured == 2 and replays == 18
    assert abs(graph_loss - eager_loss) <= 1e-6 * abs(eager_loss)
    for a, b in zip(eager, graphed):
        assert np.max(np.abs(a - b)) <= 1e-6 * max(1.0, float(np.max(np.abs(a))))


def test_bf16_working_copies_are_current_after_graph_replays() -> None:
    """After replayed bf16 steps (which never run autocast's Python), the trained model's loss in bf16
    equals that of a fresh model given its float32 parameters: the copies it reads are current."""
    minitorch.manual_seed(3)
    config = dict(n_vocab=50, n_embd=32, n_head=4, n_positions=32, n_layers=2, p_dropout=0.0, backend=CUDA,
                  use_fused_kernel=True)  # fmt: skip
    model = DecoderLM(**config)
    opt = minitorch.AdamW(model.parameters(), lr=3e-3)
    step = TranslationStep(model, opt, CUDA, "naive", use_graphs=True, dtype="bf16")
    batches = _batches(6, 50, 5)
    assert sum(step(batch, lr=3e-3) for batch in batches) == 4
    fresh = DecoderLM(**config)
    fresh.load_state_dict(model.state_dict())
    with minitorch.no_grad(), compute_precision("bf16"):
        trained, loaded = (batch_loss(m, batches[0], CUDA).item() for m in (model, fresh))
    assert trained == loaded


def test_a_collection_during_a_capture_cannot_destroy_an_earlier_graph() -> None:
    """A dead cycle holding a captured graph (a dropped trainer's) becomes garbage while another step
    is captured, with the collector set to run at every allocation: the capture still succeeds (the
    collector waits until it ends) and replays."""
    x = minitorch.rand((64,), backend=CUDA)
    old = StepGraphs(enabled=True)
    old.run("old", lambda: x * 2.0)
    box: list = [old]
    box.append(box)  # a cycle: only the collector frees it
    holder = [box]
    del old, box
    thresholds = gc.get_threshold()

    def step() -> None:
        if torch.cuda.is_current_stream_capturing() and holder:
            holder.clear()  # the cycle is now garbage
            gc.set_threshold(1, 1, 1)
            assert len([[] for _ in range(1000)]) == 1000  # container allocations: a collection's trigger
        (x * 3.0).sum()

    graphs = StepGraphs(enabled=True)
    try:
        graphs.run("new", step)
    finally:
        gc.set_threshold(*thresholds)
    gc.collect()
    assert graphs.captured == 1 and graphs.run("new", step)


def test_a_host_sync_cannot_hide_in_a_captured_step() -> None:
    """Capture refuses a device->host read, so a step that captures has none."""
    x = minitorch.rand((4,), backend=CUDA)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError):
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            (x * 2.0).sum().item()


def test_step_readouts_keep_their_values_past_the_ring() -> None:
    """More queued readouts than the readback ring has slots, none read until the end: each gives the
    values its tensors held when it was queued (a slot's values are taken out before it is rewritten),
    and 0-dim tensors read as one value."""
    from minitorch.cuda.staging import SLOTS
    from minitorch.graphs import StepReadout

    counter = minitorch.zeros((1,), backend=CUDA)
    readouts = []
    for i in range(SLOTS + 7):
        counter.copy_(counter + 1.0)
        readouts.append(StepReadout([counter, (counter * 2.0).view(())]))
    assert [r.values() for r in readouts] == [[float(i + 1), float(2 * (i + 1))] for i in range(SLOTS + 7)]
