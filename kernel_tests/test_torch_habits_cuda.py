"""Issue 33 on the CUDA backend: tests/torch_habits.py's table of the calls a PyTorch user types
first, against torch (values, dtypes, shapes, gradients), and the int64 kernels (int_kernel.cu) and
the index ops directly: exact beyond 2^24, casts, sorts of every row length up to the kernel's
limit, NaN in argmax/argmin, and the device-side answers to bad input where checking would need a
device-to-host copy (a NaN loss, zero rows, 0 for a zero divisor)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import minitorch
from minitorch import nn
from minitorch.cuda import integer
from tests.torch_habits import CASES, check

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_call_matches_torch_on_cuda(case) -> None:
    check(case, CUDA)


def test_int64_elementwise_and_reductions_are_exact() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(-(2**62), 2**62, (5, 33), dtype=np.int64)
    b = rng.integers(1, 2**20, (33,), dtype=np.int64) * rng.choice([-1, 1], 33)
    ta, tb = minitorch.tensor(a, backend=CUDA), minitorch.tensor(b, backend=CUDA)
    with np.errstate(over="ignore"):
        expected = {"+": a + b, "*": a * b, "//": a // b, "%": a % b, "max": np.maximum(a, b), "abs": np.abs(a),
                    "sum": a.sum(1), "amax": a.max(0), "amin": a.min(1), "cumsum": a.cumsum(1), "+ 7": a + 7}  # fmt: skip
    got = {"+": ta + tb, "*": ta * tb, "//": ta // tb, "%": ta % tb, "max": ta.maximum(tb), "abs": ta.abs(),
           "sum": ta.sum(1), "amax": ta.amax(0), "amin": ta.amin(1), "cumsum": ta.cumsum(1), "+ 7": ta + 7}  # fmt: skip
    for name, out in got.items():
        assert out.dtype == minitorch.int64, name
        np.testing.assert_array_equal(out.numpy(), expected[name], err_msg=name)
    np.testing.assert_array_equal((ta < tb).numpy(), a < b)
    np.testing.assert_array_equal((ta.permute(1, 0) == 3).numpy(), a.T == 3)


def test_int64_casts_fill_arange_and_gather_rows() -> None:
    big = np.array([2**53 + 1, -(2**40) - 3, 16777217, 0], dtype=np.int64)
    t = minitorch.tensor(big, backend=CUDA)
    np.testing.assert_array_equal(t.float().numpy(), big.astype(np.float32))
    np.testing.assert_array_equal(minitorch.tensor([-2.7, 2.7, 1e10], backend=CUDA).long().numpy(), [-2, 2, 10**10])
    np.testing.assert_array_equal(t.to(minitorch.bfloat16).float().numpy(), minitorch.tensor(big).to(minitorch.bfloat16).float().numpy())
    np.testing.assert_array_equal(minitorch.full((3,), 2**45 + 1, device=CUDA).numpy(), [2**45 + 1] * 3)
    np.testing.assert_array_equal(minitorch.arange(70000, device=CUDA).numpy(), np.arange(70000))
    table = minitorch.tensor(np.arange(12).reshape(4, 3) * 2**33, backend=CUDA)
    picked = table[minitorch.tensor([3, 0, 3], backend=CUDA)]
    np.testing.assert_array_equal(picked.numpy(), (np.arange(12).reshape(4, 3) * 2**33)[[3, 0, 3]])


@pytest.mark.parametrize("length", [1, 2, 3, 33, 1000, integer.MAX_SORT_ROW])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_rows_of_every_length_are_stable(length: int, descending: bool) -> None:
    rng = np.random.default_rng(length)
    x = rng.integers(-5, 5, (3, length)).astype(np.float32)  # many ties
    x[0, :: max(length // 3, 1)] = np.nan
    t = minitorch.tensor(x, backend=CUDA)
    for values in (x, x.astype(np.int64)) if length > 1 else (x,):
        ours = minitorch.tensor(values, backend=CUDA).sort(1, descending=descending)
        ref = torch.tensor(values).sort(dim=1, descending=descending, stable=True)
        np.testing.assert_array_equal(ours.indices.numpy(), ref.indices.numpy())
        np.testing.assert_array_equal(ours.values.numpy(), ref.values.numpy())
    with pytest.raises(minitorch.IndexingError, match="sort on CUDA handles rows of up to 4096"):
        minitorch.zeros(2, integer.MAX_SORT_ROW + 1, device=CUDA).sort()
    assert t.argsort(0).dtype == minitorch.int64


def test_nan_in_argmax_argmin_and_max() -> None:
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 5.0, 5.0, -1.0]], np.float32)
    t = minitorch.tensor(x, backend=CUDA)
    np.testing.assert_array_equal(t.argmax(1).numpy(), [1, 1])
    np.testing.assert_array_equal(t.argmin(1).numpy(), [1, 3])
    np.testing.assert_array_equal(t.amax(1).numpy(), [np.nan, 5.0])
    np.testing.assert_array_equal(t.max().numpy(), np.nan)


def test_bad_input_on_the_device_is_loud_without_a_host_copy() -> None:
    logits = minitorch.zeros(3, 4, device=CUDA)
    for bad in ([0, 4, 1], [0, -1, 1], [0.0, 1.5, 1.0]):
        loss = nn.cross_entropy(logits, minitorch.tensor(bad, backend=CUDA))
        assert np.isnan(loss.item()), f"targets {bad}: a finite loss"
    assert not np.isnan(nn.cross_entropy(logits, minitorch.tensor([0, -100, 1], backend=CUDA)).item())
    x = minitorch.tensor([[1.0, 2.0], [3.0, 4.0]], backend=CUDA)
    np.testing.assert_array_equal(x.gather(1, minitorch.tensor([[1], [5]], backend=CUDA)).numpy(), [[2.0], [0.0]])
    np.testing.assert_array_equal((minitorch.tensor([7, 8], backend=CUDA) // 0).numpy(), [0, 0])
    with pytest.raises(minitorch.NoKernelError, match="no int64 CUDA kernel for 'matmul'"):
        minitorch.tensor([[1, 2]], backend=CUDA) @ minitorch.tensor([[1], [2]], backend=CUDA)
