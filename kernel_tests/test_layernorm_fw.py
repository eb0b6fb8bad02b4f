"""Fused LayerNorm forward (src/layernorm_kernel.cu) against torch float64 on the CPU.

Through the minitorch API (`Tensor.layernorm`, and `CudaKernelOps.layernorm_fw` for the saved mean
and rstd) and the raw launcher on torch buffers whose outputs are poisoned with NaN first. Inputs
include rows with mean 100 and std 0.01 (float32 keeps its precision only if the kernel never
forms x^2 or rounds the mean before subtracting it) and rows whose first element is an outlier.
"""

import numpy as np
import pytest

import minitorch
from minitorch.cuda.libraries import kernel_library
from minitorch.fused.layernorm import layernorm_reference

from fused_testing import device_copy, nan_buffer, on_tensors, print_speedup, rel_err

torch = pytest.importorskip("torch")

BACKEND = minitorch.TensorBackend(minitorch.CudaKernelOps)
TOL = 1e-5
EPS = 1e-5
MAX_ELEMENTS = 1 << 22

# Every bucket of the kernel: sub-warp, warp, block (up to 16384) and streaming rows, float4
# (hidden % 4 == 0) and scalar.
HIDDEN = [1, 3, 4, 63, 64, 256, 768, 1023, 1024, 2047, 4096, 8192, 12288, 16384, 16385, 20000]
DATA = ["normal", "offset", "outlier_first"]


def make_input(rng: np.random.Generator, shape: tuple, data: str) -> np.ndarray:
    if data == "normal":
        x = rng.standard_normal(shape)
    elif data == "offset":
        x = 100.0 + 0.01 * rng.standard_normal(shape)
    else:  # the row's first element, a natural shift value, far from the rest
        x = 100.0 + 0.01 * rng.standard_normal(shape)
        x[..., 0] = -50.0
    return x.astype(np.float32)


def make_params(rng: np.random.Generator, hidden: int) -> tuple:
    gamma = (1.0 + 0.5 * rng.standard_normal(hidden)).astype(np.float32)
    beta = (0.5 * rng.standard_normal(hidden)).astype(np.float32)
    return gamma, beta


