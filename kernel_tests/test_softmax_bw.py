"""Fused attention softmax backward (src/softmax_kernel.cu) against torch float64 on the CPU.

End to end through the minitorch API (`attn_softmax(...).backward(g)` on the CUDA backend: the
gradient of the scores), and the raw launcher on torch buffers with a NaN-poisoned output. The
reference is dx = y * (g - sum_j g_j y_j) in float64 with y the float64 softmax of the same float32
scores (a row with every key removed has y = 0, so dx = 0).
"""

import numpy as np
import pytest

import minitorch
from minitorch.cuda.libraries import kernel_library
from minitorch.fused.softmax import softmax_backward_reference

from fused_testing import device_copy, nan_buffer, on_tensors, print_speedup, rel_err, softmax_float64

torch = pytest.importorskip("torch")

BACKEND = minitorch.TensorBackend(minitorch.CudaKernelOps)
TOL = 1e-5
MAX_ELEMENTS = 1 << 22

# The ITERATIONS buckets of the backward (32, 64, 128, 256, 384, 512, 768, 1024), the block-level
# ones (2048..16384), the streaming path beyond, each with float4 and scalar lengths.
LENGTHS = [1, 2, 5, 31, 32, 33, 64, 100, 128, 255, 256, 384, 500, 512, 768, 1000, 1024, 1025, 2048, 4097,
           8192, 16384, 16385, 20000]


def grad_ref(y: torch.Tensor, g: np.ndarray) -> np.ndarray:
    g64 = torch.from_numpy(g).double()
    return (y * (g64 - (g64 * y).sum(dim=-1, keepdim=True))).numpy()


def padding_mask(rng: np.random.Generator, B: int, Tk: int):
    mask = np.zeros((B, Tk), dtype=np.float32)
    for b in range(1, B):
        keep = 0 if b == B - 1 else int(rng.integers(0, Tk + 1))
        mask[b, keep:] = -np.inf
    return mask


def api_grad(x: np.ndarray, mask, causal: bool, g: np.ndarray) -> np.ndarray:
    t = minitorch.tensor_from_numpy(x, backend=BACKEND, requires_grad=True)
    m = None if mask is None else minitorch.tensor_from_numpy(mask, backend=BACKEND)
    y = t.attn_softmax(m, causal=causal)
    y.backward(minitorch.tensor_from_numpy(g, backend=BACKEND))
    return t.grad.to_numpy()


def shape_for(rng: np.random.Generator, Tk: int) -> tuple:
    B, H, Tq = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 17))
    while B * H * Tq * Tk > MAX_ELEMENTS and (B > 1 or H > 1 or Tq > 1):
        B, H, Tq = max(1, B // 2), max(1, H // 2), max(1, Tq // 2)
    return B, H, Tq, Tk


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("Tk", LENGTHS)
def test_softmax_bw_lengths(Tk: int, masked: bool) -> None:
    rng = np.random.default_rng(2000 + Tk)
    shape = shape_for(rng, Tk)
    x = (rng.standard_normal(shape) * 2.0).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    mask = padding_mask(rng, shape[0], Tk) if masked else None
    dx = api_grad(x, mask, False, g)
    ref = grad_ref(softmax_float64(x, mask, False), g)
    err = rel_err(dx, ref)
    assert err < TOL, f"shape {shape} masked={masked}: relative error {err:.3g}"


@pytest.mark.parametrize("Tq,Tk", [(1, 1), (33, 33), (256, 256), (1024, 1024), (4, 3000), (50, 20)])
def test_softmax_bw_causal(Tq: int, Tk: int) -> None:
    rng = np.random.default_rng(Tq * 31 + Tk)
    shape = (2, 2, Tq, Tk)
    x = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    dx = api_grad(x, None, True, g)
    err = rel_err(dx, grad_ref(softmax_float64(x, None, True), g))
    assert err < TOL, f"causal {shape}: relative error {err:.3g}"


def test_softmax_bw_random_shapes() -> None:
    """Seeded random shapes in the original harness's range (batch up to 32, heads 4..16, sequence
    up to 512), random causal flag and padding masks."""
    rng = np.random.default_rng(11)
    for _ in range(16):
        B, H, T = int(rng.integers(1, 33)), int(rng.choice([4, 8, 12, 16])), int(rng.integers(1, 513))
        while B * H * T * T > MAX_ELEMENTS and B > 1:
            B //= 2
        causal = bool(rng.integers(0, 2))
        x = rng.standard_normal((B, H, T, T)).astype(np.float32)
        g = rng.standard_normal((B, H, T, T)).astype(np.float32)
        mask = padding_mask(rng, B, T) if rng.integers(0, 2) else None
        dx = api_grad(x, mask, causal, g)
        err = rel_err(dx, grad_ref(softmax_float64(x, mask, causal), g))
        assert err < TOL, f"{(B, H, T, T)} causal={causal} masked={mask is not None}: relative error {err:.3g}"


@pytest.mark.parametrize("Tk", [1, 3, 40, 384, 1024, 1027, 8192, 16388, 16389])
@pytest.mark.parametrize("misaligned", [False, True])
def test_softmax_bw_raw_poisoned(Tk: int, misaligned: bool) -> None:
    """The raw launcher, any y (not only a softmax): every output element is written (the output
    starts as NaN), and unaligned buffers take the scalar path."""
    rng = np.random.default_rng(Tk + 17)
    rows = 37
    g_np = rng.standard_normal((rows, Tk)).astype(np.float32)
    y_np = rng.random((rows, Tk)).astype(np.float32)
    off = 1 if misaligned else 0
    g, y = device_copy(g_np, off), device_copy(y_np, off)
    out = nan_buffer(rows * Tk, off)
    code = kernel_library("softmax_kernel").launch_attn_softmax_bw(
        0, out.data_ptr(), g.data_ptr(), y.data_ptr(), rows, Tk, torch.cuda.current_stream().cuda_stream
    )
    assert code == 0, kernel_library("softmax_kernel").minitorch_error_string(code).decode()
    torch.cuda.synchronize()
    ref = grad_ref(torch.from_numpy(y_np).double(), g_np)
    err = rel_err(out.cpu().numpy().reshape(rows, Tk), ref)
    assert err < TOL, f"rows {rows} Tk {Tk} misaligned={misaligned}: relative error {err:.3g}"


def test_softmax_bw_raw_rejects_bad_sizes() -> None:
    lib = kernel_library("softmax_kernel")
    buf = torch.zeros(16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    for rows, Tk in [(0, 4), (4, 0), (-1, 4)]:
        code = lib.launch_attn_softmax_bw(0, buf.data_ptr(), buf.data_ptr(), buf.data_ptr(), rows, Tk, stream)
        assert code != 0, f"rows={rows} Tk={Tk} must be rejected"


def test_softmax_bw_speedup_report() -> None:
    """Fused backward vs minitorch's own composed backward (fused.softmax.softmax_backward_reference) on the GPU."""
    rng = np.random.default_rng(0)
    print()
    for shape in [(64, 8, 40, 40), (8, 12, 256, 256), (8, 12, 1024, 1024)]:
        g = minitorch.tensor_from_numpy(rng.standard_normal(shape).astype(np.float32), backend=BACKEND)
        y = minitorch.tensor_from_numpy(rng.random(shape).astype(np.float32), backend=BACKEND)
        print_speedup(
            f"attn_softmax bw {shape}",
            lambda: on_tensors(minitorch.CudaKernelOps.attn_softmax_bw, g, y),
            lambda: softmax_backward_reference(g, y),
        )
