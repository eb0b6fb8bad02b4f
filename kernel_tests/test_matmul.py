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
    workspace="exact",
    stream: Optional["torch.cuda.Stream"] = None,
) -> None:
    """out[..., M, N] = epilogue(a @ b) with a [..., M, K], b [..., K, N] of one batch shape (expand() for
    broadcasting); out's rows may be further apart than N (a column slice of a wider tensor), its batch
    matrices one after another. workspace: "exact" (what the library asks for), "none", or a tensor of
    at least that size. stream: launch there and return without waiting (e.g. while a graph captures);
    by default on the current stream, waiting for the product."""
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = a.shape[:-2]
    assert b.shape[:-2] == batch and out.shape == (*batch, M, N) and out.stride(-1) == 1
    assert all(out.stride(d) == out.shape[d + 1] * out.stride(d + 1) for d in range(out.dim() - 2))
    n_batch = 1
    for n in batch:
        n_batch *= n
    strides = (a.stride(-2), a.stride(-1), b.stride(-2), b.stride(-1))
    if isinstance(workspace, torch.Tensor):
        ws, floats = workspace, workspace.numel()
    else:
        floats = LIB.matmul_workspace_floats(M, N, K, n_batch, *strides, precision) if workspace == "exact" else 0
        ws = torch.empty(max(floats, 1), device="cuda") if floats else None
    code = LIB.launch_matmul(
        ptr(out), out.stride(-2), ptr(a), ptr(b), M, N, K, *strides,
        layout(batch, a.stride()[:-2]), layout(batch, b.stride()[:-2]),
        ptr(bias), epilogue, ptr(pre_act), int(accumulate), precision,
        ptr(ws), floats, (stream or torch.cuda.current_stream()).cuda_stream,
    )  # fmt: skip
    assert code == 0, LIB.minitorch_error_string(code).decode()
    if stream is None:
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


def aligned_operand(gen, shape: Tuple[int, ...], transposed: bool) -> "torch.Tensor":
    """As operand, but a view into storage whose unit-stride dim is padded to a multiple of 4, so odd
    sizes still have the 16-byte strides the TMA path (sm_90a) reads."""
    inner = shape[-2] if transposed else shape[-1]
    padded = (inner + 3) // 4 * 4
    if not transposed:
        return torch.randn((*shape[:-1], padded), generator=gen, device="cuda")[..., :inner]
    store = torch.randn((*shape[:-2], shape[-1], padded), generator=gen, device="cuda")
    return store[..., :inner].transpose(-1, -2)


def check_product(a, b, precision: int, workspace: str = "exact", pad: int = 0) -> None:
    """pad: output rows that many floats longer than N (which must stay untouched)."""
    wide = torch.full((*a.shape[:-1], b.shape[-1] + pad), float("nan"), device="cuda")
    out = wide[..., : b.shape[-1]]
    launch(out, a, b, precision=precision, workspace=workspace)
    assert torch.isnan(wide[..., b.shape[-1] :]).all(), "a column beyond N was written"
    ref = a.double() @ b.double()
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


@pytest.mark.parametrize("precision", [HIGHEST, HIGH])
@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
@pytest.mark.parametrize("M, N, K", [(300, 517, 1001), (129, 1000, 64), (2, 3, 5)])
def test_aligned_layouts(precision: int, a_t: bool, b_t: bool, M: int, N: int, K: int) -> None:
    """Odd sizes with 16-byte strides: on sm_90a the TMA kernel in each orientation (B K-major: direct;
    only A K-major: transposed; neither: B transformed), partial tiles at every edge."""
    gen = torch.Generator(device="cuda").manual_seed(M + N + K + 2 * a_t + 4 * b_t + 8 * precision)
    check_product(aligned_operand(gen, (M, K), a_t), aligned_operand(gen, (K, N), b_t), precision)


@pytest.mark.parametrize("precision", [HIGHEST, HIGH])
@pytest.mark.parametrize("product", ["fwd", "dX", "dW"])
def test_gpt2_products(precision: int, product: str) -> None:
    """A GPT-2 feed-forward layer's three products (4096 tokens, 768 -> 3072), in the layouts autodiff
    gives them: x @ W, dy @ W^T, x^T @ dy."""
    gen = torch.Generator(device="cuda").manual_seed(len(product) + precision)
    x, w, dy = (torch.randn(shape, generator=gen, device="cuda") for shape in ((4096, 768), (768, 3072), (4096, 3072)))
    a, b = {"fwd": (x, w), "dX": (dy, w.t()), "dW": (x.t(), dy)}[product]
    check_product(a, b, precision)


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