def reference(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> tuple:
    x64 = torch.from_numpy(x).double()
    C = x.shape[-1]
    out = torch.nn.functional.layer_norm(x64, (C,), torch.from_numpy(gamma).double(),
                                         torch.from_numpy(beta).double(), eps)
    rows = x64.reshape(-1, C)
    mean = rows.mean(dim=1)
    rstd = 1.0 / torch.sqrt(rows.var(dim=1, unbiased=False) + eps)
    return out.numpy(), mean.numpy(), rstd.numpy()


def check_stats(label: str, got: tuple, ref: tuple) -> None:
    """out and rstd relative to their largest value; the mean relative to the larger of its largest
    value and the largest std (a mean near 0 is only defined to the data's scale, which is all
    x - mean needs; measured against |mean| alone it would be noise)."""
    (out, mean, rstd), (ref_out, ref_mean, ref_rstd) = got, ref
    mean_scale = max(float(np.abs(ref_mean).max()), float((1.0 / ref_rstd).max()))
    errors = {
        "out": rel_err(out, ref_out),
        "mean": rel_err(mean, ref_mean) * max(float(np.abs(ref_mean).max()), 1e-30) / mean_scale,
        "rstd": rel_err(rstd, ref_rstd),
    }
    for name, err in errors.items():
        assert err < TOL, f"{label}: {name} relative error {err:.3g}"


def rows_for(rng: np.random.Generator, hidden: int) -> int:
    return int(max(1, min(int(rng.integers(1, 3000)), MAX_ELEMENTS // hidden)))


@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_layernorm_fw_sizes(hidden: int, data: str) -> None:
    if data == "outlier_first" and hidden == 1:
        pytest.skip("a one-element row has no other elements to be an outlier against")
    rng = np.random.default_rng(hidden * 10 + DATA.index(data))
    rows = rows_for(rng, hidden)
    x = make_input(rng, (rows, hidden), data)
    gamma, beta = make_params(rng, hidden)
    xt = minitorch.tensor_from_numpy(x, backend=BACKEND)
    gt = minitorch.tensor_from_numpy(gamma, backend=BACKEND)
    bt = minitorch.tensor_from_numpy(beta, backend=BACKEND)
    out_api = xt.layernorm(gt, bt, EPS).to_numpy()
    out, mean, rstd = (t.to_numpy() for t in on_tensors(minitorch.CudaKernelOps.layernorm_fw, xt, gt, bt, EPS))
    ref_out, ref_mean, ref_rstd = reference(x, gamma, beta, EPS)
    assert np.array_equal(out_api, out), "Tensor.layernorm and CudaKernelOps.layernorm_fw differ"
    check_stats(f"[{rows}, {hidden}] {data}", (out, mean, rstd), (ref_out, ref_mean, ref_rstd))


def test_layernorm_fw_random_shapes() -> None:
    """Seeded random [batch, seq, hidden] inputs in the original harness's range (batch*seq up to
    a few thousand tokens, hidden 256..4096 in steps of 256, plus odd sizes) and eps values."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        hidden = int(rng.choice([256 * int(rng.integers(1, 17)), int(rng.integers(1, 3000))]))
        B = int(rng.integers(1, 17))
        T = int(rng.integers(1, 257))
        while B * T * hidden > MAX_ELEMENTS and (B > 1 or T > 1):
            B, T = max(1, B // 2), max(1, T // 2)
        eps = float(rng.choice([1e-5, 1e-6, 1e-12]))
        data = str(rng.choice(DATA))
        x = make_input(rng, (B, T, hidden), data)
        gamma, beta = make_params(rng, hidden)
        out = minitorch.tensor_from_numpy(x, backend=BACKEND).layernorm(
            minitorch.tensor_from_numpy(gamma, backend=BACKEND),
            minitorch.tensor_from_numpy(beta, backend=BACKEND), eps).to_numpy()
        err = rel_err(out, reference(x, gamma, beta, eps)[0])
        assert err < TOL, f"[{B}, {T}, {hidden}] {data} eps={eps}: relative error {err:.3g}"


def test_layernorm_fw_constant_rows() -> None:
    """Rows with zero variance: var is clamped at 0, rstd = 1/sqrt(eps), out = beta."""
    x = np.full((5, 300), 3.25, dtype=np.float32)
    gamma, beta = make_params(np.random.default_rng(0), 300)
    out, _, rstd = (t.to_numpy() for t in on_tensors(
        minitorch.CudaKernelOps.layernorm_fw,
        minitorch.tensor_from_numpy(x, backend=BACKEND), minitorch.tensor_from_numpy(gamma, backend=BACKEND),
        minitorch.tensor_from_numpy(beta, backend=BACKEND), EPS))
    assert np.array_equal(out, np.broadcast_to(beta, out.shape))
    assert rel_err(rstd, np.full(5, 1.0 / np.sqrt(EPS))) < TOL


@pytest.mark.parametrize("hidden", [3, 256, 1020, 5000, 16385, 20000])
@pytest.mark.parametrize("misaligned", [False, True])
def test_layernorm_fw_raw_poisoned(hidden: int, misaligned: bool) -> None:
    """Every element of out, mean and rstd is written (they start as NaN); buffers that are not
    16-byte aligned take the scalar path even when hidden % 4 == 0."""
    rng = np.random.default_rng(hidden + 1)
    rows = 29
    x_np = make_input(rng, (rows, hidden), "offset")
    g_np, b_np = make_params(rng, hidden)
    off = 1 if misaligned else 0

    x, g, b = device_copy(x_np, off), device_copy(g_np, off), device_copy(b_np, off)
    out, mean, rstd = nan_buffer(rows * hidden, off), nan_buffer(rows, off), nan_buffer(rows, off)
    lib = kernel_library("layernorm_kernel")
    code = lib.launch_layernorm(0, out.data_ptr(), mean.data_ptr(), rstd.data_ptr(), x.data_ptr(), g.data_ptr(),
                                b.data_ptr(), rows, hidden, EPS, torch.cuda.current_stream().cuda_stream)
    assert code == 0, lib.minitorch_error_string(code).decode()
    torch.cuda.synchronize()
    got = (out.cpu().numpy().reshape(rows, hidden), mean.cpu().numpy(), rstd.cpu().numpy())
    check_stats(f"[{rows}, {hidden}] misaligned={misaligned}", got, reference(x_np, g_np, b_np, EPS))


def test_layernorm_fw_raw_rejects_bad_sizes() -> None:
    lib = kernel_library("layernorm_kernel")
    buf = torch.zeros(16, device="cuda")
    p = buf.data_ptr()
    stream = torch.cuda.current_stream().cuda_stream
    for rows, hidden, eps in [(0, 4, EPS), (4, 0, EPS), (-2, 4, EPS), (4, 4, float("nan")), (4, 4, -1.0)]:
        code = lib.launch_layernorm(0, p, p, p, p, p, p, rows, hidden, eps, stream)
        assert code != 0, f"rows={rows} hidden={hidden} eps={eps} must be rejected"


def test_layernorm_fw_speedup_report() -> None:
    """Fused forward vs minitorch's own composed LayerNorm (fused.layernorm.layernorm_reference) on the GPU."""
    rng = np.random.default_rng(0)
    print()
    for rows, hidden in [(5120, 256), (16384, 768), (65536, 1024)]:
        x = minitorch.tensor_from_numpy(make_input(rng, (rows, hidden), "normal"), backend=BACKEND)
        g, b = (minitorch.tensor_from_numpy(p, backend=BACKEND) for p in make_params(rng, hidden))
        print_speedup(
            f"layernorm fw [{rows}, {hidden}]",
            lambda: on_tensors(minitorch.CudaKernelOps.layernorm_fw, x, g, b, EPS),
            lambda: layernorm_reference(x, g, b, EPS),
        )
