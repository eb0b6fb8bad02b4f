"""Fused LayerNorm backward (src/layernorm_kernel.cu) against torch float64 autograd on the CPU.

End to end through the minitorch API (`x.layernorm(gamma, beta).backward(g)`: dx, dgamma, dbeta,
with the mean and rstd saved by the fused forward), and the raw launcher on torch buffers whose
outputs and workspace are poisoned with NaN first (an unwritten element or an unwritten partial sum
would surface as NaN).
"""

import numpy as np
import pytest

import minitorch
from minitorch.cuda.libraries import kernel_library
from minitorch.fused.layernorm import layernorm_backward_reference

from fused_testing import device_copy, nan_buffer, on_tensors, print_speedup, rel_err

torch = pytest.importorskip("torch")

BACKEND = minitorch.TensorBackend(minitorch.CudaKernelOps)
TOL = 1e-5
EPS = 1e-5
MAX_ELEMENTS = 1 << 22

# The register buckets (sub-warp, warp, 64..1024-thread teams up to 8192) and the streaming path
# (hidden > 8192), float4 and scalar.
HIDDEN = [3, 4, 63, 64, 256, 768, 1023, 1024, 2047, 4096, 8192, 8193, 12288, 16384, 20000]
DATA = ["normal", "offset"]


def make_case(rng: np.random.Generator, shape: tuple, data: str) -> tuple:
    C = shape[-1]
    if data == "normal":
        x = rng.standard_normal(shape)
    else:
        x = 100.0 + 0.01 * rng.standard_normal(shape)
    gamma = 1.0 + 0.5 * rng.standard_normal(C)
    beta = 0.5 * rng.standard_normal(C)
    dy = rng.standard_normal(shape)
    return tuple(a.astype(np.float32) for a in (x, gamma, beta, dy))


def reference(x, gamma, beta, dy, eps: float) -> tuple:
    xs = torch.from_numpy(x).double().requires_grad_(True)
    gs = torch.from_numpy(gamma).double().requires_grad_(True)
    bs = torch.from_numpy(beta).double().requires_grad_(True)
    out = torch.nn.functional.layer_norm(xs, (x.shape[-1],), gs, bs, eps)
    out.backward(torch.from_numpy(dy).double())
    return xs.grad.numpy(), gs.grad.numpy(), bs.grad.numpy()


def api_grads(x, gamma, beta, dy, eps: float) -> tuple:
    xt = minitorch.tensor_from_numpy(x, backend=BACKEND, requires_grad=True)
    gt = minitorch.tensor_from_numpy(gamma, backend=BACKEND, requires_grad=True)
    bt = minitorch.tensor_from_numpy(beta, backend=BACKEND, requires_grad=True)
    xt.layernorm(gt, bt, eps).backward(minitorch.tensor_from_numpy(dy, backend=BACKEND))
    return xt.grad.to_numpy(), gt.grad.to_numpy(), bt.grad.to_numpy()


def check(case: tuple, eps: float, label: str) -> None:
    got = api_grads(*case, eps)
    ref = reference(*case, eps)
    for name, g, r in zip(("dx", "dgamma", "dbeta"), got, ref):
        err = rel_err(g, r)
        assert err < TOL, f"{label}: {name} relative error {err:.3g}"


