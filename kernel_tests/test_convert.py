"""convert_kernel.cu and the CUDA backend's 16-bit tensors: casts between float32, bfloat16 and float16
bit for bit against torch's (round to nearest even; NaN, inf, subnormals, ties), on flat (vectorized),
odd-length, misaligned, strided and broadcast layouts; 16-bit storage through creation, copies,
views, indexing, transfers and zero-copy interop; and the error of an op without a 16-bit kernel."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import minitorch
from minitorch import bfloat16, float16, float32
from minitorch.cuda.runtime import runtime

from fused_testing import CUDA, gpu

TORCH = {float32: torch.float32, bfloat16: torch.bfloat16, float16: torch.float16}


def special_floats(n: int) -> np.ndarray:
    """n float32 values: random bit patterns, exact ties, subnormals, the largest finite values,
    zeros, infinities and NaNs."""
    rng = np.random.default_rng(n)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    bits[::7] = (bits[::7] & 0xFFFF0000) | 0x8000
    bits[1::7] &= 0x807FFFFF
    fixed = np.array([0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x00000000, 0x80000000, 0x00008000], np.uint32)
    bits[: min(n, fixed.size)] = fixed[: min(n, fixed.size)]
    return bits.view(np.float32)


def words(t: torch.Tensor) -> np.ndarray:
    """The storage words of a torch tensor, NaNs made one pattern (payloads may differ)."""
    values = t.detach().cpu()
    canon = torch.where(torch.isnan(values), torch.full_like(values, float("nan")), values)
    view = torch.int16 if values.element_size() == 2 else torch.int32
    return canon.contiguous().view(view).numpy()


@pytest.mark.parametrize("n", [1, 7, 8, 1000, 4099, 1 << 20])
@pytest.mark.parametrize("dst", [bfloat16, float16])
def test_cast_from_float32_matches_torch_bit_for_bit(n: int, dst) -> None:
    values = special_floats(n)
    out = gpu(values).to(dst)
    assert out.dtype is dst and out._tensor._storage.dtype == TORCH[dst]
    ref = torch.from_numpy(values).cuda().to(TORCH[dst])
    np.testing.assert_array_equal(words(out.to_torch()), words(ref))
    back = out.float()
    assert back.dtype is float32
    np.testing.assert_array_equal(words(back.to_torch()), words(ref.float()))
    np.testing.assert_array_equal(np.isnan(out.to_numpy()), np.isnan(values))


@pytest.mark.parametrize("src, dst", [(bfloat16, float16), (float16, bfloat16), (bfloat16, bfloat16)])
def test_casts_and_copies_between_16bit_dtypes(src, dst) -> None:
    values = special_floats(1001)
    a = gpu(values).to(src)
    ref = torch.from_numpy(values).cuda().to(TORCH[src]).to(TORCH[dst])
    out = a.to(dst) if src is not dst else a.view(7, 143).T.contiguous().T.contiguous().view(1001)
    np.testing.assert_array_equal(words(out.to_torch()), words(ref))


def test_strided_broadcast_and_misaligned_layouts() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((33, 65)).astype(np.float32)
    t = gpu(x)
    ref = torch.from_numpy(x).cuda()
    cases = {
        "transposed": (t.T.bfloat16(), ref.T.bfloat16()),
        "offset (misaligned)": (t[1:, 3:].bfloat16(), ref[1:, 3:].bfloat16()),
        "every other column": (t[:, ::2].half(), ref[:, ::2].half()),
    }
    for name, (ours, theirs) in cases.items():
        np.testing.assert_array_equal(words(ours.to_torch()), words(theirs.contiguous()), err_msg=name)
    target = minitorch.zeros((4, 33, 65), backend=CUDA, dtype=bfloat16)
    target.copy_(t)  # broadcast along the first dim, converted
    np.testing.assert_array_equal(words(target.to_torch()), words(ref.bfloat16().expand(4, 33, 65)))
    target[1, :, ::3] = 0.1
    expected = ref.bfloat16().expand(4, 33, 65).clone()
    expected[1, :, ::3] = 0.1
    np.testing.assert_array_equal(words(target.to_torch()), words(expected))


def test_16bit_tensors_through_creation_views_indexing_and_transfers() -> None:
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    b = minitorch.tensor(x, backend=CUDA, dtype=bfloat16)
    rounded = bfloat16.round(x)
    assert b.dtype is bfloat16 and b._tensor._storage.element_size() == 2
    np.testing.assert_array_equal(b.to_numpy(), rounded)
    np.testing.assert_array_equal(b.permute(2, 0, 1).contiguous().to_numpy(), rounded.transpose(2, 0, 1))
    np.testing.assert_array_equal(b[:, 1:, ::2].to_numpy(), rounded[:, 1:, ::2])
    np.testing.assert_array_equal(minitorch.cat([b, b], 1).to_numpy(), np.concatenate([rounded, rounded], 1))
    assert b[1].dtype is bfloat16 and b.view(6, 4).dtype is bfloat16
    moved = b.to("cpu")
    assert moved.dtype is bfloat16 and moved.backend.ops is minitorch.FastOps
    np.testing.assert_array_equal(moved.to_numpy(), rounded)
    assert moved.to(CUDA).dtype is bfloat16
    full = minitorch.full((5,), 1.0 / 3.0, backend=CUDA, dtype=float16)
    np.testing.assert_array_equal(full.to_numpy(), float16.round(np.full(5, 1.0 / 3.0, np.float32)))
    zeros = minitorch.zeros((3,), backend=CUDA, dtype=bfloat16)
    zeros.copy_(np.array([0.1, 0.2, 0.3], np.float32))
    torch.cuda.synchronize()
    np.testing.assert_array_equal(zeros.to_numpy(), bfloat16.round(np.array([0.1, 0.2, 0.3], np.float32)))
    minitorch.manual_seed(0)
    r = minitorch.rand((1 << 16,), backend=CUDA, dtype=bfloat16).to_numpy()
    assert r.min() >= 0.0 and r.max() < 1.0 and np.array_equal(r, bfloat16.round(r))
    shared = torch.tensor([1.5, -2.0], device="cuda", dtype=torch.bfloat16)
    view = minitorch.from_torch(shared)
    assert view.dtype is bfloat16 and view.to_torch().data_ptr() == shared.data_ptr()


def test_cast_gradients_on_cuda() -> None:
    x = gpu(np.array([0.1, 0.2, 0.3], np.float32), requires_grad=True)
    (x.bfloat16().float() * 2.0).sum().backward()
    assert x.grad.dtype is float32 and x.grad.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("op, name", [(lambda t: t.exp(), "exp"), (lambda t: t + t, "add"), (lambda t: t @ t.T, "matmul"),
                                      (lambda t: t.sum(), "sum")])  # fmt: skip
def test_ops_without_a_16bit_kernel_raise(op, name) -> None:
    t = gpu(np.ones((4, 4), np.float32)).to(float16)  # map/zip/reduce have bfloat16 kernels, not float16 ones
    with pytest.raises(minitorch.NoKernelError, match=rf"no float16 CUDA kernel for '{name}' \(cast with \.float\(\) first\)"):
        op(t)


def test_launcher_rejects_bad_codes_and_layouts() -> None:
    from minitorch.cuda.convert import SIGNATURES
    from minitorch.cuda.layout import layout

    lib = runtime().lib("convert_kernel", SIGNATURES)
    buf = torch.zeros(8, device="cuda")
    flat = layout((8,), (1,))
    stream = runtime().stream()
    assert lib.launch_convert(buf.data_ptr(), 3, flat, buf.data_ptr(), 0, flat, stream) == 1
    assert lib.launch_convert(buf.data_ptr(), 0, flat, buf.data_ptr(), 0, layout((4,), (1,)), stream) == 1
    assert lib.launch_convert(buf.data_ptr(), 0, layout((0,), (1,)), buf.data_ptr(), 1, layout((0,), (1,)), stream) == 0
