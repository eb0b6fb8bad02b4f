"""The CUDA backend's embedding kernels (embedding_kernel.cu) on float32 rows, against NumPy: the row
gather, its scatter-add backward (float64 sums within float32 rounding; each row exactly the float32
sum in position order, the kernel's deterministic order, over runs of one id long and short), and
invalid ids (zero rows forward, no gradient backward). The bfloat16 rows are in test_bf16_embedding.py."""

from __future__ import annotations

import numpy as np
import pytest

from fused_testing import CUDA, assert_close, gpu, on_tensors, rng_for


@pytest.mark.parametrize("dim", [1, 3, 32, 33])
def test_embedding_gather_and_scatter_add(dim: int) -> None:
    r = rng_for("embedding", dim)
    V = 11
    weight = r.standard_normal((V, dim)).astype(np.float32)
    ids = r.integers(0, V, (3, 5)).astype(np.float32)
    ids[0, :3] = [0, V - 1, 0]  # ends of the table and a repeated id
    out = on_tensors(CUDA.ops.embedding_fw, gpu(weight), gpu(ids)).to_numpy()
    what = f"weight [{V}, {dim}], ids {ids.shape}"
    np.testing.assert_array_equal(out, weight[ids.astype(int)], err_msg=f"embedding gather, {what}")
    grad = r.standard_normal((3, 5, dim)).astype(np.float32)
    got = on_tensors(CUDA.ops.embedding_bw, gpu(grad), gpu(ids), V).to_numpy()
    want = np.zeros((V, dim), np.float64)
    np.add.at(want, ids.astype(int).reshape(-1), grad.reshape(-1, dim).astype(np.float64))
    assert_close(got, want, 1e-6, f"embedding scatter-add, {what}", scale=float(np.abs(grad).sum()))


def test_embedding_invalid_ids_give_zero_rows_and_no_gradient() -> None:
    r = rng_for("embedding-bad")
    weight = r.standard_normal((4, 8)).astype(np.float32)
    ids = np.array([1.0, 4.0, -1.0, 2.5, 3.0], np.float32)
    out = on_tensors(CUDA.ops.embedding_fw, gpu(weight), gpu(ids)).to_numpy()
    want = np.zeros((5, 8), np.float32)
    want[0], want[4] = weight[1], weight[3]
    np.testing.assert_array_equal(out, want, err_msg="ids 4, -1 and 2.5 are invalid for 4 rows and must give zero rows")
    got = on_tensors(CUDA.ops.embedding_bw, gpu(np.ones((5, 8), np.float32)), gpu(ids), 4).to_numpy()
    want_bw = np.zeros((4, 8), np.float32)
    want_bw[1] = want_bw[3] = 1.0
    np.testing.assert_array_equal(got, want_bw, err_msg="invalid ids must not receive gradient")


def test_embedding_scatter_sums_each_row_in_position_order() -> None:
    # 5,000 positions (the rows' blocks after a sort by row): one id at 3,000 of them, invalid ids between;
    # each row is the float32 sum in position order, added once to the zeros: equal to the bit
    r = rng_for("embedding-runs")
    n, V, dim = 5000, 300, 40
    ids = r.integers(0, V, n).astype(np.float32)
    ids[r.choice(n, 3000, replace=False)] = 7.0
    ids[::97] = -1.0
    grad = r.standard_normal((n, dim)).astype(np.float32)
    got = on_tensors(CUDA.ops.embedding_bw, gpu(grad), gpu(ids), V).to_numpy()
    want = np.zeros((V, dim), np.float32)
    seen = np.zeros(V, bool)
    for p in range(n):
        if ids[p] >= 0:
            row = int(ids[p])
            want[row] = want[row] + grad[p] if seen[row] else grad[p]
            seen[row] = True
    np.testing.assert_array_equal(got, want, err_msg="rows must be float32 sums in position order")
