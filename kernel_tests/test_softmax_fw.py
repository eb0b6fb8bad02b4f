"""Fused attention softmax forward (src/softmax_kernel.cu) against torch float64 on the CPU.

Through the minitorch API (`Tensor.attn_softmax`) on the CUDA backend, plus raw calls of the
launcher on torch buffers whose output is poisoned with NaN first (every element must be written).
The reference takes the scores as float32 x + mask (what the kernel and torch's fp32
`softmax(x + mask)` see: with a finite -1e8 the sum is rounded to a multiple of 8) and does the
rest in float64; removed keys are -inf, and a row with no key left is all zeros.
"""

import numpy as np
import pytest

import minitorch
from minitorch.cuda.libraries import kernel_library
from minitorch.fused.softmax import softmax_reference

from fused_testing import device_copy, nan_buffer, on_tensors, print_speedup, rel_err, softmax_float64

torch = pytest.importorskip("torch")

BACKEND = minitorch.TensorBackend(minitorch.CudaKernelOps)
TOL = 1e-5
MAX_ELEMENTS = 1 << 22

# Row lengths covering every size bucket of the kernel (1..32 sub-warp, warp, block, streaming)
# and both the float4 (Tk % 4 == 0) and the scalar path.
LENGTHS = [1, 3, 31, 32, 33, 64, 100, 384, 1000, 1024, 1025, 2048, 4097, 8192, 12288, 16384, 16385, 20000]


def reference(x: np.ndarray, mask, causal: bool) -> np.ndarray:
    return softmax_float64(x, mask, causal).numpy()


def make_mask(rng: np.random.Generator, B: int, Tk: int, kind: str):
    """None, or [B, Tk] with padded keys at -inf / -1e8; batch 0 keeps every key, the last batch
    (when B > 1) loses every key, the others keep a random prefix."""
    if kind == "none":
        return None
    fill = -np.inf if kind == "inf" else -1e8
    mask = np.zeros((B, Tk), dtype=np.float32)
    for b in range(1, B):
        keep = 0 if b == B - 1 else int(rng.integers(0, Tk + 1))
        mask[b, keep:] = fill
    if kind == "inf":
        mask[0] += rng.standard_normal(Tk).astype(np.float32)  # an ordinary additive mask too
    return mask


def run_api(x: np.ndarray, mask, causal: bool, mask_4d: bool = False) -> np.ndarray:
    t = minitorch.tensor_from_numpy(x, backend=BACKEND)
    m = None
    if mask is not None:
        m_np = mask.reshape(mask.shape[0], 1, 1, mask.shape[1]) if mask_4d else mask
        m = minitorch.tensor_from_numpy(m_np, backend=BACKEND)
    return t.attn_softmax(m, causal=causal).to_numpy()


