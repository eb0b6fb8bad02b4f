"""The CUDA backend's ops (TensorData in, TensorData out) against float64 references (NumPy,
minitorch.operators): storage and transfers, fill/arange/uniform, map/zip/reduce, matmul and the
launch path (errors, stream); the embedding kernels are in test_embedding_cuda.py.  Tensor operations on this backend
(autodiff, training, the checks of the public entry) are tested in test_cuda_functions.py.

Inputs are seeded-random over shapes chosen to hit the kernels' edge cases: sizes 1, 3, 33, 1023
(partial float4 groups, partial warps and tiles), broadcasting, permuted (non-contiguous) layouts,
batched 4-D matmul in every transpose combination, and reductions long enough to take the
split-into-partials path.  Errors are measured as max|out - ref| / max(|ref|, tiny) (or against the
magnitude bound of the computation for sums and products) and reported with the shapes involved.
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple

import numpy as np
import pytest

import minitorch
from minitorch import cuda_kernel_ops as cko
from minitorch import operators
from minitorch.cuda import combine
from minitorch.cuda.layout import layout
from minitorch.cuda.runtime import check, runtime

from fused_testing import CUDA, Array, assert_close, gpu, on_tensors, permuted_gpu, rng_for


# ---- helpers -------------------------------------------------------------------------------------
def assert_elementwise_close(out: Array, ref: Array, what: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """|out - ref| <= atol + rtol * |ref| everywhere (NaN where ref is NaN)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, f"{what}: result shape {out.shape}, expected {ref.shape}"
    with np.errstate(invalid="ignore"):
        ok = (np.abs(out - ref) <= atol + rtol * np.abs(ref)) | (np.isnan(out) & np.isnan(ref)) | (out == ref)
    if not ok.all():
        idx = np.argwhere(~ok)[:5]
        got = [out[tuple(i)] for i in idx]
        want = [ref[tuple(i)] for i in idx]
        raise AssertionError(
            f"{what}: {int((~ok).sum())} of {ok.size} elements differ; at {idx.tolist()}: got {got}, want {want}"
        )


UNARY_DOMAIN: Dict[str, Callable[[np.random.Generator, Tuple[int, ...]], Array]] = {
    "log": lambda r, s: r.uniform(0.01, 10.0, s),
    "inv": lambda r, s: r.choice([-1.0, 1.0], s) * r.uniform(0.1, 10.0, s),
}
BINARY_DOMAIN: Dict[str, Callable[[np.random.Generator, Tuple[int, ...]], Array]] = {
    "pow": lambda r, s: r.uniform(0.1, 3.0, s),
    "log_back": lambda r, s: r.uniform(0.1, 10.0, s),
    "inv_back": lambda r, s: r.choice([-1.0, 1.0], s) * r.uniform(0.1, 10.0, s),
}


def sample(name: str, domain: Dict[str, Callable], r: np.random.Generator, shape: Tuple[int, ...]) -> Array:
    gen = domain.get(name)
    x = gen(r, shape) if gen is not None else r.standard_normal(shape) * 2.0
    return x.astype(np.float32)


def reference(fn: Callable, *arrays: Array) -> Array:
    """fn from minitorch.operators applied in float64, elementwise with numpy broadcasting."""
    args = np.broadcast_arrays(*[np.asarray(a, dtype=np.float64) for a in arrays])
    return np.vectorize(fn, otypes=[np.float64])(*args)


# ---- storage, transfers, generators ---------------------------------------------------------------
def test_storage_roundtrip_and_transfer_counts() -> None:
    x = rng_for("roundtrip").standard_normal((3, 33)).astype(np.float32)
    cko.reset_transfer_stats()
    t = gpu(x)
    stats = cko.transfer_stats()
    assert stats["h2d"] == 1, f"making a CUDA tensor should copy once host->device: {stats}"
    np.testing.assert_array_equal(t.to_numpy(), x)
    stats = cko.transfer_stats()
    assert stats["d2h"] == 1 and stats["d2h_bytes"] >= x.nbytes, f"to_numpy should copy once device->host: {stats}"
    cko.reset_transfer_stats()
    assert cko.transfer_stats() == {"h2d": 0, "d2h": 0, "h2d_bytes": 0, "d2h_bytes": 0}