@pytest.mark.parametrize("precision", [HIGHEST, HIGH])
@pytest.mark.parametrize(
    "M, N, K, a_t, b_t",
    [(256, 256, 16384, False, True), (1000, 3000, 520, False, False), (520, 200, 4100, True, False),
     (200, 520, 4100, True, False)],
)  # fmt: skip
def test_stream_k(precision: int, M: int, N: int, K: int, a_t: bool, b_t: bool) -> None:
    """The TMA path's stream-K work sharing: 4 output tiles over every SM (each finished from the parts of
    ~30 blocks), whole waves and a shared remainder (transposed orientation); weight gradients x^T @ dy
    with M > N and M < N (under "high", B or A copied K-major first). A rerun gives the same bits (the
    parts are added in a fixed order); without workspace (no stream-K, no copy) it meets the same bound."""
    gen = torch.Generator(device="cuda").manual_seed(M + K + precision)
    a, b = aligned_operand(gen, (M, K), a_t), aligned_operand(gen, (K, N), b_t)
    check_product(a, b, precision)
    runs = [torch.empty(M, N, device="cuda") for _ in range(2)]
    for out in runs:
        launch(out, a, b, precision=precision)
    assert torch.equal(runs[0], runs[1])
    check_product(a, b, precision, workspace="none")


def test_stream_k_graph_replay() -> None:
    """Stream-K flags are not cleared before a launch: each launch raises them to its own token and clears
    the ones it waited on. A launch captured in a CUDA graph (same token, same workspace every replay)
    must give the eager result's bits on every replay, also after the workspace held other data."""
    gen = torch.Generator(device="cuda").manual_seed(21)
    M, N, K = 768, 768, 4096  # attn proj dW: 36 tiles over every SM, ~4 blocks a tile
    a, b = aligned_operand(gen, (M, K), True), aligned_operand(gen, (K, N), False)
    eager = torch.empty(M, N, device="cuda")
    launch(eager, a, b)
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    ws = torch.empty(LIB.matmul_workspace_floats(M, N, K, 1, *strides, HIGHEST), device="cuda")
    out = torch.full((M, N), float("nan"), device="cuda")
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        launch(out, a, b, workspace=ws, stream=stream)
    for fill in (0.0, float("nan"), 1.0):
        ws.fill_(fill)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
        for _ in range(2):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def test_batched_weight_gradients() -> None:
    """x^T @ dy per batch matrix under "high", the copied operand batched (A, M < N) or broadcast (B)."""
    gen = torch.Generator(device="cuda").manual_seed(12)
    dy = aligned_operand(gen, (140, 260), False).expand(5, 140, 260)
    check_product(aligned_operand(gen, (5, 96, 140), True), dy, HIGH)
    x = aligned_operand(gen, (300, 140), True).expand(5, 300, 140)
    check_product(x, aligned_operand(gen, (5, 140, 64), False), HIGH)
    check_product(x, aligned_operand(gen, (5, 140, 640), False), HIGH)


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


@pytest.mark.parametrize("epilogue", [EPI_BIAS, EPI_GELU, EPI_RELU])
@pytest.mark.parametrize("b_t", [False, True])
@pytest.mark.parametrize("precision", [HIGHEST, HIGH])
def test_epilogues_aligned(epilogue: int, b_t: bool, precision: int) -> None:
    """The epilogues on 16-byte strides: on sm_90a the TMA kernel, writing straight from its
    accumulators (transposed for x @ W, where only A is K-major)."""
    gen = torch.Generator(device="cuda").manual_seed(epilogue + 4 * b_t + 8 * precision)
    M, N, K = 300, 260 if b_t else 258, 200  # direct: 16-byte stores; transposed: scalar ones
    a, b = aligned_operand(gen, (M, K), False), aligned_operand(gen, (K, N), b_t)
    bias = torch.randn(N, generator=gen, device="cuda")
    out = torch.full((M, N), float("nan"), device="cuda")
    pre = torch.full((M, N), float("nan"), device="cuda") if epilogue != EPI_BIAS else None
    launch(out, a, b, precision=precision, bias=bias, epilogue=epilogue, pre_act=pre)
    x = a.double() @ b.double() + bias.double()
    scale = float(x.abs().max())
    tol = 1e-5 if precision == HIGHEST else 3e-3
    if pre is not None:
        assert float((pre.double() - x).abs().max()) / scale < tol
    y = x if epilogue == EPI_BIAS else gelu64(x) if epilogue == EPI_GELU else torch.relu(x)
    assert float((out.double() - y).abs().max()) / scale < tol


