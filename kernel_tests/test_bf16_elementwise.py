"""bfloat16 map / zip / reduce kernels (combine.cu) against torch float64 on the same bfloat16 inputs:
each within twice torch's own bfloat16 error; outputs stored as bfloat16 (bool and float32 where
the operands promote to those), odd sizes, broadcasts, permuted and misaligned views; the column
sums behind the bias gradients (bfloat16 or float32 rows, float32 sums)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import minitorch  # noqa: E402
from minitorch import bfloat16, float32  # noqa: E402

from bf16_testing import assert_bf16_bound, bf16_pair, values  # noqa: E402
from fused_testing import assert_close, gpu, rng_for  # noqa: E402
from minitorch.cuda import combine  # noqa: E402

F = torch.nn.functional
MAPS = {
    "gelu": (lambda t: t.gelu(), lambda x: F.gelu(x, approximate="tanh")),
    "relu": (lambda t: t.relu(), torch.relu),
    "exp": (lambda t: t.exp(), torch.exp),
    "tanh": (lambda t: t.tanh(), torch.tanh),
    "neg": (lambda t: -t, torch.neg),
    "scale": (lambda t: t * 0.3, lambda x: x * 0.3),
}


@pytest.mark.parametrize("name", list(MAPS))
@pytest.mark.parametrize("view", ["contiguous", "permuted", "misaligned"])
def test_map(name: str, view: str) -> None:
    ours_fn, torch_fn = MAPS[name]
    x, xt = bf16_pair(rng_for(name, view).uniform(-3, 3, (7, 33, 9)))
    if view == "permuted":
        x, xt = x.permute(2, 0, 1), xt.permute(2, 0, 1)
    elif view == "misaligned":
        x, xt = x.contiguous().view(7 * 33 * 9)[1:], xt.reshape(-1)[1:]
    out = ours_fn(x)
    assert out.dtype is bfloat16 and out.to_torch().dtype == torch.bfloat16
    assert_bf16_bound(out, torch_fn(xt), torch_fn(xt.double()), f"{name} {view}")


ZIPS = {
    "add": (lambda a, b: a + b, torch.add),
    "mul": (lambda a, b: a * b, torch.mul),
    "max": (lambda a, b: minitorch.Tensor(a.backend.max_zip(a._tensor, b._tensor), backend=a.backend), torch.maximum),
}


@pytest.mark.parametrize("name", list(ZIPS))
def test_zip_broadcast_and_permuted(name: str) -> None:
    ours_fn, torch_fn = ZIPS[name]
    rng = rng_for("zip", name)
    a, at = bf16_pair(rng.normal(size=(5, 31, 64)))
    bias, biast = bf16_pair(rng.normal(size=(64,)))
    other, othert = bf16_pair(rng.normal(size=(64, 5, 31)))
    other, othert = other.permute(1, 2, 0), othert.permute(1, 2, 0)
    for b, bt, what in ((a, at, "same layout"), (bias, biast, "broadcast row"), (other, othert, "permuted")):
        out = ours_fn(a, b)
        assert out.dtype is bfloat16 and out.to_torch().dtype == torch.bfloat16
        assert_bf16_bound(out, torch_fn(at, bt), torch_fn(at.double(), bt.double()), f"{name} {what}")


def test_mixed_storage_operands() -> None:
    rng = rng_for("mixed")
    x, xt = bf16_pair(rng.normal(size=(3, 1001)))
    y = rng.normal(size=(3, 1001)).astype(np.float32)
    s = x + gpu(y)
    assert s.dtype is float32, "bfloat16 + float32 promotes to float32"
    np.testing.assert_allclose(values(s), values(xt) + y.astype(np.float64), rtol=1e-6, atol=1e-6)
    mask = gpu(rng.random((3, 1001)) < 0.5) == 1.0
    assert mask.dtype is minitorch.bool_
    kept = x * mask
    assert kept.dtype is bfloat16, "bfloat16 * bool stays bfloat16"
    np.testing.assert_array_equal(values(kept), values(xt) * values(mask.float().to_torch()))
    less = x < 0.25
    assert less.dtype is minitorch.bool_
    np.testing.assert_array_equal(values(less.float().to_torch()), (values(xt) < 0.25).astype(np.float64))


def test_a_zero_dim_float32_operand_keeps_bfloat16_and_its_values() -> None:
    """bfloat16 [3, 1001] times a 0-dim float32 (the 0-dim rule: bfloat16), through the backend op
    itself (as autodiff calls it) and through Tensor *: torch's bf16 values (products in float32,
    rounded once); and the gradient of a float32 leaf read through a bfloat16 cast, times a 0-dim
    float32, is that scalar (the float32 products were once relabelled as bfloat16 bytes)."""
    rng = rng_for("zero-dim")
    x, xt = bf16_pair(rng.normal(size=(3, 1001)))
    half = gpu(np.array(0.5, np.float32))
    for out in (x * half, x._new(x.backend.mul_zip(x._tensor, half._tensor))):
        assert out.dtype is bfloat16
        np.testing.assert_array_equal(values(out), values(xt * torch.tensor(0.5, device="cuda")))
    leaf = gpu(rng.normal(size=(300, 64)).astype(np.float32)).requires_grad_(True)
    (leaf.to(bfloat16) * gpu(np.array(0.25, np.float32))).sum().backward()
    np.testing.assert_array_equal(leaf.grad.to_numpy(), np.full((300, 64), 0.25, np.float32))


def test_dropout_keeps_bfloat16_and_scales_kept_values() -> None:
    x, xt = bf16_pair(rng_for("dropout").normal(size=(64, 257)))
    minitorch.manual_seed(3)
    out = minitorch.nn.dropout(x, 0.25)
    assert out.dtype is bfloat16
    got, want = values(out), values(xt)
    kept = got != 0.0
    assert 0.7 < kept.mean() < 0.8, f"kept fraction {kept.mean():.3f} for p = 0.25"
    scaled = (xt.float() * (1.0 / 0.75)).bfloat16().double().cpu().numpy()
    np.testing.assert_array_equal(got[kept], scaled[kept])


@pytest.mark.parametrize("name", ["sum", "max"])
@pytest.mark.parametrize("shape, dim", [((33, 1023), 1), ((4097, 7), 0), ((3, 70001), 1), ((5, 9, 11), 1)])
def test_reduce_accumulates_in_float32(name: str, shape, dim: int) -> None:
    x, xt = bf16_pair(rng_for(name, shape, dim).normal(size=shape))
    ours = x.sum(dim, keepdim=True) if name == "sum" else minitorch.Tensor(x.backend.max_reduce(x._tensor, dim), backend=x.backend)
    assert ours.dtype is bfloat16
    theirs = xt.sum(dim, keepdim=True) if name == "sum" else xt.amax(dim, keepdim=True)
    ref = xt.double().sum(dim, keepdim=True) if name == "sum" else xt.double().amax(dim, keepdim=True)
    assert_bf16_bound(ours, theirs, ref, f"{name} over dim {dim} of {shape}")


def test_gelu_backward_in_bfloat16() -> None:
    x, xt = bf16_pair(rng_for("gelu back").uniform(-3, 3, (17, 129)))
    x.requires_grad_(True)
    x.gelu().sum().backward()
    assert x.grad is not None and x.grad.dtype is bfloat16
    xd = xt.double().requires_grad_(True)
    F.gelu(xd, approximate="tanh").sum().backward()
    xb = xt.clone().requires_grad_(True)
    F.gelu(xb, approximate="tanh").sum().backward()
    assert_bf16_bound(x.grad, xb.grad, xd.grad, "gelu backward")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n,ld,offset", [(768, 768, 0), (770, 776, 0), (3071, 3072, 0), (768, 776, 1), (5, 8, 0)])
def test_column_sums_of_row_blocks(dtype: str, n: int, ld: int, offset: int) -> None:
    """combine.column_sums over [rows, n] blocks of rows ld apart (a bias gradient, a classifier
    chunk's dbias): by four adjacent columns where the rows are aligned for it (n not a multiple of 4:
    a short last group), else one column a thread; float32 sums of the stored values."""
    rows = 1000
    x = rng_for("column-sums", dtype, n, ld, offset).standard_normal((rows * ld + offset,)).astype(np.float32)
    src = torch.from_numpy(x).to("cuda", getattr(torch, dtype))
    stored = src.double().cpu().numpy()[offset:].reshape(rows, ld)[:, :n]
    out = torch.full((n,), float("nan"), dtype=torch.float32, device="cuda")
    combine.column_sums(out.data_ptr(), src.data_ptr() + offset * src.element_size(), n, rows, ld,
                        getattr(minitorch, dtype))  # fmt: skip
    torch.cuda.synchronize()
    what = f"column sums of [{rows}, {n}] {dtype}, rows {ld} apart"
    assert_close(out.double().cpu().numpy(), stored.sum(0), 1e-5, what, scale=float(np.abs(stored).sum(0).max()))