@pytest.mark.parametrize("shape", [(1,), (3,), (33,), (1023,), (4, 33, 5)])
def test_fill_and_zeros(shape: Tuple[int, ...]) -> None:
    t = minitorch.full(shape, 2.5, backend=CUDA)
    np.testing.assert_array_equal(t.to_numpy(), np.full(shape, 2.5, np.float32), err_msg=f"full {shape}")
    z = minitorch.zeros(shape, backend=CUDA)
    np.testing.assert_array_equal(z.to_numpy(), np.zeros(shape, np.float32), err_msg=f"zeros {shape}")


def test_fill_non_contiguous_view_writes_only_the_view() -> None:
    base = gpu(np.zeros((4, 6), np.float32))
    CUDA.ops.fill(minitorch.TensorData(base._tensor._storage, (3, 2), (6, 2)), 7.0)
    want = np.zeros((4, 6), np.float32)
    want[:3, 0:4:2] = 7.0
    np.testing.assert_array_equal(base.to_numpy(), want, err_msg="fill of a strided view [3, 2] strides (6, 2)")


@pytest.mark.parametrize("n", [1, 3, 33, 1023, 100_003])
def test_arange(n: int) -> None:
    t = minitorch.zeros((n,), backend=CUDA)._arange(n)
    np.testing.assert_array_equal(t.to_numpy(), np.arange(n, dtype=np.float32), err_msg=f"arange({n})")


@pytest.mark.parametrize("shape", [(1,), (3,), (33,), (1023,), (257, 1001)])
def test_uniform_range_determinism_and_moments(shape: Tuple[int, ...]) -> None:
    a = minitorch.zeros(shape, backend=CUDA)
    b = minitorch.zeros(shape, backend=CUDA)
    c = minitorch.zeros(shape, backend=CUDA)
    CUDA.ops.uniform(a._tensor, 1234)
    CUDA.ops.uniform(b._tensor, 1234)
    CUDA.ops.uniform(c._tensor, 1235)
    x, y, z = a.to_numpy(), b.to_numpy(), c.to_numpy()
    assert ((x >= 0.0) & (x < 1.0)).all(), f"uniform {shape}: values outside [0, 1): min {x.min()}, max {x.max()}"
    np.testing.assert_array_equal(x, y, err_msg=f"uniform {shape}: same seed gave different values")
    if x.size > 1:
        assert (x != z).any(), f"uniform {shape}: seeds 1234 and 1235 gave identical values"
    if x.size >= 100_000:
        assert abs(x.mean() - 0.5) < 0.005 and abs(x.var() - 1.0 / 12.0) < 0.003, (
            f"uniform {shape}: mean {x.mean():.4f} (want 0.5), var {x.var():.4f} (want {1 / 12:.4f})"
        )
        assert len(np.unique(x)) > 0.95 * x.size, f"uniform {shape}: only {len(np.unique(x))} distinct values"


def test_uniform_permuted_out_matches_logical_order() -> None:
    flat = minitorch.zeros((6, 5), backend=CUDA)
    CUDA.ops.uniform(flat._tensor, 99)
    view = minitorch.zeros((5, 6), backend=CUDA).permute(1, 0)
    CUDA.ops.uniform(view._tensor, 99)
    np.testing.assert_array_equal(view.to_numpy(), flat.to_numpy(), err_msg="uniform on a permuted [6, 5] view")


# ---- elementwise ------------------------------------------------------------------------------------
MAP_SHAPES = [(1,), (3,), (33,), (1023,), (4, 33, 5), (2, 3, 1, 7)]


