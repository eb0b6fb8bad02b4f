"""The bf16 fused linear cross-entropy (minitorch/cuda/classifier.py's bf16 products around
src/classifier_kernel.cu) against torch float64 on the same bf16-rounded hidden states and weight:
the loss (float32), dhidden (bf16) and dweight (float32) for an incoming gradient of 1, each within
2x torch's own bf16 error on those inputs (logits = h @ w in bf16, cross-entropy in float32 from
them, as torch autocast computes it), or FLOOR where that is smaller.  Odd vocabularies (rows off the
16-byte path), several chunks (dweight summed over chunks), the tied [V, C] head as a transposed
view, a bias, label smoothing and ignored tokens.
"""

import pytest

import minitorch
from minitorch.cuda_kernel_ops import CudaKernelOps

torch = pytest.importorskip("torch")

FLOOR = 1e-6
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)


def rel_err(out: "torch.Tensor", ref: "torch.Tensor") -> float:
    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def problem(N: int, C: int, V: int, seed: int, tied: bool, bias: bool):
    """bf16 hidden [N, C] and weight [C, V] (tied: the transpose of a contiguous [V, C]), float32 bias,
    targets and token weights (every 5th token ignored)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(N, C, generator=gen, device="cuda").to(torch.bfloat16)
    if tied:
        w = (0.3 * torch.randn(V, C, generator=gen, device="cuda")).to(torch.bfloat16).t()
    else:
        w = (0.3 * torch.randn(C, V, generator=gen, device="cuda")).to(torch.bfloat16)
    b = torch.randn(V, generator=gen, device="cuda") if bias else None
    targets = torch.randint(0, V, (N,), generator=gen, device="cuda").float()
    weights = torch.ones(N, device="cuda")
    weights[::5] = 0.0
    return h, w, b, targets, weights


def torch_loss(h, w, b, targets, weights, smoothing: float):
    logits = h @ w
    if b is not None:
        logits = logits + b.to(logits.dtype)
    per_row = torch.nn.functional.cross_entropy(logits.double() if h.dtype == torch.float64 else logits.float(),
                                                targets.long(), reduction="none", label_smoothing=smoothing)  # fmt: skip
    return (per_row * weights.to(per_row.dtype)).sum() / weights.sum()


def grads(h, w, b, targets, weights, smoothing: float):
    """(loss, dh, dw) of torch_loss at h, w (leaves in their own dtype)."""
    th, tw = (t.detach().clone().requires_grad_(True) for t in (h, w))
    loss = torch_loss(th, tw, b if b is None or h.dtype != torch.float64 else b.double(), targets, weights, smoothing)
    loss.backward()
    return loss.detach(), th.grad, tw.grad


@pytest.mark.parametrize(
    "N,C,V,chunk,tied,bias,smoothing",
    [
        (64, 64, 1000, 64, False, False, 0.0),
        (300, 96, 5003, 128, False, True, 0.1),
        (257, 128, 8191, 100, True, False, 0.0),
        (33, 40, 77, 8, True, True, 0.2),
        (512, 768, 50257, 256, True, False, 0.0),
    ],
)
def test_against_float64(N: int, C: int, V: int, chunk: int, tied: bool, bias: bool, smoothing: float) -> None:
    h, w, b, targets, weights = problem(N, C, V, N + V, tied, bias)
    ref = grads(h.double(), w.double(), b, targets, weights, smoothing)
    theirs = grads(h, w, b, targets, weights, smoothing)
    mh, mw = minitorch.from_torch(h), minitorch.from_torch(w.t()).permute(1, 0) if tied else minitorch.from_torch(w)
    mb = None if b is None else minitorch.from_torch(b)
    loss, dh, dw, _ = CudaKernelOps.linear_cross_entropy_fw(
        mh._tensor, mw._tensor, None if mb is None else mb._tensor, minitorch.from_torch(targets)._tensor,
        minitorch.from_torch(weights)._tensor, chunk, True, smoothing,
    )  # fmt: skip
    assert dh.dtype == minitorch.bfloat16 and dw.dtype == minitorch.float32
    ours = [mh._new(t).to_torch() for t in (loss, dh, dw)]
    for name, mine, torch_val, r in zip(("loss", "dhidden", "dweight"), ours, theirs, ref):
        mine = mine.reshape(r.shape)
        err, bound = rel_err(mine, r), max(2 * rel_err(torch_val.reshape(r.shape), r), FLOOR)
        assert err <= bound, f"[{N}, {C}] x {V} chunk {chunk}: {name} error {err:.3g} > 2 x torch's ({bound:.3g})"


def test_mixed_dtypes_raise() -> None:
    """bf16 hidden with a float32 weight: NoKernelError (the fused op casts both alike under autocast)."""
    h = minitorch.from_torch(torch.zeros(4, 8, device="cuda", dtype=torch.bfloat16))
    w = minitorch.from_torch(torch.zeros(8, 16, device="cuda"))
    t = minitorch.from_torch(torch.zeros(4, device="cuda"))
    with pytest.raises(minitorch.NoKernelError, match="linear_cross_entropy_fw"):
        CudaKernelOps.linear_cross_entropy_fw(h._tensor, w._tensor, None, t._tensor, t._tensor, 4, True, 0.0)
