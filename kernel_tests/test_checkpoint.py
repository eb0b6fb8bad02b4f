"""Gradient checkpointing on CUDA: DecoderLM(recompute_layers=True) gives the gradients of the plain
model with dropout on and the same seeds (the masks are drawn again from the same RNG state), with
the naive and the fused loss, the composed and fused softmax, and fused attention, and holds less
memory; plus
minitorch.cuda_memory_stats itself."""

import numpy as np
import pytest

import minitorch
from minitorch import DecoderLM, fused_linear_cross_entropy, nn

from fused_testing import rel_err

torch = pytest.importorskip("torch")

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)
TOL = 1e-5


def batch(B: int, T: int, V: int, seed: int):
    rng = np.random.default_rng(seed)
    idx = minitorch.tensor_from_numpy(rng.integers(0, V, (B, T)), backend=CUDA)
    lengths = rng.integers(T // 2, T + 1, B)
    mask = minitorch.tensor_from_numpy(np.where(np.arange(T)[None, :] < lengths[:, None], 0.0, -1e9), backend=CUDA)
    targets = minitorch.tensor_from_numpy(rng.integers(0, V, B * T), backend=CUDA)
    weights = minitorch.tensor_from_numpy((np.arange(T)[None, :] < lengths[:, None]).reshape(-1), backend=CUDA)
    return idx, mask, targets, weights


def step(model: DecoderLM, data, loss_kind: str):
    idx, mask, targets, weights = data
    B, T = idx.shape
    if loss_kind == "fused":
        hidden = model.hidden_states(idx, mask).view(B * T, model.n_embd)
        head = model.lm_head
        loss = fused_linear_cross_entropy(hidden, head.weight.value.T, targets, weights, chunk_size=37,
                                          bias=head.bias.value)
    else:
        loss = nn.cross_entropy(model(idx, mask).view(B * T, model.n_vocab), targets, weights)
    loss.backward()
    return loss


def gradients(recompute_layers: bool, fused_kernel: bool, attention: str, loss_kind: str, training: bool = True):
    minitorch.manual_seed(11)
    model = DecoderLM(61, 32, 2, 16, n_layers=3, p_dropout=0.2, backend=CUDA, use_fused_kernel=fused_kernel,
                      recompute_layers=recompute_layers, attention=attention)
    if not training:
        model.eval()
    loss = step(model, batch(3, 16, 61, seed=2), loss_kind)
    after = minitorch.rand((4,), backend=CUDA).to_numpy()
    return loss.item(), {n: p.value.grad.to_numpy() for n, p in model.named_parameters()}, after


@pytest.mark.parametrize("loss_kind", ["naive", "fused"])
@pytest.mark.parametrize("fused_kernel,attention", [(False, "naive"), (True, "naive"), (True, "fused")])
def test_checkpointed_gradients_equal_plain(fused_kernel: bool, attention: str, loss_kind: str) -> None:
    loss, grads, after = gradients(False, fused_kernel, attention, loss_kind)
    ckpt_loss, ckpt_grads, ckpt_after = gradients(True, fused_kernel, attention, loss_kind)
    assert abs(ckpt_loss - loss) <= TOL * abs(loss)
    for name, g in grads.items():
        # Scatter-adds with atomics (embedding gradients) may sum in another order: equal up to rounding.
        assert rel_err(ckpt_grads[name], g) < TOL, f"{name}: checkpointed gradient differs"
    np.testing.assert_array_equal(ckpt_after, after, err_msg="checkpointing changed the random stream after backward")
    _, no_dropout, _ = gradients(False, fused_kernel, attention, loss_kind, training=False)
    assert any(rel_err(no_dropout[n], g) > 1e-3 for n, g in grads.items()), "dropout had no effect"


def test_checkpointing_lowers_peak_memory() -> None:
    peaks = {}
    for ckpt in (False, True):
        minitorch.manual_seed(0)
        model = DecoderLM(512, 256, 8, 128, n_layers=6, p_dropout=0.1, backend=CUDA, use_fused_kernel=True,
                          recompute_layers=ckpt)
        data = batch(16, 128, 512, seed=1)
        torch.cuda.synchronize()
        base = minitorch.cuda_memory_stats(reset=True)["current"]
        loss = step(model, data, "naive")
        torch.cuda.synchronize()
        peaks[ckpt] = minitorch.cuda_memory_stats()["peak"] - base
        del model, data, loss
    assert peaks[True] < 0.6 * peaks[False], (
        f"peak above the model: {peaks[True] >> 20} MiB checkpointed vs {peaks[False] >> 20} MiB plain"
    )


def test_cuda_memory_stats() -> None:
    torch.cuda.synchronize()
    minitorch.cuda_memory_stats(reset=True)
    start = minitorch.cuda_memory_stats()
    assert set(start) == {"current", "peak"} and start["peak"] == start["current"]
    big = minitorch.zeros((1 << 20,), backend=CUDA)
    held = minitorch.cuda_memory_stats()
    assert held["current"] >= start["current"] + 4 * (1 << 20)
    del big
    after = minitorch.cuda_memory_stats(reset=True)
    assert after["peak"] >= held["current"] and after["current"] < held["current"]
    assert minitorch.cuda_memory_stats()["peak"] == after["current"]