@pytest.mark.parametrize("name", combine.UNARY_OPS)
@pytest.mark.parametrize("shape", MAP_SHAPES)
def test_map_contiguous(name: str, shape: Tuple[int, ...]) -> None:
    fn = getattr(operators, name)
    x = sample(name, UNARY_DOMAIN, rng_for("map", name, shape), shape)
    out = on_tensors(CUDA.ops.map(fn), gpu(x)).to_numpy()
    assert_elementwise_close(out, reference(fn, x), f"map({name}) on {shape}")


@pytest.mark.parametrize("name", combine.UNARY_OPS)
def test_map_permuted_input(name: str) -> None:
    fn = getattr(operators, name)
    x = sample(name, UNARY_DOMAIN, rng_for("map-perm", name), (5, 33, 3))
    t = permuted_gpu(x, (2, 0, 1))
    out = on_tensors(CUDA.ops.map(fn), t).to_numpy()
    assert_elementwise_close(out, reference(fn, x), f"map({name}) on a permuted [5, 33, 3] view")


def test_map_special_values() -> None:
    x = np.array([0.0, -0.0, -1.0, np.inf, -np.inf, np.nan, 1e-30, 88.0, 89.0, -100.0], np.float32)
    for name in combine.UNARY_OPS:
        fn = getattr(operators, name)
        with np.errstate(all="ignore"):
            out = on_tensors(CUDA.ops.map(fn), gpu(x)).to_numpy()
            ref = np.array([_safe(fn, float(v)) for v in x], np.float32)
        if name == "exp":
            ref[np.isnan(x)] = np.nan  # operators.exp sends nan down its overflow branch (inf); IEEE gives nan
        assert_elementwise_close(out, ref, f"map({name}) on special values {x.tolist()}")


def _safe(fn: Callable, *args: float) -> float:
    try:
        return fn(*args)
    except (OverflowError, ValueError, ZeroDivisionError):
        return float("nan")


def test_map_into_out_broadcasts_and_writes_strided_out() -> None:
    x = rng_for("map-out").standard_normal((1, 33)).astype(np.float32)
    out = minitorch.zeros((33, 7), backend=CUDA).permute(1, 0)  # [7, 33], non-contiguous
    result = on_tensors(CUDA.ops.map(operators.neg), gpu(x), out)
    assert result._tensor is out._tensor, "map into out must return out"
    want = np.broadcast_to(-x, (7, 33))
    assert_elementwise_close(out.to_numpy(), want, "map(neg) of [1, 33] into a permuted [7, 33] out")


BROADCAST_PAIRS = [
    ((1,), (1,)),
    ((3,), (1,)),
    ((33,), (33,)),
    ((1023,), (1,)),
    ((4, 1, 3), (5, 3)),
    ((2, 3, 4, 5), (3, 1, 5)),
    ((7, 1), (1, 33)),
]


@pytest.mark.parametrize("name", combine.BINARY_OPS)
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS)
def test_zip_broadcast(name: str, shapes: Tuple[Tuple[int, ...], Tuple[int, ...]]) -> None:
    fn = getattr(operators, name)
    r = rng_for("zip", name, shapes)
    a = sample(name, BINARY_DOMAIN, r, shapes[0])
    b = sample(name if name == "pow" else "", BINARY_DOMAIN, r, shapes[1])
    if name in ("eq", "is_close", "lt", "max"):
        a, b = np.round(a), np.round(b)  # ties and near-ties do occur
    out = on_tensors(CUDA.ops.zip(fn), gpu(a), gpu(b)).to_numpy()
    assert_elementwise_close(out, reference(fn, a, b), f"zip({name}) of {shapes[0]} and {shapes[1]}", atol=1e-5)


