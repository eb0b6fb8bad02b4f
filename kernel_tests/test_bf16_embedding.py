"""bfloat16 embedding kernels (embedding_kernel.cu): bfloat16 rows gathered from a float32 master or a
bfloat16 table (rounded once: exactly torch's .bfloat16() of the rows), invalid ids giving zero rows,
and the backward's float32 scatter-add of bfloat16 row gradients, against float64 sums (within
twice the error of torch's bfloat16 index_add), from zeros or from a given table (a tied head's
gradient); odd widths take the scalar path."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import minitorch  # noqa: E402
from minitorch import bfloat16, float32  # noqa: E402

from bf16_testing import assert_bf16_bound, bf16_pair, values  # noqa: E402
from fused_testing import CUDA, gpu, on_tensors, rng_for  # noqa: E402


@pytest.mark.parametrize("dim", [1, 7, 64, 768])
@pytest.mark.parametrize("table", ["float32", "bfloat16"])
def test_gather_rounds_rows_once(dim: int, table: str) -> None:
    rng = rng_for("embedding", dim, table)
    w = rng.standard_normal((50, dim)).astype(np.float32)
    weight = gpu(w) if table == "float32" else gpu(w).to(bfloat16)
    ids = np.array([[3, 49, 3, 0], [7, 50, -1, 2.5]], np.float32)  # 50, -1, 2.5: invalid, zero rows
    rows = on_tensors(CUDA.ops.embedding_fw, weight, gpu(ids), bfloat16)
    assert rows.dtype is bfloat16
    want = torch.from_numpy(w).bfloat16().double().numpy()[[[3, 49, 3, 0], [7, 0, 0, 0]]]
    want[1, 1:] = 0.0
    np.testing.assert_array_equal(values(rows), want)


@pytest.mark.parametrize("dim", [7, 768, 1030])
def test_scatter_add_sums_bfloat16_gradients_in_float32(dim: int) -> None:
    rng = rng_for("embedding bw", dim)
    V, n = 40, 3000  # many repeats per id: float32 sums stay accurate where bfloat16 ones drift
    ids = rng.integers(0, V, n).astype(np.float32)
    dy, dyt = bf16_pair(rng.standard_normal((n, dim)))
    grad = on_tensors(CUDA.ops.embedding_bw, dy, gpu(ids), V, float32)
    assert grad.dtype is float32
    index = torch.from_numpy(ids).long().cuda()
    ref = torch.zeros(V, dim, dtype=torch.float64, device="cuda").index_add_(0, index, dyt.double())
    theirs = torch.zeros(V, dim, dtype=torch.bfloat16, device="cuda").index_add_(0, index, dyt)
    assert_bf16_bound(grad, theirs, ref, f"embedding scatter-add dim={dim}")
    np.testing.assert_allclose(values(grad), ref.cpu().numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dim", [7, 768])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_scatter_add_into_an_initial_table(dim: int, layout: str) -> None:
    """embedding_bw(initial=): each touched row is the initial row plus the float32 sum of its rows'
    gradients; untouched rows are the initial rows, exactly (also read through a transposed view, as a
    tied head's [C, V] gradient is)."""
    rng = rng_for("embedding initial", dim, layout)
    V, n = 40, 300
    ids = rng.integers(0, V // 2, n).astype(np.float32)  # rows V/2.. untouched
    dy, dyt = bf16_pair(rng.standard_normal((n, dim)))
    start = rng.standard_normal((V, dim)).astype(np.float32)
    initial = gpu(start) if layout == "contiguous" else gpu(np.ascontiguousarray(start.T)).transpose(0, 1)
    grad = on_tensors(lambda *a: CUDA.ops.embedding_bw(*a, initial=initial._tensor), dy, gpu(ids), V, float32)
    index = torch.from_numpy(ids).long().cuda()
    sums = torch.zeros(V, dim, dtype=torch.float32, device="cuda").index_add_(0, index, dyt.float())
    got, ref = values(grad), start.astype(np.float64) + sums.double().cpu().numpy()
    np.testing.assert_array_equal(got[V // 2 :], start[V // 2 :])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4, err_msg=f"scatter-add into an initial table, {layout}")


def test_embedding_module_path_mixed_precision() -> None:
    w = gpu(rng_for("module").standard_normal((10, 16)).astype(np.float32), requires_grad=True)
    rows = minitorch.fused.embedding(w, gpu(np.array([1.0, 1.0, 4.0])), dtype=bfloat16)
    assert rows.dtype is bfloat16
    rows.sum().backward()
    assert w.grad.dtype is float32
    want = np.zeros((10, 16))
    want[1], want[4] = 2.0, 1.0
    np.testing.assert_array_equal(values(w.grad), want)
