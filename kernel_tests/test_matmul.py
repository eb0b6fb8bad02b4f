"""The tensor-core matmul library (src/matmul_kernel.cu) through its C ABI, against torch float64 on the
CPU from the same float32 inputs.

Inputs are N(0, 1) torch CUDA tensors (views for transposes, broadcast batch dims with stride 0); the
output is filled with NaN before each call so an unwritten element fails. Errors are
max|out - ref| / max|ref|. "highest" (3xTF32) must stay within 2x torch's own float32 error with TF32
off on the same inputs (+ ACC_FLOOR, the 3xTF32 scheme's error on a single product); "high" (one TF32
product) within 2x torch's error with TF32 on, or TF32_FLOOR where torch picks a float32 kernel anyway
(small batched products): that still fails any wrong index, which is off by O(1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import pytest

from minitorch.cuda.layout import layout
from minitorch.cuda.matmul import SIGNATURES
from minitorch.cuda.runtime import load_library

torch = pytest.importorskip("torch")

LIB_PATH = Path(__file__).resolve().parents[1] / "minitorch" / "cuda_kernels" / "matmul_kernel.so"
ACC_FLOOR = 5e-7
TF32_FLOOR = 1e-3
HIGHEST, HIGH = 0, 1
EPI_NONE, EPI_BIAS, EPI_GELU, EPI_RELU = 0, 1, 2, 3

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)
if not LIB_PATH.exists():
    pytest.skip(f"{LIB_PATH} is missing: build it with `bash compile_cuda.sh`", allow_module_level=True)


LIB = load_library("matmul_kernel", SIGNATURES)


def ptr(t: Optional["torch.Tensor"]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def launch(
    out: "torch.Tensor",
    a: "torch.Tensor",
    b: "torch.Tensor",
    *,
    precision: int = HIGHEST,
    bias: Optional["torch.Tensor"] = None,
    epilogue: int = EPI_NONE,
    pre_act: Optional["torch.Tensor"] = None,
    accumulate: bool = False,
    workspace: str = "exact",
) -> None:
    """out[..., M, N] (contiguous) = epilogue(a @ b) with a [..., M, K], b [..., K, N] of one batch shape
    (expand() for broadcasting). workspace: "exact" (what the library asks for) or "none"."""
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = a.shape[:-2]
    assert b.shape[:-2] == batch and out.shape == (*batch, M, N) and out.is_contiguous()
    n_batch = 1
    for n in batch:
        n_batch *= n
    floats = LIB.matmul_workspace_floats(M, N, K, n_batch) if workspace == "exact" else 0
    ws = torch.empty(max(floats, 1), device="cuda") if floats else None
    code = LIB.launch_matmul(
        ptr(out), ptr(a), ptr(b), M, N, K,
        a.stride(-2), a.stride(-1), b.stride(-2), b.stride(-1),
        layout(batch, a.stride()[:-2]), layout(batch, b.stride()[:-2]),
        ptr(bias), epilogue, ptr(pre_act), int(accumulate), precision,
        ptr(ws), floats, torch.cuda.current_stream().cuda_stream,
    )  # fmt: skip
    assert code == 0, LIB.minitorch_error_string(code).decode()
    torch.cuda.synchronize()


def gelu64(x: "torch.Tensor") -> "torch.Tensor":
    return 0.5 * x * (1.0 + torch.tanh((2.0 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))


def rel_err(out: "torch.Tensor", ref: "torch.Tensor") -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    if out.numel() == 0:
        return 0.0
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def torch_err(a: "torch.Tensor", b: "torch.Tensor", ref: "torch.Tensor", tf32: bool) -> float:
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        return rel_err(a @ b, ref)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def operand(gen, shape: Tuple[int, ...], transposed: bool) -> "torch.Tensor":
    """N(0, 1) tensor of `shape`; transposed: a view of a tensor stored with the last two dims swapped."""
    if not transposed:
        return torch.randn(shape, generator=gen, device="cuda")
    return torch.randn((*shape[:-2], shape[-1], shape[-2]), generator=gen, device="cuda").transpose(-1, -2)


def check_product(a, b, precision: int, workspace: str = "exact") -> None:
    out = torch.full((*a.shape[:-1], b.shape[-1]), float("nan"), device="cuda")
    launch(out, a, b, precision=precision, workspace=workspace)
    ref = a.double().cpu() @ b.double().cpu()
    ours = rel_err(out, ref)
    if precision == HIGHEST:
        bound = 2 * torch_err(a, b, ref, tf32=False) + ACC_FLOOR
    else:
        bound = max(2 * torch_err(a, b, ref, tf32=True), TF32_FLOOR)
    assert ours <= bound, f"error {ours:.3g} > bound {bound:.3g}"


@pytest.mark.parametrize("precision", [HIGHEST, HIGH])
@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
def test_layouts(precision: int, a_t: bool, b_t: bool) -> None:
    gen = torch.Generator(device="cuda").manual_seed(1 + 2 * a_t + 4 * b_t + 8 * precision)
    check_product(operand(gen, (197, 203), a_t), operand(gen, (203, 131), b_t), precision)


@pytest.mark.parametrize(
    "M, N, K",
    [(1, 1, 1), (1, 4099, 7), (4099, 1, 13), (17, 31, 1), (64, 64, 64), (128, 128, 32), (131, 257, 4099),
     (509, 1021, 67)],
)  # fmt: skip
def test_sizes(M: int, N: int, K: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(M * 7 + N * 3 + K)
    check_product(operand(gen, (M, K), False), operand(gen, (K, N), False), HIGHEST)


def test_strided_and_misaligned() -> None:
    """Neither dim at stride 1 (a step-2 slice), and a base one element past a 16-byte boundary: 4-byte
    copies."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(70, 2 * 90, generator=gen, device="cuda")[:, ::2]
    b = torch.randn(90 * 61 + 1, generator=gen, device="cuda")[1:].view(90, 61)
    check_product(a, b, HIGHEST)
    check_product(a, b, HIGH)