@pytest.mark.parametrize("name", ["add", "mul", "max", "gelu_back", "pow"])
def test_zip_permuted_and_expanded(name: str) -> None:
    fn = getattr(operators, name)
    r = rng_for("zip-perm", name)
    a = sample(name, BINARY_DOMAIN, r, (6, 33, 4))
    b = sample(name if name == "pow" else "", BINARY_DOMAIN, r, (33, 1))
    ta = permuted_gpu(a, (1, 2, 0))  # a, stored as [4, 6, 33]
    tb = gpu(b).expand((6, 33, 4))  # stride-0 view
    out = on_tensors(CUDA.ops.zip(fn), ta, tb).to_numpy()
    what = f"zip({name}) of a permuted [6, 33, 4] and an expanded [33, 1]"
    assert_elementwise_close(out, reference(fn, a, b), what, atol=1e-5)


@pytest.mark.parametrize("offset", [0, 1])  # 16-byte aligned views (four at a time), and misaligned ones
def test_heads_permuted_copies_and_slices(offset: int) -> None:
    """The copies attention makes: [B, T, H, D] heads to [B, H, T, D] and back into one third of a
    packed [B, T, 3, H, D] tensor (units of D = 8 contiguous floats on both sides), and a sum whose
    inputs are such views; the four-at-a-time path where the views allow it, the scalar one elsewhere."""
    r = rng_for("heads", offset)
    x = r.standard_normal((2, 5, 3, 8)).astype(np.float32)
    storage = gpu(np.concatenate([np.zeros(offset, np.float32), x.ravel()]))
    t = storage._new(minitorch.TensorData(storage._tensor._storage[offset:], x.shape))
    heads = t.permute(0, 2, 1, 3).contiguous()
    assert_elementwise_close(heads.to_numpy(), x.transpose(0, 2, 1, 3), f"heads copy (offset {offset})")
    packed = minitorch.zeros((2, 5, 3, 3, 8), backend=CUDA)
    packed[:, :, 1].copy_(heads.permute(0, 2, 1, 3))
    want = np.zeros((2, 5, 3, 3, 8), np.float32)
    want[:, :, 1] = x
    assert_elementwise_close(packed.to_numpy(), want, f"copy into a third of a packed tensor (offset {offset})")
    total = (t.permute(0, 2, 1, 3) + heads).to_numpy()
    assert_elementwise_close(total, 2 * x.transpose(0, 2, 1, 3), f"sum of permuted views (offset {offset})")


@pytest.mark.parametrize("name", ["add", "mul", "pow", "lt", "eq", "max"])
@pytest.mark.parametrize("shape", [(1,), (33,), (1023,), (3, 5, 7)])
def test_map_scalar(name: str, shape: Tuple[int, ...]) -> None:
    fn = getattr(operators, name)
    r = rng_for("scalar", name, shape)
    x = sample(name, BINARY_DOMAIN, r, shape)
    for s in (0.0, 2.0, -1.5, 0.5):
        if name == "eq":
            x = np.round(x)
        out = on_tensors(CUDA.ops.map_scalar(fn), gpu(x), s).to_numpy()
        assert_elementwise_close(out, reference(fn, x, np.float32(s)), f"map_scalar({name}, {s}) on {shape}")


def test_large_contiguous_elementwise_paths() -> None:
    n = 4 * 1024 * 1024 + 3  # many grid-stride iterations and a 3-element tail
    r = rng_for("large")
    a = r.standard_normal(n).astype(np.float32)
    b = r.standard_normal(n).astype(np.float32)
    ta, tb = gpu(a), gpu(b)
    np.testing.assert_array_equal((ta + tb).to_numpy(), a + b, err_msg=f"add of two [{n}] tensors")
    np.testing.assert_array_equal((-ta).to_numpy(), -a, err_msg=f"neg of [{n}]")
    np.testing.assert_array_equal((ta * 3.0).to_numpy(), a * np.float32(3.0), err_msg=f"mul_scalar of [{n}]")


