"""nn.cross_entropy and nn.softmax_loss on CUDA, where one kernel (the fused classifier,
minitorch/fused/softmax_loss.py) gives each row's loss and, in the backward, the logits' gradient
into a new buffer: against torch float64 on the same logits (bf16-rounded for the bf16 cases).

float32 logits must match float64 to float32 rounding; bf16 logits under minitorch.autocast (the
loss in float32 from the bf16 values, the gradient rounded to bf16) within 2x torch's own error on
the same inputs under torch.autocast (or FLOOR, relative, where that is smaller).  Odd vocabularies (rows off
the 16-byte path), label smoothing, per-token weights, ignore_index, the logits left as they were,
NaN for a bad target, and the kernel is what ran (SoftmaxLoss in the graph).
"""

import numpy as np
import pytest

import minitorch
from minitorch import nn
from minitorch.fused.softmax_loss import SoftmaxLoss, softmax_loss_rows

torch = pytest.importorskip("torch")

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)
FLOOR = 2e-6


def rel_err(out: np.ndarray, ref: "torch.Tensor") -> float:
    ref = ref.detach().cpu().double().numpy()
    if not np.isfinite(out).all():
        return float("inf")
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))


def problem(N: int, V: int, seed: int):
    """Logits [N, V] (float32, spread like a trained LM head's), targets with every 7th ignored
    (-100) and per-token weights."""
    gen = np.random.default_rng(seed)
    logits = (3.0 * gen.standard_normal((N, V))).astype(np.float32)
    targets = gen.integers(0, V, N)
    targets[::7] = -100
    weights = gen.uniform(0.5, 2.0, N).astype(np.float32)
    return logits, targets, weights


def torch_loss(logits: "torch.Tensor", targets, weights, smoothing: float) -> "torch.Tensor":
    t = torch.tensor(targets, device="cuda")
    w = torch.tensor(weights, device="cuda", dtype=logits.dtype if logits.dtype == torch.float64 else torch.float32)
    per_row = torch.nn.functional.cross_entropy(logits, t, reduction="none", label_smoothing=smoothing)
    counted = (t != -100).to(w.dtype) * w
    return (per_row * counted).sum() / counted.sum()


def torch_grads(logits_np: np.ndarray, targets, weights, smoothing: float, dtype) -> tuple:
    """(loss, dlogits) of torch_loss: float64, or the dtype under torch.autocast (bf16 leaves)."""
    x = torch.tensor(logits_np, device="cuda", dtype=dtype, requires_grad=True)
    if dtype == torch.bfloat16:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch_loss(x, targets, weights, smoothing)
    else:
        loss = torch_loss(x, targets, weights, smoothing)
    loss.backward()
    return loss.detach(), x.grad


def ours(logits_np: np.ndarray, targets, weights, smoothing: float, bf16: bool) -> tuple:
    x = minitorch.tensor_from_numpy(logits_np, backend=CUDA)
    x = (x.bfloat16() if bf16 else x).detach().requires_grad_(True)
    t = minitorch.tensor(targets.tolist(), backend=CUDA)
    w = minitorch.tensor_from_numpy(weights, backend=CUDA)
    before = x.float().to_numpy()
    with minitorch.autocast(dtype=minitorch.bfloat16, enabled=bf16):
        loss = nn.cross_entropy(x, t, w, label_smoothing=smoothing)
    loss.backward()
    assert np.array_equal(x.float().to_numpy(), before), "the logits must stay as they were"
    assert loss.dtype is minitorch.float32 and x.grad.dtype is x.dtype
    return loss.item(), x.grad.float().to_numpy()


@pytest.mark.parametrize("N,V", [(37, 10), (128, 8000), (65, 8191), (9, 50257), (300, 777)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_float32_against_float64(N: int, V: int, smoothing: float) -> None:
    logits, targets, weights = problem(N, V, N + V)
    ref_loss, ref_grad = torch_grads(logits, targets, weights, smoothing, torch.float64)
    loss, grad = ours(logits, targets, weights, smoothing, bf16=False)
    assert abs(loss - ref_loss.item()) <= 2e-6 * abs(ref_loss.item())
    assert rel_err(grad, ref_grad) <= 2e-6


@pytest.mark.parametrize("N,V", [(37, 10), (128, 8000), (65, 8191), (9, 50257), (300, 777)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_bf16_under_autocast_within_torch_error(N: int, V: int, smoothing: float) -> None:
    logits, targets, weights = problem(N, V, 2 * N + V)
    rounded = torch.tensor(logits).bfloat16().float().numpy()  # the bf16 values both sides read
    ref_loss, ref_grad = torch_grads(rounded, targets, weights, smoothing, torch.float64)
    theirs_loss, theirs_grad = torch_grads(rounded, targets, weights, smoothing, torch.bfloat16)
    loss, grad = ours(logits, targets, weights, smoothing, bf16=True)
    ref = ref_loss.item()
    loss_bound = max(2 * abs(theirs_loss.item() - ref), FLOOR * abs(ref))
    assert abs(loss - ref) <= loss_bound
    theirs = theirs_grad.float().cpu().numpy()
    assert rel_err(grad, ref_grad) <= max(2 * rel_err(theirs, ref_grad), FLOOR)


def test_softmax_loss_runs_the_kernel_and_marks_bad_targets_nan() -> None:
    logits, _, _ = problem(6, 50, 3)
    x = minitorch.tensor_from_numpy(logits, backend=CUDA).requires_grad_(True)
    rows = nn.softmax_loss(x, minitorch.tensor([1, 2, 60, 3, -1, 0], backend=CUDA))
    assert rows.history.last_fn is SoftmaxLoss  # a [N] target: the kernel's rows themselves (no view of one's own shape)
    values = rows.to_numpy()
    assert np.isnan(values[[2, 4]]).all() and np.isfinite(values[[0, 1, 3, 5]]).all()
    ref = torch.nn.functional.cross_entropy(torch.tensor(logits, dtype=torch.float64)[[0, 1, 3, 5]],
                                            torch.tensor([1, 2, 3, 0]), reduction="none")  # fmt: skip
    np.testing.assert_allclose(values[[0, 1, 3, 5]], ref.numpy(), rtol=2e-6)


def test_bf16_outside_autocast_keeps_the_composed_bf16_ops() -> None:
    """bf16 logits run the kernel only where autocast raises the loss to float32; without autocast
    they take the composed ops, each in bf16 as every other bf16 op."""
    logits, targets, _ = problem(8, 40, 5)
    x = minitorch.tensor_from_numpy(logits, backend=CUDA).bfloat16()
    t = minitorch.tensor(targets.tolist(), backend=CUDA)
    assert softmax_loss_rows(x, t, 0.0) is None
    with minitorch.autocast(dtype=minitorch.bfloat16):
        assert softmax_loss_rows(x, t, 0.0) is not None
