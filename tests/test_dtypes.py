"""Dtypes: the DType API, promotion against torch's table, rounding to bfloat16 / float16 against
ml_dtypes, NumPy and torch's CPU casts (ties, subnormals, NaN, inf), the CPU backends' rounding of
every op's output, dtypes kept through views, casts with autodiff, creation with dtype=, save/load of
16-bit tensors, and the CUDA backend's error for an op without a kernel of a dtype."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import torch
from minitorch_testing import FAST, SIMPLE, mt

import minitorch
from minitorch import bfloat16, bool_, float16, float32
from minitorch.tensor_data import TensorData

TORCH = {float32: torch.float32, bfloat16: torch.bfloat16, float16: torch.float16, bool_: torch.bool}


def special_floats() -> np.ndarray:
    """float32 values of every class a rounding must get right: random patterns over the whole range,
    exact ties (low half 0x8000) with an even and an odd kept bit, values next to ties, subnormals,
    the largest finite values (which round to infinity), signed zeros, infinities and NaNs."""
    rng = np.random.default_rng(0)
    bits = [rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)]
    high = rng.integers(0, 2**16, 500, dtype=np.uint64).astype(np.uint32) << 16
    bits += [high | 0x8000, high | 0x7FFF, high | 0x8001, high | 0x0001]
    bits.append(rng.integers(0, 2**23, 500, dtype=np.uint64).astype(np.uint32))  # subnormals
    bits.append(np.array([0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00000000, 0x80000000, 0x7F800000, 0xFF800000,
                          0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FBFFFFF, 0x00008000, 0x00018000], dtype=np.uint32))
    values = np.concatenate(bits).view(np.float32)
    return np.concatenate([values, -values])


# ---- the DType API -----------------------------------------------------------------------------
def test_dtype_attributes_names_and_numpy_equivalents() -> None:
    assert repr(bfloat16) == "minitorch.bfloat16" and repr(minitorch.bool) == "minitorch.bool"
    assert (float32.itemsize, bfloat16.itemsize, float16.itemsize, bool_.itemsize) == (4, 2, 2, 4)
    assert float32.is_floating and bfloat16.is_floating and float16.is_floating and not bool_.is_floating
    assert bfloat16.storage == "bfloat16" and bool_.storage == "float32"
    for dtype, ref in TORCH.items():
        assert getattr(torch, dtype.name) is ref
        assert minitorch.dtypes.dtype_named(dtype.name) is dtype
    assert float32 == np.float32 and np.dtype(float32) == np.float32 and float16 == np.float16
    assert minitorch.bool == np.bool_ and bfloat16 != np.float32 and bfloat16 != float32
    assert bfloat16 == ml_dtypes.bfloat16 and minitorch.dtypes.as_dtype(ml_dtypes.bfloat16) is bfloat16
    with pytest.raises(TypeError, match="NumPy has no bfloat16 dtype"):
        np.dtype(bfloat16)
    with pytest.raises(ValueError, match="unknown minitorch dtype 'int8'"):
        minitorch.dtypes.dtype_named("int8")
    assert minitorch.dtypes.as_dtype(np.float16) is float16 and minitorch.dtypes.as_dtype("bfloat16") is bfloat16
    with pytest.raises(TypeError, match="expected a minitorch dtype .* got <class 'numpy.float64'>"):
        minitorch.zeros((2,), dtype=np.float64)


def test_promotion_matches_torch() -> None:
    dtypes = list(TORCH)
    for a in dtypes:
        for b in dtypes:
            assert minitorch.promote_types(a, b) is minitorch.promote_types(b, a)
            assert TORCH[minitorch.promote_types(a, b)] == torch.promote_types(TORCH[a], TORCH[b]), (a, b)


@pytest.mark.parametrize("a_dims", [0, 2])
@pytest.mark.parametrize("b_dims", [0, 2, None])
def test_result_type_matches_torch(a_dims: int, b_dims: int) -> None:
    """Tensors with dims, 0-dim tensors and Python numbers (b_dims None) of every dtype."""
    scalars = [True, 3, 2.5]
    for a in TORCH:
        ours_a = minitorch.zeros((2,) * a_dims, dtype=a)
        ref_a = torch.zeros((2,) * a_dims, dtype=TORCH[a])
        others = scalars if b_dims is None else [(minitorch.zeros((2,) * b_dims, dtype=b), torch.zeros((2,) * b_dims, dtype=TORCH[b])) for b in TORCH]
        for other in others:
            ours_b, ref_b = (other, other) if b_dims is None else other
            expected = torch.result_type(ref_a, ref_b)
            if isinstance(ours_b, int) and not isinstance(ours_b, bool) and a is bool_:
                continue  # bool tensor with an int: torch gives int64, which minitorch lacks (float32 here)
            assert TORCH[minitorch.result_type(ours_a, ours_b)] == expected, (a, a_dims, ours_b)


def test_ops_output_dtypes(backend) -> None:
    x = mt(np.arange(6.0).reshape(2, 3), backend)
    b, h = x.bfloat16(), x.half()
    mask = x > 2.0
    assert (b + x).dtype is float32 and (b * 2.5).dtype is bfloat16 and (2.5 - b).dtype is bfloat16
    assert (b + h).dtype is float32 and (mask * b).dtype is bfloat16 and (mask + mask).dtype is float32
    assert (b > 1.0).dtype is bool_ and (b == x).dtype is bool_ and b.is_close(b).dtype is bool_
    assert (b + minitorch.tensor(2.0, backend=backend)).dtype is bfloat16  # a 0-dim float32 does not promote
    assert b.exp().dtype is bfloat16 and b.sum(1).dtype is bfloat16 and b.max().dtype is bfloat16
    assert (b @ b.T).dtype is bfloat16 and (b @ x.T).dtype is float32
    assert b.masked_fill(mask, -1.0).dtype is bfloat16 and minitorch.where(mask, b, 0.0).dtype is bfloat16
    assert minitorch.where(mask, b, x).dtype is float32
    assert minitorch.cat([b, b]).dtype is bfloat16 and minitorch.cat([b, x]).dtype is float32
    assert minitorch.stack([mask, mask]).dtype is bool_


# ---- rounding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [bfloat16, float16])
def test_rounding_matches_ml_dtypes_numpy_and_torch(dtype) -> None:
    values = special_floats()
    ours = dtype.round(values)
    with np.errstate(over="ignore", invalid="ignore"):
        reference = values.astype(ml_dtypes.bfloat16 if dtype is bfloat16 else np.float16).astype(np.float32)
    by_torch = torch.from_numpy(values).to(TORCH[dtype]).float().numpy()
    nan = np.isnan(values)
    assert np.isnan(ours[nan]).all() and np.isnan(reference[nan]).all() and np.isnan(by_torch[nan]).all()
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), reference[~nan].view(np.uint32))
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), by_torch[~nan].view(np.uint32))
    words = dtype.encode(values)
    assert words.dtype == np.uint16
    np.testing.assert_array_equal(dtype.decode(words)[~nan], ours[~nan])


def test_ties_round_to_even_and_overflow_to_infinity() -> None:
    one_ulp = 2.0**-7  # bfloat16's spacing in [1, 2)
    values = np.array([1 + one_ulp / 2, 1 + 3 * one_ulp / 2, -(1 + one_ulp / 2), 3.4e38, 2.0**-130], np.float32)
    np.testing.assert_array_equal(bfloat16.round(values), np.array([1.0, 1 + 2 * one_ulp, -1.0, np.inf, 2.0**-130], np.float32))


def test_cpu_backends_round_every_output(backend) -> None:
    """Each op on bf16 values computes in float32 and rounds its output: bit for bit torch's CPU
    results for the ops whose float32 result is exact before rounding (add, mul) and for casts."""
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((4, 33)).astype(np.float32) * 100 for _ in range(2))
    x, y = mt(a, backend).bfloat16(), mt(b, backend).bfloat16()
    tx, ty = torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16()
    for name, ours, ref in (("cast", x, tx), ("add", x + y, tx + ty), ("mul", x * y, tx * ty), ("neg", -x, -tx),
                            ("scalar", x * 1.1, tx * 1.1), ("copy", x.T.contiguous().T, tx)):  # fmt: skip
        assert ours.dtype is bfloat16, name
        np.testing.assert_array_equal(ours.to_numpy(), ref.float().numpy(), err_msg=name)
    for name, t in (("exp", (x * 0.01).exp()), ("sum", x.sum(1)), ("matmul", x @ y.T), ("mean", x.mean(0)), ("log", x.log())):
        values = t.to_numpy()
        np.testing.assert_array_equal(values, bfloat16.round(values), err_msg=f"{name} left unrounded values")
    np.testing.assert_array_equal((x @ y.T).to_numpy(), bfloat16.round(x.to_numpy() @ y.to_numpy().T))
    filled = minitorch.full((3,), 1.0 / 3.0, backend=backend, dtype=bfloat16)
    np.testing.assert_array_equal(filled.to_numpy(), bfloat16.round(np.full(3, 1.0 / 3.0, np.float32)))
    target = minitorch.zeros((2, 3), backend=backend, dtype=bfloat16)
    target[0] = 1.0 / 3.0
    np.testing.assert_array_equal(target.to_numpy()[0], bfloat16.round(np.full(3, 1.0 / 3.0, np.float32)))
    for source in (np.full((2, 3), 0.1, np.float32), mt(np.full((2, 3), 0.1), backend)):
        target.copy_(source)
        np.testing.assert_array_equal(target.to_numpy(), bfloat16.round(np.full((2, 3), 0.1, np.float32)))


# ---- tensors of a dtype ------------------------------------------------------------------------
def test_dtype_is_kept_through_views_and_copies(backend) -> None:
    x = mt(np.arange(24.0).reshape(2, 3, 4) / 7, backend).bfloat16()
    views = {
        "view": x.view(6, 4), "reshape": x.permute(2, 0, 1).reshape(4, 6), "permute": x.permute(2, 0, 1),
        "T": x.T, "contiguous": x.transpose(0, 2).contiguous(), "expand": x[:, :1].expand(2, 5, 4),
        "slice": x[:, 1:, ::2], "int": x[1], "gather": x[[1, 0]], "mask": x[x > 1.0], "flip": x[:, ::-1],
        "unsqueeze": x.unsqueeze(0), "squeeze": x[:, :1].squeeze(1), "flatten": x.flatten(), "detach": x.detach(),
        "narrow": x.narrow(2, 1, 2), "index_select": x.index_select(1, [2, 0]),
    }  # fmt: skip
    for name, t in views.items():
        assert t.dtype is bfloat16, name
    np.testing.assert_array_equal(views["gather"].to_numpy(), x.to_numpy()[[1, 0]])
    assert x.to_numpy().dtype == np.float32 and x.numpy().dtype == np.float32 and x.half().numpy().dtype == np.float16
    assert isinstance(x.tolist()[0][0][0], float) and "dtype=minitorch.bfloat16" in repr(x)
    assert x.float().dtype is float32 and x.bfloat16() is x and x.to(bfloat16) is x
    mask = x > 1.0
    assert mask.float().dtype is float32 and (mask & mask).dtype is bool_ and (~mask).dtype is bool_


def test_casts_have_gradients_cast_back(backend) -> None:
    a = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    x = mt(a, backend, requires_grad=True)
    y = x.bfloat16()
    assert y.dtype is bfloat16 and y.requires_grad
    ((y * 3.0).sum() + (x * 2.0).sum()).backward()
    assert x.grad.dtype is float32
    np.testing.assert_array_equal(x.grad.to_numpy(), np.full((3, 4), 5.0, np.float32))
    h = mt(a, backend).half().requires_grad_()
    (h.float() * h.float()).sum().backward()
    assert h.grad.dtype is float16
    np.testing.assert_array_equal(h.grad.to_numpy(), float16.round(2 * float16.round(a)))


def test_creation_with_dtype(backend) -> None:
    assert minitorch.zeros((2, 3), backend=backend, dtype=bfloat16).dtype is bfloat16
    assert minitorch.ones((2,), backend=backend, dtype=float16).to_numpy().tolist() == [1.0, 1.0]
    t = minitorch.tensor([[0.1, 0.2]], backend=backend, dtype=bfloat16)
    np.testing.assert_array_equal(t.to_numpy(), bfloat16.round(np.array([[0.1, 0.2]], np.float32)))
    assert minitorch.tensor(t).dtype is bfloat16 and minitorch.zeros_like(t).dtype is bfloat16
    assert minitorch.ones_like(t, dtype=float32).dtype is float32
    assert minitorch.tensor([2.0, 0.0], backend=backend, dtype=bool_).tolist() == [True, False]
    minitorch.manual_seed(3)
    r = minitorch.rand((4096,), backend=backend, dtype=bfloat16)
    values = r.to_numpy()
    assert r.dtype is bfloat16 and values.min() >= 0.0 and values.max() < 1.0
    np.testing.assert_array_equal(values, bfloat16.round(values))


def test_to_another_backend_keeps_or_sets_the_dtype() -> None:
    x = mt(np.array([0.1, 0.7]), FAST, requires_grad=True).bfloat16()
    moved = x.to(SIMPLE)
    assert moved.backend is SIMPLE and moved.dtype is bfloat16 and moved.requires_grad and moved.is_leaf
    np.testing.assert_array_equal(moved.to_numpy(), x.to_numpy())
    both = x.to("cpu", "float16")
    assert both.backend is FAST and both.dtype is float16 and both is not x
    assert x.to(dtype=np.float32).dtype is float32
    assert x.to(SIMPLE, float32).dtype is float32


def test_from_torch_takes_bfloat16() -> None:
    ref = torch.tensor([0.1, -3.0, 1e30]).bfloat16()
    t = minitorch.from_torch(ref)
    assert t.dtype is bfloat16
    np.testing.assert_array_equal(t.to_numpy(), ref.float().numpy())


# ---- save / load ---------------------------------------------------------------------------------
def test_save_and_load_keep_16bit_dtypes(tmp_path) -> None:
    values = special_floats()[:257]
    tree = {"b": mt(values, FAST).bfloat16().requires_grad_(), "h": mt(values, FAST).half(), "f": mt(values, FAST)}
    minitorch.save(tree, tmp_path / "w.npz")
    back = minitorch.load(tmp_path / "w.npz", backend=SIMPLE)
    for key in tree:
        assert back[key].dtype is tree[key].dtype and back[key].backend is SIMPLE
        np.testing.assert_array_equal(back[key].to_numpy(), tree[key].to_numpy())
    assert back["b"].requires_grad and not back["h"].requires_grad
    with np.load(tmp_path / "w.npz", allow_pickle=False) as archive:
        header = json.loads(archive["__minitorch__"].tobytes().decode())
        assert header["version"] == 2
        node = dict(header["tree"]["dict"])["b"]
        assert node["dtype"] == "bfloat16" and archive[node["tensor"]].dtype == np.uint16
        np.testing.assert_array_equal(archive[node["tensor"]], bfloat16.encode(tree["b"].to_numpy()))


def test_version_1_files_still_load(tmp_path) -> None:
    header = {"format": "minitorch", "version": 1, "tree": {"tensor": "0", "requires_grad": False}}
    blob = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez(tmp_path / "old.npz", __minitorch__=blob, **{"0": np.arange(3, dtype=np.float32)})
    old = minitorch.load(tmp_path / "old.npz")
    assert old.dtype is float32 and old.tolist() == [0.0, 1.0, 2.0]


# ---- the CUDA backend's refusal of ops without a kernel of a dtype -------------------------------
def _cuda_tensor(dtype, shape=(2, 4)) -> minitorch.Tensor:
    """A tensor of the CUDA backend over host memory: the dtype checks run before any kernel loads."""
    data = TensorData(np.zeros(int(np.prod(shape)), np.float32), shape, dtype=dtype)
    return minitorch.Tensor(data, backend=minitorch.TensorBackend(minitorch.CudaKernelOps))


# map/zip/reduce and LayerNorm have bfloat16 kernels; float16 has none.
_ELEMENTWISE = [
    (lambda t: t.exp(), "exp", float16), (lambda t: t + t, "add", float16), (lambda t: t * 2.0, "mul", float16),
    (lambda t: t.sum(0), "sum", float16), (lambda t: t < 0.0, "lt", float16),
]  # fmt: skip


@pytest.mark.parametrize(
    "op, name, dtype",
    _ELEMENTWISE + [(lambda t: t @ t.T, "matmul", float16)] + [  # bfloat16 products run on matmul_bf16_kernel
        (lambda t: t.layernorm(_cuda_tensor(float32, (4,)), _cuda_tensor(float32, (4,))), "layernorm_fw", float16),
    ],
)  # fmt: skip
def test_cuda_ops_without_a_kernel_of_the_dtype_raise(op, name, dtype) -> None:
    message = f"minitorch: no {dtype.name} CUDA kernel for '{name}' (cast with .float() first)"
    with pytest.raises(minitorch.NoKernelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        op(_cuda_tensor(dtype))
