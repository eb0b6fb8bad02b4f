"""bfloat16 attention softmax (softmax_kernel.cu), forward and backward, against torch float64 on the
same bfloat16 scores: within twice torch's own bfloat16 softmax error; padding (-inf) and causal
masks, rows with every key removed, every size bucket (sub-warp, warp, block, streaming) and the
scalar path (odd lengths, misaligned buffers)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from minitorch import bfloat16  # noqa: E402

from bf16_testing import assert_bf16_bound, bf16_pair, values  # noqa: E402
from fused_testing import CUDA, gpu, on_tensors, rng_for  # noqa: E402

LENGTHS = [1, 7, 32, 100, 1024, 1025, 4097, 16384, 20000]


def _torch_softmax(x, mask, causal: bool):
    """torch's softmax of x + mask with causal keys removed, in x's dtype (the mask's 0 and -inf
    add exactly, so x + mask rounds to nothing new)."""
    B, H, Tq, Tk = x.shape
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    s = x.to(wide) + (0 if mask is None else mask.to(wide).view(B, 1, 1, Tk))
    if causal:
        keep = torch.ones(Tq, Tk, dtype=torch.bool, device=x.device).tril(Tk - Tq)
        s = s.masked_fill(~keep, float("-inf"))
    y = torch.softmax(s.to(x.dtype), -1)
    return torch.nan_to_num(y, nan=0.0)


@pytest.mark.parametrize("Tk", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_softmax_forward_and_backward(Tk: int, causal: bool) -> None:
    rng = rng_for("softmax", Tk, causal)
    B, H, Tq = 3, 2, min(Tk, 5)
    misaligned = Tk % 4 == 0 and Tk < 2000  # also the scalar path of an aligned length
    n = B * H * Tq * Tk
    x, xt = bf16_pair(rng.normal(0.0, 3.0, n + 1))
    start = 1 if misaligned else 0
    x, xt = x[start : start + n].view(B, H, Tq, Tk), xt[start : start + n].view(B, H, Tq, Tk)
    mask = np.zeros((B, Tk), np.float32)
    mask[1, max(1, Tk // 2) :] = -np.inf
    mask[2, :] = -np.inf  # no key left: a row of zeros
    maskt = torch.from_numpy(mask).cuda()
    out = on_tensors(CUDA.ops.attn_softmax_fw, x, gpu(mask), causal)
    assert out.dtype is bfloat16
    ref = _torch_softmax(xt.double(), maskt.double(), causal)
    theirs = _torch_softmax(xt, maskt, causal)
    assert_bf16_bound(out, theirs, ref, f"softmax Tk={Tk} causal={causal}")
    assert (values(out)[2] == 0.0).all(), "a row with every key removed must be zeros"

    dy, dyt = bf16_pair(rng.normal(size=(B, H, Tq, Tk)))
    grad = on_tensors(CUDA.ops.attn_softmax_bw, dy, out)
    assert grad.dtype is bfloat16
    y64, g64 = values(out), values(dyt)
    ref_grad = y64 * (g64 - (g64 * y64).sum(-1, keepdims=True))
    yt = out.to_torch()
    theirs_grad = torch._softmax_backward_data(dyt, yt, -1, torch.bfloat16)
    assert_bf16_bound(grad, theirs_grad, torch.from_numpy(ref_grad), f"softmax backward Tk={Tk} causal={causal}")
