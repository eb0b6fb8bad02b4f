"""The multi-tensor AdamW with bfloat16 working copies and bfloat16 gradients (optimizer_kernel.cu):
the float32 masters follow torch.optim.AdamW (float64) on the same gradient values, the working
copy is the master rounded to bfloat16 (to nearest even) after every step, kept in place, and a
float32 step without working copies is unchanged by them."""

from __future__ import annotations

import numpy as np
import pytest

import minitorch
from minitorch import AdamW, Parameter, bfloat16

from fused_testing import rel_err

torch = pytest.importorskip("torch")

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)
# Around the 4-element tail, two chunks of 32768 and a bit, a matrix.
SHAPES = [(1,), (7,), (4099,), (32768 * 2 + 5,), (257, 129)]
STEPS = 4


@pytest.mark.parametrize("grad_dtype", ["float32", "bfloat16"])
def test_working_copies_follow_the_masters(grad_dtype: str) -> None:
    rng = np.random.default_rng(7)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    ours = [Parameter(minitorch.tensor_from_numpy(v, backend=CUDA)) for v in init]
    plain = [Parameter(minitorch.tensor_from_numpy(v, backend=CUDA)) for v in init]
    theirs = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in init]
    opt = AdamW(ours, lr=1e-2, weight_decay=0.1, max_grad_norm=5.0, working_dtype=bfloat16)
    opt_plain = AdamW(plain, lr=1e-2, weight_decay=0.1, max_grad_norm=5.0)
    ref = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1)
    copies = [opt.working_copy(p) for p in ours]
    pointers = [w._tensor._storage.data_ptr() for w in copies]
    for w, v in zip(copies, init):
        assert w.dtype is bfloat16
        np.testing.assert_array_equal(w.to_numpy(), bfloat16.round(v))
    for step in range(STEPS):
        for p, q, t, s in zip(ours, plain, theirs, SHAPES):
            g = bfloat16.round((rng.standard_normal(s) * 0.3).astype(np.float32))
            grad = minitorch.tensor_from_numpy(g, backend=CUDA)
            p.value.grad = grad.to(bfloat16) if grad_dtype == "bfloat16" else grad
            q.value.grad = minitorch.tensor_from_numpy(g, backend=CUDA)
            t.grad = torch.tensor(g, dtype=torch.float64)
        norm = float(np.sqrt(sum(float((t.grad**2).sum()) for t in theirs)))
        for t in theirs:
            t.grad *= min(1.0, 5.0 / norm)
        opt.step()
        opt_plain.step()
        ref.step()
        for i, (p, q, t) in enumerate(zip(ours, plain, theirs)):
            master = p.value.to_numpy()
            np.testing.assert_array_equal(master, q.value.to_numpy(), err_msg=f"{SHAPES[i]}: masters differ")
            assert rel_err(master, t.detach().numpy()) < 1e-5, f"{SHAPES[i]} after step {step + 1}"
            w = opt.working_copy(p)
            assert w is copies[i] and w._tensor._storage.data_ptr() == pointers[i], "the working copy moved"
            np.testing.assert_array_equal(w.to_numpy(), bfloat16.round(master), err_msg=f"{SHAPES[i]} working copy")


def test_launcher_rejects_a_bad_working_copy() -> None:
    p = Parameter(minitorch.tensor_from_numpy(np.ones(5, np.float32), backend=CUDA))
    opt = AdamW([p], working_dtype=bfloat16)
    opt.working[0] = minitorch.tensor_from_numpy(np.ones(4, np.float32), backend=CUDA).to(bfloat16)
    p.value.grad = minitorch.tensor_from_numpy(np.ones(5, np.float32), backend=CUDA)
    with pytest.raises(ValueError, match="working copy"):
        opt.step()