@pytest.mark.parametrize("data", DATA)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_layernorm_bw_sizes(hidden: int, data: str) -> None:
    rng = np.random.default_rng(hidden * 10 + DATA.index(data))
    rows = int(max(1, min(int(rng.integers(1, 3000)), MAX_ELEMENTS // hidden)))
    check(make_case(rng, (rows, hidden), data), EPS, f"[{rows}, {hidden}] {data}")


@pytest.mark.parametrize("rows", [1, 2, 7, 16, 17, 100, 4099, 70000])
def test_layernorm_bw_row_counts(rows: int) -> None:
    """Row counts around the per-block slab sizes: blocks with one row, with many, and teams past
    the last row in the last step."""
    rng = np.random.default_rng(rows)
    hidden = 64 if rows > 4096 else 384
    check(make_case(rng, (rows, hidden), "normal"), EPS, f"[{rows}, {hidden}]")


def test_layernorm_bw_hidden_one() -> None:
    """hidden == 1: xhat == 0, so dx == 0 and dgamma == 0 exactly; dbeta = column sum of dy."""
    rng = np.random.default_rng(1)
    x, gamma, beta, dy = make_case(rng, (50, 1), "normal")
    dx, dgamma, dbeta = api_grads(x, gamma, beta, dy, EPS)
    assert np.all(dx == 0.0) and np.all(dgamma == 0.0)
    assert rel_err(dbeta, dy.astype(np.float64).sum(axis=0)) < TOL


def test_layernorm_bw_two_columns() -> None:
    """hidden == 2: xhat = +-sqrt(var / (var + eps)), so dx = rstd * (g1 - g2) / 2 * eps / (var + eps)
    * (1, -1) is a cancellation of terms of size rstd * |g| (ill-conditioned in float32, for torch
    too): the error is measured against that size instead of |dx|."""
    rng = np.random.default_rng(2)
    x, gamma, beta, dy = make_case(rng, (300, 2), "normal")
    dx, dgamma, dbeta = api_grads(x, gamma, beta, dy, EPS)
    rdx, rdgamma, rdbeta = reference(x, gamma, beta, dy, EPS)
    x64 = x.astype(np.float64)
    terms = np.abs(dy * gamma).max(axis=1) / np.sqrt(x64.var(axis=1) + EPS)
    assert float(np.abs(dx - rdx).max()) / float(terms.max()) < TOL
    assert rel_err(dgamma, rdgamma) < TOL and rel_err(dbeta, rdbeta) < TOL


def test_layernorm_bw_random_shapes() -> None:
    """Seeded random [batch, seq, hidden] in the original harness's range, random eps."""
    rng = np.random.default_rng(9)
    for _ in range(16):
        hidden = int(rng.choice([256 * int(rng.integers(1, 17)), int(rng.integers(3, 3000))]))
        B, T = int(rng.integers(1, 17)), int(rng.integers(1, 257))
        while B * T * hidden > MAX_ELEMENTS and (B > 1 or T > 1):
            B, T = max(1, B // 2), max(1, T // 2)
        eps = float(rng.choice([1e-5, 1e-6]))
        data = str(rng.choice(DATA))
        check(make_case(rng, (B, T, hidden), data), eps, f"[{B}, {T}, {hidden}] {data} eps={eps}")


def test_layernorm_bw_deterministic() -> None:
    """dgamma/dbeta come from a fixed-order two-stage reduction: bit-identical across runs."""
    rng = np.random.default_rng(4)
    case = make_case(rng, (3000, 1024), "normal")
    first = api_grads(*case, EPS)
    second = api_grads(*case, EPS)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("hidden", [3, 128, 1024, 1025, 4096, 8192, 12288, 20001])
@pytest.mark.parametrize("misaligned", [False, True])
def test_layernorm_bw_raw_poisoned(hidden: int, misaligned: bool) -> None:
    """The raw launcher with NaN-filled outputs and workspace (sized by
    layernorm_bw_workspace_floats); unaligned buffers take the scalar path."""
    rng = np.random.default_rng(hidden + 5)
    rows = 45
    x_np, g_np, b_np, dy_np = make_case(rng, (rows, hidden), "offset")
    x64 = x_np.astype(np.float64)
    mean_np = x64.mean(axis=1).astype(np.float32)
    rstd_np = (1.0 / np.sqrt(x64.var(axis=1) + EPS)).astype(np.float32)
    off = 1 if misaligned else 0

    lib = kernel_library("layernorm_kernel")
    ws_len = lib.layernorm_bw_workspace_floats(rows, hidden)
    assert ws_len > 0, f"workspace query failed: {ws_len}"
    x, g, dy, mean, rstd = (device_copy(a, off) for a in (x_np, g_np, dy_np, mean_np, rstd_np))
    dx, dgamma, dbeta, ws = (nan_buffer(n, off) for n in (rows * hidden, hidden, hidden, ws_len))
    code = lib.launch_layernorm_bw(0, dx.data_ptr(), dgamma.data_ptr(), dbeta.data_ptr(), dy.data_ptr(), x.data_ptr(),
                                   g.data_ptr(), mean.data_ptr(), rstd.data_ptr(), None, ws.data_ptr(), rows, hidden,
                                   torch.cuda.current_stream().cuda_stream)
    assert code == 0, lib.minitorch_error_string(code).decode()
    torch.cuda.synchronize()
    ref = reference(x_np, g_np, b_np, dy_np, EPS)
    for name, got, r in zip(("dx", "dgamma", "dbeta"), (dx, dgamma, dbeta), ref):
        err = rel_err(got.cpu().numpy().reshape(r.shape), r)
        assert err < TOL, f"[{rows}, {hidden}] misaligned={misaligned}: {name} relative error {err:.3g}"


def test_layernorm_bw_raw_rejects_bad_sizes() -> None:
    lib = kernel_library("layernorm_kernel")
    assert lib.layernorm_bw_workspace_floats(0, 16) < 0
    assert lib.layernorm_bw_workspace_floats(16, 0) < 0
    buf = torch.zeros(64, device="cuda")
    p = buf.data_ptr()
    stream = torch.cuda.current_stream().cuda_stream
    for rows, hidden in [(0, 4), (4, 0), (-3, 4)]:
        code = lib.launch_layernorm_bw(0, p, p, p, p, p, p, p, p, None, p, rows, hidden, stream)
        assert code != 0, f"rows={rows} hidden={hidden} must be rejected"
    assert lib.launch_layernorm_bw(0, p, p, p, p, p, p, p, p, None, None, 4, 4, stream) != 0, "a null workspace must be rejected"


def test_layernorm_bw_speedup_report() -> None:
    """Fused backward vs minitorch's own composed backward (fused.layernorm.layernorm_backward_reference) on the GPU."""
    rng = np.random.default_rng(0)
    print()
    for rows, hidden in [(5120, 256), (16384, 768), (65536, 1024)]:
        x_np, g_np, _, dy_np = make_case(rng, (rows, hidden), "normal")
        x, gamma, dy = (minitorch.tensor_from_numpy(a, backend=BACKEND) for a in (x_np, g_np, dy_np))
        beta = minitorch.tensor_from_numpy(np.zeros(hidden, dtype=np.float32), backend=BACKEND)
        _, mean, rstd = on_tensors(minitorch.CudaKernelOps.layernorm_fw, x, gamma, beta, EPS)
        print_speedup(
            f"layernorm bw [{rows}, {hidden}]",
            lambda: on_tensors(minitorch.CudaKernelOps.layernorm_bw, dy, x, gamma, mean, rstd),
            lambda: layernorm_backward_reference(dy, x, gamma, mean, rstd),
        )