def random_shape(rng: np.random.Generator, Tk: int, square: bool) -> tuple:
    B = int(rng.integers(1, 5))
    H = int(rng.integers(1, 5))
    Tq = Tk if square else int(rng.integers(1, 9))
    while B * H * Tq * Tk > MAX_ELEMENTS and (B > 1 or H > 1):
        B, H = max(1, B // 2), max(1, H // 2)
    return B, H, Tq, Tk


def scores(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return (rng.standard_normal(shape) * 3.0).astype(np.float32)


@pytest.mark.parametrize("kind", ["none", "inf", "finite"])
@pytest.mark.parametrize("Tk", LENGTHS)
def test_softmax_fw_lengths(Tk: int, kind: str) -> None:
    rng = np.random.default_rng(1000 + Tk)
    shape = random_shape(rng, Tk, square=False)
    x = scores(rng, shape)
    mask = make_mask(rng, shape[0], Tk, kind)
    out = run_api(x, mask, causal=False)
    ref = reference(x, mask, causal=False)
    err = rel_err(out, ref)
    assert err < TOL, f"shape {shape} mask {kind}: relative error {err:.3g}"


@pytest.mark.parametrize("kind", ["none", "inf"])
@pytest.mark.parametrize("Tq,Tk", [(1, 1), (5, 5), (33, 33), (100, 100), (1024, 1024), (1025, 1025),
                                   (2048, 2048), (3, 40), (8, 4097), (2, 20000), (40, 8), (7, 3)])
def test_softmax_fw_causal(Tq: int, Tk: int, kind: str) -> None:
    """Causal masking: Tq == Tk, Tq < Tk (queries at the end of the keys) and Tq > Tk (the first
    Tq - Tk rows have no key at all and must be zeros)."""
    rng = np.random.default_rng(Tq * 7919 + Tk)
    B = 2
    H = 1 if Tq * Tk > MAX_ELEMENTS // 4 else 3
    x = scores(rng, (B, H, Tq, Tk))
    mask = make_mask(rng, B, Tk, kind)
    out = run_api(x, mask, causal=True)
    ref = reference(x, mask, causal=True)
    err = rel_err(out, ref)
    assert err < TOL, f"causal {(B, H, Tq, Tk)} mask {kind}: relative error {err:.3g}"
    if Tq > Tk:
        assert np.all(out[:, :, : Tq - Tk, :] == 0.0), "rows with every key removed must be zeros"


def test_softmax_fw_random_shapes() -> None:
    """Seeded random shapes in the range of the original assignment's harness (batch up to 32,
    heads 4..16, sequence up to 512) with random masks and causal flags."""
    rng = np.random.default_rng(7)
    for _ in range(24):
        B = int(rng.integers(1, 33))
        H = int(rng.choice([4, 8, 12, 16]))
        T = int(rng.integers(1, 513))
        while B * H * T * T > MAX_ELEMENTS and B > 1:
            B //= 2
        causal = bool(rng.integers(0, 2))
        kind = str(rng.choice(["none", "inf", "finite"]))
        x = scores(rng, (B, H, T, T))
        mask = make_mask(rng, B, T, kind)
        out = run_api(x, mask, causal=causal)
        err = rel_err(out, reference(x, mask, causal))
        assert err < TOL, f"shape {(B, H, T, T)} mask {kind} causal {causal}: relative error {err:.3g}"


def test_softmax_fw_mask_4d_and_large_values() -> None:
    """A [B, 1, 1, Tk] mask gives the same result as [B, Tk]; large scores do not overflow."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 2, 17, 96)) * 50.0 + 1000.0).astype(np.float32)
    mask = make_mask(rng, 3, 96, "inf")
    out2d = run_api(x, mask, causal=False)
    out4d = run_api(x, mask, causal=False, mask_4d=True)
    assert np.array_equal(out2d, out4d)
    assert rel_err(out2d, reference(x, mask, False)) < TOL


def test_softmax_fw_every_key_masked() -> None:
    """mask == -inf everywhere: zeros, not nan, on every path (warp, block, streaming)."""
    for Tk in (7, 64, 3000, 20000):
        x = np.random.default_rng(Tk).standard_normal((1, 2, 3, Tk)).astype(np.float32)
        mask = np.full((1, Tk), -np.inf, dtype=np.float32)
        out = run_api(x, mask, causal=False)
        assert np.all(out == 0.0), f"Tk={Tk}: a fully masked row must be zeros"


# ---- raw launcher calls ------------------------------------------------------------------------


def _raw_forward(out, x, mask, causal: bool) -> int:
    lib = kernel_library("softmax_kernel")
    B, H, Tq, Tk = x.shape
    stream = torch.cuda.current_stream().cuda_stream
    mask_ptr = None if mask is None else mask.data_ptr()
    return lib.launch_attn_softmax(0, out.data_ptr(), x.data_ptr(), mask_ptr, B, H, Tq, Tk, int(causal), stream)


@pytest.mark.parametrize("Tk", [4, 40, 1024, 3000, 16385])
@pytest.mark.parametrize("misaligned", [False, True])
def test_softmax_fw_raw_poisoned(Tk: int, misaligned: bool) -> None:
    """The launcher writes every output element (the output starts as NaN), also when the buffers
    are not 16-byte aligned (the scalar path must be taken for a Tk that is a multiple of 4)."""
    rng = np.random.default_rng(Tk)
    shape = (2, 3, 5, Tk)
    x_np = scores(rng, shape)
    mask_np = make_mask(rng, 2, Tk, "inf")
    off = 1 if misaligned else 0
    x = device_copy(x_np, off).view(shape)
    out = nan_buffer(x_np.size, off).view(shape)
    code = _raw_forward(out, x, device_copy(mask_np, off).view(2, Tk), causal=False)
    assert code == 0, kernel_library("softmax_kernel").minitorch_error_string(code).decode()
    torch.cuda.synchronize()
    err = rel_err(out.cpu().numpy(), reference(x_np, mask_np, False))
    assert err < TOL, f"{shape} misaligned={misaligned}: relative error {err:.3g}"


def test_softmax_fw_raw_rejects_bad_sizes() -> None:
    lib = kernel_library("softmax_kernel")
    buf = torch.zeros(16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    for B, H, Tq, Tk in [(0, 1, 1, 4), (1, 1, 1, 0), (1, -1, 1, 4)]:
        code = lib.launch_attn_softmax(0, buf.data_ptr(), buf.data_ptr(), None, B, H, Tq, Tk, 0, stream)
        assert code != 0, f"sizes {(B, H, Tq, Tk)} must be rejected"
        assert "invalid" in lib.minitorch_error_string(code).decode().lower()


# ---- speed report (printed; visible with pytest -s) ---------------------------------------------


def test_softmax_fw_speedup_report() -> None:
    """Fused kernel vs minitorch's own composed softmax (fused.softmax.softmax_reference) on the GPU."""
    rng = np.random.default_rng(0)
    print()
    for shape in [(64, 8, 40, 40), (8, 12, 256, 256), (8, 12, 1024, 1024)]:
        x = minitorch.tensor_from_numpy(scores(rng, shape), backend=BACKEND)
        mask = minitorch.tensor_from_numpy(make_mask(rng, shape[0], shape[3], "inf"), backend=BACKEND)
        print_speedup(
            f"attn_softmax fw {shape} + mask",
            lambda: on_tensors(minitorch.CudaKernelOps.attn_softmax_fw, x, mask, False),
            lambda: softmax_reference(x, mask, False),
        )