# ---- reduce ------------------------------------------------------------------------------------------
REDUCE_CASES = [
    ((1,), 0),
    ((3,), 0),
    ((1023,), 0),
    ((3, 33, 5), 0),
    ((3, 33, 5), 1),
    ((3, 33, 5), 2),
    ((16, 1, 7), 1),
    ((2, 70_001), 1),  # few long rows: split into partials
    ((70_001, 3), 0),  # long columns: split into partials
    ((300_000,), 0),
    ((64, 4096), 1),
    ((4096, 64), 0),
    ((4096, 768), 0),  # a bias gradient: 4 adjacent columns a thread, split into partials
    ((4, 256, 12), 0),  # a sum over the batch: 4 adjacent outputs a thread, no split
]


def _reduce_ref(name: str, x: Array, dim: int) -> Tuple[Array, float]:
    x64 = x.astype(np.float64)
    if name == "add":
        return x64.sum(dim, keepdims=True), float(np.abs(x64).sum(dim).max())
    if name == "mul":
        return x64.prod(dim, keepdims=True), float(np.abs(x64).prod(dim).max())
    return x64.max(dim, keepdims=True), float(np.abs(x64).max())


@pytest.mark.parametrize("name,start", [("add", 0.0), ("mul", 1.0), ("max", -np.inf)])
@pytest.mark.parametrize("shape,dim", REDUCE_CASES)
def test_reduce(name: str, start: float, shape: Tuple[int, ...], dim: int) -> None:
    r = rng_for("reduce", name, shape, dim)
    if name == "mul":
        x = r.uniform(0.999, 1.001, shape).astype(np.float32)  # products stay O(1) over long dims
    else:
        x = r.standard_normal(shape).astype(np.float32)
    fn = getattr(operators, name)
    ref, scale = _reduce_ref(name, x, dim)
    out = on_tensors(CUDA.ops.reduce(fn, start), gpu(x), dim).to_numpy()
    # float32 rounding of a long product random-walks (~1e-6 * sqrt(length) relative); the index
    # logic it shares with sum and max is checked tightly by those.
    tol = {"max": 0.0, "add": 1e-5, "mul": 1e-6 + 1e-6 * np.sqrt(shape[dim])}[name]
    scale_arg = None if name == "max" else max(scale, 1e-30)
    assert_close(out, ref, tol, f"reduce({name}) of {shape} over dim {dim}", scale=scale_arg)


@pytest.mark.parametrize("order", [(1, 0, 2), (2, 1, 0), (0, 2, 1)])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_reduce_permuted(order: Tuple[int, ...], dim: int) -> None:
    x = rng_for("reduce-perm", order, dim).standard_normal((7, 33, 5)).astype(np.float32)
    t = permuted_gpu(x, order)
    ref, scale = _reduce_ref("add", x, dim)
    what = f"over dim {dim} of a [7, 33, 5] view permuted by {order}"
    assert_close(on_tensors(CUDA.add_reduce, t, dim).to_numpy(), ref, 1e-5, f"sum {what}", scale=scale)
    assert_close(on_tensors(CUDA.max_reduce, t, dim).to_numpy(), x.max(dim, keepdims=True), 0.0, f"max {what}")


def test_reduce_start_value_and_empty_dim() -> None:
    x = rng_for("start").standard_normal((4, 5)).astype(np.float32)
    out = on_tensors(CUDA.ops.reduce(operators.add, 10.0), gpu(x), 1).to_numpy()
    assert_close(out, x.sum(1, keepdims=True) + 10.0, 1e-6, "sum with start 10")
    out = on_tensors(CUDA.ops.reduce(operators.max, 5.0), gpu(x), 0).to_numpy()
    assert_close(out, np.maximum(x.max(0, keepdims=True), 5.0), 0.0, "max with start 5")