@pytest.mark.parametrize("precision", [HIGHEST, HIGH])
@pytest.mark.parametrize("M, N, K", [(64, 64, 16384), (384, 1536, 4096)])
def test_long_k(precision: int, M: int, N: int, K: int) -> None:
    """Few output tiles and long K: split-K (and the per-tile fresh accumulators of "highest")."""
    gen = torch.Generator(device="cuda").manual_seed(K + precision)
    a, b = operand(gen, (M, K), False), operand(gen, (K, N), True)
    check_product(a, b, precision)
    if M == 64:
        check_product(a, b, precision, workspace="none")


def test_batch_broadcast() -> None:
    gen = torch.Generator(device="cuda").manual_seed(9)
    a = torch.randn(3, 1, 45, 33, generator=gen, device="cuda").expand(3, 4, 45, 33)
    b = operand(gen, (1, 4, 33, 29), True).expand(3, 4, 33, 29)
    check_product(a, b, HIGHEST)
    w = torch.randn(33, 50, generator=gen, device="cuda").expand(6, 33, 50)  # one matrix for the batch
    check_product(torch.randn(6, 19, 33, generator=gen, device="cuda"), w, HIGH)


@pytest.mark.parametrize("epilogue", [EPI_BIAS, EPI_GELU, EPI_RELU])
@pytest.mark.parametrize("M, N, K", [(100, 132, 70), (37, 45, 8192), (5, 7, 0)])
def test_epilogues(epilogue: int, M: int, N: int, K: int) -> None:
    """Bias, GELU and ReLU with the pre-activation stored, on direct, split-K and K = 0 products."""
    gen = torch.Generator(device="cuda").manual_seed(epilogue * 10 + K)
    a, b = operand(gen, (M, K), False), operand(gen, (K, N), False)
    bias = torch.randn(N, generator=gen, device="cuda")
    out = torch.full((M, N), float("nan"), device="cuda")
    pre = torch.full((M, N), float("nan"), device="cuda") if epilogue != EPI_BIAS else None
    launch(out, a, b, bias=bias, epilogue=epilogue, pre_act=pre)
    x = a.double().cpu() @ b.double().cpu() + bias.double().cpu()
    scale = max(float(x.abs().max()), 1.0)
    if pre is not None:
        assert float((pre.double().cpu() - x).abs().max()) / scale < 1e-5
    y = x if epilogue == EPI_BIAS else gelu64(x) if epilogue == EPI_GELU else torch.relu(x)
    assert float((out.double().cpu() - y).abs().max()) / scale < 1e-5


@pytest.mark.parametrize("epilogue", [EPI_GELU, EPI_RELU])
def test_activation_without_bias(epilogue: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(epilogue)
    a, b = operand(gen, (50, 40), True), operand(gen, (40, 30), False)
    out = torch.full((50, 30), float("nan"), device="cuda")
    launch(out, a, b, epilogue=epilogue)
    x = a.double().cpu() @ b.double().cpu()
    y = gelu64(x) if epilogue == EPI_GELU else torch.relu(x)
    assert float((out.double().cpu() - y).abs().max()) / float(x.abs().max()) < 1e-5


@pytest.mark.parametrize("M, N, K", [(33, 65, 100), (64, 128, 20000)])
def test_accumulate(M: int, N: int, K: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(K)
    a, b = operand(gen, (M, K), True), operand(gen, (K, N), False)
    out = torch.randn(M, N, generator=gen, device="cuda")
    ref = out.double().cpu() + a.double().cpu() @ b.double().cpu()
    launch(out, a, b, accumulate=True)
    assert rel_err(out, ref) < 1e-5


def test_empty_and_invalid() -> None:
    a, b = torch.randn(0, 5, device="cuda"), torch.randn(5, 3, device="cuda")
    launch(torch.empty(0, 3, device="cuda"), a, b)  # nothing to write, no error
    code = LIB.launch_matmul(
        None, None, None, 2, 2, 2, 2, 1, 2, 1, layout((), ()), layout((), ()), None, EPI_GELU, None, 1, HIGHEST,
        None, 0, torch.cuda.current_stream().cuda_stream,
    )  # fmt: skip
    assert code != 0  # accumulate needs epilogue 0