@pytest.mark.parametrize(
    "M, N, K, b_t",
    [(4096, 768, 768, False), (700, 4000, 512, True), (4000, 700, 512, False)],
)  # fmt: skip
def test_tile_widths_high(M: int, N: int, K: int, b_t: bool) -> None:
    """"high" products whose plan takes 192-wide tiles (768 or 4000 kernel columns: 4 or 21 tiles and a
    ragged one), in both orientations (b_t: B K-major; else x @ W, written transposed), with the GELU
    epilogue and its pre-activation, and without workspace (other tile widths or K splits)."""
    gen = torch.Generator(device="cuda").manual_seed(M + N + K)
    a, b = aligned_operand(gen, (M, K), False), aligned_operand(gen, (K, N), b_t)
    bias = torch.randn(N, generator=gen, device="cuda")
    x = a.double() @ b.double() + bias.double()
    scale = float(x.abs().max())
    for workspace in ("exact", "none"):
        out, pre = (torch.full((M, N), float("nan"), device="cuda") for _ in range(2))
        launch(out, a, b, precision=HIGH, bias=bias, epilogue=EPI_GELU, pre_act=pre, workspace=workspace)
        assert float((pre.double() - x).abs().max()) / scale < 3e-3
        assert float((out.double() - gelu64(x)).abs().max()) / scale < 3e-3
    check_product(a, b, HIGH)


def test_batch_aligned() -> None:
    """One batch dim on 16-byte strides: a batched A against a broadcast weight (transposed
    orientation) and two batched operands (direct)."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    a = aligned_operand(gen, (5, 200, 132), False)
    check_product(a, torch.randn(132, 260, generator=gen, device="cuda").expand(5, 132, 260), HIGHEST)
    check_product(a, aligned_operand(gen, (5, 132, 70), True), HIGH)


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


@pytest.mark.parametrize("precision", [HIGHEST, HIGH])
@pytest.mark.parametrize("make", [operand, aligned_operand])
@pytest.mark.parametrize("pad", [3, 4])
def test_output_row_stride(precision: int, make, pad: int) -> None:
    """Output rows ldc = N + pad floats apart (16-byte stores only where ldc allows), direct and split-K,
    in ragged and whole tiles (whole ones stored straight from the accumulators where ldc allows)."""
    gen = torch.Generator(device="cuda").manual_seed(pad + 2 * precision)
    for M, N, K in [(150, 70, 96), (64, 60, 8192), (256, 768, 96)]:
        check_product(make(gen, (M, K), False), make(gen, (K, N), M != 150), precision, pad=pad)


def test_empty_and_invalid() -> None:
    a, b = torch.randn(0, 5, device="cuda"), torch.randn(5, 3, device="cuda")
    launch(torch.empty(0, 3, device="cuda"), a, b)  # nothing to write, no error
    code = LIB.launch_matmul(
        None, 2, None, None, 2, 2, 2, 2, 1, 2, 1, layout((), ()), layout((), ()), None, EPI_GELU, None, 1, HIGHEST,
        None, 0, torch.cuda.current_stream().cuda_stream,
    )  # fmt: skip
    assert code != 0  # accumulate needs epilogue 0
    code = LIB.launch_matmul(
        None, 1, None, None, 2, 2, 2, 2, 1, 2, 1, layout((), ()), layout((), ()), None, 0, None, 0, HIGHEST,
        None, 0, torch.cuda.current_stream().cuda_stream,
    )  # fmt: skip
    assert code != 0  # output rows shorter than N