# ---- matmul ------------------------------------------------------------------------------------------
MATMUL_SHAPES = [
    ((1, 1), (1, 1)),
    ((3, 5), (5, 7)),
    ((33, 33), (33, 33)),
    ((1023, 3), (3, 1)),
    ((1, 1023), (1023, 33)),
    ((2, 1, 33, 17), (3, 17, 40)),  # batch dims broadcast both ways
    ((4, 3, 65, 129), (4, 3, 129, 66)),
    ((130, 257), (257, 131)),
    ((1536, 256), (256, 1536)),  # enough 128x128 tiles to take the big-tile kernel on an H100
    ((96, 64, 64), (96, 64, 100)),
]


def _matmul_check(ta: minitorch.Tensor, tb: minitorch.Tensor, a: Array, b: Array, what: str) -> None:
    out = on_tensors(CUDA.ops.matrix_multiply, ta, tb).to_numpy()
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    bound = float(np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64)).max())
    assert_close(out, ref, 1e-5, f"{what}: {a.shape} @ {b.shape}", scale=max(bound, 1e-30))


@pytest.mark.parametrize("shapes", MATMUL_SHAPES)
@pytest.mark.parametrize("transpose", ["nn", "tn", "nt", "tt"])
def test_matmul(shapes: Tuple[Tuple[int, ...], Tuple[int, ...]], transpose: str) -> None:
    r = rng_for("matmul", shapes, transpose)
    a = r.standard_normal(shapes[0]).astype(np.float32)
    b = r.standard_normal(shapes[1]).astype(np.float32)
    swap_a = tuple(range(a.ndim - 2)) + (a.ndim - 1, a.ndim - 2)
    swap_b = tuple(range(b.ndim - 2)) + (b.ndim - 1, b.ndim - 2)
    ta = permuted_gpu(a, swap_a) if transpose[0] == "t" else gpu(a)
    tb = permuted_gpu(b, swap_b) if transpose[1] == "t" else gpu(b)
    _matmul_check(ta, tb, a, b, f"matmul ({transpose}: 't' = transposed storage)")


def test_matmul_expanded_batch_and_odd_strides() -> None:
    r = rng_for("matmul-expand")
    a = r.standard_normal((1, 9, 5)).astype(np.float32)
    b = r.standard_normal((4, 5, 6)).astype(np.float32)
    ta = gpu(a).expand((4, 9, 5))  # batch stride 0
    _matmul_check(ta, gpu(b), np.broadcast_to(a, (4, 9, 5)), b, "matmul with an expanded (stride 0) batch dim")
    big = r.standard_normal((12, 10)).astype(np.float32)
    view = minitorch.Tensor(minitorch.TensorData(gpu(big)._tensor._storage, (6, 5), (20, 2)), backend=CUDA)
    _matmul_check(view, gpu(b[0]), big[::2, ::2], b[0], "matmul of a strided view (strides 20, 2)")


# ---- the launch path ---------------------------------------------------------------------------------
def test_unknown_function_is_rejected() -> None:
    with pytest.raises(ValueError, match="no CUDA kernel"):
        CUDA.ops.map(lambda x: x * 2.0)
    with pytest.raises(ValueError, match="add, mul, max"):
        CUDA.ops.reduce(operators.lt, 0.0)


def test_kernel_error_code_becomes_exception() -> None:
    lib = combine.lib(runtime())
    flat = layout((4,), (1,))
    code = lib.launch_map(99, 0, 0, None, flat, None, flat, None)
    assert code != 0, "an unknown opcode must be rejected by the launcher"
    with pytest.raises(cko.CudaKernelError, match="invalid argument"):
        check(code, lib, "map(99)")


def test_kernels_run_on_the_current_torch_stream() -> None:
    import torch

    a, b = gpu(np.ones((1 << 20,))), gpu(np.full((1 << 20,), 2.0))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert runtime().stream() == side.cuda_stream, "launches must use torch's current stream"
        c = a + b
    side.synchronize()
    np.testing.assert_array_equal(c.to_numpy(), np.full((1 << 20,), 3.0, np.float32))
