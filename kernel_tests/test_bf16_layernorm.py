"""bfloat16 LayerNorm kernels (layernorm_kernel.cu) against torch float64 on the same bfloat16
inputs: output and input gradient (bfloat16) within twice torch's own bfloat16 error, statistics
and gamma/beta gradients float32; every path: team sizes, the streaming kernels (hidden > 16384
forward, > 8192 backward), scalar accesses (odd hidden, rows 2-byte aligned), the backward's 16-byte
buckets (hidden % 8 == 0 up to 768: full and partly filled rows, several rows a warp) and the
8-byte ones instead (rows 8-byte aligned only, hidden % 8 == 4, hidden > 768)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from minitorch import bfloat16, float32  # noqa: E402

from bf16_testing import assert_bf16_bound, bf16_pair, values  # noqa: E402
from fused_testing import CUDA, gpu, on_tensors, rng_for  # noqa: E402

F = torch.nn.functional


def _case(rows: int, hidden: int, start: int):
    rng = rng_for("layernorm", rows, hidden, start)
    # gamma and beta bfloat16-exact, so that torch's bfloat16 layer_norm (which needs bfloat16
    # weights) reads the same values as our float32 ones.
    gamma = bfloat16.round(rng.normal(1.0, 0.5, hidden).astype(np.float32))
    beta = bfloat16.round(rng.normal(0.0, 0.5, hidden).astype(np.float32))
    x, xt = bf16_pair(rng.normal(2.0, 3.0, rows * hidden + start))
    dy, dyt = bf16_pair(rng.normal(size=rows * hidden + start))
    x, xt = x[start : start + rows * hidden].view(rows, hidden), xt[start : start + rows * hidden].view(rows, hidden)
    dy, dyt = dy[start : start + rows * hidden].view(rows, hidden), dyt[start : start + rows * hidden].view(rows, hidden)
    return x, xt, dy, dyt, gamma, beta


@pytest.mark.parametrize(
    "rows, hidden",
    [(33, 1), (33, 7), (40, 8), (65, 64), (33, 128), (2500, 512), (17, 520), (17, 764), (17, 768), (4500, 768),
     (17, 776), (9, 1000), (5, 12288), (3, 20000)],
)  # fmt: skip
@pytest.mark.parametrize("start", [0, 1, 4])  # elements: rows 16-, 2- and 8-byte aligned
def test_layernorm_forward_and_backward(rows: int, hidden: int, start: int) -> None:
    x, xt, dy, dyt, gamma, beta = _case(rows, hidden, start)
    g, b = gpu(gamma), gpu(beta)
    out, mean, rstd = on_tensors(CUDA.ops.layernorm_fw, x, g, b, 1e-5)
    assert out.dtype is bfloat16 and mean.dtype is float32 and rstd.dtype is float32
    gt, bt = torch.from_numpy(gamma).cuda(), torch.from_numpy(beta).cuda()
    ref = F.layer_norm(xt.double(), (hidden,), gt.double(), bt.double(), 1e-5)
    theirs = F.layer_norm(xt, (hidden,), gt.bfloat16(), bt.bfloat16(), 1e-5)
    what = f"[{rows}, {hidden}]{f' from element {start}' if start else ''}"
    assert_bf16_bound(out, theirs, ref, f"layernorm forward {what}")
    x64 = xt.double()
    np.testing.assert_allclose(values(mean), x64.mean(1).cpu().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values(rstd), (x64.var(1, unbiased=False) + 1e-5).rsqrt().cpu().numpy(), rtol=1e-4)

    dx, dgamma, dbeta = on_tensors(CUDA.ops.layernorm_bw, dy, x, g, mean, rstd)
    assert dx.dtype is bfloat16 and dgamma.dtype is float32 and dbeta.dtype is float32
    xd = xt.double().requires_grad_(True)
    gd, bd = gt.double().requires_grad_(True), bt.double().requires_grad_(True)
    F.layer_norm(xd, (hidden,), gd, bd, 1e-5).backward(dyt.double())
    xb = xt.clone().requires_grad_(True)
    gb, bb = gt.bfloat16().requires_grad_(True), bt.bfloat16().requires_grad_(True)
    F.layer_norm(xb, (hidden,), gb, bb, 1e-5).backward(dyt)
    assert_bf16_bound(dx, xb.grad, xd.grad, f"layernorm dinp {what}")
    assert_bf16_bound(dgamma, gb.grad, gd.grad, f"layernorm dgamma {what}")
    assert_bf16_bound(dbeta, bb.grad, bd.grad, f"layernorm dbeta {what}")


@pytest.mark.parametrize("rows, hidden", [(33, 7), (17, 768), (4500, 768), (17, 776), (9, 1000), (5, 12288)])
@pytest.mark.parametrize("start", [0, 1])
def test_layernorm_backward_with_an_addend(rows: int, hidden: int, start: int) -> None:
    """dinp + addend (a pre-LN block's residual gradient) in the kernel, rounded once: within the
    bound of torch's bfloat16 dinp plus the addend, from the float64 sum."""
    x, xt, dy, dyt, gamma, beta = _case(rows, hidden, start)
    add, addt = bf16_pair(rng_for("addend", rows, hidden).normal(size=(rows, hidden)))
    g, b = gpu(gamma), gpu(beta)
    _, mean, rstd = on_tensors(CUDA.ops.layernorm_fw, x, g, b, 1e-5)
    dx, _, _ = on_tensors(lambda *a: CUDA.ops.layernorm_bw(*a, addend=add._tensor), dy, x, g, mean, rstd)
    gt, bt = torch.from_numpy(gamma).cuda(), torch.from_numpy(beta).cuda()
    xd = xt.double().requires_grad_(True)
    F.layer_norm(xd, (hidden,), gt.double(), bt.double(), 1e-5).backward(dyt.double())
    xb = xt.clone().requires_grad_(True)
    F.layer_norm(xb, (hidden,), gt.bfloat16(), bt.bfloat16(), 1e-5).backward(dyt)
    what = f"[{rows}, {hidden}]{f' from element {start}' if start else ''}"
    assert_bf16_bound(dx, xb.grad + addt, xd.grad + addt.double(), f"layernorm dinp + addend {what}")


def test_layernorm_module_path_in_bfloat16() -> None:
    """Tensor.layernorm on a bfloat16 activation: bfloat16 out, float32 parameter gradients."""
    x, _ = bf16_pair(rng_for("module").normal(size=(4, 96)))
    x.requires_grad_(True)
    g, b = gpu(np.ones(96, np.float32), requires_grad=True), gpu(np.zeros(96, np.float32), requires_grad=True)
    out = x.layernorm(g, b)
    assert out.dtype is bfloat16
    out.sum().backward()
    assert x.grad.dtype is bfloat16 and g.grad.dtype is float32 and b.grad.dtype is float32
    np.testing.assert_allclose(values(b.grad), np.full(96, 4.0))
